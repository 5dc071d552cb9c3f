"""refresh_query_stats (keyword statistics + document vectors): incremental vs the previous implementation, and
what its chunk triggers cost the chunk stage. Isolated from the rest of the pipeline.

    # full refresh, then 1% modified / renamed / deleted x rounds: old (git rev) vs new on the same database state
    /work/venv/bin/python bench/query_stats_bench.py refresh --docs 3000 [--rounds 2] [--old-rev 28b6095] [--trace]
    # the first refresh after a full index, old and new alternately on fresh copies (medians)
    /work/venv/bin/python bench/query_stats_bench.py full --docs 3000 [--repeat 5]
    # the chunk stage with and without the triggers of migration 004: a full load into an empty chunks table,
    # and a re-chunk of every document after a refresh (every chunk deleted: the delete trigger's worst case)
    /work/venv/bin/python bench/query_stats_bench.py triggers --docs 3000 [--repeat 3]

The corpus is bench/synth_corpus.py's (seeded), indexed once with the stand-in embedder at zero cost. "Old" is
kb_assets/pipeline/query_stats.py at --old-rev, run on a copy (CREATE DATABASE ... TEMPLATE) of the database the new
code then refreshes, so both see the same state; their results are compared (lexeme counts exactly, document
vectors to 1e-6). Backend CPU seconds (from /proc) are printed beside wall seconds: the machine is shared, and
the server's own CPU time is the steadier figure.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import pipeline_bench as pb  # noqa: E402
import synth_corpus  # noqa: E402

from kb_assets.embedding import FixedCostEmbedder  # noqa: E402
from kb_assets.pipeline import chunk_source, index_sources  # noqa: E402
from kb_assets.store.spaces import doc_vector_table, refresh_query_stats  # noqa: E402
from kb_assets.store.db import connect, embedded_url, migrate  # noqa: E402

OUT = HERE / "out"
CHUNK_TRIGGERS = ("kb_chunks_lock_ins", "kb_chunks_lock_upd", "kb_chunks_lock_del", "kb_chunks_deleted",
                  "kb_chunks_updated", "kb_chunks_truncated")


def old_module(rev: str):
    src = subprocess.run(["git", "-C", str(HERE.parent), "show", f"{rev}:kb_assets/pipeline/query_stats.py"],
                         check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="qsold-")) / "old_stats.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_stats", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def url_for(server_url: str, name: str) -> str:
    import psycopg.conninfo as ci

    params = ci.conninfo_to_dict(server_url)
    params["dbname"] = name
    return ci.make_conninfo(**params)


def clone(server_url: str, src: str, dst: str) -> str:
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{dst}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{dst}" TEMPLATE "{src}"')
    return url_for(server_url, dst)


def backend_cpu(conn) -> float:
    with open(f"/proc/{conn.info.backend_pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / 100.0


def timed(conn, fn) -> tuple[object, float, float]:
    c0, t0 = backend_cpu(conn), time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - t0, 3), round(backend_cpu(conn) - c0, 2)


class TracedConnection:
    """The connection, timing each statement (--trace)."""

    def __init__(self, conn):
        self._conn, self.log = conn, []

    def execute(self, query, *a, **k):
        t0 = time.perf_counter()
        cur = self._conn.execute(query, *a, **k)
        text = query if isinstance(query, str) else query.as_string(self._conn)
        self.log.append((round(time.perf_counter() - t0, 4), " ".join(text.split())[:110]))
        return cur

    def __getattr__(self, name):
        return getattr(self._conn, name)


def compare(a, b) -> dict:
    """Lexeme counts and query_stats equal; document vectors equal to 1e-6 (documents that still exist)."""
    lex = [dict(c.execute("SELECT lexeme, ndoc FROM lexeme_stats").fetchall()) for c in (a, b)]
    qs = [c.execute("SELECT n_chunks, n_lexemes FROM query_stats").fetchone() for c in (a, b)]
    table = doc_vector_table(a.execute("SELECT table_name FROM embedding_spaces WHERE activated_at IS NOT NULL")
                             .fetchone()[0])
    vec = [{r[0]: (r[1], r[2], r[3]) for r in c.execute(
        f"SELECT x.document_id, x.content_hash, x.n_chunks, x.embedding FROM {table} x"
        " JOIN documents d ON d.id = x.document_id")} for c in (a, b)]
    worst = 0.0
    same_keys = vec[0].keys() == vec[1].keys()
    for k in vec[0].keys() & vec[1].keys():
        (h1, n1, v1), (h2, n2, v2) = vec[0][k], vec[1][k]
        if (h1, n1) != (h2, n2):
            worst = float("inf")
        else:
            worst = max(worst, float(abs(v1.to_numpy() - v2.to_numpy()).max()))
    ok = lex[0] == lex[1] and qs[0] == qs[1] and same_keys and worst < 1e-6
    return {"equal": ok, "lexemes": len(lex[1]), "documents": len(vec[1]), "max_vector_diff": worst}


def cmd_refresh(args) -> dict:
    old = old_module(args.old_rev)
    work = pb.make_workdir(args.workdir)
    corpus = work / "corpus"
    if not corpus.exists():
        synth_corpus.generate(corpus, args.docs, seed=args.seed)
    server = embedded_url(work)
    url = pb.fresh_database(server, "qs")
    cfg, _ = pb.make_config(work, corpus, url, "worktree")
    emb = FixedCostEmbedder(0.0)
    conn = connect(url)
    t = time.perf_counter()
    index_sources(cfg, conn, embedder=emb, refresh_query=False)
    print(f"indexed {args.docs} docs in {time.perf_counter() - t:.1f} s:",
          conn.execute("SELECT count(*) FROM chunks").fetchone()[0], "chunks", flush=True)
    results = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "old_rev": args.old_rev, "runs": []}

    def measure(label: str) -> None:
        nonlocal conn
        conn.close()
        old_url = clone(server, "qs", "qs_old")
        with connect(old_url) as oc:
            old_out, old_wall, old_cpu = timed(oc, lambda: old.refresh_query_stats(oc))
            conn = connect(url)
            traced = TracedConnection(conn)
            new_out, new_wall, new_cpu = timed(conn, lambda: refresh_query_stats(traced if args.trace else conn))
            cmp = compare(oc, conn)
        r = {"scenario": label, "old_s": old_wall, "old_cpu_s": old_cpu, "new_s": new_wall, "new_cpu_s": new_cpu,
             "ratio": round(old_wall / new_wall, 1) if new_wall else None, "new": new_out, "compare": cmp}
        results["runs"].append(r)
        print(f"{label:<12} old {old_wall:6.3f} s (cpu {old_cpu:5.2f})   new {new_wall:6.3f} s (cpu {new_cpu:5.2f})"
              f"   x{r['ratio']}   mode {new_out['mode']:<11} docs changed {new_out.get('changed_documents', '-')}"
              f"   equal {cmp['equal']} (max vector diff {cmp['max_vector_diff']:.1e})", flush=True)
        for secs, text in traced.log:
            if secs >= 0.01:
                print(f"      {secs:6.3f} s  {text}")
        if not cmp["equal"]:
            raise AssertionError(f"{label}: old and new statistics differ: {cmp}")

    measure("full")
    rng = random.Random(f"qs:{args.seed}")
    pool = synth_corpus.list_docs(corpus)
    rng.shuffle(pool)
    n = max(1, round(args.docs * 0.01))
    for k in range(args.rounds):
        pick, pool = pool[:3 * n], pool[3 * n:]
        synth_corpus.modify_paragraphs(corpus, pick[:n], seed=args.seed * 1000 + k)
        synth_corpus.git_commit(corpus, f"modify {n}")
        index_sources(cfg, conn, embedder=emb, refresh_query=False)
        measure(f"modify-1%#{k + 1}")
        synth_corpus.rename_files(corpus, pick[n:2 * n])
        synth_corpus.git_commit(corpus, f"rename {n}")
        index_sources(cfg, conn, embedder=emb, refresh_query=False)
        measure(f"rename-1%#{k + 1}")
        synth_corpus.delete_files(corpus, pick[2 * n:])
        synth_corpus.git_commit(corpus, f"delete {n}")
        index_sources(cfg, conn, embedder=emb, refresh_query=False)
        measure(f"delete-1%#{k + 1}")
    conn.close()
    inc = [r for r in results["runs"] if r["scenario"] != "full"]
    results["summary"] = {
        "full_old_s": results["runs"][0]["old_s"], "full_new_s": results["runs"][0]["new_s"],
        "one_percent_old_median_s": statistics.median(r["old_s"] for r in inc) if inc else None,
        "one_percent_new_median_s": statistics.median(r["new_s"] for r in inc) if inc else None,
        "one_percent_new_max_s": max(r["new_s"] for r in inc) if inc else None}
    print(json.dumps(results["summary"]))
    write(results, f"query-stats-{args.docs}")
    if not args.workdir:
        pb.remove_workdir(work)
    return results


def cmd_full(args) -> dict:
    """The first (from scratch) refresh after a full index: old and new alternately, each on a fresh copy."""
    old = old_module(args.old_rev)
    work = pb.make_workdir(args.workdir)
    corpus = work / "corpus"
    if not corpus.exists():
        synth_corpus.generate(corpus, args.docs, seed=args.seed)
    server = embedded_url(work)
    url = pb.fresh_database(server, "qs")
    cfg, _ = pb.make_config(work, corpus, url, "worktree")
    with connect(url) as conn:
        index_sources(cfg, conn, embedder=FixedCostEmbedder(0.0), refresh_query=False)
    results = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "old_rev": args.old_rev, "runs": []}
    for rep in range(args.repeat):
        for which in (("old", "new") if rep % 2 == 0 else ("new", "old")):
            with connect(clone(server, "qs", "qs_f")) as c:
                c.execute("CHECKPOINT")
                fn = old.refresh_query_stats if which == "old" else refresh_query_stats
                out, wall, cpu = timed(c, lambda: fn(c))
            results["runs"].append({"which": which, "wall_s": wall, "backend_cpu_s": cpu, "out": out})
            print(f"#{rep + 1} {which}  {wall:6.3f} s  backend cpu {cpu:5.2f} s  {out}", flush=True)
    summary = {w: {k: statistics.median(r[k] for r in results["runs"] if r["which"] == w)
                   for k in ("wall_s", "backend_cpu_s")} for w in ("old", "new")}
    results["summary"] = summary
    print(json.dumps(summary))
    write(results, f"query-stats-full-{args.docs}")
    if not args.workdir:
        pb.remove_workdir(work)
    return results


def cmd_triggers(args) -> dict:
    """Chunk stage (chunk_source) on a copy of an indexed database, with and without migration 004's triggers."""
    work = pb.make_workdir(args.workdir)
    corpus = work / "corpus"
    if not corpus.exists():
        synth_corpus.generate(corpus, args.docs, seed=args.seed)
    server = embedded_url(work)
    url = pb.fresh_database(server, "qs")
    cfg, _ = pb.make_config(work, corpus, url, "worktree")
    emb = FixedCostEmbedder(0.0)
    with connect(url) as conn:
        index_sources(cfg, conn, embedder=emb, refresh_query=False)
        refresh_query_stats(conn)      # the watermark is set: deleted chunks are recorded by the trigger
    results = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "runs": []}
    for rep in range(args.repeat):
        for case in ("full-load", "rechunk-all"):
            for triggers in ((True, False) if rep % 2 == 0 else (False, True)):
                u = clone(server, "qs", "qs_t")
                with connect(u) as c:
                    if not triggers:
                        for name in CHUNK_TRIGGERS:
                            c.execute(f"DROP TRIGGER IF EXISTS {name} ON chunks")
                    if case == "full-load":
                        c.execute("TRUNCATE chunks")
                    c.execute("UPDATE documents SET chunked_hash = NULL")
                    c.execute("VACUUM ANALYZE chunks")
                    stats, wall, cpu = timed(c, lambda: chunk_source(
                        c, pb.SOURCE_KEY, max_tokens=emb.max_tokens, count_tokens=emb.count_tokens))
                    deltas = c.execute("SELECT (SELECT count(*) FROM lexeme_deltas),"
                                       " (SELECT count(*) FROM chunk_changes)").fetchone()
                    ref = None
                    if triggers:
                        ref, rwall, _ = timed(c, lambda: refresh_query_stats(c))
                r = {"case": case, "triggers": triggers, "wall_s": wall, "backend_cpu_s": cpu,
                     "chunks_written": stats.chunks_written, "chunks_removed": stats.chunks_removed,
                     "delta_rows": deltas, "refresh": ref}
                results["runs"].append(r)
                print(f"#{rep + 1} {case:<12} triggers {'on ' if triggers else 'off'}  chunk stage {wall:6.3f} s"
                      f"  backend cpu {cpu:5.2f} s  written {stats.chunks_written} removed {stats.chunks_removed}"
                      f"  delta rows {deltas}" + (f"  then refresh {ref['seconds']} s ({ref['mode']})" if ref else ""),
                      flush=True)
    summary = {}
    for case in ("full-load", "rechunk-all"):
        for key in ("wall_s", "backend_cpu_s"):
            on = [r[key] for r in results["runs"] if r["case"] == case and r["triggers"]]
            off = [r[key] for r in results["runs"] if r["case"] == case and not r["triggers"]]
            summary[f"{case} {key} median on/off"] = (statistics.median(on), statistics.median(off),
                                                      round(statistics.median(on) - statistics.median(off), 3))
    results["summary"] = summary
    print(json.dumps(summary, indent=1))
    write(results, f"query-stats-triggers-{args.docs}")
    if not args.workdir:
        pb.remove_workdir(work)
    return results


def write(results: dict, stem: str) -> None:
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{stem}.json"
    path.write_text(json.dumps(results, indent=1, default=str))
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("refresh")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--old-rev", default="28b6095", help="git revision of the previous stats.py")
    p.add_argument("--trace", action="store_true", help="print the new refresh's statements over 10 ms")
    p.set_defaults(fn=cmd_refresh)
    p = sub.add_parser("full")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--old-rev", default="28b6095", help="git revision of the previous stats.py")
    p.set_defaults(fn=cmd_full)
    p = sub.add_parser("triggers")
    p.add_argument("--repeat", type=int, default=3)
    p.set_defaults(fn=cmd_triggers)
    for p in sub.choices.values():
        p.add_argument("--docs", type=int, default=3000)
        p.add_argument("--seed", type=int, default=7)
        p.add_argument("--workdir", help="keep the corpus and database here (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    args.fn(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
