"""The chunk stage alone (`chunk_source`), two code trees compared in one session.

    # build the corpus once (bench/synth_corpus.py), then time old vs new, alternating, each on a fresh copy of
    # one database whose documents were synced once (by the tree running this script)
    git archive <old-commit> kb_assets | tar -x -C /tmp/kbchunk/old
    /work/venv/bin/python bench/synth_corpus.py /tmp/kbchunk/corpus --docs 3000
    /work/venv/bin/python bench/chunks_bench.py --corpus /tmp/kbchunk/corpus --work /tmp/kbchunk \\
        --tree old=/tmp/kbchunk/old --tree new=. --rounds 3 [--wait-idle 0.85] [--kind doc --include '**/*.rst']
    # the model warm-up beside the cut or after it (same tree twice): chunk stage and model-ready seconds
    .venv/bin/python bench/chunks_bench.py --corpus DIR --work /tmp/kbchunk --tree during=. --tree after=. \
        --model during=during --model after=after

Each run is a child process that imports kb_assets from its tree and runs `chunk_source` (the full first run,
with the stand-in embedder's token counter and 254-token budget, as the pipeline benchmark) on a fresh copy of
the template database. It reports the stage's wall seconds, this process's CPU seconds (all threads), the
server backend's CPU seconds (the generated tsvector, the GIN index, the heap: /proc of the backend, same
machine only) and a digest of every chunk row (document path, ordinal, heading, lines, token count, chunk
hash, text; not the id, which follows the order a batch's rows come back in, a matter of the query plan) and
of the stats: the trees must agree on both, or the script fails. `--wait-idle F` starts a
round only when the machine was at least F idle over 3 s (other work on a shared 2-core machine swamps the
figures). The embedded PostgreSQL is shared by all runs (started once, under --work).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE_KEY = "bench"


def _backend_cpu(conn) -> float:
    fields = Path(f"/proc/{conn.info.backend_pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child(args) -> None:
    tree = Path(args.tree[0]).resolve()
    sys.path.insert(0, str(tree))
    from kb_assets.embedding import FixedCostEmbedder
    from kb_assets.pipeline.chunks import chunk_source
    from kb_assets.store.db import connect

    assert Path(sys.modules["kb_assets"].__file__).resolve().is_relative_to(tree)
    emb = FixedCostEmbedder(cost_per_text=0.0)
    model = args.model_load
    if model:
        from kb_assets.embedding.local import LocalEmbedder, load_model

        emb = LocalEmbedder()     # its token counter is the same tokenizer.json; `kb index` warms this one up
    out = {}
    with connect(args.url) as conn:
        server0 = _backend_cpu(conn)
        if args.profile:
            from pyinstrument import Profiler
            prof = Profiler(interval=0.001)
            prof.start()
        t, c = time.perf_counter(), time.process_time()
        if model == "during":
            emb.warm_up()         # as the kb_chunks asset does on a first run
        stats = chunk_source(conn, SOURCE_KEY, max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
        out["s"] = round(time.perf_counter() - t, 3)
        out["server_cpu_s"] = round(_backend_cpu(conn) - server0, 2)
        if model:
            load_model(emb.path)   # waits for the warm-up when one runs
            out["ready_s"] = round(time.perf_counter() - t, 3)
        out["cpu_s"] = round(time.process_time() - c, 3)
        if args.profile:
            prof.stop()
            Path(args.profile).write_text(prof.output_text(unicode=True, color=False, show_all=False))
        out["stats"] = {k: v for k, v in stats.as_metadata().items() if k != "seconds"}
        h = hashlib.sha256()
        n = 0
        for row in conn.execute(
                "SELECT d.path, c.ordinal, c.heading, c.start_line, c.end_line, c.token_count, c.chunk_hash, c.text"
                " FROM chunks c JOIN documents d ON d.id = c.document_id ORDER BY d.path, c.ordinal"):
            h.update(json.dumps(row).encode("utf-8", "surrogatepass"))
            n += 1
        h.update(json.dumps(conn.execute("SELECT path, chunked_hash = content_hash, meta->>'chunk_error'"
                                         " FROM documents ORDER BY path").fetchall()).encode())
        out["rows"] = n
        out["digest"] = h.hexdigest()
    print(json.dumps(out))


def _with_db(server_url: str, name: str) -> str:
    import psycopg.conninfo as ci

    params = ci.conninfo_to_dict(server_url)
    params["dbname"] = name
    return ci.make_conninfo(**params)


def template(server: str, args) -> str:
    """A database with the corpus's documents synced, by this checkout's code (the same for every tree)."""
    import psycopg

    from kb_assets.config import parse_config
    from kb_assets.pipeline.documents import sync_documents
    from kb_assets.store.db import connect, migrate

    name = "chunks_template"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _with_db(server, name)
    source = {"key": SOURCE_KEY, "kind": args.kind, "root": args.corpus}
    if args.kind == "code":
        source["auto_kind"] = True
    if args.include:
        source["include"] = args.include
    data = {"data_dir": str(Path(args.work) / "data"), "database_url": url, "sources": [source]}
    cfg = parse_config(data, path=str(Path(args.work) / "kb.yaml"), base_dir=args.work)
    with connect(url) as conn:
        migrate(conn)
        docs = sync_documents(conn, cfg, cfg.sources[0])
        conn.execute("CHECKPOINT")
    print(f"template: {docs.new} documents synced", flush=True)
    return name


def copy_of(server: str, name: str, run: str) -> str:
    import psycopg

    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{run}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{run}" TEMPLATE "{name}"')
    return _with_db(server, run)


def idle_fraction(window: float = 3.0) -> float:
    def snap():
        v = list(map(int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]))
        return v[3] + v[4], sum(v)
    i0, t0 = snap()
    time.sleep(window)
    i1, t1 = snap()
    return (i1 - i0) / max(1, t1 - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--work", required=True, help="short folder for the embedded PostgreSQL (socket path limit)")
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR holding a kb_assets package")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kind", default="code", help="source kind (code: auto_kind, as the pipeline benchmark)")
    ap.add_argument("--include", action="append", default=[], help="include glob (repeatable)")
    ap.add_argument("--wait-idle", type=float, default=0.0, help="start a round only at this idle fraction")
    ap.add_argument("--profile", help="pyinstrument text of each tree's first run: PREFIX-NAME.txt")
    ap.add_argument("--model", action="append", default=[], type=lambda v: tuple(v.split("=", 1)),
                    help="NAME=during|after: that tree's run also loads the local model (LocalEmbedder), its"
                         " warm-up started with the stage (during, as kb index on a first run) or after it;"
                         " reports when the model is ready")
    ap.add_argument("--model-load", choices=("during", "after"), help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    sys.path.insert(0, str(HERE.parent))
    import psycopg

    from kb_assets.store.db import embedded_url

    server = embedded_url(Path(args.work))
    name = template(server, args)
    trees = [t.split("=", 1) for t in args.tree]
    results: dict[str, list[dict]] = {n: [] for n, _ in trees}
    for r in range(args.rounds):
        if args.wait_idle:
            while (idle := idle_fraction()) < args.wait_idle:
                pass
            print(f"round {r + 1}: machine {idle:.0%} idle", flush=True)
        order = trees if r % 2 == 0 else trees[::-1]
        for tree_name, tree in order:
            url = copy_of(server, name, f"chunks_{tree_name}")
            cmd = [sys.executable, __file__, "--child", "--tree", tree, "--url", url, "--corpus", args.corpus,
                   "--work", args.work]
            if dict(args.model).get(tree_name):
                cmd += ["--model-load", dict(args.model)[tree_name]]
            if args.profile and r == 0:
                cmd += ["--profile", f"{args.profile}-{tree_name}.txt"]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            results[tree_name].append(res)
            ready = f", model ready at {res['ready_s']:.3f} s" if "ready_s" in res else ""
            print(f"round {r + 1} {tree_name:>6}: {res['s']:.3f} s{ready} (CPU here {res['cpu_s']:.3f} s, server"
                  f" {res['server_cpu_s']:.2f} s)  chunks {res['rows']}  digest {res['digest'][:12]}", flush=True)
    with psycopg.connect(server, autocommit=True) as admin:
        for tree_name, _ in trees:
            admin.execute(f'DROP DATABASE IF EXISTS "chunks_{tree_name}" WITH (FORCE)')
    first = next(iter(results.values()))[0]
    ok = True
    for tree_name, runs in results.items():
        for res in runs:
            for key in ("digest", "stats"):
                if res[key] != first[key]:
                    ok = False
                    print(f"MISMATCH {tree_name} {key}: {res[key]} != {first[key]}")
    for tree_name, runs in results.items():
        wall = [x["s"] for x in runs]
        cpu = [x["cpu_s"] for x in runs]
        srv = [x["server_cpu_s"] for x in runs]
        ready = [x["ready_s"] for x in runs if "ready_s" in x]
        print(f"{tree_name:>6}: median {statistics.median(wall):.3f} s (min {min(wall):.3f}, max {max(wall):.3f});"
              f" CPU here median {statistics.median(cpu):.3f} s; server CPU median {statistics.median(srv):.2f} s"
              + (f"; model ready median {statistics.median(ready):.3f} s" if ready else ""))
    print("stats:", json.dumps(first["stats"]))
    print("output identical across trees and runs:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
