"""The indexing pipeline on a synthetic corpus, with an embedder of fixed cost per text (isolates the pipeline).

    # full index, unchanged re-runs (direct and through Dagster), then 1% modified / renamed / deleted, x rounds
    /work/venv/bin/python bench/pipeline_bench.py scenarios --docs 3000 [--rounds 2] [--cost 0.002]
    # peak RSS of a full index in a child process, per corpus size (target: 40K-chunk run <= 1.2 x 4K-chunk run)
    /work/venv/bin/python bench/pipeline_bench.py rss --docs 300 3000
    # where the time of a full run goes (pyinstrument if installed, else cProfile; --sql: time per SQL statement)
    /work/venv/bin/python bench/pipeline_bench.py profile --docs 3000 [--sql]
    # with the real local model on 20 documents: the unchanged re-run (fresh process) never imports torch
    /work/venv/bin/python bench/pipeline_bench.py model-check
    # measured alternatives (bench-only patches, not the product), e.g. on older code:
    /work/venv/bin/python bench/pipeline_bench.py scenarios --docs 3000 --what-if clustered-vectors

Each invocation builds the corpus with bench/synth_corpus.py (seeded: the same files every time) in a fresh
temporary folder and indexes it into a fresh embedded PostgreSQL (kb_assets.store.db.embedded_url) as one source
(kind code, auto_kind: markdown files are docs, the rest code). The embedder is FixedCostEmbedder
(cost_per_text=0.002 s, the local model's tokenizer and 256-token window, no model), so

    overhead = wall time of the stage functions - texts embedded x cost_per_text

Results and their reading: docs/BENCHMARKS.md, "## pipeline". Figures are printed as a table and written as JSON to bench/out/ (gitignored). Every count the targets depend on
is asserted: the script fails loudly rather than report a wrong figure.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

_T0 = time.perf_counter()
import synth_corpus  # noqa: E402

from kb_assets.config import parse_config  # noqa: E402
from kb_assets.embedding import FixedCostEmbedder  # noqa: E402
from kb_assets.pipeline import index_sources  # noqa: E402
from kb_assets.store.db import connect, embedded_url, migrate  # noqa: E402

IMPORT_SECONDS = round(time.perf_counter() - _T0, 3)
OUT = HERE / "out"
SOURCE_KEY = "bench"
HEAVY_MODULES = ("torch", "sentence_transformers", "transformers")


class CountingEmbedder(FixedCostEmbedder):
    """FixedCostEmbedder that counts calls (the stand-in already counts texts)."""

    centroids = None        # what-if "clustered-vectors": vectors near one of 256 fixed centroids

    def __init__(self, cost: float):
        super().__init__(cost_per_text=cost)
        self.calls = 0

    def embed_documents(self, texts, token_counts=None):
        self.calls += 1
        return super().embed_documents(texts, token_counts)

    def vector(self, text: str):
        if CountingEmbedder.centroids is None:
            return super().vector(text)
        import hashlib

        import numpy as np

        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8], "little")
        rng = np.random.default_rng(seed)
        c = CountingEmbedder.centroids[seed % len(CountingEmbedder.centroids)]
        v = (c + 0.5 * rng.standard_normal(self.dimension)).astype(np.float32)
        return v / np.linalg.norm(v)


# --- setup -------------------------------------------------------------------------------------------------

def make_workdir(keep: str | None) -> Path:
    if keep:
        p = Path(keep)
        p.mkdir(parents=True, exist_ok=True)
        return p
    # pgserver needs a short path (unix socket path limit ~107 bytes)
    return Path(tempfile.mkdtemp(prefix="kbb-", dir="/tmp"))


def source_dict(corpus: Path, content: str) -> dict:
    return {"key": SOURCE_KEY, "kind": "code", "root": str(corpus), "auto_kind": True, "content": content}


def make_config(work: Path, corpus: Path, url: str, content: str):
    data = {"data_dir": str(work / "data"), "database_url": url, "sources": [source_dict(corpus, content)]}
    path = work / "kb.yaml"
    import yaml

    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return parse_config(data, path=str(path), base_dir=str(work)), path


def remove_workdir(work: Path) -> None:
    """Stop this process's embedded PostgreSQL under `work` (pgserver would stop it at exit, but not once its
    folder is gone), then delete the folder."""
    from kb_assets.store import db

    server = db._servers.pop(str((work / "pg").resolve()), None)
    if server is not None:
        server.cleanup()     # cleanup_mode "stop": stops the server when this is the last handle
    shutil.rmtree(work, ignore_errors=True)


def fresh_database(server_url: str, name: str) -> str:
    import psycopg
    import psycopg.conninfo as ci

    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    params = ci.conninfo_to_dict(server_url)
    params["dbname"] = name
    url = ci.make_conninfo(**params)
    with connect(url, register=False) as conn:
        migrate(conn)
    return url


# --- measurements ----------------------------------------------------------------------------------------------

def snapshot(conn) -> dict:
    """Independent view of the index (plain SQL): per document path, its chunk hashes."""
    by_path: dict[str, list[str]] = {}
    for path, h in conn.execute(
        "SELECT d.path, c.chunk_hash FROM chunks c JOIN documents d ON d.id = c.document_id"
        " WHERE d.source_key = %s ORDER BY d.path, c.ordinal", (SOURCE_KEY,)):
        by_path.setdefault(path, []).append(h)
    active = {r[0] for r in conn.execute(
        "SELECT path FROM documents WHERE source_key = %s AND status = 'active'", (SOURCE_KEY,))}
    return {"by_path": by_path, "active": active,
            "hashes": {h for hs in by_path.values() for h in hs},
            "chunks": sum(len(v) for v in by_path.values())}


def vector_count(conn) -> int:
    from kb_assets.store import spaces

    table = spaces.space_table(conn, FixedCostEmbedder.model, 384)
    if table is None:
        return 0
    return conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]


def run_direct(cfg, conn, cost: float, label: str) -> dict:
    emb = CountingEmbedder(cost)
    started = time.perf_counter()
    runs = index_sources(cfg, conn, embedder=emb)
    wall = time.perf_counter() - started
    r = runs[SOURCE_KEY]
    standin = emb.texts_embedded * cost
    return {
        "scenario": label, "wall_s": round(wall, 3), "texts_embedded": emb.texts_embedded,
        "embed_calls": emb.calls, "standin_s": round(standin, 3), "overhead_s": round(wall - standin, 3),
        "documents_s": r.documents.seconds, "chunks_s": r.chunks.seconds, "embeddings_s": r.embeddings.seconds,
        "embeddings_work_s": round(r.embeddings.seconds - standin, 3),
        # the pipeline proper: documents -> chunks -> embeddings, minus the stand-in's cost
        # (wall time less the search-index stage: everything outside the stages' clocks counts here)
        "pipeline_overhead_s": round(wall - r.search_index.seconds - standin, 3),
        # the search-index stage: HNSW build (after a bulk load), activation, refresh_query_stats
        "search_index_s": r.search_index.seconds,
        "vector_index_s": r.search_index.vector_index_seconds,
        "query_stats_s": float((r.search_index.query_stats or {}).get("seconds") or 0.0),
        # outside the stages' own clocks
        "other_s": round(wall - r.documents.seconds - r.chunks.seconds - r.embeddings.seconds
                         - r.search_index.seconds, 3),
        "documents": {k: v for k, v in asdict(r.documents).items() if k not in ("skip_reasons", "source")},
        "chunks": {k: v for k, v in asdict(r.chunks).items() if k != "source"},
        "embed_stats": {k: v for k, v in asdict(r.embeddings).items() if k != "source"},
        "skip_reasons": r.documents.skip_reasons,
        "heavy_modules_loaded": [m for m in HEAVY_MODULES if m in sys.modules],
    }


def hwm_kb() -> int:
    """Peak RSS of this process's own memory since exec (VmHWM). ru_maxrss is not used for the figures: Linux
    carries the forking parent's peak over exec into it (a child of a 100 MB parent reports >= 100 MB)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


