"""recall() and show(): the agent-facing query.

Pipeline of one query (docs/QUALITY.md has the measurements behind each choice):

1. Candidates, three channels, each set in one pipelined transaction (one round trip for all queries); in
   hybrid mode the keyword channel runs on the caller's connection while the queries are embedded and the
   vector channels then run on a second connection to the same schema (Tuning.parallel_channels):
   - chunk vectors: HNSW cosine over the active space, `hnsw.ef_search = candidate_window`, LIMIT the same;
     a chunk text shared by many documents (licence footers, templates) is boilerplate and ignored;
   - document vectors: the nearest documents by the mean of their chunk vectors (built by
     refresh_query_stats) — diversity: one long transcript takes one place, not the whole window;
   - keyword: the query's lexemes (english stemming) with their chunk frequencies from lexeme_stats; the
     most selective ones, within a postings budget, are looked up one by one — in document_terms (one row per
     lexeme and document, kept by refresh_query_stats), else through the chunks' GIN index — and the
     documents scored by BM25 over those postings (Tuning.keyword_bm25; or, off, each match scored by IDF or
     idf × ts_rank, summed per chunk, at most `per_document_chunks` per document).
2. Collapse to documents per channel: a document's channel score is its best chunk plus a decayed share of
   its next best chunks, at most `per_document_chunks` of them.
3. Fuse the channels (reciprocal rank fusion, weights and k are settings, a document absent from a truncated
   channel counted at its cut + 1 (Tuning.impute_rank); or a convex combination),
   apply the relevance gate and `min_score`, and split: kind "code" goes to the code section.
4. Several queries: each is ranked on its own; the union takes documents from each query's list in turn
   (so a broad query cannot crowd out a focused one) and notes which queries matched each record.
5. Records are fetched for the chosen documents only (one round trip): signpost (or a fallback summary),
   dates, status, freshness; then cut to the per-record and whole-answer budgets.

Nothing here imports dagster, torch, numpy or pandas at module load; psycopg and the config are imported on
the first call, the embedding model on the first vector query.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
import time
import weakref
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Sequence

from kb_assets.sources.safe_names import printable

from kb_assets.query.freshness import Freshness
from kb_assets.query.gate import COVERAGE_MARGIN, MIN_SIMILARITY, SURE_SIMILARITY_ABOVE_FLOOR, _gate, null_similarity  # noqa: F401
from kb_assets.query.relations import successors, successors_first
from kb_assets.query.records import (
    PASSAGE_CHARS, Record, budget_signpost, cut_words, estimate_tokens, fallback_signpost, fit_record, squash,
)

log = logging.getLogger(__name__)

MODES = ("hybrid", "vector", "keyword")
ID_PREFIX = "kb:"


class QueryError(Exception):
    """A query that cannot run as asked; str() says what to do."""


# --------------------------------------------------------------------------------------------------------
# Tuning knobs that are not (yet) user settings. Everything a user may want to change is in QuerySettings.
@dataclass(frozen=True)
class Tuning:
    keyword_window: int = 200          # chunks (documents with keyword_bm25) taken from the keyword channel
    # Which query lexemes are searched: the most selective ones, at most keyword_max_terms, until their summed
    # chunk frequencies pass keyword_postings; none in more than keyword_max_df of the chunks. 48 / 12,000 /
    # 0.4 (was 24 / 6,000 / 0.2, which dropped words a BM25 needs; docs/QUALITY.md, bench/quality.py).
    keyword_max_terms: int = 48
    keyword_postings: int = 12000
    keyword_max_df: float = 0.4
    rank_weights: tuple[float, float, float, float] = (0.5, 0.6, 0.8, 1.0)   # ts_rank weights D, C, B, A
    # score matches with ts_rank (term frequency, heading weight) — or by IDF only (False, the default):
    # the chunk's tsvector is then never read, which halves the keyword channel's cost for equal hybrid
    # quality on the PEP set (docs/QUALITY.md)
    keyword_tf: bool = False
    doc_decay: float = 0.3             # next-best chunks add decay^i × their score (0: best chunk only)
    boilerplate_docs: int = 8          # a chunk text found in more documents than this is ignored (= stats.BOILERPLATE_DOCS)
    fusion: str = "rrf"                # rrf | convex
    # Keyword channel scored as document-level BM25 (True) over the selected lexemes' postings: a document's
    # term frequency is the number of its chunks holding the term (saturating with bm25_k1), its length the
    # bytes of its text against the mean (bm25_b), IDF over documents; plus title_weight × the IDF of the
    # query lexemes in its title (or path, split on / _ . and camelCase). False: the chunk-level IDF sum.
    # title_weight 0.25 since 2026-12-01 (bench/quality.py variants): PEPs +0.009 hybrid nDCG@10, code and the
    # regression set unchanged; 0.5 gains PEPs +0.021 but costs code 0.007 (docs/QUALITY.md).
    keyword_bm25: bool = True
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    # term frequency: "chunks" (chunks holding the term), "occurrences" (in the whole document: a
    # whole-file BM25), "code_occurrences" (occurrences for code, chunks for prose), "geometric" (of the two);
    # occurrences cost code_history 0.02 keyword / 0.03 hybrid nDCG@10 (docs/QUALITY.md, fifth pass)
    bm25_tf: str = "chunks"
    bm25_occurrence_weights: tuple[float, float, float, float] = (1.0, 1.0, 1.0, 1.0)   # per position: D, C, B, A
    title_weight: float = 0.25
    # BM25 postings read from document_terms (migration 014; the same documents, scores and best chunks as
    # from the chunks, at ~0.66x the keyword SQL's time on the real PEP index: docs/BENCHMARKS.md, "The keyword
    # channel from document postings"). False, or a database not refreshed since migrating: from the chunks.
    keyword_document_terms: bool = True
    # A fourth ranking in the fusion: each candidate document's opening (its first chunk: title, front
    # matter, first window) against the query, weighted so (0: off). Scored for the candidates only.
    opening_weight: float = 0.0
    # In hybrid mode the vector channels run on a second connection (two backends, two cores) while the
    # keyword channel runs on the caller's: the candidates cost max(keyword, embedding + vectors), not their
    # sum (docs/BENCHMARKS.md, "Channels side by side"). Never inside a caller's open transaction (the
    # second connection could not see its uncommitted rows). False: one connection, one channel after another.
    parallel_channels: bool = True
    # Code files fuse with other channel weights: their keyword weight × code_keyword_factor, their
    # document-vector weight × code_document_factor. A code file's mean chunk vector is closest to the query
    # when the file is small (one function that reads like the report), a large module's is diffuse, so
    # that channel rewards small files; identifiers make keyword evidence stronger in code than in prose.
    # 1.5 / 0.5 since 2026-12-02 (docs/QUALITY.md, fifth pass): code_history hybrid nDCG@10 0.753 -> 0.777;
    # prose ranks as before (their factors are 1).
    code_keyword_factor: float = 1.5
    code_document_factor: float = 0.5
    # Reciprocal rank fusion with imputed ranks: a document absent from a channel's *truncated* list is not
    # "no evidence" there, only "below the cut"; it fuses as if at the channel's cut + 1 instead of adding
    # nothing. Without it, a document one channel of three ranks at 43 fuses below every document two
    # channels rank at 150 (PEPs: ten gold documents BM25 alone finds at ranks 43-195 were fused to 101-238).
    # "off"; "window": the channel's limit + 1 (chunk vectors: candidate_window chunks, document vectors:
    # document_window, keyword: keyword_window); "listed": the number of documents the channel ranked + 1.
    # The vector channels always count as truncated (every document has a similarity); the keyword channel
    # only when it returned a full window (else an absent document matches no query term).
    # "window" since 2026-12-03 (docs/QUALITY.md, "Sixth pass"): PEPs Recall@100 0.965 -> 0.967, nDCG@10 unchanged
    # on every set.
    impute_rank: str = "window"
    impute_channels: tuple[str, ...] = ("vector", "document", "keyword")
    # Relevance gate, strong queries: when the best result is clearly similar (floor + 0.15), keep every
    # result above the floor (True) instead of only those within the margin of the best (False): a clear
    # answer then does not cut the relevant documents further down (Recall@100).
    gate_strong_floor: bool = True
    # Relevance gate, weak queries (with the index's null level, query/gate.py): a query whose best similarity
    # is below null + CLEARLY_ON_TOPIC_ABOVE_NULL keeps only results within gate_weak_margin of its best (and
    # the strong floor above needs that level too). None: off (the margin rule above applies).
    # Off by default: 0.05 took the PEPs' off-topic results 73 -> 22 with no Recall@100 cost there, but on the full
    # rust_rfcs set (648 RFCs) it cost gate-on Recall@100 0.989 -> 0.907 (limit: 0.01); docs/QUALITY.md, "Sixth pass".
    gate_weak_margin: float | None = None
    # Relevance gate, null floor (with the index's null level, query/gate.py): a query whose best similarity is
    # below null + CLEARLY_ON_TOPIC_ABOVE_NULL keeps similarity results at or above the null level only, not
    # down to the model's fixed floor (0.25, below the background of a large corpus: PEPs 0.335, RFCs 0.347).
    # No new constant. Since 2026-12-03 (docs/QUALITY.md, "Seventh pass"): PEPs off-topic results 78 -> 31,
    # rust_rfcs 16 -> 2, no gate Recall@100 or nDCG@10 change on any of the four full sets. False: off.
    gate_null_floor: bool = True
    # ... and a result less than this above the null level stays only when BM25 ranks it among its first
    # KEYWORD_WITNESS_TOP documents (query/gate.py). None: ON_TOPIC_ABOVE_NULL (no new margin: the level a query's
    # own best must reach to count as on-topic); 0.0: the seventh pass (everything above the null level).
    # docs/QUALITY.md, "Ninth pass" (bench/quality.py): PEPs off-topic results 31 -> 14 ("restart celery workers
    # nightly" 20 -> 8), code_history 36 -> 30, no gate Recall@100 change on any of the four full sets.
    gate_null_floor_margin: float | None = None
    # exact vector scan (instead of HNSW) when filters leave at most this many chunks
    exact_scan_chunks: int = 20000
    # Relevance gate (settings min_similarity / min_keyword_coverage): `gate=False` turns it off (evaluation),
    # `min_similarity` here overrides the setting.
    min_similarity: float | None = None
    gate: bool = True
    gate_null: bool = True             # the index-relative query test of the gate (query/gate.py; False: the old gate)


DEFAULT_TUNING = Tuning()


# --------------------------------------------------------------------------------------------------------
@dataclass
class RecallResult:
    queries: list[str]
    documents: list[Record]
    code: list[Record]
    mode: str = "hybrid"
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    candidates: dict[str, Any] = field(default_factory=dict)   # per query: distinct documents per channel
    ranked: list[list[tuple[str, float]]] = field(default_factory=list)  # per query: (id, score), all kinds
    channel_scores: dict[str, dict[str, float | None]] = field(default_factory=dict)  # first query, per id
    notice: str | None = None   # e.g. the filters match no document: an empty answer that is not "no match"

    @property
    def query(self) -> str:
        return self.queries[0] if len(self.queries) == 1 else " | ".join(self.queries)

    @property
    def truncated(self) -> bool:
        return any(r.truncated for r in self.documents) or any(r.truncated for r in self.code)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "query": self.query,
            "queries": list(self.queries),
            "mode": self.mode,
            "documents": [r.to_dict(self.queries) for r in self.documents],
            "code": [r.to_dict(self.queries) for r in self.code],
            "truncated": self.truncated,
            "timings": self.timings,
        }
        if self.warnings:
            d["warnings"] = list(self.warnings)
        if self.notice:
            d["notice"] = self.notice
        body = json.dumps(d, ensure_ascii=False, separators=(",", ":"))
        d["token_estimate"] = estimate_tokens(body) + 6
        return d

    def to_batch_line(self, qid: Any) -> dict[str, Any]:
        """One line of `kb recall --queries Q.jsonl --json`: {"id", "documents", "code", ...}."""
        d = self.to_dict()
        return {"id": qid, **{k: v for k, v in d.items() if k not in ("query",)}}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, **kw)

    def render_text(self) -> str:
        """Compact text for agents: numbered records per section, ending with "~N tokens"."""
        multi = len(self.queries) > 1
        out: list[str] = []
        if multi:
            out.append("queries: " + "  ".join(f"q{i + 1}={q!r}" for i, q in enumerate(self.queries)))
        else:
            out.append(f"recall {self.queries[0]!r}")
        for w in self.warnings:
            out.append(f"warning: {w}")
        if self.notice:
            out.append(f"notice: {self.notice}")
        out.append(f"## documents ({len(self.documents)})" if self.documents
                   else "## documents: none (the filters match no document)" if self.notice
                   else "## documents: none above threshold")
        out += [r.text for r in self.documents]
        if self.code:
            out.append(f"## code ({len(self.code)})")
            out += [r.text for r in self.code]
        if self.truncated:
            out.append("(… = cut to the record budget; `kb show <id>` gives the whole document)")
        else:
            out.append("(`kb show <id>` gives the whole document)")
        body = "\n".join(out)
        n = estimate_tokens(body)
        n = estimate_tokens(body + f"\n~{n} tokens")
        return body + f"\n~{n} tokens"

    def __str__(self) -> str:
        return self.render_text()


# --------------------------------------------------------------------------------------------------------
# Query embeddings run here while the keyword channel's SQL runs on the caller's connection (recall()).
_EMBED_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kb-query-embed")
OVERLAP_ENV = "KB_RECALL_OVERLAP"     # "0": embed first, then search (measurements: bench/serve_latency.py)

# The second connection of each caller's connection (Tuning.parallel_channels): same database, same
# search_path, autocommit; opened on first use, replaced when the search_path differs, closed with its owner.
_siblings: "weakref.WeakKeyDictionary[Any, tuple[str, Any, weakref.finalize]]" = weakref.WeakKeyDictionary()
_sibling_failures: set[str] = set()


def _sibling_for(conn, search_path: str):
    """The second connection beside `conn`, or None when none can be opened (then recall() runs its
    channels one after another on `conn`; the reason is logged once per database)."""
    with _cache_lock:
        got = _siblings.get(conn)
    if got is not None:
        path, sib, _ = got
        if path == search_path and not sib.closed and not sib.broken:
            return sib
        _drop_sibling(conn)
    import psycopg

    try:
        sib = psycopg.connect(conn.info.dsn, password=conn.info.password or None, autocommit=True)
        # the owner's exact search_path: the channels must read the owner's schema and nothing below it
        sib.execute("SELECT set_config('search_path', %s, false)", (search_path,))
    except psycopg.Error as exc:
        if conn.info.dsn not in _sibling_failures:
            _sibling_failures.add(conn.info.dsn)
            log.warning("recall(): no second database connection (%s); the search channels run one after "
                        "another", (str(exc).strip().splitlines() or [type(exc).__name__])[0])
        return None
    with _cache_lock:
        _siblings[conn] = (search_path, sib, weakref.finalize(conn, sib.close))
    return sib


def _idle(conn) -> bool:
    from psycopg.pq import TransactionStatus

    return conn.info.transaction_status == TransactionStatus.IDLE


def _drop_sibling(conn) -> None:
    with _cache_lock:
        got = _siblings.pop(conn, None)
    if got is not None:
        got[2]()     # closes it now and forgets the close at the owner's end

# Connections and embedders are cached per process: an agent's Python session pays the model load and the
# database start once.
_cache_lock = threading.Lock()
_urls: dict[tuple[str, str], str] = {}
_conns: dict[tuple[str, int], Any] = {}
_embedders: dict[tuple, Any] = {}


def _resolve_config(config):
    if config is None or isinstance(config, str) or hasattr(config, "__fspath__"):
        from kb_assets.config import load_config
        return load_config(config)
    return config


def _connection_for(cfg):
    from kb_assets.store.db import connect, open_database

    key = (cfg.config_path, cfg.effective_database_url() or str(cfg.data_path()), cfg.effective_schema())
    with _cache_lock:
        url = _urls.get(key)
    if url is None:
        url = open_database(cfg)
        with _cache_lock:
            _urls[key] = url
    ckey = (url, threading.get_ident())
    with _cache_lock:
        conn = _conns.get(ckey)
    if conn is None or conn.closed or conn.broken:
        conn = connect(url, register=False)
        with _cache_lock:
            _conns[ckey] = conn
    return conn


def _embedder_for(cfg):
    settings = cfg.local if cfg.embedder == "local" else cfg.voyage
    key = (cfg.embedder, settings.model_dump_json())
    with _cache_lock:
        emb = _embedders.get(key)
    if emb is None:
        from kb_assets.embedding import make_embedder
        emb = make_embedder(cfg)
        with _cache_lock:
            _embedders[key] = emb
    return emb


def _as_list(v: str | Sequence[str] | None) -> list[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        return [v]
    out = [str(x) for x in v]
    return out or None


# --------------------------------------------------------------------------------------------------------
# Dates: the one parser of the index (sources/dates.py), so a filter reads a date as the documents stage did.
from kb_assets.sources.dates import parse_date  # noqa: E402


def _meta_dates(meta: dict[str, Any]) -> tuple[str | None, str | None]:
    created = meta.get("created") or meta.get("date")
    updated = meta.get("updated") or meta.get("last_modified") or meta.get("modified")
    return _fmt_date(created), _fmt_date(updated)


def _column_dates(created: date | None, updated: date | None, meta: dict[str, Any]) -> tuple[str | None, str | None]:
    """A document's dates as the documents stage stored them (migration 007: created / updated, every active
    document dated), the stored meta's for a row not yet refilled."""
    if created is None and updated is None:
        return _meta_dates(meta)
    return (created.isoformat() if created else None), (updated.isoformat() if updated else None)


