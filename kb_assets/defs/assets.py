"""One asset per stage, partitioned by source. Each writes our own tables and returns metadata."""

import time

import dagster as dg

from kb_assets.defs.partitions import sources_partitions
from kb_assets.defs.resources import KbResource
from kb_assets.pipeline import stages
from kb_assets.pipeline.progress import beside as progress_beside
from kb_assets.pipeline.progress import current as current_progress

GROUP = "kb"


def _table(rows: list[dict], columns: list[str]) -> dg.MetadataValue:
    """A markdown table preview in the UI: the table pandas' to_markdown() gives (it calls tabulate), without
    importing pandas, which cost ~0.5 s of every run worker (issue 11: an unchanged partition in <= 5 s)."""
    if not rows:
        return dg.MetadataValue.md("_none_")
    from tabulate import tabulate

    cells = [["" if r.get(c) is None else r.get(c) for c in columns] for r in rows]
    return dg.MetadataValue.md(tabulate(cells, headers=columns, tablefmt="pipe"))


@dg.asset(
    partitions_def=sources_partitions,
    group_name=GROUP,
    kinds={"python", "postgres"},
    description="One row per live document of the source: listed (git-aware), read, redacted, classified.",
)
def kb_documents(context: dg.AssetExecutionContext, kb: KbResource) -> dg.MaterializeResult:
    source = kb.config.source(context.partition_key)
    stats, skipped = stages.documents(kb.config, source.key, kb.run_stage, current_progress(),
                                      embedder_factory=kb.embedder)
    context.log.info(f"{source.key}: {stats.new} new, {stats.changed} changed, {stats.unchanged} unchanged, "
                     f"{stats.deleted} deleted, {stats.skipped} skipped")
    warnings = []
    if stats.unmatched_includes:
        from kb_assets.store.health import glob_warning

        warnings.append(glob_warning(source.key, stats.unmatched_includes))
        context.log.warning(warnings[-1])
    if stats.listed == 0 and stats.complete:
        warnings.append(f"source {source.key!r}: the listing found no file to index")
        context.log.warning(warnings[-1])
    return dg.MaterializeResult(metadata={
        "listing_mode": stats.listing_mode + (f" ({stats.listing_reason})" if stats.listing_reason else ""),
        "warnings": dg.MetadataValue.md("\n".join(f"- {w}" for w in warnings) if warnings else "_none_"),
        "unmatched_include_globs": dg.MetadataValue.json(stats.unmatched_includes),
        "counts": _table([{"new": stats.new, "changed": stats.changed, "unchanged": stats.unchanged,
                           "deleted": stats.deleted, "skipped (this run)": stats.skipped,
                           "skipped (total)": stats.skipped_total, "listed": stats.listed}],
                         ["new", "changed", "unchanged", "deleted", "skipped (this run)", "skipped (total)",
                          "listed"]),
        "skip_reasons_table": _table([{"reason": r, "files": n} for r, n in sorted(stats.skip_reasons.items())],
                                     ["reason", "files"]),
        "new": stats.new, "changed": stats.changed, "unchanged": stats.unchanged, "deleted": stats.deleted,
        "skipped": stats.skipped, "skipped_total": stats.skipped_total, "listed": stats.listed,
        "read_errors": stats.read_errors, "commit": stats.commit or "", "listing_complete": stats.complete,
        "skip_reasons": dg.MetadataValue.json(stats.skip_reasons),
        "skipped_files": _table([{"path": p, "reason": r, "detail": (d or "")[:120]} for p, r, d in skipped],
                                ["path", "reason", "detail"]),
        "seconds": stats.seconds,
    })


# The chunk, embedding and signposts stages are one step (a multi-asset of three assets): Dagster runs a run's
# steps one after another in process (`kb index`: execute_in_process ignores the job's executor), so the step runs
# them side by side itself, each on its own connection. On a first load the embedding stage embeds chunks as the
# chunk stage commits them; otherwise it starts when the chunk stage ends. The signposts stage needs only the
# documents: it runs after the chunk stage, beside the embedding stage (docs/BENCHMARKS.md, "Signposts beside
# embeddings", "Embeddings beside chunking"). Selected alone (the UI, a subset job) each runs alone, as before.
kb_chunks = dg.AssetKey("kb_chunks")
kb_embeddings = dg.AssetKey("kb_embeddings")
kb_signposts = dg.AssetKey("kb_signposts")


def _configured_kinds() -> tuple[str, str]:
    """(signposter, embedder) of the config, read once at import: the UI shows them as kinds, and they choose
    the step's pool."""
    from kb_assets.config import load_config

    try:
        cfg = load_config()
        return cfg.signposter, cfg.embedder
    except Exception:   # a config error is reported by the partitions / the run, not at import here
        return "extractive", "local"


_SIGNPOSTER_KIND, _EMBEDDER_KIND = _configured_kinds()
# A step has one pool (op granularity): the one of the API the step calls. The local model calls none, so
# with Gemini signposts the step takes an `llm_api` slot; otherwise `embedding_api` (docs/DEPLOYMENT.md).
_STEP_POOL = "llm_api" if _SIGNPOSTER_KIND == "gemini" and _EMBEDDER_KIND != "voyage" else "embedding_api"


