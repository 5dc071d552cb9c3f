"""The indexing stages as plain functions (no Dagster): documents → chunks → embeddings → search index (with
query_stats) → signposts → projections (with relations). `query/` only reads what these write.

`kb_assets/defs/` wraps each stage in an asset; benchmarks and tests may call `index_sources` directly.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kb_assets.pipeline.progress import Progress, null_progress

if TYPE_CHECKING:
    from kb_assets.config import KbConfig
    from kb_assets.pipeline.chunks import ChunkStats
    from kb_assets.pipeline.documents import DocumentStats
    from kb_assets.pipeline.embeddings import EmbedStats
    from kb_assets.pipeline.search_index import SearchIndexStats

# The stages are imported when first named (PEP 562): `kb index` with nothing to do imports
# kb_assets.pipeline.cancel / source_state without paying for numpy and every stage module.
_LAZY = {"ChunkStats": "chunks", "chunk_source": "chunks", "DocumentStats": "documents",
         "sync_documents": "documents", "EmbedStats": "embeddings", "embed_source": "embeddings",
         "remove_orphan_vectors": "embeddings", "SearchIndexStats": "search_index",
         "build_search_index": "search_index", "stages_changed": "search_index"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "ChunkStats", "DocumentStats", "EmbedStats", "SearchIndexStats", "SourceRun", "build_search_index",
    "chunk_source", "embed_source", "index_sources", "run_embeddings_stage", "sync_documents",
]


@dataclass
class SourceRun:
    documents: DocumentStats
    chunks: ChunkStats
    embeddings: EmbedStats
    search_index: SearchIndexStats | None = None
    signposts: object | None = None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)


def run_embeddings_stage(conn, embedder, source_key: str | None, *, batch_rows: int = 500,
                         progress: Progress = null_progress, max_batches: int | None = None,
                         chunking_done=None) -> EmbedStats:
    """Embed what is missing and drop vectors nothing uses (the search-index stage then activates the space)."""
    from kb_assets.pipeline.embeddings import embed_source, remove_orphan_vectors

    stats = embed_source(conn, embedder, source_key=source_key, batch_rows=batch_rows, progress=progress,
                         max_batches=max_batches, chunking_done=chunking_done)
    if stats.missing_after == 0:
        started = time.perf_counter()
        stats.orphans_removed = remove_orphan_vectors(conn)
        stats.seconds = round(stats.seconds + time.perf_counter() - started, 3)
    return stats


def index_sources(cfg: KbConfig, conn, *, embedder, signposter=None, source_keys: list[str] | None = None,
                  progress: Progress = null_progress, refresh_query: bool = True,
                  projections: bool = False) -> dict[str, SourceRun]:
    """Run every stage for the chosen sources in this process (what the Dagster assets do, in order).

    `projections=True` also runs the projections stage once at the end (it writes files under
    cfg.projections_path(), so it is opt-in here: evaluation and the regression set index scratch schemas)."""
    from kb_assets.pipeline.chunks import chunk_source
    from kb_assets.pipeline.documents import sync_documents
    from kb_assets.pipeline.search_index import build_search_index, stages_changed

    runs: dict[str, SourceRun] = {}
    for source in cfg.sources:
        if not source.enabled or (source_keys and source.key not in source_keys):
            continue
        started = time.perf_counter()
        docs = sync_documents(conn, cfg, source, progress)
        chunks = chunk_source(conn, source.key, max_tokens=embedder.max_tokens,
                              count_tokens=embedder.count_tokens, progress=progress)
        emb = run_embeddings_stage(conn, embedder, source.key, batch_rows=cfg.embed_batch_rows, progress=progress)
        changed = stages_changed(docs.as_metadata(), chunks.as_metadata(), emb.as_metadata())
        # in the run (no background build): a caller of this function queries the index right after
        search = build_search_index(conn, embedder.model, embedder.dimension, refresh_query=refresh_query,
                                    index_changed=changed, background=False, progress=progress)
        sp = None
        if signposter is not None:
            from kb_assets.pipeline.signposts import run_signposts

            sp = run_signposts(conn, source.key, signposter)
        runs[source.key] = SourceRun(docs, chunks, emb, search, sp, round(time.perf_counter() - started, 3))
        if search.query_stats_refreshed:
            runs[source.key].extra["query_stats"] = search.query_stats
    if projections and runs:
        from kb_assets.pipeline.projections import build_projections

        stats = build_projections(conn, cfg)
        for run in runs.values():
            run.extra["projections"] = stats
    return runs
