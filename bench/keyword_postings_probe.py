"""Probe: would the keyword channel be cheaper reading its postings from something narrower
than the chunk heap? On a real index, recall()'s keyword SQL read each selected lexeme's chunks through the GIN
index, one bitmap heap scan of `chunks` per lexeme (docs/BENCHMARKS.md, "On a real index: the PEPs at HEAD"); since
migration 014 it reads document_terms (the last variant below), and the chunks only as a fallback.

    python bench/keyword_postings_probe.py PATH/TO/kb.yaml [--long 60] [--rounds 3]

Builds two scratch relations in that index's database and drops them at the end:
- `exp_terms (id, document_id, tsv)` with its own GIN index: the chunk heap without the chunk text;
- `exp_postings (lexeme, chunk_id, document_id)` with a btree on lexeme INCLUDE (document_id, chunk_id): one row
  per chunk and lexeme, read by an index-only scan.
- `exp_doc_postings (lexeme, document_id, tf)`: each document's chunk count per lexeme (BM25's tf as kb computes
  it, Tuning.bm25_tf "chunks"), btree INCLUDE; the "document postings" variant scores documents from it and looks
  up the best chunk (coverage) for the window's documents only, through `exp_postings`.
- "document postings, lean": the same with each document's text length stored beside its tf (`exp_doc_postings.dl`:
  no join to `documents` until the window is cut), the CTEs materialised (their row estimates were 37 where 4,571
  rows flow) and the best chunk looked up by `document_id = ANY(window)`.
- "document_terms (shipped, migration 014)": what recall() runs since 2026-12-04 (when the index's last refresh kept
  document_terms): postings per (lexeme, document) with their chunk ids, the best chunk from those ids.
`--explain` prints `EXPLAIN (ANALYZE, BUFFERS)` of one paragraph query for every variant first.
Then times the keyword SQL from the chunks and the same SQL with its postings scan swapped (the 20 short topic queries of
bench/recall_latency.py and `--long` What's-New paragraphs, jit and parallel workers off as recall() sets them),
and checks that every variant returns exactly the chunks SQL's documents and scores.
"""
from __future__ import annotations

import argparse
import statistics as st
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]

SHIPPED = "CROSS JOIN LATERAL (SELECT id, document_id FROM chunks WHERE tsv @@ sel.tq) c)"
VARIANTS = {
    "narrow tsv table": "CROSS JOIN LATERAL (SELECT id, document_id FROM exp_terms WHERE tsv @@ sel.tq) c)",
    "postings table": "CROSS JOIN LATERAL (SELECT chunk_id AS id, document_id FROM exp_postings p"
                      " WHERE p.lexeme = sel.lexeme) c)",
    # every selected lexeme in one bitmap scan of the chunk heap (each page visited once), then which lexemes each
    # matching chunk holds: measured 3.5x slower than the shipped SQL (every chunk's tsvector tested per lexeme),
    # kept as the record of a path tried
    "one heap scan": "JOIN (SELECT id, document_id, tsv FROM chunks WHERE tsv @@ (SELECT string_agg(tq::text, ' | ')"
                     "::tsquery FROM sel)) c ON c.tsv @@ sel.tq)",
}


def _after_best(rest: str) -> str:
    """What follows the shipped SQL's `best` CTE (the title CTE and the final SELECT)."""
    end = "ORDER BY ch.document_id, ch.cov DESC, ch.id)"
    after = rest.split(" best AS (", 1)[1]
    return after[after.index(end) + len(end):]


def document_postings_sql(shipped: str) -> str:
    """The shipped BM25 SQL with its documents scored from exp_doc_postings, and the chunk postings read for the
    window's documents only (the best chunk of each, for the coverage gate)."""
    head, rest = shipped.split(" m AS (", 1)
    ds = " ds AS (" + rest.split(" ds AS (", 1)[1].split(" top AS (", 1)[0]
    top = " top AS (" + rest.split(" top AS (", 1)[1].split(" best AS (", 1)[0]
    after_best = _after_best(rest)
    return (head + " dt AS (SELECT p.document_id, p.lexeme, p.tf::float8 AS tf FROM sel"
            " JOIN exp_doc_postings p ON p.lexeme = sel.lexeme),"
            " ddf AS (SELECT lexeme, count(*)::float8 AS ndf FROM dt GROUP BY lexeme)," + ds + top +
            " m AS (SELECT p.chunk_id AS id, p.document_id, sel.idf FROM sel JOIN exp_postings p"
            " ON p.lexeme = sel.lexeme AND p.document_id IN (SELECT document_id FROM top)),"
            " ch AS (SELECT id, document_id, sum(idf) AS cov FROM m GROUP BY id, document_id),"
            " best AS (SELECT DISTINCT ON (ch.document_id) ch.document_id, ch.id, ch.cov FROM ch"
            " ORDER BY ch.document_id, ch.cov DESC, ch.id)" + after_best)


