"""What a nothing-changed `kb index` costs, as whole processes (issue 11 §4): wall, CPU, peak RSS, texts embedded,
and whether the model stack (torch, sentence-transformers) or an API client was imported.

    /work/wt/schema/.venv/bin/python bench/noop_bench.py \\
        --corpus /work/shared/corpora/adr-nats-io+nats-architecture-and-design-*.tar.gz [--nochange 3] \\
        [--database-url postgresql://…] [--importtime] [--check-cost] [--work DIR]

It extracts the corpus (a tarball, or a folder) into a fresh work folder, writes a kb.yaml over its `adr/*.md`
(the local model, extractive signposts, the embedded PostgreSQL under the work folder unless --database-url),
then runs `kb index --json` once (first: everything is embedded) and --nochange more times, each under
`/usr/bin/time -v` in its own process. CPU time (user + sys of the kb process) is the figure that does not
depend on the machine's load; wall time does (report it with `uptime`'s load average, printed here).
--importtime adds `python -X importtime` to the last nochange run and prints the slowest top-level imports;
--check-cost then times the regression check alone (unchanged, index changed, and as before this change).
--work DIR with a folder indexed before: every run, the first one too, is a nothing-changed run.
Targets (nothing changed): wall <= 3 s, peak RSS <= 300 MB, 0 texts embedded, no model import; since the fast
path (kb_assets/pipeline/source_state.py) no Dagster import either ("no run" column). --forced N adds N runs
with `kb index --force`, interleaved: the same nothing-changed pass through the Dagster job, as before.
Results: docs/BENCHMARKS.md, "## nothing-changed kb index".
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HEAVY = ("torch", "sentence_transformers", "transformers", "voyageai", "google.genai")
_RUN = (
    "import json, sys\n"
    "from kb_assets.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "heavy = sorted({m.split('.')[0] for m in sys.modules if any(m == h or m.startswith(h + '.') for h in %r)})\n"
    "print('HEAVY=' + json.dumps(heavy), file=sys.stderr)\n"
    "print('DAGSTER=' + json.dumps('dagster' in sys.modules), file=sys.stderr)\n"
    "sys.exit(rc)\n" % (HEAVY,))


def _corpus_root(spec: str, work: Path) -> Path:
    matches = sorted(glob.glob(spec)) or [spec]
    src = Path(matches[0])
    if src.is_dir():
        return src
    with tarfile.open(src) as tar:
        tar.extractall(work / "corpus", filter="data")
    tops = [p for p in (work / "corpus").iterdir() if p.is_dir()]
    return tops[0] if len(tops) == 1 else work / "corpus"


def write_config(work: Path, root: Path, database_url: str | None = None) -> Path:
    """work/kb.yaml: one source `nats` (kind adr) over root's adr/*.md, the local model, extractive signposts,
    the embedded PostgreSQL under work/data unless database_url."""
    cfg = work / "kb.yaml"
    cfg.write_text(json.dumps({
        "data_dir": str(work / "data"), "database_url": database_url,
        "sources": [{"key": "nats", "kind": "adr", "root": str(root), "include": ["adr/*.md"]}]}, indent=1))
    return cfg


def _time_field(text: str, label: str) -> str:
    m = re.search(rf"{re.escape(label)}: (.+)", text)
    return m.group(1).strip() if m else ""


def _seconds(clock: str) -> float:
    parts = [float(p) for p in clock.split(":")]
    return sum(p * 60 ** i for i, p in enumerate(reversed(parts)))


def run_index(cfg: Path, *, importtime: bool = False, timeout: float | None = None, force: bool = False) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("DAGSTER_HOME", None)      # kb index's own default: an ephemeral Dagster instance
    cmd = ["/usr/bin/time", "-v", sys.executable] + (["-X", "importtime"] if importtime else []) + \
          ["-c", _RUN, "index", "--config", str(cfg), "--json"] + (["--force"] if force else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cfg.parent, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"kb index failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout)
    heavy = json.loads(next(line for line in proc.stderr.splitlines() if line.startswith("HEAVY="))[6:])
    err = proc.stderr
    row = {
        "wall_s": round(_seconds(_time_field(err, "Elapsed (wall clock) time (h:mm:ss or m:ss)")), 2),
        "cpu_s": round(float(_time_field(err, "User time (seconds)")) + float(_time_field(err, "System time (seconds)")), 2),
        "rss_mb": round(int(_time_field(err, "Maximum resident set size (kbytes)")) / 1024, 1),
        "embedded": sum(s["this_run"]["embeddings"].get("chunks_embedded", 0) for s in out["sources"]),
        "documents": sum(s["documents"] for s in out["sources"]),
        "chunks": sum(s["chunks"] for s in out["sources"]),
        "llm_calls": sum(s["this_run"]["signposts"].get("llm_calls", 0) for s in out["sources"]),
        "heavy_imports": heavy,
        "dagster": json.loads(next(line for line in err.splitlines() if line.startswith("DAGSTER="))[8:]),
        "skipped_run": all(s.get("skipped_run") for s in out["sources"]),
        "job_s": out.get("seconds"),
    }
    if importtime:
        tops = []
        for line in err.splitlines():
            m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S.*)$", line)
            if m and not m.group(2).startswith(" "):
                tops.append((int(m.group(1)) / 1e6, m.group(2)))
        row["slowest_imports"] = [(name, round(s, 2)) for s, name in sorted(tops, reverse=True)[:8]]
    return row


_CHECK_COST = """
import resource, sys, time
from kb_assets.config import load_config
from kb_assets.embedding import make_embedder
from kb_assets.pipeline.regression_check import run_regression_check
from kb_assets.store.db import connect, open_database
from kb_assets.store.schema import regression_schema

