"""Keep the embedded PostgreSQL up for a while after a query command (`kb recall`, `show`, `search`,
`status`) exits, so an agent's next call joins it instead of starting and stopping a server each time.

Why: with torch gone from the query path, a cold `kb recall` spends most of its wall time in pgserver —
`pg_ctl start` on the way in and `pg_ctl -w stop` (a shutdown checkpoint) on the way out, 1–5 s on a busy
machine (docs/BENCHMARKS.md, "cold recall"). An agent asks in bursts; paying both on every call is waste.

How: a query process opens its pgserver handle with cleanup_mode=None (its exit never stops the server)
and makes sure one small detached "linger" process (this module's __main__) holds a normal handle. That
process sleeps until nobody has used the database for KB_DB_LINGER seconds (default 300; the stamp file's
mtime is the last use), then exits; pgserver's refcount stops the server when the last handle goes (the
linger process, or a `kb index` / `kb mcp` still running). `KB_DB_LINGER=0` restores stop-at-exit.
Only the embedded database lingers; a configured database_url is never touched.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

LINGER_ENV = "KB_DB_LINGER"
DEFAULT_SECONDS = 300
STAMP = ".kb_linger"        # in the pgdata folder: "<pid>\n"; mtime = last use


_enabled = False


def enable() -> None:
    """This process is a short query command: let the embedded database outlive it (see the docstring)."""
    global _enabled
    _enabled = True


def active_seconds() -> int:
    """Seconds to linger for this process: 0 unless enable() was called and KB_DB_LINGER allows it."""
    return linger_seconds() if _enabled else 0


def linger_seconds() -> int:
    raw = os.environ.get(LINGER_ENV, "").strip()
    if not raw:
        return DEFAULT_SECONDS
    try:
        return max(0, int(float(raw)))
    except ValueError:
        return DEFAULT_SECONDS


def _alive(pid: int) -> bool:
    """A live linger process (not a zombie, not a recycled pid)."""
    import psutil   # a pgserver dependency

    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and "kb_assets.store.linger" in " ".join(proc.cmdline())
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def touch(pgdata: Path) -> int | None:
    """Record a use of the database now; the linger process's pid if one is alive."""
    stamp = pgdata / STAMP
    try:
        pid = int(stamp.read_text().strip() or 0)
    except (OSError, ValueError):
        pid = 0
    try:
        os.utime(stamp)
    except OSError:
        pass
    return pid if pid and _alive(pid) else None


def running_url(pgdata: Path) -> str | None:
    """The URL of the server a live linger process holds, read from postmaster.pid — without pgserver's
    get_server, whose machine-wide lock waits behind every other pgserver start or stop on the machine
    (measured: 5 s to join a running server on a busy machine). The touch() before this extends the
    linger process's deadline, so the server stays up while this process uses it."""
    from pgserver.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, KeyError, IndexError):
        return None
    if info is None or not info.is_running() or info.status != "ready":
        return None
    return info.get_uri()


def ensure_linger(pgdata: Path, seconds: int) -> None:
    """Start the linger process unless one is alive (it re-reads the stamp, so a touch extends it)."""
    if touch(pgdata) is not None:
        return
    subprocess.Popen([sys.executable, "-m", "kb_assets.store.linger", str(pgdata), str(seconds)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True, cwd="/")


def _main(pgdata: Path, seconds: int) -> None:
    import warnings

    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import pgserver

    stamp = pgdata / STAMP
    try:
        pid = int(stamp.read_text().strip() or 0)
    except (OSError, ValueError):
        pid = 0
    if pid and pid != os.getpid() and _alive(pid):
        return                      # another linger process won the race
    import signal

    state = {"joined": False, "term": False}

    def on_term(*_):
        # SIGTERM (a shutdown, `kill`) ends the wait like the idle timeout, so atexit still stops the server.
        # One that comes while the server is being joined waits for the handle: exiting before it is held
        # left the server up with no process to stop it (seen under load in test_store_linger).
        if state["joined"]:
            sys.exit(0)
        state["term"] = True

    signal.signal(signal.SIGTERM, on_term)
    stamp.write_text(f"{os.getpid()}\n")
    server = pgserver.get_server(pgdata, cleanup_mode="stop")   # joins the running server (or starts it)
    state["joined"] = True
    try:
        while not state["term"]:
            try:
                idle = time.time() - stamp.stat().st_mtime
            except OSError:
                break
            if idle >= seconds:
                break
            time.sleep(min(30.0, max(1.0, seconds - idle)))
    finally:
        try:
            if int(stamp.read_text().strip() or 0) == os.getpid():
                stamp.unlink()
        except (OSError, ValueError):
            pass
        del server                   # atexit: the last handle stops the server


if __name__ == "__main__":
    _main(Path(sys.argv[1]), int(sys.argv[2]))
