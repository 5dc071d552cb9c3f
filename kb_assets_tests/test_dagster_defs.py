"""The Dagster layer: definitions load, assets materialize per source partition with metadata, checks pass,
the schedule requests one run per source, the sensor sees new commits. Real embedded PostgreSQL, real
local model on a tiny corpus."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@e", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def project(tmp_path, db_url, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "docs" / "adr").mkdir(parents=True)
    (repo / "src").mkdir()
    (repo / "docs" / "adr" / "0001-use-postgres.md").write_text(
        "# 1. Use PostgreSQL with pgvector\n\nDate: 2025-03-01\n\n## Status\n\nAccepted\n\n## Context\n\n"
        "We need one database for documents, chunks and vectors so that deletes and swaps are transactional.\n\n"
        "## Decision\n\nWe will use PostgreSQL with the pgvector extension because it keeps vectors beside the "
        "rows they describe.\n\n## Consequences\n\nOperators run one database; HNSW indexes need memory.\n")
    (repo / "src" / "retry.py").write_text(
        '"""Retry helpers for API calls."""\n\nimport random\n\n\n'
        "def backoff(attempt: int, base: float = 0.5) -> float:\n"
        '    """Exponential backoff with full jitter."""\n'
        "    return random.uniform(0, base * 2 ** attempt)\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "init")
    cfg = tmp_path / "kb.yaml"
    cfg.write_text(json.dumps({
        "database_url": db_url,
        "sources": [
            {"key": "decisions", "kind": "adr", "root": str(repo), "include": ["docs/adr/*.md"]},
            {"key": "code", "kind": "code", "root": str(repo), "include": ["src/**/*.py"]},
        ],
    }))
    monkeypatch.setenv("KB_CONFIG", str(cfg))
    # Partitions are read from the config when the definitions are imported.
    for mod in [m for m in sys.modules if m.startswith("kb_assets.defs") or m == "kb_assets.definitions"]:
        del sys.modules[mod]
    return repo, cfg


def _defs():
    definitions = importlib.import_module("kb_assets.definitions").defs
    return definitions() if callable(definitions) else definitions


def test_definitions_load_with_partitions_per_source(project):
    defs = _defs()
    job = defs.resolve_job_def("kb_index")
    assert set(job.partitions_def.get_partition_keys()) == {"decisions", "code"}
    keys = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    assert {"kb_documents", "kb_chunks", "kb_embeddings", "kb_search_index", "kb_signposts", "kb_projections"} <= keys
    assert defs.resolve_schedule_def("nightly_index") and defs.resolve_sensor_def("git_commit_sensor")


def test_the_named_definitions_are_all_the_defs_folder_holds(project):
    """definitions.py names its assets, checks, jobs, schedules and sensors instead of discovering them with
    dg.load_from_defs_folder (~0.2 s of every run worker): a definition added under kb_assets/defs/ and not
    named there fails here. The sensors' and schedule's objects are the modules' own."""
    defs = _defs()
    folder = dg.Definitions.merge(
        dg.load_from_defs_folder(path_within_project=Path(importlib.import_module("kb_assets.defs").__file__).parent),
        dg.Definitions(resources={"kb": importlib.import_module("kb_assets.defs.resources").KbResource()}))

    def names(d: dg.Definitions) -> dict:
        return {"assets": sorted(k.to_user_string() for k in d.resolve_all_asset_keys()),
                "checks": sorted(k.to_user_string() for k in d.resolve_asset_graph().asset_check_keys),
                "sensors": sorted(s.name for s in d.sensors or []),
                "schedules": sorted(s.name for s in d.schedules or []),
                "jobs": sorted({j.name for j in d.jobs or []})}

    got = names(defs)
    assert got == names(folder)
    assert len(got["assets"]) == 6 and len(got["checks"]) == 7 and got["jobs"] == ["kb_index"]