def _fmt_date(v: Any) -> str | None:
    if v in (None, ""):
        return None
    d = parse_date(v)
    return d.isoformat() if d else str(v)[:30]


def _doc_date(meta: dict[str, Any]) -> date | None:
    for k in ("updated", "last_modified", "modified", "date", "created"):
        d = parse_date(meta.get(k))
        if d:
            return d
    return None


# --------------------------------------------------------------------------------------------------------
@dataclass
class _Filters:
    sources: list[str] | None = None
    kinds: list[str] | None = None
    tags: list[str] | None = None
    path_prefix: str | None = None
    since: date | None = None
    until: date | None = None

    @property
    def any_sql(self) -> bool:
        return bool(self.sources or self.kinds or self.tags or self.path_prefix) or self.any_date

    @property
    def any_date(self) -> bool:
        return self.since is not None or self.until is not None

    def sql(self) -> tuple[str, dict[str, Any]]:
        parts, params = [], {}
        if self.sources:
            parts.append("d.source_key = ANY(%(f_sources)s)")
            params["f_sources"] = self.sources
        if self.kinds:
            parts.append("d.kind = ANY(%(f_kinds)s)")
            params["f_kinds"] = self.kinds
        if self.tags:
            # tags live in meta (from the file) and in the signpost; both are lowercase-compared
            parts.append(
                "(EXISTS (SELECT 1 FROM jsonb_array_elements_text(CASE WHEN jsonb_typeof(d.meta->'tags') = 'array'"
                " THEN d.meta->'tags' ELSE '[]'::jsonb END) t WHERE lower(t) = ANY(%(f_tags)s))"
                " OR EXISTS (SELECT 1 FROM signpost_state st JOIN signposts sp USING (content_hash, generator, model,"
                " prompt_version) WHERE st.document_id = d.id AND jsonb_typeof(sp.payload->'tags') = 'array'"
                " AND EXISTS (SELECT 1 FROM jsonb_array_elements_text(sp.payload->'tags') t2"
                " WHERE lower(t2) = ANY(%(f_tags)s))))")
            params["f_tags"] = [t.lower() for t in self.tags]
        if self.path_prefix:
            parts.append("starts_with(d.path, %(f_prefix)s)")
            params["f_prefix"] = self.path_prefix
        # Dates in SQL, in every channel, over the whole index (migration 007: every document has one, its
        # own or its commit's / file's). A document still without one (not re-indexed since) matches no range.
        if self.since is not None:
            parts.append("coalesce(d.updated, d.created) >= %(f_since)s")
            params["f_since"] = self.since
        if self.until is not None:
            parts.append("coalesce(d.updated, d.created) <= %(f_until)s")
            params["f_until"] = self.until
        return ("".join(" AND " + p for p in parts), params)


