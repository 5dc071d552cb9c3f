"""The two thread tools of a small pass's side-by-side lines (pipeline/side_by_side.py): `yield_cpu` lowers the
priority of the calling thread only (Linux nice values are per thread), and the threads it starts inherit it;
`prompt_gil_handoffs` shortens the GIL switch interval while any user is inside and restores the process's
own when the last one leaves."""
from __future__ import annotations

import os
import sys
import threading

import pytest

from kb_assets.pipeline.side_by_side import BESIDE_NICE, prompt_gil_handoffs, yield_cpu


def _nice(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_yield_cpu_lowers_the_calling_thread_and_what_it_starts_only():
    main = _nice(threading.get_native_id())
    seen: dict[str, int] = {}

    def child() -> None:
        seen["child"] = _nice(threading.get_native_id())

    def line() -> None:
        yield_cpu()
        seen["line"] = _nice(threading.get_native_id())
        started = threading.Thread(target=child)
        started.start()
        started.join()

    thread = threading.Thread(target=line)
    thread.start()
    thread.join()
    assert seen["line"] == min(19, main + BESIDE_NICE)
    assert seen["child"] == seen["line"]                  # a thread inherits its creator's nice value
    assert _nice(threading.get_native_id()) == main       # the rest of the process keeps its priority
    assert _nice(0) == main


def test_prompt_gil_handoffs_restores_the_process_interval_after_the_last_user():
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.004)
        with prompt_gil_handoffs():
            assert sys.getswitchinterval() == pytest.approx(0.0005)
            with prompt_gil_handoffs(interval=0.0001):    # a second user inside: the first one's stays
                assert sys.getswitchinterval() == pytest.approx(0.0005)
            assert sys.getswitchinterval() == pytest.approx(0.0005)
        assert sys.getswitchinterval() == pytest.approx(0.004)
    finally:
        sys.setswitchinterval(before)
