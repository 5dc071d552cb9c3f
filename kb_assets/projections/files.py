"""Writing projection files: only when the bytes differ (an unchanged index keeps every mtime), atomically
(temp file in the same folder + rename: a reader never sees half a file), and removing the files of ours
that are no longer produced (a tag nobody uses any more, a deleted source)."""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SUFFIX = ".dsl"
STALE_TEMP_SECONDS = 60     # older temp files are a killed writer's (a live one renames its file in milliseconds)


def write_if_changed(path: Path, text: str) -> bool:
    """Write `text` (UTF-8, LF) to `path` unless it already holds exactly that. Returns whether it wrote."""
    data = text.encode("utf-8")
    try:
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o666 & ~_umask())     # mkstemp makes 0600: projections are meant to be read by others
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@dataclass
class FileSync:
    """Makes a projections folder hold exactly a set of files. Only `*.dsl` files in the folders we own
    (the top level, by-tag/, code/) are ever removed, so the folder can live inside a repository."""

    root: Path
    written: list[str] = field(default_factory=list)
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)

    OWNED = ("", "by-tag", "code")

    def apply(self, files: dict[str, str]) -> None:
        for rel in sorted(files):
            if write_if_changed(self.root / rel, files[rel]):
                self.written.append(rel)
            else:
                self.unchanged += 1
        stale_before = time.time() - STALE_TEMP_SECONDS
        for folder in self.OWNED:
            d = self.root / folder if folder else self.root
            if not d.is_dir():
                continue
            for p in d.glob(f".*{SUFFIX}.*.tmp"):     # left by a writer killed between mkstemp and rename
                try:
                    if p.stat().st_mtime < stale_before:
                        p.unlink()
                except FileNotFoundError:
                    pass
            for p in sorted(d.glob(f"*{SUFFIX}")):
                rel = p.relative_to(self.root).as_posix()
                if rel not in files:
                    p.unlink()
                    self.removed.append(rel)