@dataclass
class _DocHit:
    doc_id: int
    kind: str
    vec: list[tuple[float, int]] = field(default_factory=list)   # (similarity, chunk id)
    kw: list[tuple[float, int]] = field(default_factory=list)    # (keyword score, chunk id)
    d_sim: float | None = None                                   # document-vector similarity
    v_score: float = 0.0
    k_score: float = 0.0
    v_rank: int | None = None
    k_rank: int | None = None
    d_rank: int | None = None
    o_sim: float | None = None                                   # similarity of the document's first chunk
    o_rank: int | None = None
    score: float = 0.0
    coverage: float = 0.0        # share of the query's IDF mass that the best keyword chunk matches

    @property
    def similarity(self) -> float:
        return max([s for s, _ in self.vec] + ([self.d_sim] if self.d_sim is not None else []), default=0.0)

    def best_chunk(self) -> int | None:
        if self.vec and (not self.kw or self.v_rank is not None and (self.k_rank is None or self.v_rank <= self.k_rank)):
            return max(self.vec)[1]
        if self.kw:
            return max(self.kw)[1]
        return None


def _aggregate(scores: list[tuple[float, int]], cap: int, decay: float) -> float:
    top = sorted((s for s, _ in scores), reverse=True)[:cap]
    return sum(s * (decay ** i) for i, s in enumerate(top)) if top else 0.0


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:[./-][A-Za-z_][A-Za-z0-9_]*)*")
_COMPOUND = re.compile(r"[a-z0-9][A-Z]|[A-Za-z0-9][./_-][A-Za-z]")


def identifier_words(text: str) -> str:
    """The parts of every camelCase, snake_case, dotted or path-like word of `text` (`getUserName` ->
    "get User Name", `httpx/_client.py` -> "httpx client py"): what migration 009's kb_identifier_words adds
    to each chunk's tsvector, so a query finds them by their parts."""
    out = []
    for w in _IDENTIFIER.findall(text):
        if not _COMPOUND.search(w):
            continue
        w = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", w))
        out += [p for p in re.split(r"[ ./_-]+", w) if len(p) > 1]
    return " ".join(out)


def _tsquery_literal(lexeme: str) -> str:
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


_KEYWORD_TAIL = (
    " m AS (SELECT c.id, c.document_id, sum(sel.idf * ts_rank(%(wts)s::float4[], c.tsv, sel.tq)) AS s,"
    " sum(sel.idf) AS cov"
    " FROM sel CROSS JOIN LATERAL (SELECT id, document_id, tsv FROM chunks WHERE tsv @@ sel.tq) c"
    " GROUP BY c.id, c.document_id),"
    # every matching chunk is scored anyway (the postings budget bounds them), so the per-document cap
    # costs nothing here: at most `per_document_chunks` chunks of one document enter the window
    " r AS (SELECT m.*, row_number() OVER (PARTITION BY m.document_id ORDER BY m.s DESC, m.id) AS n"
    " FROM m{filter_join}),"
    " top AS (SELECT * FROM r WHERE n <= %(cap)s ORDER BY s DESC, id LIMIT %(kw_window)s)"
    " SELECT top.id, top.document_id, d.kind, top.s, top.cov, (SELECT sum(idf) FROM allw), (SELECT count(*) FROM sel)"
    " FROM top JOIN documents d ON d.id = top.document_id WHERE d.status = 'active' ORDER BY top.s DESC, top.id")

# The query's lexemes with their chunk frequencies; the most selective ones within the postings budget are
# searched. Lexemes unknown to the statistics (new since the last refresh) count as rare. The lexeme is
# quoted as a tsquery literal (quotes doubled, backslashes escaped) so that no parser splits it again.
_KEYWORD_SQL = (
    "WITH q AS (SELECT t.lexeme, coalesce(s.ndoc, 1)::float8 AS df"
    " FROM unnest(to_tsvector('english', %(text)s)) t LEFT JOIN lexeme_stats s ON s.lexeme = t.lexeme"
    " WHERE length(t.lexeme) <= 60),"
    " allw AS (SELECT lexeme, df, ln(1 + (%(n)s - df + 0.5) / (df + 0.5)) AS idf,"
    " sum(df) OVER (ORDER BY df, lexeme) AS cum, row_number() OVER (ORDER BY df, lexeme) AS rn FROM q),"
    " sel AS (SELECT (chr(39) || replace(replace(lexeme, chr(92), chr(92) || chr(92)), chr(39), chr(39) || chr(39))"
    " || chr(39))::tsquery AS tq, idf, lexeme"
    " FROM allw WHERE df <= %(max_df)s AND (rn = 1 OR cum <= %(postings)s) AND rn <= %(max_terms)s),"
    + _KEYWORD_TAIL)

# Document-level BM25 over the same postings (Tuning.keyword_bm25). One row per document: its best chunk
# (most query IDF mass, for the passage and the coverage gate), its score.
_KEYWORD_BM25_TAIL = (
    " m AS (SELECT c.id, c.document_id, sel.lexeme, sel.idf{occ_col}"
    " FROM sel CROSS JOIN LATERAL (SELECT id, document_id{occ} FROM chunks WHERE tsv @@ sel.tq) c),"
    " ch AS (SELECT id, document_id, sum(idf) AS cov FROM m GROUP BY id, document_id),"
    " dt AS (SELECT document_id, lexeme, count(*)::float8 AS tf{occ_sum} FROM m GROUP BY document_id, lexeme),"
    " ddf AS (SELECT lexeme, count(*)::float8 AS ndf FROM dt GROUP BY lexeme),"
    " ds AS (SELECT dt.document_id, sum(ln(1 + (%(ndocs)s - ddf.ndf + 0.5) / (ddf.ndf + 0.5))"
    "  * {tf} * (%(k1)s + 1) / ({tf} + %(k1)s * (1 - %(b)s + %(b)s * octet_length(d.text) / %(avgdl)s))) AS s"
    "  FROM dt JOIN ddf USING (lexeme) JOIN documents d ON d.id = dt.document_id WHERE d.status = 'active'{filter}"
    "  GROUP BY dt.document_id),"
    " top AS (SELECT ds.document_id, ds.s FROM ds ORDER BY ds.s DESC, ds.document_id LIMIT %(kw_window)s),"
    # the best chunk of the window's documents only (not of every matching document)
    " best AS (SELECT DISTINCT ON (ch.document_id) ch.document_id, ch.id, ch.cov FROM ch"
    "  WHERE ch.document_id IN (SELECT document_id FROM top) ORDER BY ch.document_id, ch.cov DESC, ch.id){title}"
    " SELECT best.id, top.document_id, d.kind, top.s{title_score},"
    " best.cov, (SELECT sum(idf) FROM allw), (SELECT count(*) FROM sel)"
    " FROM top JOIN best USING (document_id) JOIN documents d ON d.id = top.document_id{title_join} ORDER BY 4 DESC, 2")
