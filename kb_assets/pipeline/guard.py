"""How a stage runs against the database: under its source's lock, re-run after a transient database error.

Every stage is idempotent and resumable (what is committed stays, the rest is found again), so after a lost
connection the stage is simply run again on a fresh one, for at most `database_retry_seconds` of outage;
then DatabaseUnreachable. A stop request (cancel.py) ends it at the next batch boundary.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, TypeVar

from kb_assets.pipeline import cancel

T = TypeVar("T")

_last_unreachable: list[BaseException] = []
_config_refusals: list[BaseException] = []


def run_stage(cfg, source_key: str | None, fn: Callable[..., T], *, lock: bool = True,
              on_wait: Callable[[str], None] | None = None) -> T:
    """fn(conn) on a connection of its own (handed on from a previous stage when sound: store/idle_connections.py;
    fresh after a failure), with the source's lock when `lock` and a source is given."""
    from kb_assets.config import ConfigError
    from kb_assets.store.db import cfg_retry_seconds, database_origin, open_database_once
    from kb_assets.store.idle_connections import stage_connection
    from kb_assets.store.locks import source_lock
    from kb_assets.store.retry import DatabaseUnreachable, retry_call

    def attempt() -> T:
        cancel.check()
        url = open_database_once(cfg)
        held = source_lock(url, source_key, on_wait=on_wait, check=cancel.check) if lock and source_key \
            else nullcontext()
        with held, stage_connection(url) as conn:      # the previous stage's, if it is still sound
            return fn(conn)

    stage = getattr(fn, "__qualname__", "stage").split(".")[0]
    _trace(stage, "start")
    try:
        with cancel.quiet_signals():
            url, origin = database_origin(cfg)
            return retry_call(attempt, url=url, origin=origin, what=stage,
                              # the database stayed away for a stage already: the next ones try once
                              budget=0.0 if _last_unreachable else cfg_retry_seconds(cfg))
    except DatabaseUnreachable as exc:
        _last_unreachable.append(exc)
        raise
    except ConfigError as exc:       # a refusal (max_files, a broad root): the CLI prints it as one line
        _config_refusals.append(exc)
        raise
    finally:
        _trace(stage, "end")


TRACE_ENV = "KB_STAGE_TRACE"   # a file: "<time> <pid> <stage> start|end" per stage (the fault harness's clock)


def _trace(stage: str, event: str) -> None:
    import os
    import time

    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{time.time():.3f} {os.getpid()} {stage} {event}\n".encode())
    finally:
        os.close(fd)


def last_unreachable() -> BaseException | None:
    """The last DatabaseUnreachable a stage of this process gave up with (the CLI turns it into exit 4)."""
    return _last_unreachable[-1] if _last_unreachable else None


def last_config_refusal() -> BaseException | None:
    """The last configuration error (ConfigError, e.g. a listing past max_files) a stage of this process
    failed on: `kb index` then mutes Dagster's step-failure records and prints that one line (exit 2)."""
    return _config_refusals[-1] if _config_refusals else None


def clear() -> None:
    _last_unreachable.clear()
    _config_refusals.clear()
