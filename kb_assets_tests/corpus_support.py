"""A small markdown source for tests that index with the stand-in embedder: `notes` documents of `parts` sections."""
from __future__ import annotations

from pathlib import Path

from kb_assets.config import parse_config

PARA = "The queue keeps its work in PostgreSQL and takes batches with skip locked; retries back off. "


def notes_source(tmp_path: Path, db_url: str, *, notes: int, parts: int):
    """(config with one doc source "docs", its root): note-<i>.md, each a title and `parts` sections of prose."""
    root = tmp_path / "docs"
    root.mkdir()
    for i in range(notes):
        (root / f"note-{i}.md").write_text(f"# Note {i}\n\n" + "\n\n".join(
            f"## Part {j}\n\n{PARA * 3} Topic {i}-{j}." for j in range(parts)), encoding="utf-8")
    cfg = parse_config({"database_url": db_url, "sources": [
        {"key": "docs", "kind": "doc", "root": str(root), "include": ["*.md"]}]},
        path=str(tmp_path / "kb.yaml"), base_dir=str(tmp_path))
    return cfg, root
