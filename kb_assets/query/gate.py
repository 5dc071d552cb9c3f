"""The relevance gate: which of a query's ranked documents are relevant enough to return at all.

Two levels (docs/QUALITY.md, "Fifth pass"):

1. Is the query about this index at all? Its best passage's similarity is compared with the index's own
   **null level**: the similarity that questions about nothing in particular reach here (PROBE_QUERIES:
   everyday and office topics; NULL_QUANTILE of their best-passage similarities, measured once per index
   and process). A fixed floor cannot tell this on a large corpus — with more documents, something always
   lies above it (all-MiniLM-L6-v2: off-topic best 0.19 on 21 documents, 0.38 on 736 PEPs) — the null
   level moves with the corpus. A query less than ON_TOPIC_ABOVE_NULL above it keeps only its exact-term
   keyword matches (the coverage rescue below) — unless the keyword and vector channels agree on its first
   document (_channels_agree).
2. Per result (the gate before this pass): a similarity near the query's best result and above the model's
   floor, or a keyword match covering most of the query's informative words; for a clearly on-topic query
   (CLEARLY_ON_TOPIC_ABOVE_NULL) also the keyword channel's first KEYWORD_TOP_KEPT documents (at most a tenth
   of the index) — a BM25 answer
   the model does not see (its gold documents ranked 18–46 by BM25 were the gate's whole Recall@100 cost).
   A query that is not clearly on-topic keeps only results more similar than the null level itself
   (Tuning.gate_null_floor): on a large corpus the model's fixed floor lies below the background, and an
   off-topic query's twenty "similar" results were mostly below it (docs/QUALITY.md, "Seventh pass").
   Within ON_TOPIC_ABOVE_NULL above the null level, a result needs a second witness: BM25 among its first
   KEYWORD_WITNESS_TOP documents (Tuning.gate_null_floor_margin; docs/QUALITY.md, "Ninth pass"). The model
   alone puts an off-topic query's twenty results just above the background ("restart celery workers
   nightly" on the PEPs); a real answer that close to it is one the keyword channel finds too.

The null level needs the query embedder (probes are embedded like queries): it is computed for models
with a calibrated floor (MIN_SIMILARITY) only, where the margins were measured.
"""
from __future__ import annotations

import hashlib
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kb_assets.query.engine import _DocHit


# Calibrated per model (docs/QUALITY.md: PEP evaluation set, regression set, off-topic queries): the best-passage
# similarity below which a result is noise. Unknown models get 0 (no floor) until someone measures them.
MIN_SIMILARITY = {"all-MiniLM-L6-v2": 0.25, "sentence-transformers/all-MiniLM-L6-v2": 0.25}
SURE_SIMILARITY_ABOVE_FLOOR = 0.15     # floor + this: similar enough whatever the best result is
COVERAGE_MARGIN = 0.2

# Questions about nothing a team's knowledge base is about (and none of bench/quality.py's off-topic
# queries): their best-passage similarities are the index's background level.
PROBE_QUERIES = (
    "how to bake sourdough bread at home", "best hiking trails in the alps", "history of the roman empire",
    "symptoms of the common cold", "how to change a flat bicycle tyre", "learn to play guitar chords",
    "football world cup results", "planting tomatoes in spring", "wedding dress shopping tips",
    "cheap flights to tokyo", "how volcanoes erupt", "renaissance painting techniques",
    "knitting a wool scarf", "training for a marathon", "caring for a pet cat",
    "choosing a mortgage for a first home", "the plot of a famous opera", "weather forecast for the weekend",
    "yoga poses for back pain", "vintage car restoration", "photosynthesis in plants",
    "how to write a cover letter", "chess opening strategies", "coral reef conservation",
    "configure a wifi router password", "print a document from a laptop", "set up an email signature",
    "spreadsheet formula for monthly budget", "update the phone operating system", "video call background blur",
    "machine learning model accuracy", "database backup schedule", "website search engine optimisation",
    "customer support ticket priority", "sales quarterly revenue report", "employee onboarding checklist",
)
NULL_QUANTILE = 0.75                 # of the probes' best similarities (a few probes may be on-topic somewhere)
ON_TOPIC_ABOVE_NULL = 0.05           # all-MiniLM-L6-v2; joint choice over four sets (bench/gate_study.py)
CLEARLY_ON_TOPIC_ABOVE_NULL = 0.20
KEYWORD_TOP_KEPT = 50
WEAK_KEYWORD_TOP_KEPT = 2            # with Tuning.gate_weak_margin: BM25's first documents of a weak query
KEYWORD_WITNESS_TOP = 10             # a result just above the null level stays when BM25 ranks it this high

