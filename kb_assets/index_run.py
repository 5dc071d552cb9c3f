"""`kb index` as an on-call engineer expects it: signals obeyed, one run per source, a lost database named.

Exit codes (README): 0 done · 1 a source failed · 2 configuration mistake · 3 the source is being indexed by
another run (`--no-wait`) · 4 the database is unreachable · 130 SIGINT · 143 SIGTERM.

Signals: Dagster's in-process execution replaces the SIGINT/SIGTERM handlers with its own, which only note
the interrupt (a run was seen ignoring both for 20 s). So `kb index` blocks both signals in every thread
and a thread of its own takes them with sigtimedwait: whatever handler Dagster installs, the first signal
sets the stop flag the stages check between batches (pipeline/cancel.py); a second signal, or a stop that
takes longer than HARD_DEADLINE_SECONDS, exits at once after releasing the embedded server's handle.
Committed batches stay; the state is consistent either way (every batch is its own transaction).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

from kb_assets.pipeline import cancel

EXIT_BUSY = 3
EXIT_DB_UNREACHABLE = 4
HARD_DEADLINE_SECONDS = 8.0     # docker stop allows 10 s
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code_for(exc: BaseException) -> int | None:
    """The exit code of an error with its own (None: not one of ours)."""
    from kb_assets.store.locks import SourceBusy
    from kb_assets.store.retry import DatabaseUnreachable

    if isinstance(exc, SourceBusy):
        return EXIT_BUSY
    if isinstance(exc, DatabaseUnreachable):
        return EXIT_DB_UNREACHABLE
    return None


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:
        pass


class IndexRun:
    """Signals and progress of one `kb index` command."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.started = time.monotonic()
        self.done: list[str] = []
        self.current: str | None = None
        self.pending: list[str] = []
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._blocked = False
        self._exit_lock = threading.Lock()

    # ---------------------------------------------------------------- signals
    def install(self) -> "IndexRun":
        """Block SIGINT/SIGTERM in this (the main) thread — and so in every thread it starts later — and take
        them on a thread of our own. Call before any other thread exists."""
        if threading.current_thread() is not threading.main_thread():
            return self
        cancel.reset()
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        self._blocked = True
        self._thread = threading.Thread(target=self._take_signals, name="kb-signals", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop taking signals (a process that goes on after the command, e.g. a test calling main())."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
            self._blocked = False

    def _take_signals(self) -> None:
        while not self._closed.is_set():
            info = signal.sigtimedwait(_SIGNALS, 0.25)
            if info is not None:
                self._on_signal(info.si_signo)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum = signum
            cancel.request_stop(f"{name} received")
            _say(f"kb index: {name} received — stopping at the next batch boundary "
                 f"(at most {HARD_DEADLINE_SECONDS:.0f} s; send it again to stop at once)")
            timer = threading.Timer(HARD_DEADLINE_SECONDS, self.hard_exit,
                                    args=(f"the work in flight did not stop within {HARD_DEADLINE_SECONDS:.0f} s",))
            timer.daemon = True
            timer.start()
        else:
            self.hard_exit(f"second signal ({name})")

    @property
    def stopping(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)

    # ---------------------------------------------------------------- the one line, and the exit
    def summary_line(self, how: str = "") -> str:
        from kb_assets.store.status import captured_run

        name = signal.Signals(self.signum).name if self.signum else "a stop request"
        parts = []
        if self.done:
            parts.append(f"finished {', '.join(self.done)}")
        if self.current:
            stages = captured_run(self.current)
            finished = [s for s in ("documents", "chunks", "embeddings", "search_index", "signposts") if s in stages]
            embedded = (stages.get("embeddings") or {}).get("chunks_embedded")
            what = f"stopped {self.current!r}"
            what += f" after {', '.join(finished)}" if finished else " in its first stage"
            if embedded:
                what += f" ({embedded} chunks embedded)"
            parts.append(what)
        if self.pending:
            parts.append(f"not started {', '.join(self.pending)}")
        done = "; ".join(parts) or "nothing started"
        return (f"kb index: stopped by {name} after {time.monotonic() - self.started:.1f} s{how} — {done}. "
                "Committed work is kept and the index is consistent; re-run `kb index` to finish.")

    def finish(self) -> None:
        """After a stop at a batch boundary: one line, release, exit 130/143 (without waiting for a model
        call that was abandoned in a worker thread)."""
        self._exit(self.summary_line())

    def hard_exit(self, why: str) -> None:
        self._exit(self.summary_line(f" ({why})"))

    def _exit(self, line: str) -> None:
        if not self._exit_lock.acquire(blocking=False):
            return      # the other path is exiting already
        _say(line)
        release_resources()
        try:
            sys.stdout.flush()
        except Exception:
            pass
        os._exit(self.exit_code)


def release_resources() -> None:
    """What a hard exit must not skip: this process's handle on the embedded server (source locks go with
    the connections, which the server closes when the process ends)."""
    try:
        from kb_assets.store.db import release_embedded

        release_embedded()
    except Exception:
        pass


def own_figures(rows: list[dict]) -> list[dict]:
    """Each source row's `last_run` replaced by the figures this process recorded (another run may have
    written the shared `sources` row since)."""
    from kb_assets.store.status import captured_run

    for r in rows:
        r["last_run"] = captured_run(r["source"])
    return rows
