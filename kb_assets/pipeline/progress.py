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


def set_current(progress: Progress | None) -> None:
    """The CLI registers its display here; assets running in the same process report to it."""
    global _current
    _current = progress or null_progress


def current() -> Progress:
    return _current