_null_cache: dict[tuple, float] = {}           # (database dsn, table, chunks, model) -> level
_null_by_conn: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # the same, without reading the dsn
_null_lock = threading.Lock()


# The probes' query vectors for the packaged model, shipped beside this file (written by
# `python bench/write_probe_vectors.py`; kb_assets_tests/test_gate.py checks them against the
# model): a process's first gated query then makes no embedding call, only the nearest-neighbour lookups.
PROBE_VECTORS_FILE = Path(__file__).with_name("probe_vectors.npz")


def _probes_digest() -> str:
    return hashlib.sha256("\n".join(PROBE_QUERIES).encode()).hexdigest()[:16]


def probe_vectors(embedder) -> list:
    """PROBE_QUERIES' query vectors: the shipped ones when they are of this model and these probes, else
    embedded now (one query embedding each)."""
    import numpy as np     # here: `import kb_assets.query` stays light

    model, dim = getattr(embedder, "model", ""), getattr(embedder, "dimension", None)
    try:
        with np.load(PROBE_VECTORS_FILE) as f:
            shipped = f["vectors"] if (str(f["model"]) == model and str(f["probes"]) == _probes_digest()
                                       and f["vectors"].shape == (len(PROBE_QUERIES), dim)) else None
    except (OSError, KeyError, ValueError):
        shipped = None
    if shipped is not None:
        return list(shipped)
    return [embedder.embed_query(p) for p in PROBE_QUERIES]


def write_probe_vectors(embedder, path: Path = PROBE_VECTORS_FILE) -> Path:
    import numpy as np

    vectors = np.asarray([embedder.embed_query(p) for p in PROBE_QUERIES], dtype=np.float32)
    np.savez(path, vectors=vectors, model=np.array(embedder.model), probes=np.array(_probes_digest()))
    return path


def null_similarity(conn, table: str, embedder, n_chunks: int) -> float | None:
    """The index's null level (see the module text), or None for a model without a calibrated floor.

    Cached per database, vector table, chunk count and model: the first gated query of a process pays
    len(PROBE_QUERIES) nearest-neighbour lookups (and, for a model without shipped probe vectors, as many
    query embeddings; docs/BENCHMARKS.md)."""
    model = getattr(embedder, "model", "")
    if embedder is None or model not in MIN_SIMILARITY:
        return None
    short = (table, int(n_chunks), model)
    mine = _null_by_conn.get(conn)
    if mine is not None and short in mine:
        return mine[short]
    key = (conn.info.dsn, *short)
    with _null_lock:
        if key in _null_cache:
            _null_by_conn.setdefault(conn, {})[short] = _null_cache[key]
            return _null_cache[key]
    from psycopg import sql

    vectors = ["[" + ",".join(repr(float(x)) for x in v) + "]" for v in probe_vectors(embedder)]
    q = sql.SQL("SELECT 1 - (embedding <=> %s::vector) FROM {t} ORDER BY embedding <=> %s::vector LIMIT 1"
                ).format(t=sql.Identifier(table))
    best = []
    with conn.transaction():
        conn.execute("SET LOCAL hnsw.ef_search = 100")   # the true nearest chunk, not an approximation of it
        for v in vectors:
            row = conn.execute(q, (v, v)).fetchone()
            if row is not None:
                best.append(float(row[0]))
    if not best:
        return None
    best.sort()
    level = best[min(len(best) - 1, int(NULL_QUANTILE * len(best)))]
    with _null_lock:
        _null_cache[key] = level
        _null_by_conn.setdefault(conn, {})[short] = level
    return level


def _channels_agree(ranked: list[_DocHit]) -> bool:
    """BM25's first document is also the vector channels' first (chunk or document vector): independent
    evidence that a weakly similar query is about this index after all (a paraphrase the model barely
    matches, e.g. the regression set's "stored messages unreadable to someone who steals the disk")."""
    return any(h.k_rank == 1 and (h.v_rank == 1 or h.d_rank == 1) for h in ranked)


def null_floor_margin(tuning) -> float:
    """How far above the null level a not-clearly-on-topic query's result must be to stand on its similarity
    alone (Tuning.gate_null_floor_margin; None: ON_TOPIC_ABOVE_NULL, the level its best had to reach for the
    query to count as on-topic at all; 0: the seventh pass's floor at the null level)."""
    margin = getattr(tuning, "gate_null_floor_margin", None)
    return ON_TOPIC_ABOVE_NULL if margin is None else float(margin)


