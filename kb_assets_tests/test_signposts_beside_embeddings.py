"""The signposts stage runs beside the embedding stage in one Dagster step (kb_embeddings_and_signposts):
through `kb index` the two overlap in time and write exactly what one after the other writes; one of them
failing fails the run with its own error, stops the other at a batch boundary and leaves a state the next run
completes; either asset materialized alone (the UI) runs alone. Whole `kb index` processes, the real Dagster
job, real embedded PostgreSQL; the fixed-cost stand-in embedder (deterministic vectors, a cost to overlap)."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from psycopg import sql

COST = 0.02            # seconds per text: the embedding stage lasts long enough for the other to run beside it
N_DOCS = 80


def _corpus(root: Path, n_docs: int = N_DOCS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for n in range(n_docs):
        sections = "\n\n".join(
            f"## Part {p}\n\nStream {n} keeps retention rule {p} because storage grows; consumers replay "
            f"message {n * 31 + p} after a restart. " * 3 for p in range(6))
        (root / f"ADR-{n:03}.md").write_text(f"# ADR {n}: retention decision {n}\n\n## Decision\n\nWe keep "
                                             f"{n + 7} days.\n\n{sections}\n")
    return root


def _config(tmp_path: Path, db_url: str, corpus: Path, schema: str) -> Path:
    cfg = tmp_path / f"kb-{schema}.yaml"
    cfg.write_text(json.dumps({"data_dir": str(tmp_path / f"data-{schema}"), "database_url": db_url,
                               "schema": schema, "embed_batch_rows": 40,
                               "sources": [{"key": "adrs", "kind": "adr", "root": str(corpus),
                                            "include": ["*.md"]}]}))
    return cfg


# `kb index` in a child, with a fault planted before the CLI starts (argv[1]: python to run first)
_RUN = "import sys\nexec(sys.argv[1])\nfrom kb_assets.cli import main\nsys.exit(main(sys.argv[2:]))\n"


def _kb_index(cfg: Path, trace: Path, *, plant: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "KB_STANDIN_EMBEDDER": str(COST),
           "KB_STAGE_TRACE": str(trace)}
    env.pop("KB_CONFIG", None)
    env.pop("KB_SCHEMA", None)
    return subprocess.run([sys.executable, "-c", _RUN, plant, "index", "--config", str(cfg), "--json"],
                          capture_output=True, text=True, env=env, timeout=900)


def _spans(trace: Path) -> dict[str, tuple[float, float]]:
    """stage -> (first start, last end) of the stage trace."""
    spans: dict[str, list[float]] = {}
    for line in trace.read_text().splitlines():
        t, _, stage, event = line.split()
        span = spans.setdefault(stage, [float("inf"), 0.0])
        if event == "start":
            span[0] = min(span[0], float(t))
        else:
            span[1] = max(span[1], float(t))
    return {k: (a, b) for k, (a, b) in spans.items()}


def _state(db_url: str, schema: str) -> dict:
    """What the two stages wrote, independent of ids and times: vectors per chunk hash, signposts per path."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}, public").format(sql.Identifier(schema)))
        tables = [r[0] for r in conn.execute("SELECT table_name FROM embedding_spaces").fetchall()]
        vectors = {}
        for table in tables:
            vectors.update({h: v for h, v in conn.execute(
                sql.SQL("SELECT chunk_hash, embedding::text FROM {}").format(sql.Identifier(table))).fetchall()})
        chunks = {r[0] for r in conn.execute("SELECT DISTINCT chunk_hash FROM chunks").fetchall()}
        signposts = dict(conn.execute(
            "SELECT d.path, s.payload::text FROM documents d JOIN signpost_state st ON st.document_id = d.id"
            " JOIN signposts s ON s.content_hash = st.content_hash AND s.generator = st.generator"
            " AND s.model = st.model AND s.prompt_version = st.prompt_version"
            " WHERE d.status = 'active'").fetchall())
        documents = conn.execute("SELECT count(*) FROM documents WHERE status = 'active'").fetchone()[0]
    return {"vectors": vectors, "chunks": chunks, "signposts": signposts, "documents": documents}


def _reload_definitions(cfg: Path, monkeypatch):
    monkeypatch.setenv("KB_CONFIG", str(cfg))
    monkeypatch.setenv("KB_STANDIN_EMBEDDER", str(COST))
    # partitions and kinds are read from the config when the definitions are imported
    for mod in [m for m in sys.modules if m.startswith("kb_assets.defs") or m == "kb_assets.definitions"]:
        del sys.modules[mod]
    definitions = importlib.import_module("kb_assets.definitions").defs
    return definitions() if callable(definitions) else definitions


def _materialized(result) -> dict[str, dict]:
    return {m.asset_key.to_user_string(): {k: v.value for k, v in m.metadata.items()}
            for m in (e.event_specific_data.materialization for e in result.get_asset_materialization_events())}


