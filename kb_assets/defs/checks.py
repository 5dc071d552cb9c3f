"""Asset checks: the index is complete, has no orphans, and signposting is not failing."""

import dagster as dg

from kb_assets.defs.assets import (kb_chunks, kb_documents, kb_embeddings, kb_projections, kb_search_index,
                                   kb_signposts)
from kb_assets.defs.resources import KbResource
from kb_assets.store import checks
from kb_assets.store.checks import SIGNPOST_FAILURE_RATE_LIMIT


def json_metadata(values: dict) -> dict:
    """Plain values as Dagster metadata: lists and dicts as JSON."""
    return {k: dg.MetadataValue.json(v) if isinstance(v, (dict, list)) else v for k, v in values.items()}


def check_metadata(outcome) -> dict:
    """A core CheckOutcome's metadata for Dagster: lists and dicts as JSON, tables as markdown."""
    metadata = json_metadata(outcome.metadata)
    metadata.update({k: _md_table(rows, cols) for k, (rows, cols) in outcome.tables.items()})
    return metadata


def _result(outcome) -> dg.AssetCheckResult:
    """A core CheckOutcome (kb_assets/store/checks.py) as Dagster's check result."""
    return dg.AssetCheckResult(
        passed=outcome.passed, description=outcome.description, metadata=check_metadata(outcome),
        severity=dg.AssetCheckSeverity.WARN if outcome.severity == "warn" else dg.AssetCheckSeverity.ERROR)


@dg.asset_check(asset=kb_embeddings, description="Every chunk has a vector for the configured model.")
def every_chunk_embedded(kb: KbResource) -> dg.AssetCheckResult:
    embedder = kb.embedder()
    # checks retry a database that is restarting like the stages do (no source lock: they only read)
    return _result(kb.run_stage(None, lambda conn: checks.every_chunk_embedded(conn, embedder.model,
                                                                               embedder.dimension), lock=False))


@dg.asset_check(asset=kb_chunks, description="No chunk without a live document, no vector without a chunk.")
def no_orphans(kb: KbResource) -> dg.AssetCheckResult:
    return _result(kb.run_stage(None, checks.no_orphans, lock=False))


@dg.asset_check(asset=kb_signposts, description=f"Under {SIGNPOST_FAILURE_RATE_LIMIT:.0%} of documents failing.")
def signpost_failure_rate(kb: KbResource) -> dg.AssetCheckResult:
    return _result(kb.run_stage(None, checks.signpost_failure_rate, lock=False))


@dg.asset_check(asset=kb_search_index, description=(
    "The committed regression set (agent-style queries over a fixed corpus shipped in kb_assets/query/"
    "regression/) finds its expected documents in the top 3, with the configured embedder. The corpus is "
    "indexed into its own schema (kb's schema + _regression), so the check never touches the real index. It "
    "runs again only when something it depends on changed (its own index, the embedder, kb's code or settings; "
    "not the real index, which it never reads): otherwise it reports its stored result, marked reused, without "
    "indexing its corpus or loading the model; query vectors are cached per model."))
def recall_regression_set(kb: KbResource) -> dg.AssetCheckResult:
    # its schema is shared by every run: two runs at once check one after the other (the lock), and a
    # database restart is retried like the stages
    return _result(kb.run_stage(":regression-check",
                                lambda conn: checks.recall_regression_set(kb.config, kb.embedder())))


# ---------------------------------------------------------------- per partition: drift and parity
def _run_sources(context: dg.AssetCheckExecutionContext, kb: KbResource) -> list:
    """The run's partition (a source), or every enabled source when the check runs on its own."""
    key = context.run.tags.get("dagster/partition") if context.run else None
    if key:
        return [kb.config.source(key)]
    return [s for s in kb.config.sources if s.enabled]


def _md_table(rows: list[dict], columns: list[str]) -> dg.MetadataValue:
    from kb_assets.defs.assets import _table   # one renderer, without pandas' import (assets.py)

    return _table(rows, columns)


@dg.asset_check(asset=kb_documents, description=(
    "Drift: the commit the source is indexed at is the tip of its branch (HEAD, `branch:`, or "
    "<remote>/<branch> after the sensor's fetch). Warns when the index is behind; sources that are not git "
    "have no commit and pass."))
def indexed_commit_matches_tip(context: dg.AssetCheckExecutionContext, kb: KbResource) -> dg.AssetCheckResult:
    with kb.connect() as conn:
        return _result(checks.indexed_commit_matches_tip(conn, kb.config, _run_sources(context, kb)))


@dg.asset_check(asset=kb_search_index, description=(
    "Vector/keyword parity: every active chunk of the source has a vector in the active space and a "
    "keyword vector (tsvector), so both halves of hybrid search can find it."))
def vector_keyword_parity(context: dg.AssetCheckExecutionContext, kb: KbResource) -> dg.AssetCheckResult:
    with kb.connect() as conn:
        return _result(checks.vector_keyword_parity(conn, _run_sources(context, kb)))


@dg.asset_check(asset=kb_projections, description=(
    "Every document tag is in the kb.yaml `tags:` vocabulary (or one of its aliases). Tags outside it get no "
    "by-tag file: add them to the vocabulary (or as aliases) or fix the documents. Passes when no vocabulary is set."))
def tags_in_vocabulary(kb: KbResource) -> dg.AssetCheckResult:
    with kb.connect() as conn:
        return _result(checks.tags_in_vocabulary(conn, kb.config))
