"""Cold `kb recall`: a fresh process per call (what an agent pays when it shells out), wall time and peak RSS.

    python bench/cold_recall.py                          # index a sample (this repo's docs) once, 5 runs per encoder
    python bench/cold_recall.py --config /path/kb.yaml   # over your own indexed sources
    python bench/cold_recall.py --runs 5 --encoders numpy torch --phases --linger

Each run: `kb recall QUERY --json --config F` in a new process, started and reaped here (os.wait4 gives the
child's own peak RSS); the answer is checked to be JSON with documents. Encoders: `numpy` (the default
query encoder, embedding/numpy_bert.py) and `torch` (KB_QUERY_ENCODER=torch: sentence-transformers, the
old path) alternate run by run, so both see the same machine load; both with KB_DB_LINGER=0 (the
embedded PostgreSQL starts and stops in every process). `--linger` adds numpy runs with the database left
up between calls (store/linger.py), as agents' bursts of calls see it. `--phases` runs one more fresh process
that stamps each phase (imports, config, database start, encoder load, the query).
The load average is printed before and after: on a shared machine, compare ratios within one run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KB = Path(sys.executable).with_name("kb")
QUERY = "why do recall results come from many distinct documents?"
SAMPLE = Path(tempfile.gettempdir()) / "kb-cold-bench"


def _env(encoder: str, linger: str = "0") -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", KB_QUERY_ENCODER=encoder,
               KB_DB_LINGER=linger)
    env.pop("KB_DATABASE_URL", None)
    return env


def sample_config() -> Path:
    """This repository's docs (README, docs/*.md) indexed once under /tmp/kb-cold-bench."""
    config = SAMPLE / "kb.yaml"
    if (SAMPLE / "indexed").exists():
        return config
    SAMPLE.mkdir(parents=True, exist_ok=True)
    config.write_text(textwrap.dedent(f"""\
        data_dir: {SAMPLE / '.kb'}
        sources:
          - {{key: docs, kind: doc, root: {ROOT}, include: ['README.md', 'docs/*.md']}}
        """))
    env = _env("numpy")
    env["DAGSTER_HOME"] = tempfile.mkdtemp(prefix="kb-cold-dagster-")
    subprocess.run([str(KB), "index", "--config", str(config), "--quiet", "--wait-index"], env=env, check=True)
    (SAMPLE / "indexed").write_text("ok\n")
    return config


def one_run(config: Path, query: str, encoder: str, linger: str = "0") -> tuple[float, float, int]:
    """(wall seconds, peak RSS MB, documents returned) of one fresh `kb recall` process."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([str(KB), "recall", query, "--json", "--config", str(config)],
                                env=_env(encoder, linger),
                                stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"kb recall exited {proc.returncode} ({encoder})")
        out.seek(0)
        answer = json.loads(out.read())
    return wall, usage.ru_maxrss / 1024, len(answer["documents"])


PHASES = r"""
import sys, time
T0 = time.perf_counter()
marks = []
def mark(name): marks.append((name, time.perf_counter() - T0))
import kb_assets.cli, kb_assets.query; mark("imports (cli, query, config)")
from kb_assets.config import load_config
cfg = load_config(sys.argv[1]); mark("config loaded")
from kb_assets.query.engine import _connection_for, _embedder_for
_connection_for(cfg); mark("database up (pgserver start, migrate check, connect)")
emb = _embedder_for(cfg); emb.embed_query("warm up"); mark("query encoder loaded + first embed")
from kb_assets.query import recall
r = recall(sys.argv[2], config=cfg); mark("recall() (embed + SQL + records)")
heavy = sorted(m for m in ("torch", "sentence_transformers", "transformers", "dagster", "pandas") if m in sys.modules)
print("\t".join(f"{n}={t:.3f}" for n, t in marks) + "\theavy=" + ",".join(heavy))
"""


def phases(config: Path, query: str, encoder: str) -> list[tuple[str, float]]:
    out = subprocess.run([sys.executable, "-c", PHASES, str(config), query], env=_env(encoder), capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()[-1]
    parts = [p.split("=", 1) for p in out.split("\t")]
    return [(n, float(v)) if n != "heavy" else (n, v) for n, v in parts]


def stop_linger(config: Path) -> None:
    """End the linger process the lingering runs left (SIGTERM: it stops the embedded database)."""
    import signal

    import yaml

    data_dir = Path(yaml.safe_load(config.read_text()).get("data_dir") or ".kb")
    if not data_dir.is_absolute():
        data_dir = config.parent / data_dir
    stamp = data_dir / "pg" / ".kb_linger"
    try:
        os.kill(int(stamp.read_text().strip()), signal.SIGTERM)
    except (OSError, ValueError):
        return
    for _ in range(300):
        if not stamp.exists():
            break
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path)
    ap.add_argument("--query", default=QUERY)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--encoders", nargs="+", default=["numpy", "torch"], choices=["numpy", "torch"])
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between runs (the previous process's "
                    "embedded PostgreSQL stops when it exits)")
    ap.add_argument("--phases", action="store_true")
    ap.add_argument("--linger", action="store_true", help="also: numpy encoder with the embedded database "
                    "lingering between calls (the default KB_DB_LINGER=300; the first run starts it)")
    args = ap.parse_args()
    config = args.config or sample_config()
    load_before = os.getloadavg()
    results: dict[str, list[tuple[float, float, int]]] = {e: [] for e in args.encoders}
    for i in range(args.runs):
        for enc in args.encoders:
            results[enc].append(one_run(config, args.query, enc))
            time.sleep(args.pause)
    lingering: list[tuple[float, float, int]] = []
    if args.linger:
        for i in range(args.runs):
            lingering.append(one_run(config, args.query, "numpy", linger="300"))
            time.sleep(args.pause)
        stop_linger(config)
    load_after = os.getloadavg()
    print(f"cold kb recall, {args.runs} fresh processes per encoder, query {args.query!r}")
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
          f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} (2 cores)")
    print("| query encoder | wall median (s) | wall min–max (s) | peak RSS median (MB) | documents |")
    print("| --- | --- | --- | --- | --- |")
    med = {}
    for enc, rows in results.items():
        walls = [w for w, _, _ in rows]
        med[enc] = statistics.median(walls)
        print(f"| {enc} | {med[enc]:.2f} | {min(walls):.2f}–{max(walls):.2f} | "
              f"{statistics.median(r for _, r, _ in rows):.0f} | {rows[0][2]} |")
    if lingering:
        walls = [w for w, _, _ in lingering]
        med["linger"] = statistics.median(walls[1:] or walls)
        print(f"| numpy, database lingering (KB_DB_LINGER=300) | {med['linger']:.2f} (runs 2–{len(walls)}) | "
              f"{min(walls):.2f}–{max(walls):.2f} (run 1: {walls[0]:.2f}, starts it) | "
              f"{statistics.median(r for _, r, _ in lingering):.0f} | {lingering[0][2]} |")
    if "numpy" in med and "torch" in med:
        print(f"ratio torch / numpy (median wall): {med['torch'] / med['numpy']:.1f}x")
    if args.phases:
        for enc in args.encoders:
            marks = phases(config, args.query, enc)
            prev = 0.0
            print(f"phases ({enc}), seconds since process start:")
            for name, t in marks:
                if name == "heavy":
                    print(f"  heavy modules loaded: {t or 'none'}")
                    continue
                print(f"  {t:6.2f}  (+{t - prev:5.2f})  {name}")
                prev = t


if __name__ == "__main__":
    main()