# The same ranking from document_terms (Tuning.keyword_document_terms; tf "chunks" only): each selected lexeme's
# documents by one index range, their lengths and filters read once per document (not per posting), the best
# chunk of the window's documents from the postings' chunk ids.
_KEYWORD_TERMS_TAIL = (
    " dt AS MATERIALIZED (SELECT p.document_id, p.lexeme, cardinality(p.chunk_ids)::float8 AS tf, sel.idf,"
    "  p.chunk_ids FROM sel JOIN document_terms p ON p.lexeme = sel.lexeme),"
    " ddf AS (SELECT lexeme, count(*)::float8 AS ndf FROM dt GROUP BY lexeme),"
    " dd AS MATERIALIZED (SELECT d.id AS document_id, octet_length(d.text)::float8 AS dl, d.kind FROM documents d"
    "  WHERE d.id = ANY(ARRAY(SELECT DISTINCT document_id FROM dt)) AND d.status = 'active'{filter}),"
    " ds AS (SELECT dt.document_id, sum(ln(1 + (%(ndocs)s - ddf.ndf + 0.5) / (ddf.ndf + 0.5))"
    "  * dt.tf * (%(k1)s + 1) / (dt.tf + %(k1)s * (1 - %(b)s + %(b)s * dd.dl / %(avgdl)s))) AS s"
    "  FROM dt JOIN ddf USING (lexeme) JOIN dd USING (document_id) GROUP BY dt.document_id),"
    " top AS MATERIALIZED (SELECT ds.document_id, ds.s, dd.kind FROM ds JOIN dd USING (document_id)"
    "  ORDER BY ds.s DESC, ds.document_id LIMIT %(kw_window)s),"
    " ch AS (SELECT c.id, dt.document_id, sum(dt.idf) AS cov FROM dt JOIN top USING (document_id)"
    "  CROSS JOIN LATERAL unnest(dt.chunk_ids) AS c(id) GROUP BY 1, 2),"
    " best AS (SELECT DISTINCT ON (ch.document_id) ch.document_id, ch.id, ch.cov FROM ch"
    "  ORDER BY ch.document_id, ch.cov DESC, ch.id){title}"
    " SELECT best.id, top.document_id, top.kind, top.s{title_score},"
    " best.cov, (SELECT sum(idf) FROM allw), (SELECT count(*) FROM sel)"
    " FROM top JOIN best USING (document_id){title_join} ORDER BY 4 DESC, 2")


# A document's term frequency (Tuning.bm25_tf): "chunks" holding the term, or its "occurrences" in the whole
# document (each matching chunk's count: ts_rank_cd of a one-lexeme query sums its positions' weights,
# Tuning.bm25_occurrence_weights, at most 256 positions per chunk) — for every kind, for code only
# ("code_occurrences"), or the geometric mean of both counts. Measured, not kept (docs/QUALITY.md, fifth pass).
def _bm25_tf_sql(mode: str) -> dict[str, str]:
    if mode == "chunks":
        return {"{occ_col}": "", "{occ}": "", "{occ_sum}": "", "{tf}": "dt.tf"}
    tfs = {"occurrences": "dt.occ", "code_occurrences": "(CASE WHEN d.kind = 'code' THEN dt.occ ELSE dt.tf END)",
           "geometric": "sqrt(dt.tf * dt.occ)"}
    if mode not in tfs:
        raise ValueError(f"Tuning.bm25_tf: {mode!r} is not one of chunks, {', '.join(tfs)}")
    tf = tfs[mode]
    return {"{occ_col}": ", c.occ", "{occ}": ", ts_rank_cd(%(occ_wts)s::float4[], tsv, sel.tq, 0)::float8 AS occ",
            "{occ_sum}": ", sum(occ) AS occ", "{tf}": tf}


# With a title weight: the IDF of the query lexemes in each window document's title (or path, split on / _ .
# and camelCase: documents.title_terms, stored since migration 014 — ~3 ms a query computed for 200 titles), one
# hash join for the window — only then (a per-row subplan cost 70 ms at 50K chunks).
_KEYWORD_TITLE_CTE = (
    ", tt AS (SELECT top.document_id, sum(a.idf) AS t FROM top JOIN documents d ON d.id = top.document_id"
    " CROSS JOIN LATERAL unnest(tsvector_to_array(d.title_terms)) AS tl(lexeme)"
    " JOIN allw a ON a.lexeme = tl.lexeme GROUP BY top.document_id)")

# Without statistics (never refreshed): the lexemes chosen in Python, all counted as equally rare.
_KEYWORD_SQL_NOSTATS = (
    "WITH allw AS (SELECT unnest(%(all_idf)s::float8[]) AS idf),"
    " sel AS (SELECT tq, idf FROM unnest(%(tqs)s::tsquery[], %(idfs)s::float8[]) AS t(tq, idf)),"
    + _KEYWORD_TAIL)


_doc_lengths: dict[tuple, tuple[int, float]] = {}


def _document_lengths(conn, search_path: str, refreshed_at) -> tuple[int, float]:
    """(active documents, their mean text bytes) for BM25, cached per database and schema until the next
    statistics refresh (octet_length reads the stored size: no detoasting)."""
    key = (conn.info.dsn, search_path, refreshed_at)
    got = _doc_lengths.get(key)
    if got is None:
        n, avg = conn.execute("SELECT count(*), avg(octet_length(text)) FROM documents WHERE status = 'active'").fetchone()
        got = (max(1, int(n or 0)), float(avg or 1.0) or 1.0)
        with _cache_lock:
            _doc_lengths[key] = got
    return got


