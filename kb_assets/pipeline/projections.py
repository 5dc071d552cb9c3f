"""Stage 6: projections — resolve the relations, then render the tier files (kb_assets/projections).

Runs after the signposts and the search index. The files cover the whole index (every source), so a
partition's run re-renders them all; rendering is cheap and writing touches only files whose bytes change,
so an unchanged index rewrites nothing (every mtime stays).
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg

from kb_assets.config import KbConfig
from kb_assets.pipeline.relations import RelationStats, resolve_relations


@dataclass
class ProjectionStats:
    directory: str = ""
    files: int = 0
    written: list[str] = field(default_factory=list)
    unchanged: int = 0
    removed: list[str] = field(default_factory=list)
    entries: int = 0                     # T0 lines
    t0_tokens_per_entry: float = 0.0     # with the local model's tokenizer (chunking/tokens.py)
    tags: int = 0
    tags_outside_vocabulary: dict[str, int] = field(default_factory=dict)
    relations: dict = field(default_factory=dict)
    seconds: float = 0.0

    def as_metadata(self) -> dict:
        return asdict(self)


def _display_roots(conn: psycopg.Connection, out_dir: Path) -> dict[str, str]:
    """Each source's root as the files show it: relative to the projections folder (stable when both live in
    one repository), absolute when that is shorter."""
    roots = {}
    for key, root in conn.execute("SELECT key, root FROM sources ORDER BY key"):
        try:
            rel = os.path.relpath(root, out_dir)
        except ValueError:
            rel = root
        roots[key] = rel if len(rel) <= len(root) else root
    return roots


T0_COUNTS_FILE = "t0_token_counts.json"     # under data_dir/cache: line digest -> tokens, for the next run


def _line_key(line: str) -> str:
    return hashlib.blake2b(line.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _load_counts(path: Path | None, tokenizer: str) -> dict[str, int]:
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    counts = data.get("counts") if isinstance(data, dict) and data.get("tokenizer") == tokenizer else None
    return counts if isinstance(counts, dict) else {}


def _save_counts(path: Path, tokenizer: str, counts: dict[str, int]) -> None:
    """Atomically and only when the bytes change (projections/files.py); a folder that cannot be written only
    loses the saving."""
    from kb_assets.projections.files import write_if_changed

    try:
        write_if_changed(path, json.dumps({"tokenizer": tokenizer, "counts": counts}, separators=(",", ":")))
    except OSError:
        pass


def t0_tokens_per_entry(lines: list[str], counts_file: Path | None = None) -> float:
    """Mean tokens per T0 line (the local model's tokenizer). With `counts_file`, a line counted by an earlier
    run is not counted again: a small change re-renders every line but changes few (3,000 lines cost ~0.3 s
    of CPU beside the vector stages); the file keeps this run's lines only."""
    if not lines:
        return 0.0
    try:
        from kb_assets.chunking.tokens import default_tokenizer_path, make_token_counter

        path = default_tokenizer_path()
        st = path.stat()
        tokenizer = f"{path}:{st.st_size}:{st.st_mtime_ns}"
        known = _load_counts(counts_file, tokenizer)
        keys = [_line_key(line) for line in lines]
        todo = [i for i, k in enumerate(keys) if not isinstance(known.get(k), int)]
        if todo:
            # once per run: no word cache to pay for
            new = make_token_counter(path).count_once([lines[i] for i in todo])
            known.update((keys[i], n) for i, n in zip(todo, new))
        counts = [known[k] for k in keys]
        if counts_file is not None:    # this run's lines only: a removed line's count goes with it
            _save_counts(counts_file, tokenizer, {k: known[k] for k in keys})
    except Exception:                  # tokenizer missing: the offline estimate
        from kb_assets.chunking.tokens import estimate_tokens

        counts = estimate_tokens(lines)
    return round(sum(counts) / len(lines), 2)


def build_projections(conn: psycopg.Connection, cfg: KbConfig, *, measure_tokens: bool = True) -> ProjectionStats:
    from kb_assets.projections.files import FileSync
    from kb_assets.projections.load import load_edges, load_entries
    from kb_assets.projections.render import render_all
    from kb_assets.projections.vocabulary import TagVocabulary

    started = time.perf_counter()
    rel: RelationStats = resolve_relations(conn)
    out_dir = cfg.projections_path()
    rendered = render_all(load_entries(conn), load_edges(conn), TagVocabulary(cfg.tags),
                          _display_roots(conn, out_dir))
    sync = FileSync(out_dir)
    sync.apply(rendered.files)
    stats = ProjectionStats(
        directory=str(out_dir), files=len(rendered.files), written=sync.written, unchanged=sync.unchanged,
        removed=sync.removed, entries=rendered.t0_entries,
        t0_tokens_per_entry=t0_tokens_per_entry(rendered.t0_lines, cfg.data_path() / "cache" / T0_COUNTS_FILE)
        if measure_tokens else 0.0,
        tags=len(rendered.tag_counts), tags_outside_vocabulary=rendered.tags_outside,
        relations=rel.as_metadata())
    stats.seconds = round(time.perf_counter() - started, 3)
    return stats