# --- what-ifs: measured alternatives to the shipped code (never the product's figures) ----------------------
# The earlier what-ifs (cached token counter, async commit, HNSW built after the bulk load with room in
# maintenance_work_mem, batched chunk swaps, keyset-paginated missing vectors) are the shipped pipeline now;
# docs/BENCHMARKS.md keeps their before/after figures.

WHAT_IFS = ("clustered-vectors", "overlapped-write")


def apply_what_ifs(names: list[str]) -> None:
    """Patch this process to measure an alternative without editing kb_assets.

    clustered-vectors: the stand-in's vectors lie near one of 256 fixed centroids (cosine ~0.8 within a
                   cluster) instead of uniformly on the sphere: HNSW work on vectors shaped more like real
                   embeddings (uniform random 384-d vectors are HNSW's worst case).
    overlapped-write: the embedding stage starts batch N+1's model call before writing batch N (the order
                   before issue 12's "≤ 1 batch redone after kill -9"): what serialising the write costs.
    """
    for n in names:
        if n not in WHAT_IFS:
            raise SystemExit(f"unknown what-if {n!r}: use {', '.join(WHAT_IFS)}")
    if "clustered-vectors" in names:
        import numpy as np

        CountingEmbedder.centroids = np.random.default_rng(12345).standard_normal((256, 384)).astype(np.float32)
    if "overlapped-write" in names:
        from kb_assets.pipeline import embeddings

        embeddings.WRITE_BEFORE_NEXT_CALL = False


