"""The embedded PostgreSQL outlives a query command for KB_DB_LINGER seconds, then stops; 0 stops at exit."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _postmaster_pid(pgdata: Path) -> int | None:
    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def _status(root: Path, linger: str) -> float:
    env = dict(os.environ, KB_DB_LINGER=linger, HF_HUB_OFFLINE="1")
    env.pop("KB_DATABASE_URL", None)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kb_assets.cli", "status", "--json", "--config", str(root / "kb.yaml")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return time.perf_counter() - started


def _wait(predicate, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def test_query_commands_leave_the_database_to_a_linger_process_that_stops_it():
    root = Path(tempfile.mkdtemp(prefix="kbl-", dir="/tmp"))     # short: the unix socket lives in pgdata
    (root / "kb.yaml").write_text("data_dir: .kb\nsources: []\n")
    pgdata = root / ".kb" / "pg"
    try:
        _status(root, "0")
        assert _postmaster_pid(pgdata) is None               # KB_DB_LINGER=0: stopped at exit, as before

        _status(root, "4")
        first = _postmaster_pid(pgdata)
        assert first is not None                             # still up after the command exited
        assert _wait(lambda: (pgdata / ".kb_linger").exists() and (pgdata / ".kb_linger").read_text().strip(), 30)
        linger_pid = int((pgdata / ".kb_linger").read_text())
        _status(root, "4")                                   # joins the same server, extends the linger
        assert _postmaster_pid(pgdata) == first
        assert int((pgdata / ".kb_linger").read_text()) == linger_pid   # one linger process, not two
        assert _wait(lambda: _postmaster_pid(pgdata) is None, 60), "the linger process never stopped the server"
        assert not (pgdata / ".kb_linger").exists()

        _status(root, "300")                                 # a long linger ended early by SIGTERM
        assert _postmaster_pid(pgdata) is not None
        assert _wait(lambda: (pgdata / ".kb_linger").exists() and (pgdata / ".kb_linger").read_text().strip(), 30)
        os.kill(int((pgdata / ".kb_linger").read_text()), 15)
        assert _wait(lambda: _postmaster_pid(pgdata) is None, 60), "SIGTERM to the linger process left postgres up"

        # a linger process killed outright (no atexit) leaves its pid in pgserver's handle list: the next
        # command drops the dead pid, so its own exit stops the server instead of leaving it up forever
        _status(root, "300")
        assert _wait(lambda: (pgdata / ".kb_linger").exists() and (pgdata / ".kb_linger").read_text().strip(), 30)
        killed = int((pgdata / ".kb_linger").read_text())
        assert _wait(lambda: str(killed) in (pgdata / ".handle_pids.json").read_text(), 30)
        os.kill(killed, 9)
        assert _wait(lambda: not Path(f"/proc/{killed}").exists() or
                     Path(f"/proc/{killed}/status").read_text().find("zombie") >= 0, 30)
        _status(root, "0")
        assert _wait(lambda: _postmaster_pid(pgdata) is None, 60), "a dead handle kept the server up"
    finally:
        try:     # a failed run: end the linger process this test started (SIGTERM: it stops the server)
            os.kill(int((pgdata / ".kb_linger").read_text()), 15)
        except (OSError, ValueError):
            pass
        if not _wait(lambda: _postmaster_pid(pgdata) is None, 30):
            _status(root, "0")     # drops dead handles, and its exit stops the server
