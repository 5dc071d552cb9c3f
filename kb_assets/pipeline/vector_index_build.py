"""The search-index stage's HNSW build, in the background: a first load's answer does not wait for it.

Why: building the graph of a large space is the longest step after the model's own work (56K vectors: ~30 s
of a 3,000-document first load, docs/BENCHMARKS.md), and nobody needs it to get a correct answer: until it
is ready the planner scans every vector (exact, ~60 ms at 50K chunks, and `recall()` says so in a warning).
So when the space has many vectors and no other space would answer meanwhile, the stage activates the space
and hands the build to a detached process (this module's __main__), then returns.

How the build stays safe:
- It runs `CREATE INDEX CONCURRENTLY`: later runs keep writing the table while it builds, and nothing blocks
  queries. It holds the table's build lock (spaces.BUILD_LOCK_CLASS, a session advisory lock) for as long as
  it runs, so "building" is always a live session, never a stale flag.
- A build that is killed, cancelled or loses its server leaves the index missing or INVALID; the next
  `kb index` (any run, an unchanged one included: `resume`) drops the leftover and starts it again.
- It runs at the lowest CPU priority (nice 19, and its backend's session group niced too where the kernel groups
  by session) with no parallel workers: the small runs that follow a first load come first.
- On the embedded database it holds its own pgserver handle, so the server outlives the `kb index` that
  started it until the build is done.
- A stage that must have the index now (`ensure_vector_index`) waits for a running build instead of
  starting a second; a large load cancels it (it would otherwise insert row by row into the graph).

Outcome lines go to `<data_dir>/logs/vector_index.log` (embedded database) or `~/.cache/kb/vector_index.log`.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
from psycopg import sql

from kb_assets.store import spaces

log = logging.getLogger(__name__)

# Build in the background from this many vectors (~3 s of build on 2 cores; below it the stage just builds).
# KB_VECTOR_INDEX_BACKGROUND_ROWS overrides it (tests use a small value; a huge one always builds in the run).
BACKGROUND_MIN_ROWS = 10_000
_ENV_MIN_ROWS = "KB_VECTOR_INDEX_BACKGROUND_ROWS"
_DSN_ENV = "KB_VECTOR_INDEX_DSN"
STARTUP_TIMEOUT_S = 30.0     # the builder holds its lock within this, or the stage builds in the run itself


def background_min_rows() -> int:
    raw = os.environ.get(_ENV_MIN_ROWS, "").strip()
    try:
        return int(raw) if raw else BACKGROUND_MIN_ROWS
    except ValueError:
        return BACKGROUND_MIN_ROWS


def worth_background(conn: psycopg.Connection, table: str) -> bool:
    n = conn.execute(sql.SQL("SELECT count(*) FROM {t}").format(t=sql.Identifier(table))).fetchone()[0]
    return n >= background_min_rows()


# ---- the side that starts it (the search-index stage, `kb index`) ------------------------------------------

def start(conn: psycopg.Connection, table: str) -> bool:
    """Start a detached build of `table`'s index unless one is running. True once a build runs (it holds the
    build lock) or is done; False if it could not start (the caller builds in the run instead)."""
    if spaces.build_holder(conn, table) is not None:
        return True
    schema = conn.execute("SELECT current_schema()").fetchone()[0]
    pgdata = _embedded_pgdata(conn)
    env = dict(os.environ)
    env[_DSN_ENV] = psycopg.conninfo.make_conninfo(conn.info.dsn, password=conn.info.password)
    cmd = [sys.executable, "-m", "kb_assets.pipeline.vector_index_build", schema, table]
    if pgdata is not None:
        cmd += ["--pgdata", str(pgdata)]
    logfile = log_path(pgdata)
    try:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        err = open(logfile, "ab")
    except OSError:
        err = subprocess.DEVNULL
    try:
        proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True, close_fds=True, cwd="/")
    except OSError as exc:
        log.warning("could not start the background build of %s's vector index: %s", table, exc)
        return False
    finally:
        if err is not subprocess.DEVNULL:
            err.close()
    # reaped when it exits, should this process live on (a Dagster code server, a test): no zombie left behind
    threading.Thread(target=proc.wait, name="kb-vector-index-reaper", daemon=True).start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if spaces.build_holder(conn, table) is not None:
            return True
        if proc.poll() is not None:    # exited: built by someone else meanwhile, or failed (see the log)
            return spaces.has_vector_index(conn, table)
        time.sleep(0.05)
    proc.kill()
    return False


def resume(conn: psycopg.Connection) -> str | None:
    """The space in use has no valid vector index and nothing builds it (a build was killed): start one.
    Cheap when all is well (one query). Returns the index state after, or None without an active space."""
    active = spaces.active_space(conn)
    if active is None:
        return None
    table = active[2]
    state = spaces.vector_index_state(conn, table)
    if state == "missing" and start(conn, table):
        state = spaces.vector_index_state(conn, table)
    return state


def wait_ready(conn: psycopg.Connection, table: str | None = None, *, timeout: float | None = None,
               poll: float = 0.5) -> str:
    """Wait while the (active) space's index is being built; returns the final state ('ready' or 'missing')."""
    if table is None:
        active = spaces.active_space(conn)
        if active is None:
            return "missing"
        table = active[2]
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state = spaces.vector_index_state(conn, table)
        if state != "building" or (deadline is not None and time.monotonic() >= deadline):
            return state
        time.sleep(poll)


