"""Stage 4: make the embedded vectors searchable — the space's HNSW index, activation, recall()'s statistics.

Kept out of the embedding stage on purpose: building an HNSW index over a bulk load once is ~10x cheaper than
maintaining it row by row during the load, and it is query-serving work, not indexing work. On a model change
a space becomes the one queries use only when it covers every chunk *and* has its index, so queries never go
to a half-built or unindexed space while the old one could answer. With no other space to answer (a first
load, or the space in use after a large load) a large build runs in the background after activation instead
(pipeline/vector_index_build.py): queries scan every vector meanwhile, correct and only slower.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field

import psycopg

from kb_assets.pipeline import cancel
from kb_assets.pipeline.embeddings import count_missing
from kb_assets.pipeline.progress import Progress, null_progress
from kb_assets.store import spaces

log = logging.getLogger(__name__)


@dataclass
class SearchIndexStats:
    model: str
    dimension: int
    space_missing: int = 0          # chunk hashes of any source still without a vector in this space
    vector_index_built: bool = False
    vector_index_background: bool = False   # handed to a detached build (pipeline/vector_index_build.py)
    vector_index_seconds: float = 0.0
    activated: bool = False
    query_stats_refreshed: bool = False
    query_stats: dict = field(default_factory=dict)
    seconds: float = 0.0

    def as_metadata(self) -> dict:
        return asdict(self)


def build_search_index(conn: psycopg.Connection, model: str, dimension: int, *,
                       refresh_query: bool = True, index_changed: bool = True, background: bool = True,
                       progress: Progress = null_progress) -> SearchIndexStats:
    """Index, activate and refresh what recall() reads, for the (model, dimension) space.

    `index_changed`: whether the stages before changed anything; False skips the statistics refresh (an
    unchanged re-run stays cheap) unless they were never computed or the space was just activated.
    `background`: a large HNSW build of a space no other space answers for meanwhile goes to a detached
    process after activation (pipeline/vector_index_build.py); False builds it here.
    """
    with cancel.cancellable(conn):   # a stop request cancels the HNSW build or the refresh (rolled back)
        return _build_search_index(conn, model, dimension, refresh_query=refresh_query,
                                   index_changed=index_changed, background=background, progress=progress)


def _build_search_index(conn, model, dimension, *, refresh_query, index_changed, background,
                        progress) -> SearchIndexStats:
    from kb_assets.pipeline import vector_index_build
    from kb_assets.pipeline.query_stats import refresh_query_stats

    started = time.perf_counter()
    stats = SearchIndexStats(model=model, dimension=dimension)
    table = spaces.space_table(conn, model, dimension)
    if table is None:
        stats.seconds = round(time.perf_counter() - started, 3)
        return stats
    stats.space_missing = count_missing(conn, table)
    active = spaces.active_space(conn)
    in_use = active is not None and active[2] == table
    # An incomplete space that is not in use gets its index only once complete (its rest still loads fast);
    # the space in use always has one (a large load may have dropped it: see embeddings.LARGE_LOAD).
    needs_index = (in_use or stats.space_missing == 0) and not spaces.has_vector_index(conn, table)
    # Without another space answering meanwhile (a first load, or the space in use after a large load), a
    # large build need not hold up the answer: activate now, build in the background. A model change keeps
    # the rule above: the old space answers until the new one is complete *and* indexed.
    build_after = needs_index and background and (active is None or in_use) and stats.space_missing == 0 \
        and vector_index_build.worth_background(conn, table)
    if build_after:
        needs_index = False
        if not in_use:
            spaces.activate_space(conn, model, dimension)
            stats.activated = in_use = True
    if needs_index:
        t0 = time.perf_counter()
        stats.vector_index_built = _build_now(conn, table, model, progress)
        stats.vector_index_seconds = round(time.perf_counter() - t0, 3)
    cancel.check()
    if not in_use and stats.space_missing == 0:
        spaces.activate_space(conn, model, dimension)
        stats.activated = in_use = True
    if refresh_query and in_use:
        never = conn.execute("SELECT NOT EXISTS (SELECT 1 FROM query_stats)").fetchone()[0]
        if index_changed or never or stats.activated or stats.vector_index_built:
            stats.query_stats = refresh_query_stats(conn)
            stats.query_stats_refreshed = True
    if build_after:
        # after the refresh: its first one adds triggers to the vector table, DDL that would wait for the
        # whole concurrent build
        t0 = time.perf_counter()
        if vector_index_build.start(conn, table):
            stats.vector_index_background = True
            log.info("%s: vector index building in the background (queries scan every vector until it is"
                     " ready)", table)
        else:
            stats.vector_index_built = _build_now(conn, table, model, progress)
        stats.vector_index_seconds = round(time.perf_counter() - t0, 3)
    stats.seconds = round(time.perf_counter() - started, 3)
    return stats


def _build_now(conn, table: str, model: str, progress: Progress) -> bool:
    progress.start(f"{model}: building the vector index", total=None)
    try:
        return spaces.ensure_vector_index(conn, table)
    finally:
        progress.done()


def stages_changed(documents: dict, chunks: dict, embeddings: dict) -> bool:
    """Whether a run's documents / chunks / embeddings stages (their `as_metadata()` dicts) changed anything."""
    d, c, e = documents, chunks, embeddings
    return bool(d.get("new") or d.get("changed") or d.get("deleted") or c.get("chunks_written")
                or c.get("chunks_removed") or e.get("chunks_embedded") or e.get("orphans_removed"))


def source_changed_in_last_run(conn: psycopg.Connection, source_key: str) -> bool:
    """`stages_changed` for the source's last run, from the stats its stages recorded in
    `sources.last_run_stats` (how the Dagster asset, a separate step, learns it)."""
    row = conn.execute("SELECT last_run_stats FROM sources WHERE key = %s", (source_key,)).fetchone()
    last = (row[0] if row else None) or {}
    return stages_changed(last.get("documents", {}), last.get("chunks", {}), last.get("embeddings", {}))
