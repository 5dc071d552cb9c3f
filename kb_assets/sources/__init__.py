"""Sources: discovery (git-aware listing with change signatures), readers per document kind, redaction.

Public API (what the pipeline calls):
    discovery.list_source(root, source) -> Listing(files, skips, commit, complete)
    discovery.changes_since(root, source, old_commit) -> GitChanges | None
    discovery.head_commit(root) -> str | None
    discovery.list_paths(root, source, paths) -> Listing          (entries for some paths only)
    discovery.git_file_dates(root, source) -> {path: (first, last)}
    readers.read_entry(root, entry, source, git_dates=None) -> list[SourceDocument] | Skip
    redaction.redact(text) -> (text, {type: count})
Submodules are imported lazily so that kb_assets.config can import kb_assets.sources.globs cheaply.
"""
from __future__ import annotations

from typing import Any

__all__ = ["FileEntry", "GitChanges", "Listing", "changes_since", "git_file_dates", "head_commit",
           "list_paths", "list_source", "read_entry", "redact"]


def __getattr__(name: str) -> Any:
    if name in ("FileEntry", "GitChanges", "Listing", "changes_since", "git_file_dates", "head_commit",
                "list_paths", "list_source"):
        from kb_assets.sources import discovery
        return getattr(discovery, name)
    if name == "read_entry":
        from kb_assets.sources.readers import read_entry
        return read_entry
    if name == "redact":
        from kb_assets.sources.redaction import redact
        return redact
    raise AttributeError(name)