class _Searcher:
    """One recall() call's database work: one round trip for the set-up, one pipelined round trip for the
    candidate searches of every query, one for the records."""

    def __init__(self, conn, settings, tuning: Tuning, filters: _Filters):
        self.conn = conn
        self.s = settings
        self.t = tuning
        self.f = filters
        self.space: tuple[str, int, str] | None = None
        self.doc_table: str | None = None
        self.n_chunks = 1
        self.have_stats = False
        self.have_terms = False            # document_terms kept by the last statistics refresh
        self.exact = False
        self.has_vector_index = True
        self.n_docs = 1
        self.avg_doc_bytes = 1.0
        self.search_path = ""

    def prepare(self, need_vectors: bool) -> None:
        fsql, fparams = self.f.sql()
        count = ("(SELECT count(*) FROM (SELECT 1 FROM documents d JOIN chunks c ON c.document_id = d.id"
                 " WHERE d.status = 'active'" + fsql + " LIMIT %(lim)s) x)") if (self.f.any_sql and need_vectors) \
            else "NULL::bigint"
        row = self.conn.execute(
            # relations of the connection's own schema only (never one further down its search_path)
            "SELECT s.model, s.dimension, s.table_name,"
            " to_regclass(quote_ident(current_schema()) || '.' || quote_ident(left(s.table_name || '_docs', 63)))"
            " IS NOT NULL, (SELECT n_chunks FROM query_stats WHERE id = 1),"
            " coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(quote_ident(current_schema())"
            " || '.' || quote_ident(left(s.table_name || '_hnsw', 63)))), false),"
            " (SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = 'chunks'::regclass), " + count + ","
            " (SELECT document_terms FROM query_stats WHERE id = 1), current_setting('search_path'),"
            " (SELECT refreshed_at FROM query_stats WHERE id = 1)"
            " FROM (SELECT 1) one LEFT JOIN LATERAL (SELECT model, dimension, table_name FROM embedding_spaces"
            " WHERE activated_at IS NOT NULL ORDER BY activated_at DESC LIMIT 1) s ON true",
            {**fparams, "lim": self.t.exact_scan_chunks + 1}).fetchone()
        (model, dim, table, has_docs, n_stats, has_vector_index, n_est, n_filtered, have_terms, self.search_path,
         refreshed_at) = row
        self.have_terms = bool(have_terms)
        self.has_vector_index = bool(has_vector_index)
        if table is not None:
            from kb_assets.store.spaces import doc_vector_table
            self.space = (model, int(dim), table)
            self.doc_table = doc_vector_table(table) if has_docs else None
        self.have_stats = n_stats is not None
        self.n_chunks = max(1, int(n_stats if n_stats is not None else (n_est or 0)))
        # Filters that leave few chunks: an exact scan over them returns the full window (HNSW in
        # pgvector < 0.8 returns at most ef_search rows *before* filtering).
        self.exact = n_filtered is not None and n_filtered <= self.t.exact_scan_chunks
        if self.t.keyword_bm25:
            self.n_docs, self.avg_doc_bytes = _document_lengths(self.conn, self.search_path, refreshed_at)

    # ---- SQL per channel
    def vector_sql(self):
        from psycopg import sql

        fsql, _ = self.f.sql()
        t = sql.Identifier(self.space[2])
        if self.f.any_sql and self.exact:
            return sql.SQL(
                "SELECT c.id, c.document_id, d.kind, 1 - (e.embedding <=> %(q)s::vector) AS sim, md5(c.text)"
                " FROM documents d JOIN chunks c ON c.document_id = d.id JOIN {t} e ON e.chunk_hash = c.chunk_hash"
                " WHERE d.status = 'active'" + fsql +
                " ORDER BY (e.embedding <=> %(q)s::vector) + 0 LIMIT %(w)s").format(t=t)
        return sql.SQL(
            "WITH v AS MATERIALIZED (SELECT chunk_hash, embedding <=> %(q)s::vector AS dist FROM {t}"
            " ORDER BY embedding <=> %(q)s::vector LIMIT %(w)s)"
            " SELECT c.id, c.document_id, d.kind, 1 - v.dist AS sim, md5(c.text)"
            " FROM v JOIN chunks c ON c.chunk_hash = v.chunk_hash JOIN documents d ON d.id = c.document_id"
            " WHERE d.status = 'active'" + fsql).format(t=t)

    def documents_sql(self):
        """Nearest documents by their mean chunk vector (absent until refresh_query_stats has built them)."""
        from psycopg import sql

        fsql, _ = self.f.sql()
        t = sql.Identifier(self.doc_table)
        if self.f.any_sql:
            return sql.SQL("SELECT x.document_id, d.kind, 1 - (x.embedding <=> %(q)s::vector) FROM {t} x"
                           " JOIN documents d ON d.id = x.document_id WHERE d.status = 'active'" + fsql +
                           " ORDER BY (x.embedding <=> %(q)s::vector) + 0 LIMIT %(dw)s").format(t=t)
        return sql.SQL("WITH v AS MATERIALIZED (SELECT document_id, embedding <=> %(q)s::vector AS dist FROM {t}"
                       " ORDER BY embedding <=> %(q)s::vector LIMIT %(dw)s)"
                       " SELECT v.document_id, d.kind, 1 - v.dist FROM v JOIN documents d ON d.id = v.document_id"
                       " WHERE d.status = 'active'").format(t=t)

    def keyword_sql(self) -> str:
        fsql, _ = self.f.sql()
        base = _KEYWORD_SQL if self.have_stats else _KEYWORD_SQL_NOSTATS
        if self.t.keyword_bm25 and self.have_stats:
            titled = self.t.title_weight > 0
            if self.have_terms and self.t.keyword_document_terms and self.t.bm25_tf == "chunks":
                base = base.replace(_KEYWORD_TAIL, _KEYWORD_TERMS_TAIL)
            else:
                base = base.replace(_KEYWORD_TAIL, _KEYWORD_BM25_TAIL)
                for k, v in _bm25_tf_sql(self.t.bm25_tf).items():
                    base = base.replace(k, v)
            return base.replace("{filter}", fsql).replace(
                "{title}", _KEYWORD_TITLE_CTE if titled else "").replace(
                "{title_score}", " + %(title_w)s * coalesce(tt.t, 0)" if titled else "").replace(
                "{title_join}", " LEFT JOIN tt ON tt.document_id = top.document_id" if titled else "")
        if not self.t.keyword_tf:   # no ts_rank: the chunk's tsvector is never read (no detoasting)
            base = base.replace("ts_rank(%(wts)s::float4[], c.tsv, sel.tq)", "(0.3 + 0 * cardinality(%(wts)s::float4[]))") \
                .replace("SELECT id, document_id, tsv FROM chunks", "SELECT id, document_id FROM chunks")
        # without filters the documents are joined only for the window's rows (chunks exist only for
        # active documents; the final join re-checks)
        join = (" JOIN documents d ON d.id = m.document_id WHERE d.status = 'active'" + fsql) if fsql else ""
        return base.replace("{filter_join}", join)

    def keyword_params(self, text: str) -> dict[str, Any]:
        parts = identifier_words(text)     # the query's identifiers by their parts too (migration 009)
        text = f"{text} {parts}" if parts else text
        p: dict[str, Any] = {"wts": list(self.t.rank_weights), "cap": self.s.per_document_chunks,
                             "kw_window": self.t.keyword_window}
        if self.t.keyword_bm25:
            p.update(ndocs=float(self.n_docs), avgdl=float(self.avg_doc_bytes), k1=self.t.bm25_k1, b=self.t.bm25_b,
                     title_w=self.t.title_weight, occ_wts=list(self.t.bm25_occurrence_weights))
        if self.have_stats:
            p.update(text=text, n=float(self.n_chunks), max_df=self.t.keyword_max_df * self.n_chunks,
                     postings=self.t.keyword_postings, max_terms=self.t.keyword_max_terms)
        else:
            lexemes = [r[0] for r in self.conn.execute(
                "SELECT lexeme FROM unnest(to_tsvector('english', %s)) WHERE length(lexeme) <= 60", (text,))]
            idf = math.log(1 + (self.n_chunks - 0.5) / 1.5)
            chosen = sorted(lexemes, key=lambda x: (-len(x), x))[:8]   # longest words: usually the rarest
            p.update(all_idf=[idf] * len(lexemes), tqs=[_tsquery_literal(x) for x in chosen],
                     idfs=[idf] * len(chosen))
        return p

    def openings(self, hits: dict[int, "_DocHit"], qlit: str) -> None:
        """Similarity of each candidate document's first chunk to the query (Tuning.opening_weight)."""
        from psycopg import sql

        q = sql.SQL("SELECT c.document_id, 1 - (e.embedding <=> %s::vector) FROM chunks c JOIN {t} e"
                    " ON e.chunk_hash = c.chunk_hash WHERE c.document_id = ANY(%s) AND c.ordinal = 0"
                    ).format(t=sql.Identifier(self.space[2]))
        for did, sim in self.conn.execute(q, (qlit, list(hits))).fetchall():
            hits[did].o_sim = float(sim)

    def search(self, items: list[tuple[str, str | None]], channels: list[str], conn=None) -> list[dict[str, list]]:
        """Candidates of every query in one pipelined transaction (on `conn`, default the caller's
        connection): {channel: rows} per query."""
        _, fparams = self.f.sql()
        plan = []   # (query index, channel, sql, params, ef_search)
        for i, (text, qlit) in enumerate(items):
            if "vector" in channels:
                plan.append((i, "vector", self.vector_sql(), {"q": qlit, "w": self.s.candidate_window, **fparams},
                             self.s.candidate_window))
            if "document" in channels and self.doc_table and self.s.document_window > 0:
                plan.append((i, "document", self.documents_sql(), {"q": qlit, "dw": self.s.document_window,
                                                                   **fparams}, self.s.document_window))
            if "keyword" in channels:
                plan.append((i, "keyword", self.keyword_sql(), {**self.keyword_params(text), **fparams}, None))
        out: list[dict[str, list]] = [{} for _ in items]
        if not plan:
            return out
        conn = conn if conn is not None else self.conn
        cursors = []
        with conn.pipeline():
            with conn.transaction():
                # small, index-driven queries: JIT compilation and parallel workers only add start-up time
                conn.execute("SET LOCAL jit = off")
                conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
                ef_now = None
                for i, ch, q, params, ef in plan:
                    if ef is not None and ef != ef_now:     # pgvector accepts 1..1000
                        conn.execute(f"SET LOCAL hnsw.ef_search = {min(1000, max(10, int(ef)))}")
                        ef_now = ef
                    cur = conn.cursor()
                    cur.execute(q, params)
                    cursors.append((i, ch, cur))
        for i, ch, cur in cursors:
            out[i][ch] = cur.fetchall()
        return out


def _imputed_ranks(hits: dict[int, _DocHit], active: list[str], settings, tuning: Tuning,
                   truncated: dict[str, bool] | None) -> dict[str, int]:
    """channel -> the rank a document absent from it fuses with (Tuning.impute_rank); channels whose list is
    complete (the keyword channel below its window: an absent document matches no query term) get none."""
    if tuning.impute_rank == "off":
        return {}
    if tuning.impute_rank not in ("window", "listed"):
        raise ValueError(f"Tuning.impute_rank: {tuning.impute_rank!r} is not one of off, window, listed")
    truncated = truncated or {}
    limits = {"vector": settings.candidate_window, "document": settings.document_window,
              "keyword": tuning.keyword_window}
    has = {"vector": lambda h: bool(h.vec), "document": lambda h: h.d_sim is not None,
           "keyword": lambda h: bool(h.kw)}
    out: dict[str, int] = {}
    for c in active:
        if c not in tuning.impute_channels or c not in limits:
            continue
        if c == "keyword" and not truncated.get("keyword", False):
            continue
        listed = sum(1 for h in hits.values() if has[c](h))
        if listed == 0:
            continue                  # the channel found nothing: no evidence to be below
        out[c] = (limits[c] if tuning.impute_rank == "window" else listed) + 1
    return out


