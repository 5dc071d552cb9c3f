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


def run_stage(cfg, source_key: str | None, fn: Callable[..., T], *, lock: bool = True,
              on_wait: Callable[[str], None] | None = None) -> T:
    """fn(conn) with a fresh connection (and the source's lock when `lock` and a source is given)."""
    from kb_assets.store.db import cfg_retry_seconds, connect, open_database_once
    from kb_assets.store.locks import source_lock
    from kb_assets.store.retry import DatabaseUnreachable, retry_call

    def attempt() -> T:
        cancel.check()
        url = open_database_once(cfg)
        held = source_lock(url, source_key, on_wait=on_wait, check=cancel.check) if lock and source_key \
            else nullcontext()
        with held, connect(url) as conn:
            return fn(conn)

    try:
        with cancel.quiet_signals():
            return retry_call(attempt, url=cfg.effective_database_url() or f"(embedded, {cfg.data_path() / 'pg'})",
                              budget=cfg_retry_seconds(cfg))
    except DatabaseUnreachable as exc:
        _last_unreachable.append(exc)
        raise


def last_unreachable() -> BaseException | None:
    """The last DatabaseUnreachable a stage of this process gave up with (the CLI turns it into exit 4)."""
    return _last_unreachable[-1] if _last_unreachable else None


def clear() -> None:
    _last_unreachable.clear()