def _materialize_chunks(kb: KbResource, key: str, *, warm_up: bool | None = None,
                        beside: stages.ChunkingBeside | None = None) -> dg.MaterializeResult:
    embedder = kb.embedder()  # only its tokenizer is used here: the model is not loaded (or warms up)
    stats = stages.chunks(key, embedder, kb.run_stage, current_progress(), warm_up=warm_up, beside=beside)
    return dg.MaterializeResult(asset_key=kb_chunks, metadata={
        "documents_chunked": stats.documents_chunked, "chunks_written": stats.chunks_written,
        "chunks_removed": stats.chunks_removed, "chunks_kept": stats.chunks_kept, "chunks_total": stats.chunks_total,
        "errors": stats.errors, "seconds": stats.seconds,
    })


def _materialize_embeddings(kb: KbResource, key: str, *,
                            beside: stages.ChunkingBeside | None = None) -> dg.MaterializeResult:
    progress = current_progress() if beside is None else progress_beside(current_progress())
    stats = stages.embeddings(kb.config, key, kb.embedder(), kb.run_stage, progress, beside=beside)
    cost = 0.0
    if kb.config.embedder == "voyage":
        cost = stats.tokens / 1e6 * kb.config.voyage.price_per_million_tokens
    return dg.MaterializeResult(asset_key=kb_embeddings, metadata={
        "model": stats.model, "dimension": stats.dimension, "chunks_embedded": stats.chunks_embedded,
        "batches": stats.batches, "tokens": stats.tokens, "estimated_cost_usd": round(cost, 6),
        "missing_after": stats.missing_after, "orphans_removed": stats.orphans_removed,
        "vector_index_dropped": stats.vector_index_dropped, "seconds": stats.seconds,
    })


def _materialize_signposts(kb: KbResource, key: str) -> dg.MaterializeResult:
    from kb_assets.signposts.base import SignpostAuthError, SignpostQuotaError

    signposter = kb.signposter()
    started = time.perf_counter()
    try:
        meta = stages.signposts(kb.config, key, signposter, kb.run_stage)
    except (SignpostAuthError, SignpostQuotaError) as exc:
        # Retrying cannot fix a rejected key or an exhausted daily quota: fail once, clearly.
        raise dg.Failure(description=str(exc), allow_retries=False) from exc
    meta = {k: v for k, v in meta.items() if isinstance(v, (int, float, str, bool))}
    meta.setdefault("seconds", round(time.perf_counter() - started, 3))
    meta["generator"] = signposter.generator
    meta["model"] = signposter.model
    return dg.MaterializeResult(asset_key=kb_signposts, metadata=meta)


@dg.multi_asset(
    name="kb_chunks_embeddings_and_signposts",
    partitions_def=sources_partitions,
    group_name=GROUP,
    can_subset=True,
    specs=[
        dg.AssetSpec(kb_chunks, deps=[kb_documents], kinds={"python", "postgres"}, description=(
            "Chunks cut on natural boundaries (headings, paragraphs, turns, definitions), token-bounded.")),
        dg.AssetSpec(kb_embeddings, deps=[kb_chunks], kinds={"python", "pgvector"}, description=(
            "A vector for every chunk hash in the active (model, dimension) space; pay once per hash.")),
        dg.AssetSpec(kb_signposts, deps=[kb_documents], kinds={"python", _SIGNPOSTER_KIND}, description=(
            "Per-document signposts: summary, decisions with rationale, artifacts (code: purpose, "
            "functions).")),
    ],
    pool=_STEP_POOL,
    # a retry re-runs the step: committed chunks, vectors and current signposts are found again, not redone
    retry_policy=dg.RetryPolicy(max_retries=2, delay=60 if _SIGNPOSTER_KIND == "gemini" else 30,
                                backoff=dg.Backoff.EXPONENTIAL),
    description="The chunk, embedding and signposts stages of a source, side by side when selected together.",
)
def kb_chunks_embeddings_and_signposts(context: dg.AssetExecutionContext, kb: KbResource):
    key = context.partition_key
    selected = context.selected_asset_keys
    if len(selected) == 1:
        (only,) = selected
        if only == kb_chunks:
            yield _materialize_chunks(kb, key)
        elif only == kb_embeddings:
            yield _materialize_embeddings(kb, key)
        else:
            yield _materialize_signposts(kb, key)
        return
    from kb_assets.pipeline.side_by_side import run_together

    results: dict[dg.AssetKey, dg.MaterializeResult] = {}

    def run(asset: dg.AssetKey, materialize):
        def call():
            results[asset] = materialize()
        return call

    # the chunk stage here (its progress bar, its signal handling), the embedding stage beside it, following it;
    # the signposts beside the stage here, or after the chunk stage when the embedding stage follows it (with
    # the cut and the model's load at once they compete for the interpreter: measured slower); on a first load
    # the keyword statistics follow here too, beside the model (stages.keyword_statistics_ahead)
    chunking = stages.ChunkingBeside() if {kb_chunks, kb_embeddings} <= selected else None
    here_jobs, besides = [], []
    if kb_chunks in selected:
        here_jobs.append(run(kb_chunks, lambda: _materialize_chunks(kb, key, warm_up=chunking is not None,
                                                                    beside=chunking)))
    if kb_embeddings in selected:
        embed = run(kb_embeddings, lambda: _materialize_embeddings(kb, key, beside=chunking))
        if chunking is None:
            here_jobs.append(embed)
        else:
            besides.append((f"kb_embeddings[{key}]", embed))
    if kb_signposts in selected:
        signposts = run(kb_signposts, lambda: _materialize_signposts(kb, key))
        if chunking is None:
            besides.append((f"kb_signposts[{key}]", signposts))
        else:
            here_jobs.append(signposts)
    if chunking is not None:
        def keyword_statistics():      # a first load: the chunks are all in, the model is still at work
            if chunking.follow:
                ahead = stages.keyword_statistics_ahead(key, kb.run_stage)
                if ahead is not None:
                    context.log.info(f"{key}: keyword statistics refreshed beside the embedding stage "
                                     f"({ahead.get('seconds', 0.0)} s)")
        here_jobs.append(keyword_statistics)

    def here():
        for job in here_jobs:
            job()

    _, _, error = run_together(here, besides)
    # what one stage finished is reported even when another failed: its work is committed
    for asset in (kb_chunks, kb_embeddings, kb_signposts):
        if asset in results:
            yield results[asset]
    if error is not None:
        raise error