def _fuse(hits: dict[int, _DocHit], channels: list[str], settings, tuning: Tuning,
          truncated: dict[str, bool] | None = None) -> list[_DocHit]:
    """Rank documents per channel, then fuse the ranks (RRF) or the normalized scores (convex).

    `truncated`: channel -> whether its list was cut at its window (Tuning.impute_rank reads it)."""
    cap = settings.per_document_chunks
    for h in hits.values():
        h.v_score = _aggregate(h.vec, cap, tuning.doc_decay)
        h.k_score = _aggregate(h.kw, cap, tuning.doc_decay)
    spec = {  # channel -> (has evidence, score, rank attribute, weight)
        "vector": (lambda h: bool(h.vec), lambda h: h.v_score, "v_rank", settings.vector_weight),
        "document": (lambda h: h.d_sim is not None, lambda h: h.d_sim or 0.0, "d_rank", settings.document_weight),
        "keyword": (lambda h: bool(h.kw), lambda h: h.k_score, "k_rank", settings.keyword_weight),
        "opening": (lambda h: h.o_sim is not None, lambda h: h.o_sim or 0.0, "o_rank", tuning.opening_weight),
    }
    active = [c for c in channels if spec[c][3] > 0] or channels
    for c in active:
        has, score, rank_attr, _w = spec[c]
        ranked = sorted((h for h in hits.values() if has(h)), key=lambda h: (-score(h), h.doc_id))
        for i, h in enumerate(ranked, 1):
            setattr(h, rank_attr, i)
    weights = {c: spec[c][3] for c in active}
    code_weights = {**weights, **{c: weights[c] * f for c, f in (("keyword", tuning.code_keyword_factor),
                                                                ("document", tuning.code_document_factor))
                                  if c in weights}}
    if not any(code_weights.values()):
        code_weights = weights
    wsum = sum(weights.values()) or 1.0
    code_wsum = sum(code_weights.values()) or 1.0
    if tuning.fusion == "rrf":
        k = settings.rrf_k
        imputed = _imputed_ranks(hits, active, settings, tuning, truncated)
        for h in hits.values():
            w, ws = (code_weights, code_wsum) if h.kind == "code" else (weights, wsum)
            s = 0.0
            for c in active:
                r = getattr(h, spec[c][2])
                if r is None:
                    r = imputed.get(c)        # below a truncated channel's cut (None: no evidence there)
                if r is not None:
                    s += w[c] / (k + r)
            h.score = s * (k + 1) / ws            # 1.0 = first in every channel
    else:  # convex: similarities as they are (clamped to 0..1), keyword scores relative to the best one
        kmax = max((h.k_score for h in hits.values()), default=0.0) or 1.0
        vnorm = sum(tuning.doc_decay ** i for i in range(cap)) or 1.0
        for h in hits.values():
            w, ws = (code_weights, code_wsum) if h.kind == "code" else (weights, wsum)
            s = 0.0
            for c in active:
                has, score, _r, _w = spec[c]
                if not has(h):
                    continue
                x = score(h) / (kmax if c == "keyword" else vnorm if c == "vector" else 1.0)
                s += w[c] * max(0.0, min(1.0, x))
            h.score = s / ws
    return sorted(hits.values(), key=lambda h: (-h.score, h.doc_id))


