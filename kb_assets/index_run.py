"""`kb index` as an on-call engineer expects it: signals obeyed, one run per source, a lost database named.

Exit codes (README): 0 done · 1 a source failed · 2 configuration mistake · 3 the source is being indexed by
another run (`--no-wait`) · 4 the database is unreachable · 130 SIGINT · 143 SIGTERM.

Signals: Dagster's in-process execution swaps the SIGINT/SIGTERM handlers for its own, which note the
interrupt or raise it inside a step at any instant (a run was seen ignoring both for 20 s). So `kb index`
learns of a signal through the interpreter's wakeup fd — written by the C-level handler whatever Python
handler is installed — read by a thread of its own: the first signal sets the stop flag the stages check
between batches (pipeline/cancel.py; while a stage runs its Python handler is a no-op, so nothing is
raised mid-batch); a second signal, or a stop that takes longer than HARD_DEADLINE_SECONDS, exits at once
after releasing the embedded server's handle. (Blocking the signals instead is inherited by child
processes: Dagster's log-tail helpers then ignored their SIGTERM for 30 s per step.)
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
        self._fds: tuple[int, int] = (-1, -1)
        self._saved: dict = {}
        self._saved_wakeup = -1
        self._exit_lock = threading.Lock()

    # ---------------------------------------------------------------- signals
    def install(self) -> "IndexRun":
        """Take SIGINT/SIGTERM through the wakeup fd (main thread only; elsewhere nothing changes)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        cancel.reset()
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._fds = (read_fd, write_fd)
        self._saved = {s: signal.getsignal(s) for s in _SIGNALS}
        for s in _SIGNALS:
            signal.signal(s, cancel.ignore_signal)    # the wakeup thread acts; the handler only keeps us alive
        self._saved_wakeup = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        cancel.set_signal_listener(True)
        self._thread = threading.Thread(target=self._take_signals, name="kb-signals", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Put the handlers back (a process that goes on after the command, e.g. a test calling main())."""
        if self._thread is None:
            return
        cancel.set_signal_listener(False)
        signal.set_wakeup_fd(self._saved_wakeup)
        for s, h in self._saved.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._closed.set()
        os.close(self._fds[1])          # ends the reader's os.read
        self._thread.join(timeout=2)
        os.close(self._fds[0])
        self._thread = None

    def _take_signals(self) -> None:
        while not self._closed.is_set():
            try:
                data = os.read(self._fds[0], 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in _SIGNALS and not self._closed.is_set():
                    self._on_signal(signum)

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


class _MutedDagsterStderr:
    """sys.stderr that drops Dagster's console records once `mute()` is true (after a stop request or a lost
    database the CLI's own single line says it all; Dagster would add a failure and a trace per step)."""

    def __init__(self, stream, mute):
        self._stream, self._mute = stream, mute

    def write(self, text):
        if " - dagster - " in text and self._mute():
            return len(text)
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def mute_dagster_when(mute):
    """Context manager: Dagster's console log records are dropped while mute() is true."""
    from contextlib import contextmanager

    @contextmanager
    def _cm():
        saved = sys.stderr
        sys.stderr = _MutedDagsterStderr(saved, mute)
        try:
            yield
        finally:
            sys.stderr = saved

    return _cm()


def release_resources() -> None:
    """What a hard exit must not skip: this process's handle on the embedded server (source locks go with
    the connections, which the server closes when the process ends)."""
    try:
        from kb_assets.store.db import release_embedded

        release_embedded(exiting=True)
    except Exception:
        pass


def own_figures(rows: list[dict]) -> list[dict]:
    """Each source row's `last_run` replaced by the figures this process recorded (another run may have
    written the shared `sources` row since)."""
    from kb_assets.store.status import captured_run

    for r in rows:
        r["last_run"] = captured_run(r["source"])
    return rows


def exit_without_teardown(code: int) -> None:
    """End a finished `kb index` console process that ran Dagster without the interpreter's teardown: freeing
    Dagster's, SQLAlchemy's and alembic's modules object by object costs ~0.6 s CPU per process here (measured
    with `import dagster` alone: 1.5 vs 0.9 s user). Everything a normal exit does for us still happens:
    the atexit handlers (the embedded server's handles, logging's flush, plug-ins' own) run, and the streams
    are flushed. Not taken while a non-daemon thread still runs (a normal exit waits for it)."""
    import atexit

    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