@dg.asset(
    partitions_def=sources_partitions,
    group_name=GROUP,
    kinds={"pgvector", "postgres"},
    deps=[kb_embeddings],
    description=("What recall() searches: the vector space's HNSW index (built once after a bulk load), the "
                 "space's activation once it is complete, keyword statistics and document vectors."),
)
def kb_search_index(context: dg.AssetExecutionContext, kb: KbResource) -> dg.MaterializeResult:
    key = context.partition_key
    embedder = kb.embedder()   # model and dimension only: nothing is loaded
    stats = stages.search_index(key, embedder, kb.run_stage, current_progress())
    q = stats.query_stats
    return dg.MaterializeResult(metadata={
        "model": stats.model, "dimension": stats.dimension, "space_missing": stats.space_missing,
        "vector_index_built": stats.vector_index_built, "vector_index_seconds": stats.vector_index_seconds,
        "vector_index_background": stats.vector_index_background,
        "space_activated": stats.activated, "query_stats_refreshed": stats.query_stats_refreshed,
        "query_stats_seconds": q.get("seconds", 0.0), "lexemes": q.get("lexemes", 0),
        "document_vectors": dg.MetadataValue.json(q.get("document_vectors") or {}),
        "keyword_postings_written": q.get("document_terms", 0),   # document_terms rows (migration 014)
        "seconds": stats.seconds,
    })


@dg.asset(
    partitions_def=sources_partitions,
    group_name=GROUP,
    kinds={"python", "postgres"},
    deps=[kb_signposts, kb_search_index],
    description=("Tier files under data_dir/machine (setting projections_dir): T0 index.dsl, T1 <type>.dsl with "
                 "\"use when\", by-tag/<tag>.dsl (governed tags), T3 relates.dsl and code/<source>.dsl; relations "
                 "resolved first. Deterministic; unchanged files are not rewritten."),
)
def kb_projections(context: dg.AssetExecutionContext, kb: KbResource) -> dg.MaterializeResult:
    # every source's projections at once: no source lock; re-run on a fresh connection like the other stages
    stats = stages.projections(kb.config, context.partition_key, kb.run_stage)
    rel = stats.relations
    context.log.info(f"projections: {len(stats.written)} written, {stats.unchanged} unchanged, "
                     f"{len(stats.removed)} removed in {stats.directory}")
    return dg.MaterializeResult(metadata={
        "directory": dg.MetadataValue.path(stats.directory), "files": stats.files,
        "written": len(stats.written), "unchanged": stats.unchanged, "removed": len(stats.removed),
        "written_files": dg.MetadataValue.json(stats.written[:50]), "entries": stats.entries,
        "t0_tokens_per_entry": stats.t0_tokens_per_entry, "tags": stats.tags,
        "tags_outside_vocabulary": len(stats.tags_outside_vocabulary),
        "relations": rel.get("edges", 0), "relations_resolved": rel.get("resolved", 0),
        "relations_unresolved": rel.get("unresolved", 0),
        "relations_by_kind": dg.MetadataValue.json(rel.get("by_kind", {})),
        "unresolved_by_kind": dg.MetadataValue.json(rel.get("unresolved_by_kind", {})),
        "seconds": stats.seconds,
    })


kb_job = dg.define_asset_job(
    "kb_index",
    selection=dg.AssetSelection.groups(GROUP),
    description="Index one source: documents → chunks → embeddings → search index, and signposts; then projections.",
)
