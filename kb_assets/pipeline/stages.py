"""A source's stages as one run executes them: each under its source's run lock (through the `run_stage`
it is given), its figures recorded in `sources.last_run_stats`. The Dagster assets (kb_assets/defs/assets.py)
call these, and so does `kb index` when it indexes a small change without a Dagster run
(pipeline/direct_run.py): one body per stage, whoever runs it.

`run_stage(source_key | None, fn(conn), *, lock=True)` is guard.run_stage bound to the config, or the
Dagster resource's, which turns a stop or a lost database into a Dagster failure.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

from kb_assets.pipeline import cancel
from kb_assets.pipeline.progress import Progress, null_progress, steps_share_process
from kb_assets.store.status import record_run

if TYPE_CHECKING:
    from kb_assets.config import KbConfig

RunStage = Callable[..., Any]


def trace_as(asset_name: str, stage):
    """The stage's name in the stage trace (KB_STAGE_TRACE, bench/faults.py), which guard takes from the
    function's qualified name: the asset's, whoever runs it."""
    stage.__qualname__ = f"{asset_name}.<locals>.stage"
    return stage


def documents(cfg: KbConfig, key: str, run_stage: RunStage, progress: Progress = null_progress, *,
              embedder_factory: Callable[[], Any] | None = None):
    """(DocumentStats, the 50 latest skipped files as (path, reason, detail)).

    `embedder_factory`: makes the run's embedder, when the run's later steps share this process (`kb index`): a
    source seen for the first time, with many files listed, loads its model while this stage reads them."""
    from kb_assets.pipeline.documents import sync_documents

    source = cfg.source(key)

    def stage(conn):
        if embedder_factory is not None and steps_share_process():
            _warm_up_for_a_new_source(conn, key, embedder_factory)
        stats = sync_documents(conn, cfg, source, progress)
        record_run(conn, source.key, "documents", {"documents": stats.as_metadata()})
        skipped = conn.execute(
            "SELECT path, skip_reason, skip_detail FROM documents WHERE source_key = %s AND status = 'skipped'"
            " ORDER BY updated_at DESC LIMIT 50", (source.key,)).fetchall()
        return stats, skipped

    return run_stage(key, trace_as("kb_documents", stage))


def _warm_up_for_a_new_source(conn, key: str, embedder_factory: Callable[[], Any]) -> None:
    """A first load starts the model's load here, not at the chunk stage: on 3,000 files the documents stage
    reads for ~4 s, and the embedding stage, which follows the chunk stage's first commits, otherwise waits for
    the load (docs/BENCHMARKS.md, "A first load's head and tail"). Only for a source with no document yet and at
    least WARM_UP_MIN_DOCUMENTS files in the listing `kb index` offers (a small or a known source: no load)."""
    from kb_assets.pipeline.chunks import WARM_UP_MIN_DOCUMENTS
    from kb_assets.pipeline.source_state import offered_files

    listed = offered_files(key)
    if listed is None or listed < WARM_UP_MIN_DOCUMENTS:
        return
    if conn.execute("SELECT EXISTS (SELECT 1 FROM documents WHERE source_key = %s)", (key,)).fetchone()[0]:
        return
    embedder = embedder_factory()
    if hasattr(embedder, "warm_up"):      # the local model; a remote embedder has nothing to load
        embedder.warm_up()


class ChunkingBeside:
    """What the chunk stage tells an embedding stage running beside it (one step, two threads): whether to follow
    it (decided at its start, on its connection, before it writes a chunk) and when it has ended."""

    def __init__(self) -> None:
        self.decided = threading.Event()
        self.follow = False
        self.done = threading.Event()

    def wait(self, event: threading.Event) -> None:
        while not event.wait(0.25):
            cancel.check()


def chunks(key: str, embedder, run_stage: RunStage, progress: Progress = null_progress, *,
           warm_up: bool | None = None, beside: ChunkingBeside | None = None, encode_ahead: bool = False):
    """`warm_up`: load the model while this stage cuts, on a first load (the embedding stage runs in this process
    next or beside); None: when the run's steps share this process (`kb index`). `beside`: an embedding stage
    runs beside this one (embeddings(..., beside=)); told whether to follow, and when this stage ends.
    `encode_ahead`: the new chunks' texts go to the embedder as soon as they are cut, while this stage stores
    them; the embedding stage, next in this process, takes their vectors (embeddings.encode_ahead)."""
    from kb_assets.pipeline.chunks import chunk_source, first_load_ahead

    warm = steps_share_process() if warm_up is None else warm_up

    def stage(conn):
        first_load = first_load_ahead(conn, key)
        if beside is not None and not beside.decided.is_set():
            beside.follow = follows_chunking(conn, key, embedder, first_load=first_load)
            beside.decided.set()
        # the model loads while this stage cuts: the embedding stage needs it next, in this process; a step
        # of its own in another process would load it for nothing
        if warm and hasattr(embedder, "warm_up") and first_load:
            embedder.warm_up()
        on_cut = None
        if encode_ahead:
            from kb_assets.pipeline.embeddings import encode_ahead as start

            def on_cut(conn, chunks):
                start(conn, embedder, chunks)
        stats = chunk_source(conn, key, max_tokens=lambda: embedder.max_tokens, count_tokens=embedder.count_tokens,
                             progress=progress, on_cut=on_cut)
        record_run(conn, key, "chunks", {"chunks": stats.as_metadata()})
        return stats

    try:
        return run_stage(key, trace_as("kb_chunks", stage))
    finally:
        if beside is not None:
            beside.decided.set()
            beside.done.set()


def embeddings(cfg: KbConfig, key: str, embedder, run_stage: RunStage, progress: Progress = null_progress, *,
               beside: ChunkingBeside | None = None):
    """`beside`: this stage runs beside the chunk stage. When it follows (a first load into a space with no HNSW
    index yet: follows_chunking) it embeds chunks as they are committed; otherwise it waits for the chunk stage
    to end and runs as it would after it."""
    from kb_assets.pipeline import run_embeddings_stage

    def stage(conn):
        follow = None
        if beside is not None:
            beside.wait(beside.decided)
            if beside.follow:
                follow = beside.done
            else:
                beside.wait(beside.done)
        stats = run_embeddings_stage(conn, embedder, key, batch_rows=cfg.embed_batch_rows, progress=progress,
                                     chunking_done=follow)
        record_run(conn, key, "embeddings", {"embeddings": stats.as_metadata()})
        return stats

    return run_stage(key, trace_as("kb_embeddings", stage))


def follows_chunking(conn, key: str, embedder, *, first_load: bool | None = None) -> bool:
    """Whether the embedding stage embeds chunks while the chunk stage still writes them: on a first load (most of
    the source never chunked), into a vector space without its HNSW index yet. Into an indexed space each vector
    would go through the index (~10x a bulk build per vector: the stage drops the index only for a load it can
    count, which a stage running beside the chunk stage cannot)."""
    from kb_assets.pipeline.chunks import first_load_ahead

    if first_load is None:          # the chunk stage passes what it read already
        first_load = first_load_ahead(conn, key)
    return first_load and _space_unindexed(conn, embedder)


def _space_unindexed(conn, embedder) -> bool:
    """The embedder's vector space has no HNSW index (yet, or none at all)."""
    from kb_assets.store import spaces

    table = spaces.space_table(conn, embedder.model, embedder.dimension)
    return table is None or not spaces.has_vector_index(conn, table)