def test_every_job_runs_its_steps_in_process_unless_the_deployment_says_otherwise(project, monkeypatch):
    """Issue 11: a process per step cost ~31 s of a nothing-changed partition run from the UI. The location's
    default executor (Definitions(executor=...)) covers kb_index and the UI's asset-graph "Materialize",
    which runs the implicit asset job; KB_DAGSTER_EXECUTOR=multiprocess gives the process-per-step back."""
    from kb_assets.config import ConfigError

    defs = _defs()
    asset_job = defs.resolve_implicit_global_asset_job_def()
    for job in (defs.resolve_job_def("kb_index"), asset_job):
        assert job.executor_def is dg.in_process_executor, job.name
    monkeypatch.setenv("KB_DAGSTER_EXECUTOR", "multiprocess")
    assert _defs().resolve_job_def("kb_index").executor_def is dg.multiprocess_executor
    monkeypatch.setenv("KB_DAGSTER_EXECUTOR", "threads")
    with pytest.raises(ConfigError, match="KB_DAGSTER_EXECUTOR: unknown executor 'threads'"):
        _defs()


def test_materialize_a_partition_reports_metadata_and_checks_pass(project):
    repo, _ = project
    defs = _defs()
    job = defs.resolve_job_def("kb_index")
    instance = dg.DagsterInstance.ephemeral()
    result = job.execute_in_process(partition_key="decisions", instance=instance)
    assert result.success
    mats = {m.asset_key.to_user_string(): m.metadata
            for m in (e.event_specific_data.materialization for e in result.get_asset_materialization_events())}
    docs = mats["kb_documents"]
    assert docs["new"].value == 1 and docs["deleted"].value == 0
    assert mats["kb_embeddings"]["chunks_embedded"].value >= 1
    assert mats["kb_embeddings"]["model"].value == "all-MiniLM-L6-v2"
    search = mats["kb_search_index"]
    assert search["vector_index_built"].value and search["space_activated"].value
    assert search["query_stats_refreshed"].value and search["space_missing"].value == 0
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert {"every_chunk_embedded", "no_orphans", "signpost_failure_rate", "recall_regression_set",
            "tags_in_vocabulary"} <= set(checks)
    assert all(checks.values()), checks
    proj = mats["kb_projections"]
    assert proj["written"].value >= 3 and proj["entries"].value == 1
    machine = Path(proj["directory"].value)
    assert "0001-use-postgres.md | adr | Use PostgreSQL with pgvector | = | Accepted" in (machine / "index.dsl").read_text()

    again = job.execute_in_process(partition_key="decisions", instance=instance)
    mats2 = {m.asset_key.to_user_string(): m.metadata
             for m in (e.event_specific_data.materialization for e in again.get_asset_materialization_events())}
    assert mats2["kb_documents"]["unchanged"].value == 1
    assert mats2["kb_embeddings"]["chunks_embedded"].value == 0
    # nothing changed: no index build, no statistics refresh
    assert not mats2["kb_search_index"]["vector_index_built"].value
    assert not mats2["kb_search_index"]["query_stats_refreshed"].value
    assert mats2["kb_projections"]["written"].value == 0            # unchanged index: no file rewritten


def test_schedule_requests_one_run_per_source(project):
    defs = _defs()
    schedule = defs.resolve_schedule_def("nightly_index")
    import datetime as dt

    ctx = dg.build_schedule_context(repository_def=defs.get_repository_def(),
                                   scheduled_execution_time=dt.datetime(2026, 11, 30, 3, tzinfo=dt.timezone.utc))
    requests = schedule.evaluate_tick(ctx).run_requests
    assert sorted(r.partition_key for r in requests) == ["code", "decisions"]
    assert len({r.run_key for r in requests}) == 2


def test_sensor_requests_a_run_when_head_moves(project):
    repo, _ = project
    defs = _defs()
    sensor = defs.resolve_sensor_def("git_commit_sensor")
    ctx = dg.build_sensor_context(definitions=defs)
    first = sensor.evaluate_tick(ctx)
    assert sorted(r.partition_key for r in first.run_requests) == ["code", "decisions"]
    cursor = first.cursor
    ctx = dg.build_sensor_context(definitions=defs, cursor=cursor)
    assert not sensor.evaluate_tick(ctx).run_requests           # nothing new
    (repo / "docs" / "adr" / "0002-more.md").write_text("# 2. More\n\n" + "text " * 50)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "more")
    ctx = dg.build_sensor_context(definitions=defs, cursor=cursor)
    third = sensor.evaluate_tick(ctx)
    head = _git(repo, "rev-parse", "HEAD")
    assert {r.run_key for r in third.run_requests} == {f"decisions@{head}", f"code@{head}"}