def test_side_by_side_in_kb_index_writes_what_one_after_the_other_writes(tmp_path, db_url, monkeypatch):
    corpus = _corpus(tmp_path / "corpus")
    trace = tmp_path / "trace.log"
    proc = _kb_index(_config(tmp_path, db_url, corpus, "kb"), trace)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads(proc.stdout)["sources"][0]["this_run"]
    assert run["signposts"]["generated"] == N_DOCS and run["embeddings"]["missing_after"] == 0
    spans = _spans(trace)
    (e0, e1), (s0, s1) = spans["kb_embeddings"], spans["kb_signposts"]
    assert s0 < e1 and e0 < s1, f"the stages did not overlap: embeddings {e0:.2f}-{e1:.2f}, signposts {s0:.2f}-{s1:.2f}"
    overlapped = _state(db_url, "kb")

    # the reference, one after the other in the real job: documents → chunks → embeddings, then the
    # signposts asset alone (the UI's "Materialize selected" of one asset of the pair)
    defs = _reload_definitions(_config(tmp_path, db_url, corpus, "kb_serial"), monkeypatch)
    job = defs.resolve_job_def("kb_index")
    instance = dg.DagsterInstance.ephemeral()
    first = job.execute_in_process(partition_key="adrs", instance=instance, asset_selection=[
        dg.AssetKey("kb_documents"), dg.AssetKey("kb_chunks"), dg.AssetKey("kb_embeddings")])
    assert first.success
    mats = _materialized(first)
    assert "kb_signposts" not in mats and mats["kb_embeddings"]["missing_after"] == 0
    assert _state(db_url, "kb_serial")["signposts"] == {}        # the pair's other asset did not run
    alone = job.execute_in_process(partition_key="adrs", instance=instance,
                                   asset_selection=[dg.AssetKey("kb_signposts")])
    assert alone.success
    mats = _materialized(alone)
    assert set(mats) == {"kb_signposts"} and mats["kb_signposts"]["generated"] == N_DOCS
    assert mats["kb_signposts"]["generator"] == "extractive"
    checks = {e.check_name: e.passed for e in alone.get_asset_check_evaluations()}
    assert checks == {"signpost_failure_rate": True}
    serial = _state(db_url, "kb_serial")

    assert overlapped["documents"] == serial["documents"] == N_DOCS
    assert len(overlapped["signposts"]) == N_DOCS
    assert overlapped["signposts"] == serial["signposts"]
    assert set(overlapped["vectors"]) == overlapped["chunks"] and len(overlapped["chunks"]) > N_DOCS
    assert overlapped["vectors"] == serial["vectors"]


# The faults, planted in the child: a stage-level error in the middle of each stage (not retried: Dagster's
# retry policy would run the step again after 30 s, which is not what is tested here).
_SLOW_SIGNPOSTS = """
import time
import kb_assets.signposts.extractive as ex
_generate = ex.ExtractiveSignposter.generate
def _slow(self, inp):
    time.sleep(0.03)          # long enough to be in the middle of the other stage
    return _generate(self, inp)
ex.ExtractiveSignposter.generate = _slow
"""

_SIGNPOSTS_FAIL = _SLOW_SIGNPOSTS + """
import dagster as dg
import kb_assets.pipeline.signposts as sp
_write = sp._write_successes
_calls = []
def _failing(conn, signposter, items):
    _calls.append(1)
    if len(_calls) > 1:
        raise dg.Failure("signpost store failed on purpose", allow_retries=False)
    return _write(conn, signposter, items)
sp._write_successes = _failing
"""

_EMBEDDINGS_FAIL = _SLOW_SIGNPOSTS + """
import dagster as dg
import kb_assets.embedding.fixed as fx
_embed = fx.FixedCostEmbedder.embed_documents
_calls = []
def _failing(self, texts, token_counts=None):
    _calls.append(1)
    if len(_calls) > 2:
        raise dg.Failure("model failed on purpose", allow_retries=False)
    return _embed(self, texts, token_counts)
fx.FixedCostEmbedder.embed_documents = _failing
"""


@pytest.mark.parametrize("plant,error,stopped", [
    (_SIGNPOSTS_FAIL, "signpost store failed on purpose", "embeddings"),
    (_EMBEDDINGS_FAIL, "model failed on purpose", "signposts"),
])
def test_one_stage_failing_fails_the_run_with_its_error_and_stops_the_other(tmp_path, db_url, plant, error,
                                                                             stopped):
    cfg = _config(tmp_path, db_url, _corpus(tmp_path / "corpus"), "kb")
    trace = tmp_path / "trace.log"
    proc = _kb_index(cfg, trace, plant=plant)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert [f["source"] for f in out["failures"]] == ["adrs"]
    assert error in out["failures"][0]["error"]          # the cause, not "stopped: ... beside it failed"
    assert "beside it failed" not in out["failures"][0]["error"]
    spans = _spans(trace)
    assert "kb_search_index" not in spans and "kb_projections" not in spans   # the run stopped at the pair
    state = _state(db_url, "kb")
    # consistent: every vector is of a chunk; what is stored is whole; the stopped stage did not finish
    assert set(state["vectors"]) <= state["chunks"]
    if stopped == "embeddings":
        assert 0 < len(state["vectors"]) < len(state["chunks"])
        assert len(state["signposts"]) == 64             # the first write batch, committed before the fault
    else:
        assert len(state["vectors"]) == 2 * 20           # two calls of half a batch (40) before the model failed
        assert len(state["signposts"]) < N_DOCS

    trace.unlink()
    again = _kb_index(cfg, trace)                          # no fault: the next run completes the rest
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    run = json.loads(again.stdout)["sources"][0]["this_run"]
    done = _state(db_url, "kb")
    assert set(done["vectors"]) == done["chunks"] and len(done["signposts"]) == N_DOCS
    assert run["embeddings"]["chunks_embedded"] == len(done["chunks"]) - len(state["vectors"])
    assert run["signposts"]["generated"] == N_DOCS - len(state["signposts"])