def signposts(cfg: KbConfig, key: str, signposter, run_stage: RunStage) -> dict:
    """The signposts stage's figures (raises SignpostAuthError / SignpostQuotaError: no retry can help)."""
    from kb_assets.pipeline.signposts import run_signposts

    def stage(conn):
        stats = run_signposts(conn, key, signposter, max_failures=cfg.gemini.max_failures_before_parking,
                              concurrency=cfg.gemini.concurrency if cfg.signposter == "gemini" else 1)
        meta = stats.as_metadata() if hasattr(stats, "as_metadata") else dict(vars(stats))
        record_run(conn, key, "signposts", {"signposts": meta})
        return meta

    return run_stage(key, trace_as("kb_signposts", stage))


def search_index(key: str, embedder, run_stage: RunStage, progress: Progress = null_progress):
    from kb_assets.pipeline.search_index import build_search_index, source_changed_in_last_run

    def stage(conn):
        stats = build_search_index(conn, embedder.model, embedder.dimension,
                                   index_changed=source_changed_in_last_run(conn, key), progress=progress)
        record_run(conn, key, "search_index", {"search_index": {
            k: v for k, v in stats.as_metadata().items() if k != "query_stats"}})
        return stats

    return run_stage(key, trace_as("kb_search_index", stage))


def keyword_statistics_ahead(key: str, run_stage: RunStage) -> dict | None:
    """On a first load into a database with no vector space in use yet: the search index's keyword statistics
    refreshed as soon as the chunks are in, beside the embedding stage, rather than after it. The refresh is
    exact and incremental (pipeline/query_stats.py), so the search-index stage then only adds what changed
    since (nothing) and builds the document vectors: ~3 s of a 3,000-document first load's tail, after the last
    vector, now runs beside the model (docs/BENCHMARKS.md, "A first load's head and tail"). None when a space
    is in use: a refresh would then also average the vectors of documents still being embedded."""
    from kb_assets.pipeline.query_stats import refresh_query_stats
    from kb_assets.store.spaces import active_space

    def stage(conn):
        return None if active_space(conn) is not None else refresh_query_stats(conn)

    return run_stage(key, trace_as("kb_search_index", stage))


def projections(cfg: KbConfig, key: str, run_stage: RunStage, *, record: bool = True):
    """Every source's tier files at once (no source lock); the figures are recorded under `key` (`record=False`:
    by the caller, with record_projections, once the stages running beside have recorded theirs)."""
    from kb_assets.pipeline.projections import build_projections

    def stage(conn):
        stats = build_projections(conn, cfg)
        if record:
            _record_projections(conn, key, stats)
        return stats

    return run_stage(None, trace_as("kb_projections", stage), lock=False)


def record_projections(key: str, stats, run_stage: RunStage) -> None:
    run_stage(None, lambda conn: _record_projections(conn, key, stats), lock=False)


def _record_projections(conn, key: str, stats) -> None:
    record_run(conn, key, "projections", {"projections": {
        k: v for k, v in stats.as_metadata().items() if k not in ("written", "removed")}})
