"""The documents stage alone (`sync_documents`), two code trees compared in one session.

    # build the corpus once (bench/synth_corpus.py), then time old vs new, alternating, each in a fresh database
    git archive <old-commit> kb_assets | tar -x -C /tmp/kbdoc/old
    /work/venv/bin/python bench/documents_bench.py --corpus /tmp/kbdoc/corpus --work /tmp/kbdoc \
        --tree old=/tmp/kbdoc/old --tree new=. --rounds 3 [--content HEAD]

Each run is a child process that imports kb_assets from its tree, runs `sync_documents` on a fresh database
(the full first run), then once more (unchanged re-run), and reports the stage's seconds and a digest of every
`documents` row (all columns but ids and timestamps) and of the stats: the trees must agree on both, or the
script fails. The embedded PostgreSQL is shared by all runs (started once, under --work).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE_KEY = "bench"


def child(args) -> None:
    tree = Path(args.tree[0]).resolve()
    sys.path.insert(0, str(tree))
    from kb_assets.config import parse_config
    from kb_assets.pipeline.documents import sync_documents
    from kb_assets.store.db import connect, migrate

    assert Path(sys.modules["kb_assets"].__file__).resolve().is_relative_to(tree)
    data = {"data_dir": str(Path(args.work) / "data"), "database_url": args.url,
            "sources": [{"key": SOURCE_KEY, "kind": "code", "root": args.corpus, "auto_kind": True,
                         "content": args.content}]}
    cfg = parse_config(data, path=str(Path(args.work) / "kb.yaml"), base_dir=args.work)
    out = {}
    with connect(args.url) as conn:
        migrate(conn)
        for label in ("full", "unchanged"):
            if args.profile and label == "full":
                from pyinstrument import Profiler
                prof = Profiler(interval=0.001)
                prof.start()
            t, c = time.perf_counter(), time.process_time()
            stats = sync_documents(conn, cfg, cfg.sources[0])
            out[label + "_s"] = round(time.perf_counter() - t, 3)
            out[label + "_cpu_s"] = round(time.process_time() - c, 3)     # this process, all threads
            if args.profile and label == "full":
                prof.stop()
                Path(args.profile).write_text(prof.output_text(unicode=True, color=False, show_all=False))
            meta = {k: v for k, v in stats.as_metadata().items() if k != "seconds"}
            out[label + "_stats"] = meta
        h = hashlib.sha256()
        n = 0
        for row in conn.execute(
                "SELECT path, kind, title, status, skip_reason, skip_detail, file_sig, content_hash, chunked_hash,"
                " meta::text, text, indexed_commit FROM documents ORDER BY source_key, path"):
            h.update(json.dumps(row).encode("utf-8", "surrogatepass"))
            n += 1
        h.update(json.dumps(conn.execute("SELECT key, kind, root, config_hash, indexed_commit FROM sources"
                                         " ORDER BY key").fetchall()).encode())
        out["rows"] = n
        out["digest"] = h.hexdigest()
    print(json.dumps(out))


def fresh_database(server_url: str, name: str) -> str:
    import psycopg
    import psycopg.conninfo as ci

    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    params = ci.conninfo_to_dict(server_url)
    params["dbname"] = name
    return ci.make_conninfo(**params)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--work", required=True, help="short folder for the embedded PostgreSQL (socket path limit)")
    ap.add_argument("--tree", action="append", default=[], help="NAME=DIR holding a kb_assets package")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--content", choices=("worktree", "HEAD"), default="worktree")
    ap.add_argument("--profile", help="pyinstrument text of each tree's first full run: PREFIX-NAME.txt")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    sys.path.insert(0, str(HERE.parent))
    from kb_assets.store.db import embedded_url

    server = embedded_url(Path(args.work))
    trees = [t.split("=", 1) for t in args.tree]
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for name, tree in order:
            url = fresh_database(server, f"docs_{name}")
            cmd = [sys.executable, __file__, "--child", "--tree", tree, "--url", url, "--corpus", args.corpus,
                   "--work", args.work, "--content", args.content]
            if args.profile and r == 0:
                cmd += ["--profile", f"{args.profile}-{name}.txt"]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            results[name].append(res)
            print(f"round {r + 1} {name:>6}: full {res['full_s']:.3f} s (CPU {res['full_cpu_s']:.3f} s)"
                  f"  unchanged {res['unchanged_s']:.3f} s"
                  f"  rows {res['rows']}  digest {res['digest'][:12]}", flush=True)
    first = next(iter(results.values()))[0]
    ok = True
    for name, runs in results.items():
        for res in runs:
            for key in ("digest", "full_stats", "unchanged_stats"):
                if res[key] != first[key]:
                    ok = False
                    print(f"MISMATCH {name} {key}: {res[key]} != {first[key]}")
    for name, runs in results.items():
        full = [x["full_s"] for x in runs]
        unch = [x["unchanged_s"] for x in runs]
        cpu = [x["full_cpu_s"] for x in runs]
        print(f"{name:>6}: full median {statistics.median(full):.3f} s (min {min(full):.3f}, max {max(full):.3f});"
              f" CPU median {statistics.median(cpu):.3f} s; unchanged median {statistics.median(unch):.3f} s")
    print("stats:", json.dumps(first["full_stats"]))
    print("output identical across trees and runs:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
