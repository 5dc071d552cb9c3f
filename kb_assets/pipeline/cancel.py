"""Cooperative cancellation: a process-wide stop flag the stages check between batches.

`kb index` sets it on SIGINT/SIGTERM (kb_assets/index_run.py). A stage that sees it raises `Cancelled` at a
batch boundary, so whatever was committed stays committed and nothing is half-written; a re-run finishes
the work. Long single statements (an HNSW build, the statistics refresh) are cancelled on the server
through `cancellable(conn)`.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Callable, Iterator

_stop = threading.Event()
_reason = ""
_scope = threading.local()   # .event: a stop shared by stages running side by side (stop_scope)
_hooks: dict[int, Callable[[], None]] = {}
_hooks_lock = threading.Lock()


_listener = False      # a signal listener (`kb index`) is installed: stages keep signals from raising


def ignore_signal(signum, frame) -> None:
    """A Python-level signal handler that does nothing: the listener learns of the signal through the
    interpreter's wakeup fd, and nothing is raised in the middle of a batch."""


def set_signal_listener(active: bool) -> None:
    global _listener
    _listener = active


@contextmanager
def quiet_signals() -> Iterator[None]:
    """While a stage runs in the main thread under `kb index`: SIGINT/SIGTERM raise nothing here (Dagster's
    step handler would raise at any instant); the listener sets the stop flag, checked between batches."""
    import signal

    if not _listener or threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in saved:
        signal.signal(s, ignore_signal)
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


class Cancelled(Exception):
    """The run was asked to stop; raised at a batch boundary (the state is consistent)."""


def request_stop(reason: str = "stop requested") -> None:
    """Set the flag and cancel the statements registered with `cancellable` (safe from any thread)."""
    global _reason
    if not _stop.is_set():
        _reason = reason
    _stop.set()
    with _hooks_lock:
        hooks = list(_hooks.values())
    for hook in hooks:
        try:
            hook()
        except Exception:   # a connection already gone has nothing to cancel
            pass


@contextmanager
def stop_scope(event: threading.Event, reason: str) -> Iterator[None]:
    """Inside, in this thread, `check()` and `stop_requested()` also see `event`: two stages run side by side
    (defs/assets.py) stop each other when one fails, without the process-wide flag (that one means the
    operator asked, and `kb index` would end every later source too)."""
    previous = getattr(_scope, "stop", None)
    _scope.stop = (event, reason)
    try:
        yield
    finally:
        _scope.stop = previous


def _scoped_reason() -> str | None:
    scoped = getattr(_scope, "stop", None)
    return scoped[1] if scoped is not None and scoped[0].is_set() else None


def stop_requested() -> bool:
    return _stop.is_set() or _scoped_reason() is not None


def reason() -> str:
    return _reason


def reset() -> None:
    """Clear the flag (tests, and a long-lived process starting a new run)."""
    global _reason
    _stop.clear()
    _reason = ""


def check() -> None:
    """Raise Cancelled if a stop was requested: call it between batches."""
    if _stop.is_set():
        raise Cancelled(_reason or "stop requested")
    scoped = _scoped_reason()
    if scoped is not None:
        raise Cancelled(scoped)


def wait(future: Future, poll: float = 0.1):
    """`future.result()`, but give up (raise Cancelled) as soon as a stop is requested: the call in flight
    is abandoned, its result never written."""
    while True:
        check()
        try:
            return future.result(timeout=poll)
        except TimeoutError:
            continue


@contextmanager
def cancellable(conn) -> Iterator[None]:
    """While inside, a stop request cancels the statement `conn` is running (psycopg's cancel is
    thread-safe); the statement's transaction rolls back and the stage raises Cancelled."""
    key = id(conn)
    with _hooks_lock:
        _hooks[key] = conn.cancel
    try:
        check()
        yield
    except Exception as exc:
        import psycopg

        if _stop.is_set() and isinstance(exc, psycopg.errors.QueryCanceled):
            raise Cancelled(_reason or "stop requested") from None
        raise
    finally:
        with _hooks_lock:
            _hooks.pop(key, None)