cfg, mode = load_config(sys.argv[1]), sys.argv[2]
embedder = make_embedder(cfg)
if mode == "as before":   # what every run paid before: the model loaded, the 26 queries embedded
    with connect(open_database(cfg, schema=regression_schema(cfg.effective_schema()))) as c:
        c.execute("DELETE FROM query_vectors")
t0, c0 = time.perf_counter(), time.process_time()
r = run_regression_check(cfg, embedder, force=mode != "unchanged")
print("ROW=" + repr((mode, round(time.perf_counter() - t0, 2), round(time.process_time() - c0, 2),
                     round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), r["reused"],
                     r["query_vectors_embedded"], "torch" in sys.modules)))
"""


def check_cost(cfg: Path) -> None:
    """The regression check alone, each in a fresh process: unchanged (reused), index changed (run again with
    the cached query vectors), and as before this change (model load + every query embedded)."""
    import ast

    print(f"{'regression check':<18} {'wall s':>7} {'cpu s':>6} {'RSS MB':>7} {'reused':>6} {'embedded':>8} torch")
    for mode in ("unchanged", "index changed", "as before", "unchanged"):
        proc = subprocess.run([sys.executable, "-c", _CHECK_COST, str(cfg), mode], capture_output=True, text=True,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        line = next((x for x in proc.stdout.splitlines() if x.startswith("ROW=")), None)
        if line is None:
            raise SystemExit(proc.stderr[-3000:])
        m, wall, cpu, rss, reused, embedded, torch = ast.literal_eval(line[4:])
        print(f"{m:<18} {wall:>7} {cpu:>6} {rss:>7} {str(reused):>6} {embedded:>8} {torch}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="/work/shared/corpora/adr-nats-io+nats-architecture-and-design-*.tar.gz")
    ap.add_argument("--nochange", type=int, default=3, help="nothing-changed runs after the first")
    ap.add_argument("--database-url", default=None, help="a running server instead of the embedded one")
    ap.add_argument("--importtime", action="store_true")
    ap.add_argument("--forced", type=int, default=0,
                    help="nothing-changed runs with --force (the Dagster job runs), interleaved with --nochange")
    ap.add_argument("--work", default=None, help="work folder (default: a fresh temporary folder)")
    ap.add_argument("--check-cost", action="store_true",
                    help="then the regression check alone: unchanged / index changed / as before (after the runs)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="kb-noop-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    root = _corpus_root(args.corpus, work)
    cfg = write_config(work, root, args.database_url)
    rows = [("first", run_index(cfg))]
    for i in range(max(args.nochange, args.forced)):
        if i < args.nochange:
            rows.append((f"nochange {i + 1}", run_index(cfg, importtime=args.importtime and i == args.nochange - 1)))
        if i < args.forced:   # interleaved: the same pass through the Dagster job, as before the fast path
            rows.append((f"forced {i + 1}", run_index(cfg, force=True)))
    load = os.getloadavg()
    print(f"corpus {root} · {rows[0][1]['documents']} documents, {rows[0][1]['chunks']} chunks · "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} · {os.cpu_count()} cores")
    print(f"{'run':<11} {'wall s':>7} {'cpu s':>6} {'RSS MB':>7} {'embedded':>8} {'llm':>4} {'no run':>6} "
          f"{'dagster':>7}  heavy imports")
    for name, r in rows:
        print(f"{name:<11} {r['wall_s']:>7} {r['cpu_s']:>6} {r['rss_mb']:>7} {r['embedded']:>8} {r['llm_calls']:>4} "
              f"{str(r['skipped_run']):>6} {str(r['dagster']):>7}  {','.join(r['heavy_imports']) or '-'}")
    for name, r in rows:
        if r.get("slowest_imports"):
            print(f"slowest imports ({name}, cumulative s): " +
                  ", ".join(f"{n} {s}" for n, s in r["slowest_imports"]))
    nochange = [r for name, r in rows[1:]]
    failures_fast = [name for name, r in rows[1:] if name.startswith("nochange") and (r["dagster"] or r["wall_s"] > 3)]
    if failures_fast:
        print(f"nothing-changed runs that imported Dagster or took over 3 s: {failures_fast}")
    failures = [f"{k}" for r in nochange for k, bad in (("embedded", r["embedded"] != 0),
                                                        ("heavy imports", bool(r["heavy_imports"])),
                                                        ("rss", r["rss_mb"] > 300)) if bad]
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "noop_bench.json").write_text(json.dumps({"load": load, "rows": rows}, indent=1))
    if args.check_cost:
        check_cost(cfg)
    if failures:
        raise SystemExit(f"nothing-changed targets missed: {sorted(set(failures))}")


if __name__ == "__main__":
    main()
