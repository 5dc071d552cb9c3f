"""Roots that are too broad to index (issue 12 §2: `root: /` stored /etc/shadow and 11,183 /proc files).

Refused with one line naming the fix, before anything is listed:
- `/`, the home folder (and the folders above it), and system folders (/etc, /usr, /var, /bin, /lib, ...):
  unless the source sets `allow_broad_root: true`;
- anything under /proc, /sys or /dev: always (kernel pseudo-files: endless, blocking or secret).
While listing, a source past `max_files` listed files (default 100,000) is refused the same way (unless
`allow_broad_root: true`), and /proc, /sys, /dev are never entered or read, even under an allowed `/`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from kb_assets.config import ConfigError

if TYPE_CHECKING:
    from kb_assets.config import SourceConfig

NEVER_READ = ("/proc", "/sys", "/dev")
SYSTEM_DIRS = frozenset({
    "/etc", "/usr", "/var", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/opt", "/srv",
    "/run", "/tmp", "/mnt", "/media", "/home", "/root", "/snap", "/nix", "/usr/local", "/usr/lib", "/usr/share",
    "/var/lib", "/var/log", "/System", "/Library", "/Applications", "/Users", "/private", "/Volumes",
})
ALLOW_FIX = "point root at a project folder, or set `allow_broad_root: true` on the source if you mean it"


def is_never_read(real: str) -> bool:
    """A resolved path under /proc, /sys or /dev."""
    return any(real == p or real.startswith(p + "/") for p in NEVER_READ)


def broad_root_problem(root: Path, allow_broad_root: bool) -> tuple[str, str] | None:
    """(problem, fix) when this root must not be indexed, else None. Nothing is listed."""
    real = os.path.realpath(root)
    if is_never_read(real):
        return (f"{real} is a kernel pseudo-filesystem: /proc, /sys and /dev are never read",
                "point root at a project folder")
    if allow_broad_root:
        return None
    if real == "/":
        return "is the whole file system (/)", ALLOW_FIX
    home = os.path.realpath(Path.home())
    if real == home:
        return f"is the home folder ({real})", ALLOW_FIX
    if home.startswith(real.rstrip("/") + "/"):
        return f"{real} holds the home folder ({home})", ALLOW_FIX
    if real in SYSTEM_DIRS:
        return f"{real} is a system folder", ALLOW_FIX
    return None


def check_root(root: Path, source: SourceConfig, config_path: str = "kb.yaml") -> None:
    """Raise ConfigError (one line: file, key, problem, fix) when the source's root is too broad."""
    found = broad_root_problem(Path(root), getattr(source, "allow_broad_root", False))
    if found is not None:
        raise ConfigError(config_path, f"sources[{source.key}].root", *found)


class TooManyFiles(ConfigError):
    """A listing past max_files (raised by discovery while listing: the rest is not listed)."""

    def __init__(self, source: SourceConfig, limit: int, config_path: str = "kb.yaml"):
        self.source, self.limit = source, limit
        super().__init__(config_path, f"sources[{source.key}].max_files",
                         f"the listing of {source.root} passed {limit:,} files",
                         "narrow include/exclude, raise max_files, or set `allow_broad_root: true` on the source")

    def with_config_path(self, config_path: str) -> TooManyFiles:
        return TooManyFiles(self.source, self.limit, config_path)


def max_files_for(source: SourceConfig) -> int | None:
    """The listing bound for this source (None: unbounded, allow_broad_root)."""
    if getattr(source, "allow_broad_root", False):
        return None
    return getattr(source, "max_files", 100_000)


def config_error_names() -> frozenset[str]:
    """Class names of the configuration errors a run can fail on (the CLI maps them to exit 2)."""
    return frozenset({"ConfigError", "TooManyFiles"})
