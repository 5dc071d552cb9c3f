"""A small change indexed without a Dagster run (`kb index`, pipeline/direct_run.py) gives exactly the index
the Dagster job gives for the same change, runs the job's checks, and reaches Dagster through the
`kb_direct_runs` sensor as asset materializations and check evaluations. Whole `kb index` processes, real
embedded PostgreSQL (two databases), the real local model, a real Dagster instance."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from test_index_fast_path import _RUN, _age
from test_index_integrity import _assert_equivalent, _assert_same, _snapshot, _sources, _write_corpus, second_db  # noqa: F401


def _kb_index(cfg: Path, home: Path, *extra: str) -> tuple[dict, bool]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "KB_DB_LINGER": "0",
           "DAGSTER_HOME": str(home)}
    env.pop("KB_CONFIG", None)
    proc = subprocess.run([sys.executable, "-c", _RUN, "index", "--config", str(cfg), "--json", *extra],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    dagster = json.loads(next(line for line in proc.stderr.splitlines() if line.startswith("DAGSTER="))[8:])
    return json.loads(proc.stdout), dagster


def _runners(out: dict) -> dict:
    return {s["source"]: s["runner"] for s in out["sources"]}


def _tier_files(cfg) -> dict[str, str]:
    root = cfg.projections_path()
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*.dsl"))}


def test_small_change_without_dagster_equals_the_job_and_is_reported(tmp_path, db_url, second_db, monkeypatch):
    from kb_assets.config import load_config
    from kb_assets.pipeline import direct_run, source_state
    from kb_assets.pipeline.query_stats import refresh_query_stats
    from kb_assets.store.db import connect, open_database

    repo = tmp_path / "repo"
    _write_corpus(repo)
    _age(*repo.rglob("*.*"))
    paths = {}
    for name, url in (("direct", db_url), ("job", second_db)):
        (tmp_path / name).mkdir()
        paths[name] = tmp_path / name / "kb.yaml"
        paths[name].write_text(json.dumps({"database_url": url, "data_dir": str(tmp_path / name / "data"),
                                           "sources": _sources(repo)}))
        (tmp_path / name / "dagster").mkdir()
        first, dagster = _kb_index(paths[name], tmp_path / name / "dagster")
        assert set(_runners(first).values()) == {"dagster"} and dagster     # a first run: the whole job

    # a small change: one ADR edited, one renamed, one deleted, a code file added
    adr = repo / "docs" / "adr"
    first_adr, second_adr, third_adr = sorted(adr.iterdir())
    first_adr.write_text(first_adr.read_text() + "\n## Update\n\nWe also keep the embeddings of old models.\n")
    second_adr.rename(adr / "0009-retries-moved.md")
    third_adr.unlink()
    (repo / "src" / "clock.py").write_text(
        '"""Monotonic clocks for timeouts."""\n\nimport time\n\n\ndef deadline(seconds: float) -> float:\n'
        '    """When a timeout of `seconds` from now ends, on the monotonic clock."""\n'
        "    return time.monotonic() + seconds\n")
    _age(*repo.rglob("*.*"), seconds=60)

    out, dagster = _kb_index(paths["direct"], tmp_path / "direct" / "dagster")
    assert _runners(out) == {"decisions": "direct", "code": "direct"} and not dagster
    docs = {s["source"]: s["this_run"]["documents"] for s in out["sources"]}
    assert (docs["decisions"]["changed"], docs["decisions"]["new"], docs["decisions"]["deleted"]) == (1, 1, 2)
    assert docs["code"]["new"] == 1
    job_out, dagster = _kb_index(paths["job"], tmp_path / "job" / "dagster", "--dagster")
    assert _runners(job_out) == {"decisions": "dagster", "code": "dagster"} and dagster
    # the summary's counts (the direct run's: from its checks' coverage; the job's: counted after it) agree
    def counts(o: dict) -> dict:
        return {s["source"]: (s["documents"], s["chunks"], s["embedded"]) for s in o["sources"]}

    assert counts(out) == counts(job_out)
    assert all(chunks > 0 and embedded == chunks for _, chunks, embedded in counts(out).values())

    direct_cfg, job_cfg = load_config(str(paths["direct"])), load_config(str(paths["job"]))
    with connect(open_database(direct_cfg)) as conn:
        direct = _snapshot(conn)
        # the direct run's own state is what a full recompute gives
        refresh_query_stats(conn, full=True)
        recomputed = _snapshot(conn)
        stored = conn.execute("SELECT id, source_key, assets, checks FROM direct_runs ORDER BY id").fetchall()
    _assert_same(direct["content"], recomputed["content"], "direct run vs full recompute")
    _assert_same(direct["ids"], recomputed["ids"], "direct run vs full recompute (by id)")
    with connect(open_database(job_cfg)) as conn:
        job = _snapshot(conn)
    _assert_equivalent(direct["content"], job["content"], "direct run vs the Dagster job")
    assert _tier_files(direct_cfg) == _tier_files(job_cfg)

    # the run is stored with what the assets and the job's seven checks found
    assert [r[1] for r in stored] == ["decisions", "code"]
    for _id, _source, assets, checks in stored:
        assert set(assets) == {"kb_documents", "kb_chunks", "kb_embeddings", "kb_signposts", "kb_search_index",
                               "kb_projections"}
        assert {c["name"]: c["passed"] for c in checks} == {
            "every_chunk_embedded": True, "no_orphans": True, "signpost_failure_rate": True,
            "indexed_commit_matches_tip": True, "vector_keyword_parity": True, "tags_in_vocabulary": True,
            "recall_regression_set": True}

    # nothing changed now: no run at all
    again, dagster = _kb_index(paths["direct"], tmp_path / "direct" / "dagster")
    assert _runners(again) == {"decisions": None, "code": None} and not dagster

    # the sensor reports the stored runs to Dagster, once
    monkeypatch.setenv("KB_CONFIG", str(paths["direct"]))
    for mod in [m for m in sys.modules if m.startswith("kb_assets.defs") or m == "kb_assets.definitions"]:
        del sys.modules[mod]
    definitions = importlib.import_module("kb_assets.definitions").defs
    defs = definitions() if callable(definitions) else definitions
    sensor = defs.resolve_sensor_def("kb_direct_runs")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    instance = dg.DagsterInstance.ephemeral()
    result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
    materializations = [e for e in result.asset_events if isinstance(e, dg.AssetMaterialization)]
    evaluations = [e for e in result.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
    assert len(materializations) == 12 and len(evaluations) == 14 and not result.run_requests
    assert result.cursor == str(stored[-1][0])
    for event in result.asset_events:      # what the daemon does with a sensor's asset events
        instance.report_runless_asset_event(event)
    latest = instance.get_latest_materialization_event(dg.AssetKey("kb_documents"))
    assert latest.asset_materialization.partition == "code"
    assert latest.asset_materialization.tags["kb/runner"] == "direct"
    meta = latest.asset_materialization.metadata
    assert meta["new"].value == 1 and meta["listed"].value == 2
    partitions = instance.get_materialized_partitions(dg.AssetKey("kb_search_index"))
    assert partitions == {"decisions", "code"}
    idle = sensor(dg.build_sensor_context(instance=instance, definitions=defs, cursor=result.cursor))
    assert not idle.asset_events and idle.cursor == result.cursor

    # a larger change than the limit goes through the job; settings changed likewise
    monkeypatch.setattr(direct_run, "DIRECT_MAX_FILES", 0)
    monkeypatch.setattr(direct_run, "DIRECT_MAX_SHARE", 0.0)
    (repo / "src" / "clock.py").write_text((repo / "src" / "clock.py").read_text() + "\nTICK = 0.1\n")
    _age(repo / "src" / "clock.py", seconds=60)
    source = direct_cfg.source("code")
    state = source_state.source_fingerprint(direct_cfg, source)
    with connect(open_database(direct_cfg)) as conn:
        assert direct_run.why_not_direct(conn, direct_cfg, source, state) == "1 files changed (more than 0)"
        monkeypatch.setattr(direct_run, "DIRECT_MAX_FILES", 100)
        assert direct_run.why_not_direct(conn, direct_cfg, source, state) is None
        other = direct_cfg.model_copy(update={"embed_batch_rows": direct_cfg.embed_batch_rows + 1})
        changed = source_state.source_fingerprint(other, other.source("code"))
        assert direct_run.why_not_direct(conn, other, other.source("code"), changed) == \
            "settings changed since the last complete run"