def _gate(ranked: list[_DocHit], channels: list[str], floor: float, settings, tuning=None,
          null: float | None = None, n_docs: int = 0) -> list[_DocHit]:
    """The relevance gate: drop weak results instead of filling the list.

    Similarity (the best passage's, or the document vector's): a result is kept at or above
    max(floor, min(best − margin, floor + 0.15)) — near the best result of this query, never below the
    floor, and always when clearly similar (floor + 0.15). Keyword coverage (share of the query's IDF mass
    its best chunk matches) keeps a result at or above max(min_keyword_coverage, best − 0.2) in hybrid
    mode (a rescue for exact-term matches); in keyword-only mode, where it is the only evidence, at or above
    max(0.1, min(best − 0.2, min_keyword_coverage)).
    With the index's `null` level (vector channels on): a query whose best similarity is below
    null + ON_TOPIC_ABOVE_NULL keeps its coverage-rescued keyword matches only (unless the channels agree on
    the first document); one below null + CLEARLY_ON_TOPIC_ABOVE_NULL keeps similarity results at or above
    the null level only (with tuning.gate_null_floor: the level is the index's background, so a result
    below it is no evidence for a query that is not clearly about the index), and those less than
    null_floor_margin() above it only when BM25 ranks them among its first KEYWORD_WITNESS_TOP; one at or above
    null + CLEARLY_ON_TOPIC_ABOVE_NULL also keeps the keyword channel's first KEYWORD_TOP_KEPT documents (at
    most a tenth of the index's `n_docs`: on a small index they would be all of it).
    """
    if not ranked:
        return ranked
    vec_on, kw_on = "vector" in channels, "keyword" in channels
    margin = settings.similarity_margin
    t_sim = t_cov = float("inf")
    t_witness = None                       # with the null floor: similarity this high needs BM25 as a witness
    best = 0.0
    weak_margin = getattr(tuning, "gate_weak_margin", None) if null is not None else None
    if vec_on:
        best = max(h.similarity for h in ranked)
        t_sim = max(floor, min(best - margin, floor + SURE_SIMILARITY_ABOVE_FLOOR))
        strong = floor + SURE_SIMILARITY_ABOVE_FLOOR
        if weak_margin is not None:           # "clearly similar" measured against this index's background too
            strong = max(strong, null + CLEARLY_ON_TOPIC_ABOVE_NULL)
        if tuning is not None and tuning.gate_strong_floor and best >= strong:
            t_sim = floor
        elif weak_margin is not None:         # a query barely above the background: only what is near its best
            t_sim = max(floor, best - weak_margin)
    if kw_on:
        best_cov = max(h.coverage for h in ranked)
        if vec_on:
            t_cov = max(settings.min_keyword_coverage, best_cov - COVERAGE_MARGIN)
        else:
            t_cov = max(0.1, min(best_cov - COVERAGE_MARGIN, settings.min_keyword_coverage))
    if vec_on and null is not None and getattr(tuning, "gate_null_floor", False) \
            and best < null + CLEARLY_ON_TOPIC_ABOVE_NULL:
        # not clearly on-topic: nothing below this index's background, and what lies just above it only with
        # BM25's witness (t_witness ... t_sim)
        t_witness = max(t_sim, null)
        t_sim = max(t_sim, null + null_floor_margin(tuning))
    k_top = 0
    if vec_on and null is not None:
        if best < null + ON_TOPIC_ABOVE_NULL and not _channels_agree(ranked):
            t_sim = float("inf")                     # not about this index: exact-term matches only
            t_witness = None
        elif best >= null + CLEARLY_ON_TOPIC_ABOVE_NULL:
            k_top = min(KEYWORD_TOP_KEPT, n_docs // 10)
        elif weak_margin is not None and best >= null + ON_TOPIC_ABOVE_NULL:
            # on-topic but not clearly: the near-best results above, and BM25's first two (a gold document
            # the model ranks 0.07-0.09 below the best, BM25 first or second: click-15/-20, whatsnew-3.4-139)
            k_top = min(WEAK_KEYWORD_TOP_KEPT, n_docs // 10)
    return [h for h in ranked
            if (vec_on and (h.vec or h.d_sim is not None)
                and (h.similarity >= t_sim
                     or (t_witness is not None and h.similarity >= t_witness and h.k_rank is not None
                         and h.k_rank <= KEYWORD_WITNESS_TOP)))
            or (kw_on and h.kw and (h.coverage >= t_cov or (h.k_rank is not None and h.k_rank <= k_top)))]

