"""The relevance gate: which of a query's ranked documents are relevant enough to return at all."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kb_assets.query.engine import _DocHit


# Calibrated per model (docs/QUALITY.md: PEP evaluation set, regression set, off-topic queries): the best-passage
# similarity below which a result is noise. Unknown models get 0 (no floor) until someone measures them.
MIN_SIMILARITY = {"all-MiniLM-L6-v2": 0.25, "sentence-transformers/all-MiniLM-L6-v2": 0.25}
SURE_SIMILARITY_ABOVE_FLOOR = 0.15     # floor + this: similar enough whatever the best result is
COVERAGE_MARGIN = 0.2


def _gate(ranked: list[_DocHit], channels: list[str], floor: float, settings, tuning=None) -> list[_DocHit]:
    """The relevance gate: drop weak results instead of filling the list.

    Similarity (the best passage's, or the document vector's): a result is kept at or above
    max(floor, min(best − margin, floor + 0.15)) — near the best result of this query, never below the
    floor, and always when clearly similar (floor + 0.15). Keyword coverage (share of the query's IDF mass
    its best chunk matches) keeps a result at or above max(min_keyword_coverage, best − 0.2) in hybrid
    mode (a rescue for exact-term matches); in keyword-only mode, where it is the only evidence, at or above
    max(0.1, min(best − 0.2, min_keyword_coverage)).
    """
    if not ranked:
        return ranked
    vec_on, kw_on = "vector" in channels, "keyword" in channels
    margin = settings.similarity_margin
    t_sim = t_cov = float("inf")
    if vec_on:
        best = max(h.similarity for h in ranked)
        t_sim = max(floor, min(best - margin, floor + SURE_SIMILARITY_ABOVE_FLOOR))
        if tuning is not None and tuning.gate_strong_floor and best >= floor + SURE_SIMILARITY_ABOVE_FLOOR:
            t_sim = floor
    if kw_on:
        best_cov = max(h.coverage for h in ranked)
        if vec_on:
            t_cov = max(settings.min_keyword_coverage, best_cov - COVERAGE_MARGIN)
        else:
            t_cov = max(0.1, min(best_cov - COVERAGE_MARGIN, settings.min_keyword_coverage))
    return [h for h in ranked
            if (vec_on and (h.vec or h.d_sim is not None) and h.similarity >= t_sim)
            or (kw_on and h.kw and h.coverage >= t_cov)]
