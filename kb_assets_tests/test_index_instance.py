"""`kb index` on an unconfigured $DAGSTER_HOME (no dagster.yaml): its runs are where Dagster's default instance
on that home finds them (the UI's view), written without compute-log capture or telemetry, and through the
event log that keeps its connections open (kb_assets/defs/cli_event_log.py). A configured home is used as
configured. Whole `kb index` processes, the embedded PostgreSQL, the real local model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kb_assets_tests.test_index_fast_path import _doc


def _index(cfg: Path, home: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "KB_DB_LINGER": "0",
           "DAGSTER_HOME": str(home)}
    env.pop("KB_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "kb_assets.cli", "index", "--config", str(cfg), "--force",
                           "--quiet"], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_runs_on_an_unconfigured_home_are_seen_by_dagsters_default_instance(tmp_path, db_url):
    import dagster as dg

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text(_doc("Note a", "streams keep seven days"))
    cfg = tmp_path / "kb.yaml"
    cfg.write_text(json.dumps({"data_dir": str(tmp_path / "data"), "database_url": db_url,
                               "sources": [{"key": "notes", "kind": "doc", "root": str(notes),
                                            "include": ["*.md"]}]}))
    home = tmp_path / "dagster_home"
    home.mkdir()
    _index(cfg, home)
    _index(cfg, home)
    assert not (home / "dagster.yaml").exists()      # nothing written into the user's home but storage
    default = dg.DagsterInstance.local_temp(tempdir=str(home))     # what `dagster dev` on that home opens
    assert type(default.event_log_storage).__name__ == "SqliteEventLogStorage"
    runs = default.get_run_records(limit=5)
    assert len(runs) == 2 and all(r.dagster_run.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    for r in runs:
        events = default.all_logs(r.dagster_run.run_id)
        assert any(e.dagster_event and e.dagster_event.event_type_value == "STEP_SUCCESS" for e in events)
    mat = default.fetch_materializations(dg.AssetKey("kb_documents"), limit=5).records
    assert {m.partition_key for m in mat} == {"notes"} and len(mat) == 2
    assert not list(home.rglob("compute_logs")), "compute logs were captured"
    assert not (home / "logs" / "event.log").exists(), "telemetry was written"
    default.dispose()

    # a configured home is used as configured (here: Dagster's defaults, compute logs captured)
    configured = tmp_path / "configured_home"
    configured.mkdir()
    (configured / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    _index(cfg, configured)
    assert list(configured.rglob("compute_logs"))


def test_the_kb_console_script_ends_a_run_cleanly_without_teardown(tmp_path):
    """`kb index` (the console script) after a Dagster run leaves through index_run.exit_without_teardown: exit
    code, JSON on stdout and the atexit work (the embedded server's handle released: with KB_DB_LINGER=0 the
    server stops when the last handle goes) are those of a normal exit."""
    import tempfile
    import time

    root = Path(tempfile.mkdtemp(prefix="kbexit-", dir="/tmp"))   # short: the server's socket is under it
    (root / "notes").mkdir()
    (root / "notes" / "a.md").write_text(_doc("Note a", "streams keep seven days"))
    (root / "kb.yaml").write_text("data_dir: .kb\nsources:\n  - {key: notes, kind: doc, root: notes, include: ['*.md']}\n")
    kb = Path(sys.executable).parent / "kb"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "KB_DB_LINGER": "0",
           "DAGSTER_HOME": str(tmp_path)}
    for k in ("KB_DATABASE_URL", "KB_CONFIG"):
        env.pop(k, None)
    for _ in range(2):
        proc = subprocess.run([str(kb), "index", "--force", "--json"], cwd=root, env=env, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert [s["source"] for s in json.loads(proc.stdout)["sources"]] == ["notes"]
    assert list(tmp_path.rglob("*.db")) and not list(tmp_path.rglob("*.db-wal"))   # storages closed, WAL checkpointed
    pid_file = root / ".kb" / "pg" / "postmaster.pid"
    deadline = time.monotonic() + 30
    while pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not pid_file.exists(), "the embedded server was left running: atexit did not release its handle"
    proc = subprocess.run([str(kb), "index", "--config", str(root / "kb.yaml"), "--source", "nope"], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "nope" in proc.stderr     # errors before any run: unchanged