# --- Dagster ---------------------------------------------------------------------------------------------------

class DagsterHarness:
    """The real assets (kb_documents, kb_chunks, kb_embeddings, kb_search_index) in a job, with the resource's embedder swapped
    for the stand-in; one execute_in_process per partition on an ephemeral instance."""

    def __init__(self, kb_yaml: Path, cost: float):
        os.environ["KB_CONFIG"] = str(kb_yaml)             # partitions are read from the config at import
        home = kb_yaml.parent / "dagster_home"              # removed with the work folder
        home.mkdir(exist_ok=True)
        os.environ.setdefault("DAGSTER_HOME", str(home))
        t = time.perf_counter()
        import dagster as dg

        from kb_assets.defs.assets import (kb_chunks, kb_chunks_embeddings_and_signposts, kb_documents,
                                           kb_embeddings, kb_search_index)
        from kb_assets.defs.resources import KbResource

        self.import_s = round(time.perf_counter() - t, 3)
        harness = self

        class BenchKb(KbResource):
            def embedder(self):
                return harness.embedder

        self.cost = cost
        self.embedder = CountingEmbedder(cost)
        # kb_chunks and kb_embeddings are two assets of a three-asset step (with kb_signposts): the job selects them
        assets = [kb_documents, kb_chunks_embeddings_and_signposts, kb_search_index]
        job = dg.define_asset_job("bench_index", selection=[kb_documents.key, kb_chunks, kb_embeddings,
                                                            kb_search_index.key],
                                  partitions_def=kb_documents.partitions_def)
        self.defs = dg.Definitions(assets=assets, jobs=[job],
                                   resources={"kb": BenchKb(config_path=str(kb_yaml))})
        self.job = self.defs.resolve_job_def("bench_index")
        self.dg = dg

    def run(self, label: str) -> dict:
        dg = self.dg
        self.embedder = CountingEmbedder(self.cost)
        instance = dg.DagsterInstance.ephemeral()
        started = time.perf_counter()
        result = self.job.execute_in_process(
            partition_key=SOURCE_KEY, instance=instance,
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}})
        wall = time.perf_counter() - started
        check(result.success, "dagster run failed")
        asset_s = 0.0
        per = {}
        for ev in result.get_asset_materialization_events():
            mat = ev.event_specific_data.materialization
            secs = float(mat.metadata["seconds"].value)     # kb_search_index's includes refresh_query_stats
            per[mat.asset_key.to_user_string()] = secs
            asset_s += secs
        instance.dispose()
        return {"scenario": label, "wall_s": round(wall, 3), "asset_work_s": round(asset_s, 3),
                "dagster_overhead_s": round(wall - asset_s, 3), "per_asset_s": per,
                "texts_embedded": self.embedder.texts_embedded, "embed_calls": self.embedder.calls,
                "heavy_modules_loaded": [m for m in HEAVY_MODULES if m in sys.modules]}


# --- scenarios ---------------------------------------------------------------------------------------------------

