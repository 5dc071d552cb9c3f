"""Two stages at once in one process: one in the calling thread, the other in a thread beside it.

The embedding stage mostly waits (on the model's worker thread, or on an API); the signposts stage is Python
work that needs only the documents. Run one after the other, their times add up; side by side the second
hides in the first's waits (docs/BENCHMARKS.md, "Signposts beside embeddings"). Each stage opens its own
connection (the callables do). When one fails, the other is stopped at its next batch boundary through a
stop shared by the two (cancel.stop_scope), so what either committed stays and a re-run finishes the rest.
"""
from __future__ import annotations

import threading
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