# --------------------------------------------------------------------------------------------------------
def recall(queries: str | Sequence[str], *, config=None, limit: int | None = None, code_limit: int | None = None,
           source: str | Sequence[str] | None = None, kind: str | Sequence[str] | None = None,
           tag: str | Sequence[str] | None = None, path_prefix: str | None = None,
           since: date | str | None = None, until: date | str | None = None, include_passage: bool = False,
           mode: str = "hybrid", record_chars: int | None = None, embedder=None, conn=None,
           min_score: float | None = None, tuning: Tuning | None = None,
           ranked_ids: bool = False, answer_tokens: int | None = None) -> RecallResult:
    """Ranked signposts for one or several queries: `documents` (default 20) and `code` (default 10).

    `config`: a KbConfig, a path to kb.yaml, or None (the usual lookup; with `conn` given and no config,
    the default settings). `embedder`: anything with `.embed_query(text)`, `.model`, `.dimension` (default:
    the config's). `conn`: a psycopg connection (default: one cached per process for the config's database).
    `answer_tokens` bounds the whole compact answer (records shrink evenly to fit; default 6,000 tokens);
    `min_score` overrides the threshold setting; `tuning` the internal knobs (evaluation); `ranked_ids`
    fills `result.ranked` with every candidate's (id, score) per query, all kinds, before the limits
    (evaluation: Recall@100).
    """
    from kb_assets.query.inputs import QueryInputError, check_date_range, check_limit, check_queries

    t_start = time.perf_counter()
    qs = [squash(q) for q in check_queries(queries)]   # one clear error for a number, NUL, lone surrogate
    if not qs or any(not q for q in qs):
        raise QueryError("empty query: pass a non-empty string or list of strings")
    if mode not in MODES:
        raise QueryError(f"unknown mode {mode!r}: use one of {', '.join(MODES)}")
    cfg = None if (config is None and conn is not None) else _resolve_config(config)
    if cfg is not None:
        settings = cfg.query
    else:
        from kb_assets.config import QuerySettings
        settings = QuerySettings()
    tuning = tuning or DEFAULT_TUNING
    limit = settings.documents_limit if limit is None else int(limit)
    code_limit = settings.code_limit if code_limit is None else int(code_limit)
    record_chars = settings.record_chars if record_chars is None else int(record_chars)
    min_score = settings.min_score if min_score is None else float(min_score)
    if answer_tokens is None:
        answer_tokens = settings.answer_tokens
    check_limit("limit", limit)
    check_limit("code_limit", code_limit)
    if record_chars < 120:
        raise QueryError("record_chars must be at least 120")
    try:
        since_d = parse_date(since) if since is not None else None
        until_d = parse_date(until) if until is not None else None
    except Exception:  # pragma: no cover - parse_date returns None rather than raising
        since_d = until_d = None
    if since is not None and since_d is None:
        raise QueryInputError(f"cannot read the date {since!r}: use YYYY-MM-DD")
    if until is not None and until_d is None:
        raise QueryInputError(f"cannot read the date {until!r}: use YYYY-MM-DD")
    check_date_range(since_d, until_d)
    filters = _Filters(_as_list(source), _as_list(kind), _as_list(tag), path_prefix or None, since_d, until_d)

    if conn is None:
        conn = _connection_for(cfg)
    # a caller's open transaction may hold rows a second connection cannot see: then one connection only
    use_sibling = tuning.parallel_channels and _idle(conn)
    result = RecallResult(queries=qs, documents=[], code=[], mode=mode)
    if filters.any_sql:
        # Say so when the filters alone leave nothing: otherwise an empty answer reads as "nothing relevant"
        where, params = filters.sql()
        if conn.execute("SELECT NOT EXISTS (SELECT 1 FROM documents d WHERE d.status = 'active'" + where + ")",
                        params).fetchone()[0]:
            result.notice = "no indexed document matches the filters (" + ", ".join(
                f"{k}={v}" for k, v in (("source", filters.sources), ("kind", filters.kinds),
                                        ("tag", filters.tags), ("path_prefix", filters.path_prefix),
                                        ("since", filters.since), ("until", filters.until)) if v) + ")"
    searcher = _Searcher(conn, settings, tuning, filters)
    searcher.prepare(need_vectors=mode != "keyword")
    space = searcher.space
    if mode != "keyword" and space is None:
        if mode == "vector":
            raise QueryError("no vectors are indexed yet: run `kb index` (or use mode='keyword')")
        result.warnings.append("no vectors indexed yet: keyword search only (run `kb index`)")
        mode = "keyword"
    if mode != "keyword":
        if embedder is None:
            if cfg is None:
                from kb_assets.config import KbConfig
                cfg = KbConfig()
            embedder = _embedder_for(cfg)
        if (embedder.model, int(embedder.dimension)) != (space[0], int(space[1])):
            raise QueryError(
                f"the index was built with {space[0]} ({space[1]}-d); the config says {embedder.model} "
                f"({embedder.dimension}-d): run `kb index` to build the new space, or set the embedder back")
    channels = {"hybrid": ["vector", "document", "keyword"], "vector": ["vector", "document"],
                "keyword": ["keyword"]}[mode]
    if "vector" in channels and not searcher.has_vector_index:
        result.warnings.append("the vector index is being (re)built: vector search scans every vector until "
                               "it is ready (`kb status`): correct, but slower")
    if "keyword" in channels and not searcher.have_stats:
        result.warnings.append("keyword statistics are missing: run `kb index` (refresh_query_stats) "
                               "for better keyword search")

    # ---- embed every query (outside any transaction: the embedder may be a network call)
    def embed_all() -> tuple[list[tuple[str, str | None]], float]:
        spent, out = 0.0, []
        for qtext in qs:
            qlit = None
            if "vector" in channels:
                t0 = time.perf_counter()
                qvec = embedder.embed_query(qtext)
                spent += time.perf_counter() - t0
                if len(qvec) != int(space[1]):
                    raise QueryError(f"the embedder returned {len(qvec)} numbers, the index holds {space[1]}-d vectors")
                qlit = "[" + ",".join(repr(float(x)) for x in qvec) + "]"
            out.append((qtext, qlit))
        return out, spent

    # ---- candidates, collapse, fusion. The keyword channel needs no vector: in hybrid mode it runs on this
    # connection while another thread embeds the queries (the encoder and the database each take a core).
    t0 = time.perf_counter()
    if "keyword" in channels and "vector" in channels and os.environ.get(OVERLAP_ENV) != "0":
        vector_channels = [c for c in channels if c != "keyword"]
        gated = tuning.gate and tuning.gate_null

        def embed_and_search():
            # beside the keyword SQL: the embedding, then (on a second connection) the vector channels
            items, spent = embed_all()
            sib = _sibling_for(conn, searcher.search_path) if use_sibling else None
            if sib is None:
                return items, spent, None
            import psycopg

            try:
                found = searcher.search(items, vector_channels, conn=sib)
                if gated:     # the null level, measured once per process: beside the keyword SQL too
                    null_similarity(sib, space[2], embedder, searcher.n_chunks)
            except psycopg.OperationalError as exc:
                log.info("recall(): the second connection failed (%s); searching on the first", exc)
                _drop_sibling(conn)
                return items, spent, None
            return items, spent, found

        pending = _EMBED_POOL.submit(embed_and_search)
        try:
            keyword_found = searcher.search([(q, None) for q in qs], ["keyword"])
        finally:
            items, embed_s, found = pending.result()
        if found is None:
            found = searcher.search(items, vector_channels)
        for rows, kw in zip(found, keyword_found):
            rows.update(kw)
    else:
        items, embed_s = embed_all()
        t0 = time.perf_counter()
        found = searcher.search(items, channels)
    per_query: list[list[_DocHit]] = []
    hits_by_query: list[dict[int, _DocHit]] = []
    for rows_by_channel in found:
        hits: dict[int, _DocHit] = {}
        stats: dict[str, Any] = {}
        rows = rows_by_channel.get("vector")
        if rows is not None:
            docs_per_hash: dict[str, set[int]] = defaultdict(set)
            for _cid, did, _k, _s, h in rows:
                docs_per_hash[h].add(did)
            for cid, did, k, sim, h in rows:
                if len(docs_per_hash[h]) > tuning.boilerplate_docs:
                    continue      # boilerplate shared by many documents (licence footers, templates)
                hits.setdefault(did, _DocHit(did, k)).vec.append((float(sim), cid))
            stats["vector_chunks"] = len(rows)
            stats["vector_docs"] = len({r[1] for r in rows})
        rows = rows_by_channel.get("document")
        if rows is not None:
            for did, k, sim in rows:
                hits.setdefault(did, _DocHit(did, k)).d_sim = float(sim)
            stats["document_docs"] = len(rows)
        rows = rows_by_channel.get("keyword")
        if rows is not None:
            mass = float(rows[0][5] or 1.0) if rows else 1.0
            for cid, did, k, s, cov, _mass, _n in rows:
                h = hits.setdefault(did, _DocHit(did, k))
                h.kw.append((float(s) / mass, cid))
                h.coverage = max(h.coverage, float(cov) / mass)
            stats["keyword_terms"] = int(rows[0][6]) if rows else 0
            stats["keyword_chunks"] = len(rows)
            stats["keyword_docs"] = len({r[1] for r in rows})
        used = [c for c in channels if c in rows_by_channel]
        if tuning.opening_weight > 0 and "vector" in used and hits:
            searcher.openings(hits, items[len(per_query)][1])
            used.append("opening")
        kw_rows = rows_by_channel.get("keyword")
        ranked = _fuse(hits, used, settings, tuning,
                       truncated={"keyword": kw_rows is not None and len(kw_rows) >= tuning.keyword_window})
        stats["distinct_docs"] = len(ranked)
        result.candidates.setdefault("per_query", []).append(stats)
        per_query.append(ranked)
        hits_by_query.append(hits)
    search_s = time.perf_counter() - t0

    # ---- the date filter ran in SQL with the others (documents.created / updated, migration 007)
    t0 = time.perf_counter()

    # ---- threshold, sections, union over queries
    if tuning.gate:
        floor = tuning.min_similarity if tuning.min_similarity is not None else settings.min_similarity
        if floor is None:
            floor = MIN_SIMILARITY.get(getattr(embedder, "model", ""), 0.0) if embedder is not None else 0.0
        null = null_similarity(conn, space[2], embedder, searcher.n_chunks) \
            if tuning.gate_null and "vector" in channels else None
        per_query = [_gate(ranked, channels, floor, settings, tuning, null, getattr(searcher, "n_docs", 0))
                     for ranked in per_query]
    per_query = [[h for h in ranked if h.score >= min_score] for ranked in per_query]
    chosen_docs = _union([[h for h in r if h.kind != "code"] for r in per_query], limit)
    chosen_code = _union([[h for h in r if h.kind == "code"] for r in per_query], code_limit)
    search_s += time.perf_counter() - t0

    t0 = time.perf_counter()
    # Superseded documents name their successors; a successor found too is placed above what it supersedes.
    succ = _successors(conn, [h.doc_id for h, _ in chosen_docs])
    chosen_docs = successors_first(chosen_docs, succ)
    fresh = Freshness()
    records = _fetch_records(conn, [h for h, _ in chosen_docs + chosen_code], fresh, include_passage)
    for did, names in succ.items():
        resolved = [name for target, name in names if target is not None]
        if did in records and resolved:
            records[did]["superseded_by"] = resolved[0]
    multi = len(qs) > 1

    def build(budget: int) -> tuple[list[Record], list[Record]]:
        sections: tuple[list[Record], list[Record]] = ([], [])
        for target, section, chosen in ((sections[0], "documents", chosen_docs), (sections[1], "code", chosen_code)):
            for h, qidx in chosen:
                base = records.get(h.doc_id)
                if base is None:      # deleted between the search and the fetch
                    continue
                rec = _make_record(base, h, section, qidx)
                fit_record(rec, budget, rank=len(target) + 1, multi=multi)
                target.append(rec)
        return sections

    # The whole answer has a budget too (answer_tokens): when the records would exceed it, every record's
    # budget shrinks in proportion (never below 200 characters).
    budget = record_chars
    docs_out, code_out = build(budget)
    allowed = answer_tokens * 4 - 400          # chars/4 estimate; room for the header and footer lines
    for _ in range(3):
        total = sum(len(r.text) + 1 for r in docs_out + code_out)
        if total <= allowed or budget <= 200:
            break
        budget = max(200, int(budget * allowed / total))
        docs_out, code_out = build(budget)
    result.documents, result.code = docs_out, code_out
    result.candidates["record_chars"] = budget
    fetch_s = time.perf_counter() - t0
    if ranked_ids:
        all_hits = hits_by_query
        ids = sorted({h.doc_id for ranked in per_query for h in ranked} | set(all_hits[0]))
        names = {did: make_id(src, path) for did, src, path in conn.execute(
            "SELECT id, source_key, path FROM documents WHERE id = ANY(%s)", (ids,)).fetchall()} if ids else {}
        result.ranked = [[(names.get(h.doc_id, f"#{h.doc_id}"), h.score) for h in ranked] for ranked in per_query]
        result.channel_scores = {names.get(h.doc_id, f"#{h.doc_id}"): {
            "vector": h.v_score, "document": h.d_sim, "keyword": h.k_score, "similarity": h.similarity,
            "coverage": h.coverage} for h in all_hits[0].values()}
    result.mode = mode
    total = time.perf_counter() - t_start
    result.timings = {"embed_ms": round(embed_s * 1000, 2), "search_ms": round(search_s * 1000, 2),
                      "fetch_ms": round(fetch_s * 1000, 2), "total_ms": round(total * 1000, 2),
                      "recall_ms": round((total - embed_s) * 1000, 2)}
    return result


def _successors(conn, doc_ids: list[int]) -> dict[int, list[tuple[int | None, str]]]:
    import psycopg

    try:
        return successors(conn, doc_ids)
    except psycopg.errors.UndefinedTable:      # a database migrated before relations existed (011)
        return {}


def _union(lists: list[list[_DocHit]], limit: int) -> list[tuple[_DocHit, list[int]]]:
    """Round-robin over the per-query lists (deduplicated), then ordered by best score."""
    if limit <= 0:
        return []
    matched: dict[int, list[int]] = defaultdict(list)
    best: dict[int, _DocHit] = {}
    for qi, ranked in enumerate(lists):
        for h in ranked:
            matched[h.doc_id].append(qi)
            if h.doc_id not in best or h.score > best[h.doc_id].score:
                best[h.doc_id] = h
    taken: list[int] = []
    seen: set[int] = set()
    pos = [0] * len(lists)
    while len(taken) < limit and any(pos[i] < len(lists[i]) for i in range(len(lists))):
        for qi, ranked in enumerate(lists):
            while pos[qi] < len(ranked) and ranked[pos[qi]].doc_id in seen:
                pos[qi] += 1
            if pos[qi] < len(ranked) and len(taken) < limit:
                did = ranked[pos[qi]].doc_id
                seen.add(did)
                taken.append(did)
                pos[qi] += 1
    out = [(best[d], matched[d]) for d in taken]
    out.sort(key=lambda x: (-x[0].score, x[0].doc_id))
    return out