def _embedded_pgdata(conn: psycopg.Connection) -> Path | None:
    """kb's embedded server's data folder when this connection goes to it (this process holds a handle on it):
    the builder must hold a handle of its own, or the server stops when `kb index` exits. A configured
    database_url is never joined, even one served by someone else's pgserver."""
    from kb_assets.store import db

    with db._servers_lock:
        ours = {str(Path(k).resolve()) for k in db._servers}
    if not ours:
        return None
    try:
        with conn.transaction():
            folder = Path(conn.execute("SHOW data_directory").fetchone()[0]).resolve()
    except psycopg.Error:
        return None               # not allowed to read it: not our embedded server
    return folder if str(folder) in ours else None


def log_path(pgdata: Path | None) -> Path:
    if pgdata is not None:
        return pgdata.parent / "logs" / "vector_index.log"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kb" / "vector_index.log"


# ---- the builder process ----------------------------------------------------------------------------------

def _say(line: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} pid {os.getpid()}: {line}\n")
    sys.stderr.flush()


def _lower_priority(conn: psycopg.Connection) -> None:
    """Nice the build's backend when the server runs on this machine as our user (embedded, or a local
    server): the runs that follow a first load get the CPU first. Elsewhere this does nothing."""
    host = conn.info.host or ""
    if host and not host.startswith("/") and host not in ("localhost", "127.0.0.1", "::1"):
        return
    try:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        if not _postgres_process_here(backend):
            return
        os.setpriority(os.PRIO_PROCESS, backend, 19)
    except (OSError, psycopg.Error):
        return
    _lower_autogroup(backend)


def _postgres_process_here(pid: int) -> bool:
    """Whether `pid` is a PostgreSQL process of this machine. A server in a container on localhost reports pids
    of its own namespace, which here may be anyone's: nicing one, or worse its whole session, would slow an
    unrelated program. Without /proc (macOS) the host check above is all there is."""
    try:
        return b"postgres" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return not Path("/proc/self").exists()


def _lower_autogroup(pid: int) -> bool:
    """Nice `pid`'s scheduling autogroup as well (Linux with sched_autogroup, the default of most distributions
    and of this machine). There a nice value only ranks a process inside its own session's group, and every
    PostgreSQL backend starts a session of its own (setsid), so nice 19 alone left the build an equal share of
    the CPU beside a `kb index` in another session: a modify pass right after a first load took 6.2-7.0 s
    instead of 3.8-4.1 (docs/BENCHMARKS.md, "Small passes beside the background build"). The backend is alone
    in its group, so this lowers nothing else; the group ends with the backend. False where there is no such
    file or it is not ours to write."""
    for _ in range(3):
        try:
            with open(f"/proc/{pid}/autogroup", "w") as fh:
                fh.write("19")
            return True
        except BlockingIOError:     # the kernel takes one such change a tenth of a second from a non-root user
            time.sleep(0.11)
        except OSError:
            return False
    return False


def build(conn: psycopg.Connection, table: str) -> str:
    """Build `table`'s index concurrently under its build lock: 'built', 'ready' (nothing to do) or 'busy'."""
    if not spaces.try_build_lock(conn, table):
        return "busy"
    if spaces.has_vector_index(conn, table):
        return "ready"
    if spaces.vector_index_exists(conn, table):   # INVALID, left by a killed or cancelled build
        conn.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {i}").format(
            i=spaces.own(conn, spaces.vector_index_name(table))))
    # a killed builder's backend notices within seconds and stops, rather than building for nobody (PostgreSQL
    # 14 and later; an older server finishes the build for nobody, which the next one then finds done)
    if conn.info.server_version >= 140000:
        conn.execute("SET client_connection_check_interval = '2s'")
    conn.execute("SET maintenance_work_mem = '1GB'")      # the graph in memory (see ensure_vector_index)
    conn.execute("SET max_parallel_maintenance_workers = 0")
    _lower_priority(conn)
    conn.execute(spaces.create_index_sql(table, concurrently=True))
    conn.execute(sql.SQL("ANALYZE {t}").format(t=sql.Identifier(table)))
    return "built"


def _main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m kb_assets.pipeline.vector_index_build")
    ap.add_argument("schema")
    ap.add_argument("table")
    ap.add_argument("--pgdata")
    a = ap.parse_args(argv)
    from kb_assets.store import db

    if a.pgdata:
        import warnings

        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        db.embedded_url(Path(a.pgdata).parent)      # our own handle: the server stays up until we are done
    started = time.perf_counter()
    try:
        with db.connect(os.environ[_DSN_ENV], schema=a.schema, register=False) as conn:
            outcome = build(conn, a.table)
    except Exception as exc:      # noqa: BLE001 - one line for the log; the next `kb index` starts it again
        first = (str(exc).strip().splitlines() or [repr(exc)])[0]
        _say(f"{a.schema}.{a.table}: vector index build failed after {time.perf_counter() - started:.1f} s: "
             f"{type(exc).__name__}: {first}")
        return 1
    if outcome == "built":
        _say(f"{a.schema}.{a.table}: vector index built in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