def lean_document_postings_sql(shipped: str) -> str:
    """Document postings without the joins: lengths stored with the postings, documents joined for the window only
    (twice its size, then the status check), materialised CTEs, the best chunk through `= ANY(window)`."""
    head, rest = shipped.split(" m AS (", 1)
    after_best = _after_best(rest)
    return (head + " dt AS MATERIALIZED (SELECT p.document_id, p.lexeme, p.tf::float8 AS tf, p.dl FROM sel"
            " JOIN exp_doc_postings p ON p.lexeme = sel.lexeme),"
            " ddf AS (SELECT lexeme, ln(1 + (%(ndocs)s - count(*) + 0.5) / (count(*) + 0.5)) AS w FROM dt GROUP BY lexeme),"
            " ds AS (SELECT dt.document_id, sum(ddf.w * dt.tf * (%(k1)s + 1) / (dt.tf + %(k1)s * (1 - %(b)s + %(b)s"
            " * dt.dl / %(avgdl)s))) AS s FROM dt JOIN ddf USING (lexeme) GROUP BY dt.document_id),"
            " top0 AS MATERIALIZED (SELECT document_id, s FROM ds ORDER BY s DESC, document_id LIMIT %(kw_window)s * 2),"
            " top AS MATERIALIZED (SELECT top0.* FROM top0 JOIN documents d ON d.id = top0.document_id"
            " WHERE d.status = 'active' ORDER BY top0.s DESC, top0.document_id LIMIT %(kw_window)s),"
            " ch AS (SELECT p.chunk_id AS id, p.document_id, sum(sel.idf) AS cov FROM sel JOIN exp_postings p"
            " ON p.lexeme = sel.lexeme AND p.document_id = ANY(ARRAY(SELECT document_id FROM top)) GROUP BY 1, 2),"
            " best AS (SELECT DISTINCT ON (ch.document_id) ch.document_id, ch.id, ch.cov FROM ch"
            " ORDER BY ch.document_id, ch.cov DESC, ch.id)" + after_best)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kb_yaml")
    ap.add_argument("--long", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3, help="the first one warms the caches and is not timed")
    ap.add_argument("--explain", action="store_true", help="print each variant's plan for one paragraph query")
    a = ap.parse_args()

    from kb_assets.config import load_config
    from kb_assets.query.engine import Tuning, _connection_for, _Filters, _Searcher
    from kb_assets.query.metrics import load_queries
    from recall_latency import SHORT_PEP_QUERIES

    cfg = load_config(a.kb_yaml)
    conn = _connection_for(cfg)
    conn.autocommit = True
    try:
        conn.execute("SET maintenance_work_mem = '512MB'")
        t = time.time()
        conn.execute("CREATE TABLE exp_postings AS SELECT l AS lexeme, id AS chunk_id, document_id"
                     " FROM chunks, unnest(tsvector_to_array(tsv)) l")
        conn.execute("CREATE INDEX ON exp_postings (lexeme, document_id) INCLUDE (chunk_id)")
        conn.execute("VACUUM ANALYZE exp_postings")      # the visibility map: index-only scans
        rows, size = conn.execute("SELECT count(*), pg_size_pretty(pg_total_relation_size('exp_postings'))"
                                  " FROM exp_postings").fetchone()
        print(f"exp_postings: {rows} rows, {size} with its index, {time.time() - t:.1f} s")
        t = time.time()
        conn.execute("CREATE TABLE exp_doc_postings AS SELECT p.lexeme, p.document_id, count(*) AS tf, d.dl"
                     " FROM exp_postings p JOIN (SELECT id, octet_length(text)::int AS dl FROM documents) d"
                     " ON d.id = p.document_id GROUP BY p.lexeme, p.document_id, d.dl")
        conn.execute("CREATE INDEX ON exp_doc_postings (lexeme) INCLUDE (document_id, tf, dl)")
        conn.execute("VACUUM ANALYZE exp_doc_postings")
        rows, size = conn.execute("SELECT count(*), pg_size_pretty(pg_total_relation_size('exp_doc_postings'))"
                                  " FROM exp_doc_postings").fetchone()
        print(f"exp_doc_postings: {rows} rows, {size} with its index, {time.time() - t:.1f} s")
        t = time.time()
        conn.execute("CREATE TABLE exp_terms AS SELECT id, document_id, tsv FROM chunks")
        conn.execute("CREATE INDEX ON exp_terms USING gin (tsv)")
        conn.execute("VACUUM ANALYZE exp_terms")
        print("exp_terms: %s with its index (heap %s; the chunks heap %s), %.1f s" % (*conn.execute(
            "SELECT pg_size_pretty(pg_total_relation_size('exp_terms')), pg_size_pretty(pg_relation_size('exp_terms')),"
            " pg_size_pretty(pg_relation_size('chunks'))").fetchone(), time.time() - t))

        # the keyword SQL from the chunks (the fallback; before migration 014 it also computed the titles'
        # lexemes per query), and the shipped one
        searcher = _Searcher(conn, cfg.query, Tuning(keyword_document_terms=False), _Filters())
        searcher.prepare(True)
        shipped = searcher.keyword_sql()
        if SHIPPED not in shipped:
            sys.exit("the keyword SQL changed: update SHIPPED in this probe")
        terms = _Searcher(conn, cfg.query, Tuning(), _Filters())
        terms.prepare(True)
        sqls = {"chunks (fallback)": shipped, **{k: shipped.replace(SHIPPED, v) for k, v in VARIANTS.items()},
                "document postings": document_postings_sql(shipped),
                "document postings, lean": lean_document_postings_sql(shipped)}
        if "document_terms" in terms.keyword_sql():
            sqls["document_terms (shipped, migration 014)"] = terms.keyword_sql()
        else:
            print("document_terms not kept in this index yet (no refresh since migration 014): not measured")
        queries = list(SHORT_PEP_QUERIES) + list(load_queries(
            ROOT.parent / "shared" / "eval" / "peps_whatsnew" / "queries.jsonl").values())[:a.long]

        def run(sql: str, params: dict) -> tuple[list, float]:
            """Rows and milliseconds, jit and parallel workers off as recall() sets them."""
            with conn.transaction():
                conn.execute("SET LOCAL jit = off")
                conn.execute("SET LOCAL max_parallel_workers_per_gather = 0")
                t = time.perf_counter()
                rows = conn.execute(sql, params).fetchall()
                return rows, (time.perf_counter() - t) * 1000

        if a.explain:
            params = searcher.keyword_params(queries[len(SHORT_PEP_QUERIES) + 5])
            for name, sql in sqls.items():
                plan, _ = run("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                print(f"===== {name}\n" + "\n".join(r[0] for r in plan))
        times: dict[str, list[float]] = {k: [] for k in sqls}
        same = {k: 0 for k in sqls}
        for rnd in range(a.rounds):
            for q in queries:
                params = searcher.keyword_params(q)
                ref = None
                for name, sql in sqls.items():
                    got, ms = run(sql, params)
                    if rnd:
                        times[name].append(ms)
                    key = [(r[1], round(r[3], 9)) for r in got]
                    ref = key if ref is None else ref
                    same[name] += rnd == 0 and key == ref
        for name, v in times.items():
            print(f"{name:20s} p50 {st.median(v):6.1f} ms  p95 {sorted(v)[int(len(v) * .95)]:6.1f} ms  "
                  f"identical results {same[name]}/{len(queries)}")
    finally:
        conn.execute("DROP TABLE IF EXISTS exp_postings")
        conn.execute("DROP TABLE IF EXISTS exp_terms")
        conn.execute("DROP TABLE IF EXISTS exp_doc_postings")


if __name__ == "__main__":
    main()