_RECORD_SQL = """
SELECT d.id, d.source_key, d.path, d.kind, d.title, d.meta, d.indexed_commit, d.file_sig,
       s.indexed_commit, s.root, sp.payload, st.generator, st.stale,
       CASE WHEN sp.payload IS NULL THEN left(d.text, 4000) END,
       p.heading, p.start_line, p.end_line, left(p.text, 4000),
       d.doc_status, d.created, d.updated
FROM unnest(%s::bigint[], %s::bigint[]) AS x(did, cid)
JOIN documents d ON d.id = x.did
JOIN sources s ON s.key = d.source_key
LEFT JOIN signpost_state st ON st.document_id = d.id
LEFT JOIN signposts sp ON sp.content_hash = st.content_hash AND sp.generator = st.generator
     AND sp.model = st.model AND sp.prompt_version = st.prompt_version
LEFT JOIN chunks p ON p.id = x.cid
"""


def _fetch_records(conn, hits: list[_DocHit], fresh: Freshness, include_passage: bool) -> dict[int, dict]:
    """Everything the records show, for the chosen documents only, in one round trip."""
    if not hits:
        return {}
    ids = [h.doc_id for h in hits]
    cids = [h.best_chunk() if include_passage else None for h in hits]
    out: dict[int, dict] = {}
    for (did, src, path, kind, title, meta, dcommit, sig, scommit, root, payload, gen, sp_stale, head,
         p_heading, p_start, p_end, p_text, doc_status, created, updated
         ) in conn.execute(_RECORD_SQL, (ids, cids)).fetchall():
        meta = meta or {}
        if payload is None:
            payload = fallback_signpost(title, head, kind)
        else:
            payload = dict(payload)
            payload["_generator"] = gen or ""
        out[did] = {
            "id": make_id(src, path), "source": src, "path": path, "kind": kind, "title": title or path,
            "meta": meta, "indexed_commit": dcommit or scommit, "payload": payload, "signpost_stale": bool(sp_stale),
            "doc_status": doc_status, "dates": _column_dates(created, updated, meta),
            "stale": fresh.is_stale(root=root, source_commit=scommit, path=path, file_sig=sig),
        }
        if p_text is not None:
            out[did]["passage"] = {"heading": p_heading, "lines": [p_start, p_end],
                                   "text": cut_words(p_text, PASSAGE_CHARS)[0]}
    return out


def _make_record(base: dict, h: _DocHit, section: str, qidx: list[int]) -> Record:
    meta = base["meta"]
    created, updated = base["dates"]
    payload = base["payload"]
    title = squash(base["title"])
    main = "purpose" if section == "code" else "summary"
    text = squash(payload.get(main) or "")
    if title and text.lower().startswith(title.lower()) and len(text) > len(title) + 3:
        # a summary that opens with the title repeats the line above it: drop the repetition
        rest = text[len(title):].lstrip(" —–-:.")
        if rest:
            payload = {**payload, main: rest}
    signpost, cut = budget_signpost(base["kind"], payload, section)
    if base["signpost_stale"]:
        signpost["stale"] = True
    # the documents stage's one normalised status (documents.doc_status), the stored meta's for a row not refilled
    status = squash(base["doc_status"] or meta.get("status") or base["payload"].get("status") or "")
    rec = Record(
        id=base["id"], title=cut_words(base["title"], 120)[0], kind=base["kind"], source=base["source"],
        path=base["path"], score=h.score, status=status, created=created, updated=updated, signpost=signpost,
        indexed_commit=base["indexed_commit"], stale=base["stale"], queries=list(qidx),
        passage=base.get("passage"), truncated=cut, section=section,
        superseded_by=base.get("superseded_by"))
    return rec


# --------------------------------------------------------------------------------------------------------
def make_id(source_key: str, path: str) -> str:
    """The stable id of a document: `kb:<source>/<path>`.

    Stable across re-indexing, deletion and re-adding (it does not use the database row id); a rename is a
    new document, as it is in the source. Source keys cannot contain "/", so the first "/" separates them.
    """
    return f"{ID_PREFIX}{source_key}/{path}"


def parse_id(doc_id: str) -> tuple[str, str]:
    s = doc_id.strip()
    if s.startswith(ID_PREFIX):
        s = s[len(ID_PREFIX):]
    if "/" not in s:
        raise QueryError(f"not a kb id: {doc_id!r} — ids look like kb:<source>/<path> (as printed by kb recall)")
    src, path = s.split("/", 1)
    if not src or not path:
        raise QueryError(f"not a kb id: {doc_id!r} — ids look like kb:<source>/<path>")
    return src, path


def show(doc_id: str, *, config=None, conn=None) -> dict[str, Any]:
    """The whole document (tier 2): title, path, kind, meta, text, signpost, chunk headings, freshness."""
    from kb_assets.query.inputs import check_query_text

    src, path = parse_id(check_query_text(doc_id, "id"))
    if conn is None:
        conn = _connection_for(_resolve_config(config))
    row = conn.execute(
        "SELECT d.id, d.source_key, d.path, d.kind, d.title, d.status, d.skip_reason, d.skip_detail, d.meta,"
        " d.text, d.content_hash, d.indexed_commit, d.file_sig, d.updated_at, s.indexed_commit, s.root,"
        " d.doc_status, d.created, d.updated"
        " FROM documents d JOIN sources s ON s.key = d.source_key WHERE d.source_key = %s AND d.path = %s",
        (src, path)).fetchone()
    if row is None:
        near = conn.execute(
            "SELECT source_key || '/' || path FROM documents WHERE source_key = %s AND path LIKE %s ORDER BY path LIMIT 5",
            (src, "%" + path.rsplit("/", 1)[-1][:40].replace("%", r"\%").replace("_", r"\_") + "%")).fetchall()
        hint = ("; similar: " + ", ".join(ID_PREFIX + r[0] for r in near)) if near else ""
        raise QueryError(f"no document {make_id(src, path)} in the index{hint}")
    (did, src, path, kind, title, status, skip_reason, skip_detail, meta, text, chash, dcommit, sig, updated_at,
     scommit, root, doc_status, doc_created, doc_updated) = row
    sp = conn.execute(
        "SELECT sp.payload, st.generator, st.model, st.prompt_version, st.stale, st.content_hash FROM signpost_state st"
        " JOIN signposts sp ON sp.content_hash = st.content_hash AND sp.generator = st.generator"
        " AND sp.model = st.model AND sp.prompt_version = st.prompt_version WHERE st.document_id = %s",
        (did,)).fetchone()
    if sp:
        signpost = {**sp[0], "generator": sp[1], "model": sp[2], "prompt_version": sp[3], "stale": bool(sp[4])}
    else:
        signpost = {**fallback_signpost(title, text, kind)}
        signpost["generator"] = signpost.pop("_generator", "none")
    chunks = [{"ordinal": o, "heading": h, "lines": [a, b], "tokens": t} for o, h, a, b, t in conn.execute(
        "SELECT ordinal, heading, start_line, end_line, token_count FROM chunks WHERE document_id = %s ORDER BY ordinal",
        (did,))]
    created, updated = _column_dates(doc_created, doc_updated, meta or {})
    fresh = Freshness()
    return {
        "id": make_id(src, path), "source": src, "path": path, "kind": kind, "title": title,
        "status": doc_status or (meta or {}).get("status") or "", "index_status": status,
        "skip_reason": skip_reason, "skip_detail": skip_detail,
        "created": created, "updated": updated, "meta": meta or {}, "signpost": signpost,
        "indexed_commit": dcommit or scommit, "content_hash": chash,
        "stale": fresh.is_stale(root=root, source_commit=scommit, path=path, file_sig=sig),
        "root": root, "text": text or "", "chunks": chunks,
    }


def render_show(doc: dict[str, Any]) -> str:
    """`kb show` text: a header, the signpost, the chunk outline, then the whole text."""
    # names may hold control characters (a newline in a file name): each header field stays on its line
    lines = [f"{printable(doc['id'])}  [{doc['kind']}{' · ' + doc['status'] if doc['status'] else ''}]"
             + ("  STALE (the source changed since indexing)" if doc["stale"] else ""),
             f"title: {printable(doc['title'] or '')}",
             f"file: {printable(doc['root'] + '/' + doc['path'].split('#', 1)[0])}" if doc.get("root")
             else f"path: {printable(doc['path'])}"]
    if doc.get("created") or doc.get("updated"):
        lines.append(f"dates: created {doc.get('created') or '?'}, updated {doc.get('updated') or '?'}")
    if doc.get("indexed_commit"):
        lines.append(f"indexed at commit {doc['indexed_commit']}")
    sp = doc["signpost"]
    lines.append(f"signpost ({sp.get('generator', 'none')}):")
    lines.append(json.dumps({k: v for k, v in sp.items() if k not in ("generator", "model", "prompt_version")},
                            ensure_ascii=False, indent=1))
    if doc["chunks"]:
        lines.append("outline: " + "; ".join(f"{c['heading'] or '(start)'} L{c['lines'][0]}-{c['lines'][1]}"
                                             for c in doc["chunks"][:60])
                     + (f"; … (+{len(doc['chunks']) - 60})" if len(doc["chunks"]) > 60 else ""))
    lines.append("-" * 40)
    lines.append(doc["text"])
    return "\n".join(lines)
