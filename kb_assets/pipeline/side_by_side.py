"""Two stages at once in one process: one in the calling thread, the other in a thread beside it.

The embedding stage mostly waits (on the model's worker thread, or on an API); the signposts stage is Python
work that needs only the documents. Run one after the other, their times add up; side by side the second
hides in the first's waits (docs/BENCHMARKS.md, "Signposts beside embeddings"). Each stage opens its own
connection (the callables do). When one fails, the other is stopped at its next batch boundary through a
stop shared by the two (cancel.stop_scope), so what either committed stays and a re-run finishes the rest.

Two tools for threads that share the interpreter: prompt_gil_handoffs (a shorter GIL switch interval while
they run) and yield_cpu (a line that waits for nothing steps back for one on the critical path).
"""
from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

from kb_assets.pipeline import cancel

STOPPED_BESIDE = "the stage running beside it failed"


@dataclass
class Outcome:
    value: Any = None
    done: bool = False


def run_side_by_side(here: Callable[[], Any], beside: Callable[[], Any], *,
                     thread_name: str = "stage-beside") -> tuple[Outcome, Outcome, BaseException | None]:
    """Run `here()` in this thread and `beside()` in a new one; wait for both.

    Returns both outcomes and the error to fail with: the first one raised (the other stage, stopped because
    of it, ends with a Cancelled or whatever the caller turned it into, which is not the cause). A
    BaseException in this thread (an interrupt) stops the stage beside, waits for it, and propagates."""
    mine, (theirs,), error = run_together(here, [(thread_name, beside)])
    return mine, theirs, error


def run_together(here: Callable[[], Any], besides: list[tuple[str, Callable[[], Any]]]
                 ) -> tuple[Outcome, list[Outcome], BaseException | None]:
    """run_side_by_side with any number of stages beside `here`, each in a thread named by its pair; one
    failing stops all the others (one stop shared by all)."""
    stop = threading.Event()
    order_lock = threading.Lock()
    errors: list[BaseException] = []
    mine, theirs = Outcome(), [Outcome() for _ in besides]

    def call(fn: Callable[[], Any], out: Outcome) -> None:
        with cancel.stop_scope(stop, STOPPED_BESIDE):
            try:
                out.value = fn()
                out.done = True
            except Exception as exc:   # noqa: BLE001 - handed to the caller, which raises it
                with order_lock:
                    errors.append(exc)
                stop.set()

    threads = [threading.Thread(target=call, args=(fn, out), name=name, daemon=True)
               for (name, fn), out in zip(besides, theirs)]
    for thread in threads:
        thread.start()
    try:
        call(here, mine)
    finally:
        if not mine.done:
            stop.set()      # failed or interrupted here: the stages beside stop at their next batch
        for thread in threads:
            thread.join()
    return mine, theirs, (errors[0] if errors else None)


_switch_lock = threading.Lock()
_switch_users = 0
_switch_saved = 0.0


@contextmanager
def prompt_gil_handoffs(interval: float = 0.0005):
    """A shorter GIL switch interval while threads of this process share the work: a thread that comes back
    from a wait (the network, onnxruntime's pool) needs the GIL from one running Python, and at the default
    5 ms it waits up to that long each time. The chunk stage's connection thread waits so after every statement
    of a batch; a small pass's model thread after every call (its 16 calls of two texts took 1.1 s beside a
    busy Python thread, 0.8 s at this interval, 0.47 s alone). The first entrant saves the process's interval,
    the last one restores it."""
    global _switch_users, _switch_saved
    with _switch_lock:
        if _switch_users == 0:
            _switch_saved = sys.getswitchinterval()
            sys.setswitchinterval(min(_switch_saved, interval))
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0:
                sys.setswitchinterval(_switch_saved)


BESIDE_NICE = 10     # how much lower this thread's priority goes in yield_cpu


def yield_cpu() -> None:
    """Lower the calling thread's CPU priority by BESIDE_NICE (Linux: a nice value is per thread, and the
    threads it starts inherit it), for work that waits for nothing beside work that is on the critical path.
    With prompt_gil_handoffs, the model's calls beside it then take ~their time alone (0.54 s against 0.47 s for
    a small pass's 16 calls, 0.80 s at equal priority). Only ever lowered (no privilege needed); nothing happens
    where a thread cannot be niced. Call it in a thread that ends with that work."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BESIDE_NICE))
    except (AttributeError, OSError):
        pass
