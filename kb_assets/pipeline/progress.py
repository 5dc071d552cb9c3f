"""A tiny progress protocol the core stages report to; the CLI shows it, Dagster logs it."""
from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def start(self, label: str, total: int | None = None) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def done(self) -> None: ...


class _NullProgress:
    def start(self, label: str, total: int | None = None) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def done(self) -> None:
        pass


null_progress: Progress = _NullProgress()

_current: Progress = null_progress


def beside(progress: Progress) -> Progress:
    """A progress of its own for a stage running beside another (two bars at once): the display's `beside()`
    when it has one, else nothing (one display cannot show two stages)."""
    make = getattr(progress, "beside", None)
    return make() if callable(make) else null_progress


def set_current(progress: Progress | None) -> None:
    """The CLI registers its display here; assets running in the same process report to it."""
    global _current
    _current = progress or null_progress


def current() -> Progress:
    return _current


_steps_in_process = False


def set_steps_in_process(flag: bool) -> None:
    """`kb index` says so while its runs execute every step in its own process (execute_in_process), so a
    stage may prepare what the next stage uses (the embedding model); a run launched from the UI may run
    each step in a process of its own, where that would be loaded for nothing."""
    global _steps_in_process
    _steps_in_process = flag


def steps_share_process() -> bool:
    return _steps_in_process