def cmd_scenarios(args) -> dict:
    apply_what_ifs(args.what_if)
    work = make_workdir(args.workdir)
    corpus = work / "corpus"
    results: dict = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "docs": args.docs,
                     "cost_per_text": args.cost, "content": args.content, "seed": args.seed, "size": args.size,
                     "import_s": IMPORT_SECONDS, "machine": machine_note(), "what_if": args.what_if,
                     "runs": [], "dagster": []}
    t = time.perf_counter()
    results["corpus"] = synth_corpus.generate(corpus, args.docs, seed=args.seed, size=args.size)
    results["corpus"]["generate_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    url = embedded_url(work)
    results["db_start_s"] = round(time.perf_counter() - t, 2)
    url = fresh_database(url, "bench")
    cfg, kb_yaml = make_config(work, corpus, url, args.content)
    conn = connect(url)

    def record(r: dict) -> dict:
        results["runs"].append(r)
        print_row(r)
        return r

    print_header()
    # 1. full index
    full = record(run_direct(cfg, conn, args.cost, "full"))
    snap = snapshot(conn)
    n_chunks, n_hashes = snap["chunks"], len(snap["hashes"])
    check(full["texts_embedded"] == n_hashes, f"full run embedded {full['texts_embedded']} != {n_hashes} hashes")
    check(vector_count(conn) == n_hashes, "vectors != distinct chunk hashes after the full run")
    full["chunks_total"] = n_chunks
    full["distinct_hashes"] = n_hashes
    full["overhead_s_per_1000_chunks"] = round(full["overhead_s"] / n_chunks * 1000, 3)
    full["pipeline_chunks_per_s"] = round(n_chunks / full["overhead_s"], 1) if full["overhead_s"] > 0 else None
    full["pipeline_overhead_s_per_1000_chunks"] = round(full["pipeline_overhead_s"] / n_chunks * 1000, 3)
    full["search_index_s_per_1000_chunks"] = round(full["search_index_s"] / n_chunks * 1000, 3)
    results["full"] = full

    # 2. unchanged re-runs, direct
    for k in range(args.rounds + 1):
        r = record(run_direct(cfg, conn, args.cost, f"unchanged#{k + 1}"))
        check(r["embed_calls"] == 0 and r["texts_embedded"] == 0, "unchanged re-run called the embedder")
        check(not r["heavy_modules_loaded"], f"model libraries imported: {r['heavy_modules_loaded']}")
        check(r["chunks"]["documents_chunked"] == 0, "unchanged re-run re-chunked documents")

    # 3. unchanged re-runs through Dagster
    if not args.no_dagster:
        h = DagsterHarness(kb_yaml, args.cost)
        results["dagster_import_s"] = h.import_s
        for k in range(args.rounds + 1):
            r = h.run(f"dagster-unchanged#{k + 1}")
            check(r["embed_calls"] == 0, "unchanged Dagster run called the embedder")
            check(not r["heavy_modules_loaded"], f"model libraries imported: {r['heavy_modules_loaded']}")
            results["dagster"].append(r)
            print(f"  {r['scenario']:<22} wall {r['wall_s']:7.3f} s  asset work {r['asset_work_s']:6.3f} s  "
                  f"Dagster overhead {r['dagster_overhead_s']:6.3f} s  per asset {r['per_asset_s']}")

    # 4. 1% modified / renamed / deleted, `rounds` times on disjoint documents
    rng = random.Random(f"scenarios:{args.seed}")
    pool = synth_corpus.list_docs(corpus)
    rng.shuffle(pool)
    n = max(1, round(args.docs * 0.01))
    for k in range(args.rounds):
        pick, pool = pool[: 3 * n], pool[3 * n:]
        to_modify, to_rename, to_delete = pick[:n], pick[n:2 * n], pick[2 * n:]

        before = snapshot(conn)
        synth_corpus.modify_paragraphs(corpus, to_modify, seed=args.seed * 1000 + k)
        synth_corpus.git_commit(corpus, f"modify {n}")
        r = run_direct(cfg, conn, args.cost, f"modify-1%#{k + 1}")
        after = snapshot(conn)
        new_hashes = after["hashes"] - before["hashes"]
        per_doc = {p: sum(1 for h in set(after["by_path"].get(p, [])) if h not in before["hashes"])
                   for p in to_modify}
        outside = {h for p, hs in after["by_path"].items() if p not in to_modify for h in hs} - before["hashes"]
        r.update(expected_embedded=len(new_hashes), docs_touched=n,
                 new_chunks_per_doc=sorted(per_doc.values()),
                 chunks_in_touched_docs=sum(len(after["by_path"].get(p, [])) for p in to_modify))
        record(r)
        check(r["texts_embedded"] == len(new_hashes),
              f"modify: embedded {r['texts_embedded']} != {len(new_hashes)} new distinct chunk hashes")
        check(not outside, f"modify: {len(outside)} new hashes outside the modified documents")
        check(r["documents"]["changed"] == n, f"modify: {r['documents']['changed']} documents changed, not {n}")
        check(vector_count(conn) == len(after["hashes"]), "modify: vectors != distinct hashes (orphans kept?)")

        before = after
        moved = synth_corpus.rename_files(corpus, to_rename)
        synth_corpus.git_commit(corpus, f"rename {n}")
        r = run_direct(cfg, conn, args.cost, f"rename-1%#{k + 1}")
        after = snapshot(conn)
        r.update(expected_embedded=0, docs_touched=n)
        record(r)
        check(r["texts_embedded"] == 0, f"rename: embedded {r['texts_embedded']} texts (expected 0)")
        for old, new in moved.items():
            check(old not in after["active"] and new in after["active"], f"rename: {old} -> {new} not reflected")
            check(after["by_path"][new] == before["by_path"][old], f"rename: chunks of {new} differ from {old}")

        before = after
        synth_corpus.delete_files(corpus, to_delete)
        synth_corpus.git_commit(corpus, f"delete {n}")
        r = run_direct(cfg, conn, args.cost, f"delete-1%#{k + 1}")
        after = snapshot(conn)
        gone_hashes = before["hashes"] - after["hashes"]
        r.update(expected_embedded=0, docs_touched=n, expected_orphans=len(gone_hashes))
        record(r)
        check(r["texts_embedded"] == 0, "delete: embedded texts")
        check(all(p not in after["active"] and p not in after["by_path"] for p in to_delete),
              "delete: deleted documents or their chunks are still there")
        check(r["embed_stats"]["orphans_removed"] == len(gone_hashes),
              f"delete: {r['embed_stats']['orphans_removed']} vectors removed, expected {len(gone_hashes)}")
        check(vector_count(conn) == len(after["hashes"]), "delete: vectors != distinct hashes")

    # unchanged once more at the end (after git history grew)
    r = record(run_direct(cfg, conn, args.cost, "unchanged-end"))
    check(r["texts_embedded"] == 0, "final unchanged run embedded texts")
    conn.close()
    results["summary"] = summarize(results)
    write_results(results, f"pipeline-{args.docs}-{args.content}" + "".join(f"-{w}" for w in args.what_if))
    print_summary(results["summary"])
    if not args.workdir:
        remove_workdir(work)
    return results


def summarize(res: dict) -> dict:
    full = res["full"]
    unchanged = [r["wall_s"] for r in res["runs"] if r["scenario"].startswith("unchanged")]
    s = {
        "chunks": full["chunks_total"], "distinct_hashes": full["distinct_hashes"],
        "full_wall_s": full["wall_s"], "full_texts": full["texts_embedded"], "full_standin_s": full["standin_s"],
        "full_overhead_s": full["overhead_s"], "overhead_s_per_1000_chunks": full["overhead_s_per_1000_chunks"],
        "full_pipeline_overhead_s": full["pipeline_overhead_s"],
        "pipeline_overhead_s_per_1000_chunks": full["pipeline_overhead_s_per_1000_chunks"],
        "full_search_index_s": full["search_index_s"], "full_vector_index_s": full["vector_index_s"],
        "full_query_stats_s": full["query_stats_s"],
        "pipeline_chunks_per_s": full["pipeline_chunks_per_s"],
        "unchanged_wall_s": unchanged, "unchanged_median_s": statistics.median(unchanged),
    }
    if res["dagster"]:
        s["dagster_unchanged_wall_s"] = [r["wall_s"] for r in res["dagster"]]
        s["dagster_unchanged_asset_work_s"] = [r["asset_work_s"] for r in res["dagster"]]
        s["dagster_overhead_s"] = [r["dagster_overhead_s"] for r in res["dagster"]]
        # the asset "seconds" leave out orphan removal / activation: also compare with the direct re-runs
        s["dagster_wall_minus_direct_median_s"] = [round(r["wall_s"] - statistics.median(unchanged), 3)
                                                   for r in res["dagster"]]
    for kind in ("modify", "rename", "delete"):
        rs = [r for r in res["runs"] if r["scenario"].startswith(kind)]
        s[f"{kind}_wall_s"] = [r["wall_s"] for r in rs]
        s[f"{kind}_texts"] = [r["texts_embedded"] for r in rs]
        if kind == "modify":
            s["modify_expected"] = [r["expected_embedded"] for r in rs]
    s["targets"] = {
        "pipeline stages overhead <= 0.33 s / 1000 chunks": s["pipeline_overhead_s_per_1000_chunks"] <= 0.33,
        "whole run incl. search index <= 0.33 s / 1000 chunks": s["overhead_s_per_1000_chunks"] <= 0.33,
        "unchanged: 0 calls, no model, <= 1.5 s": max(unchanged) <= 1.5,
        "modify embeds exactly the new hashes": s["modify_texts"] == s["modify_expected"],
        "rename embeds 0": all(x == 0 for x in s["rename_texts"]),
    }
    return s


# --- RSS -----------------------------------------------------------------------------------------------------

def cmd_child(args) -> None:
    """Full index of an existing corpus into an existing database (run in a child process by `rss`)."""
    apply_what_ifs(args.what_if)
    cfg = parse_config({"database_url": args.db_url, "sources": [source_dict(Path(args.corpus), args.content)]},
                       path="<bench>", base_dir=str(Path(args.corpus).parent))
    conn = connect(args.db_url)
    rss_before = hwm_kb()
    r = run_direct(cfg, conn, args.cost, "full")
    r["chunks_total"] = r["chunks"]["chunks_total"]
    r["rss_after_imports_kb"] = rss_before
    r["max_rss_kb"] = hwm_kb()
    r["ru_maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r["import_s"] = IMPORT_SECONDS
    print("RESULT " + json.dumps(r))


def run_child(argv: list[str]) -> tuple[dict, int]:
    """Run this script as a child under GNU time; returns (its RESULT json, its peak RSS in KB as /usr/bin/time
    reports it). /usr/bin/time is a tiny parent, so its figure is not inflated by this (larger) process's
    peak the way our own wait4 ru_maxrss would be."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", tf.name, sys.executable, __file__, *argv],
                           stdout=subprocess.PIPE, text=True)
        if p.returncode != 0:
            raise SystemExit(f"child failed ({p.returncode}): {p.stdout[-2000:]}")
        time_kb = int(tf.read().strip().splitlines()[-1])
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[7:]), time_kb


def cmd_rss(args) -> dict:
    work = make_workdir(args.workdir)
    server = embedded_url(work)
    results = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "cost_per_text": args.cost,
               "machine": machine_note(), "runs": []}
    print(f"{'docs':>6} {'chunks':>7} {'texts':>7} {'wall s':>8} {'VmHWM MB':>9} {'GNU time MB':>11}"
          f" {'after imports MB':>17} {'ru_maxrss MB':>12}")
    for docs in args.docs:
        corpus = work / f"corpus-{docs}"
        if not corpus.exists():
            synth_corpus.generate(corpus, docs, seed=args.seed, size=args.size)
        for k in range(args.rounds):
            url = fresh_database(server, f"rss_{docs}_{k}")
            r, time_kb = run_child(["_child", "--corpus", str(corpus), "--db-url", url, "--cost", str(args.cost),
                                     "--content", args.content, "--what-if", ",".join(args.what_if)])
            row = {"docs": docs, "round": k + 1, "chunks": r["chunks_total"], "texts": r["texts_embedded"],
                   "wall_s": r["wall_s"], "overhead_s": r["overhead_s"],
                   "child_max_rss_mb": round(r["max_rss_kb"] / 1024, 1), "gnu_time_max_rss_mb": round(time_kb / 1024, 1),
                   "rss_after_imports_mb": round(r["rss_after_imports_kb"] / 1024, 1),
                   "ru_maxrss_mb": round(r["ru_maxrss_kb"] / 1024, 1)}
            results["runs"].append(row)
            print(f"{docs:>6} {row['chunks']:>7} {row['texts']:>7} {row['wall_s']:>8.1f} "
                  f"{row['child_max_rss_mb']:>9.1f} {row['gnu_time_max_rss_mb']:>11.1f} "
                  f"{row['rss_after_imports_mb']:>17.1f} {row['ru_maxrss_mb']:>12.1f}", flush=True)
    if len(args.docs) >= 2:
        small, large = min(args.docs), max(args.docs)
        peak = lambda d: max(r["child_max_rss_mb"] for r in results["runs"] if r["docs"] == d)  # noqa: E731
        ratio = peak(large) / peak(small)
        results["ratio_large_over_small"] = round(ratio, 3)
        results["target_ratio_le_1.2"] = ratio <= 1.2
        print(f"peak RSS {large} docs / {small} docs = {ratio:.3f} (target <= 1.2: "
              f"{'PASS' if ratio <= 1.2 else 'FAIL'})")
    write_results(results, "rss")
    if not args.workdir:
        remove_workdir(work)
    return results


# --- the real local model: an unchanged re-run never loads it -------------------------------------------------

def cmd_model_child(args) -> None:
    """Index with the real LocalEmbedder (all-MiniLM-L6-v2); report whether torch got imported."""
    from kb_assets.embedding import LocalEmbedder

    class Counting(LocalEmbedder):
        calls = 0
        texts = 0

        def embed_documents(self, texts, token_counts=None):
            Counting.calls += 1
            Counting.texts += len(texts)
            return super().embed_documents(texts, token_counts)

    cfg = parse_config({"database_url": args.db_url, "sources": [source_dict(Path(args.corpus), args.content)]},
                       path="<bench>", base_dir=str(Path(args.corpus).parent))
    conn = connect(args.db_url)
    emb = Counting()
    started = time.perf_counter()
    index_sources(cfg, conn, embedder=emb)
    print("RESULT " + json.dumps({"wall_s": round(time.perf_counter() - started, 3), "embed_calls": Counting.calls,
                                  "texts_embedded": Counting.texts, "model_loaded": emb.loaded,
                                  "heavy_modules_loaded": [m for m in HEAVY_MODULES if m in sys.modules]}))


def cmd_model_check(args) -> dict:
    """Small corpus: a full index with the real model in one child, then an unchanged re-run in a fresh child."""
    work = make_workdir(args.workdir)
    corpus = work / "corpus"
    synth_corpus.generate(corpus, args.docs, seed=args.seed, size=args.size)
    url = fresh_database(embedded_url(work), "model_check")
    base = ["_model_child", "--corpus", str(corpus), "--db-url", url, "--content", args.content]
    full, full_rss = run_child(base)       # GNU time's peak RSS (KB)
    again, again_rss = run_child(base)
    res = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "docs": args.docs,
           "full": {**full, "max_rss_mb": round(full_rss / 1024, 1)},
           "unchanged": {**again, "max_rss_mb": round(again_rss / 1024, 1)}}
    print(json.dumps(res, indent=2))
    check(full["texts_embedded"] > 0 and full["model_loaded"], "the full run did not use the model")
    check(again["embed_calls"] == 0 and not again["model_loaded"] and not again["heavy_modules_loaded"],
          "the unchanged re-run loaded the model or called it")
    write_results(res, "model-check")
    if not args.workdir:
        remove_workdir(work)
    return res


# --- profile -------------------------------------------------------------------------------------------------

class SqlTimer:
    """Wall time the client spends per SQL statement shape, per COPY and per COMMIT (psycopg patched in place)."""

    def __init__(self):
        import collections
        from contextlib import contextmanager

        import psycopg

        self.totals: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
        timer = self
        orig_execute, orig_copy, orig_tx = psycopg.Connection.execute, psycopg.Cursor.copy, psycopg.Connection.transaction

        def label(conn, query) -> str:
            q = query if isinstance(query, str) else query.as_string(conn)
            return " ".join(q.split())[:90]

        def execute(self, query, *a, **k):
            t = time.perf_counter()
            try:
                return orig_execute(self, query, *a, **k)
            finally:
                timer.add(label(self, query), time.perf_counter() - t)

        @contextmanager
        def copy(self, statement, *a, **k):
            t = time.perf_counter()
            with orig_copy(self, statement, *a, **k) as c:
                yield c
            timer.add(label(self.connection, statement), time.perf_counter() - t)

        @contextmanager
        def transaction(self, *a, **k):
            with orig_tx(self, *a, **k) as tx:
                yield tx
                t = time.perf_counter()
            timer.add("COMMIT", time.perf_counter() - t)

        psycopg.Connection.execute, psycopg.Cursor.copy, psycopg.Connection.transaction = execute, copy, transaction

    def add(self, key: str, seconds: float) -> None:
        e = self.totals[key]
        e[0] += 1
        e[1] += seconds

    def report(self) -> list[dict]:
        rows = sorted(self.totals.items(), key=lambda kv: -kv[1][1])
        return [{"sql": k, "calls": n, "seconds": round(s, 3)} for k, (n, s) in rows]


def cmd_profile(args) -> None:
    apply_what_ifs(args.what_if)
    work = make_workdir(args.workdir)
    corpus = work / "corpus"
    synth_corpus.generate(corpus, args.docs, seed=args.seed, size=args.size)
    url = fresh_database(embedded_url(work), "profile")
    cfg, _ = make_config(work, corpus, url, args.content)
    conn = connect(url)
    OUT.mkdir(exist_ok=True)
    stem = f"{args.docs}" + "".join(f"-{w}" for w in args.what_if)
    try:
        from pyinstrument import Profiler
    except ImportError:
        Profiler = None
    if args.sql:
        timer = SqlTimer()
        r = run_direct(cfg, conn, args.cost, "full")
        rows = timer.report()
        path = OUT / f"sqltime-{stem}.json"
        path.write_text(json.dumps(rows, indent=2), encoding="utf-8")
        for row in rows[:25]:
            print(f"{row['seconds']:>9.3f} s {row['calls']:>7}  {row['sql']}")
        print(f"SQL total {sum(r_['seconds'] for r_ in rows):.3f} s (statements nest inside COMMIT-less blocks; "
              f"COMMIT is the commit alone)")
    elif Profiler is not None and not args.cprofile:
        prof = Profiler(interval=0.002)
        prof.start()
        r = run_direct(cfg, conn, args.cost, "full")
        prof.stop()
        path = OUT / f"profile-{stem}.txt"
        path.write_text(prof.output_text(unicode=False, color=False, show_all=False), encoding="utf-8")
        (OUT / f"profile-{stem}.html").write_text(prof.output_html(), encoding="utf-8")
    else:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        r = run_direct(cfg, conn, args.cost, "full")
        prof.disable()
        path = OUT / f"profile-{stem}.txt"
        with path.open("w") as fh:
            st = pstats.Stats(prof, stream=fh)
            st.sort_stats("cumulative").print_stats(60)
            st.sort_stats("tottime").print_stats(40)
    print(json.dumps({k: r[k] for k in ("wall_s", "texts_embedded", "standin_s", "overhead_s", "documents_s",
                                          "chunks_s", "embeddings_s")}))
    print(f"profile written to {path}")
    conn.close()
    if not args.workdir:
        remove_workdir(work)


# --- output ----------------------------------------------------------------------------------------------------

def machine_note() -> dict:
    load = os.getloadavg()
    return {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "python": sys.version.split()[0],
            "loadavg_at_start": [round(x, 2) for x in load]}


def print_header() -> None:
    print(f"{'scenario':<16} {'wall s':>8} {'texts':>6} {'stand-in s':>10} {'overhead s':>10} {'docs s':>7} "
          f"{'chunks s':>8} {'embed s':>8} {'pipe ovh':>8} {'search s':>8} {'hnsw s':>7} {'qstats s':>8} {'other s':>7} {'new/chg/del/unch docs':>22} "
          f"{'chunks written':>14}")


def print_row(r: dict) -> None:
    d = r["documents"]
    docs = f"{d['new']}/{d['changed']}/{d['deleted']}/{d['unchanged']}"
    extra = ""
    if "expected_embedded" in r:
        extra = f"  expected {r['expected_embedded']}"
    if r.get("new_chunks_per_doc"):
        extra += f"  new chunks per edited doc {r['new_chunks_per_doc']}"
    print(f"{r['scenario']:<16} {r['wall_s']:>8.3f} {r['texts_embedded']:>6} {r['standin_s']:>10.3f} "
          f"{r['overhead_s']:>10.3f} {r['documents_s']:>7.3f} {r['chunks_s']:>8.3f} {r['embeddings_s']:>8.3f} "
          f"{r['pipeline_overhead_s']:>8.3f} {r['search_index_s']:>8.3f} {r['vector_index_s']:>7.3f} "
          f"{r['query_stats_s']:>8.3f} {r['other_s']:>7.3f} "
          f"{docs:>22} {r['chunks']['chunks_written']:>14}{extra}", flush=True)


def print_summary(s: dict) -> None:
    print()
    for k, v in s.items():
        if k != "targets":
            print(f"  {k}: {v}")
    for k, ok in s["targets"].items():
        print(f"  [{'PASS' if ok else 'FAIL'}] {k}")


def write_results(results: dict, stem: str) -> Path:
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    print(f"results: {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p, docs_default):
        p.add_argument("--cost", type=float, default=0.002, help="stand-in seconds per text")
        p.add_argument("--seed", type=int, default=7)
        p.add_argument("--size", type=float, default=synth_corpus.DEFAULT_SIZE)
        p.add_argument("--content", choices=("worktree", "HEAD"), default="worktree")
        p.add_argument("--workdir", help="keep the corpus and database here (default: a temp dir, removed)")
        p.add_argument("--what-if", default=[], type=lambda v: [x for x in v.split(",") if x],
                       help=f"comma-separated measured alternatives (not the product): {', '.join(WHAT_IFS)}")
        return p

    p = common(sub.add_parser("scenarios"), 3000)
    p.add_argument("--docs", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-dagster", action="store_true")
    p = common(sub.add_parser("rss"), None)
    p.add_argument("--docs", type=int, nargs="+", default=[300, 3000])
    p.add_argument("--rounds", type=int, default=1)
    p = common(sub.add_parser("profile"), 3000)
    p.add_argument("--docs", type=int, default=3000)
    p.add_argument("--cprofile", action="store_true")
    p.add_argument("--sql", action="store_true", help="no profiler: time each SQL statement shape, COPY, COMMIT")
    p = common(sub.add_parser("model-check"), None)
    p.add_argument("--docs", type=int, default=20)
    p = common(sub.add_parser("_model_child"), None)
    p.add_argument("--corpus", required=True)
    p.add_argument("--db-url", required=True)
    p = common(sub.add_parser("_child"), None)
    p.add_argument("--corpus", required=True)
    p.add_argument("--db-url", required=True)
    args = ap.parse_args(argv)
    {"scenarios": cmd_scenarios, "rss": cmd_rss, "profile": cmd_profile, "_child": cmd_child,
     "model-check": cmd_model_check, "_model_child": cmd_model_child}[args.cmd](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
