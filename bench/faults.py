"""Fault injection against the real `kb index` process: kill -9 at random instants in every stage, SIGTERM
mid-run, two runs at once, the database stopped (and restarted) mid-run. After each fault the index is
re-run, and its end state is compared with a clean index of the same corpus.

    .venv/bin/python bench/faults.py --docs 60 --kills-per-stage 2 --json bench/out/faults.json

The corpus is bench/synth_corpus.py's (markdown, Python, TypeScript, Go), indexed as two sources. The
embedder is the fixed-cost stand-in ($KB_STANDIN_EMBEDDER: deterministic vectors, a cost per text, and a log
of every call, so the work a killed run and its re-run did between them is counted). Stages announce
themselves through $KB_STAGE_TRACE, which is how a kill lands inside the stage it is meant for.

Compared (content, not ids): documents (source, path, status, content hash, chunked hash), chunks (source,
path, ordinal, hash, heading, lines, tokens), vectors (chunk hash → vector), document vectors (source, path
→ mean vector, to 1e-5), keyword statistics (lexeme → chunk frequency; totals), signposts (source, path →
content hash). Counted: duplicates, orphans, chunk hashes without a vector, texts embedded beyond the clean
run's (in batches of `embed_batch_rows`).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

STAGES = ["kb_documents", "kb_chunks", "kb_embeddings", "kb_search_index", "kb_signposts", "kb_projections"]
PY = sys.executable


# ---------------------------------------------------------------- corpus, config, processes
def make_corpus(work: Path, n_docs: int, seed: int = 11) -> Path:
    from bench.synth_corpus import generate

    corpus = work / "corpus"
    if not corpus.exists():
        generate(corpus, n_docs, seed=seed)
    return corpus


def write_config(path: Path, corpus: Path, data_dir: Path, *, batch_rows: int, database_url: str | None = None,
                 retry_seconds: float = 10) -> Path:
    lines = [f"data_dir: {data_dir}", f"embed_batch_rows: {batch_rows}", f"database_retry_seconds: {retry_seconds}"]
    if database_url:
        lines.append(f"database_url: '{database_url}'")
    lines += ["sources:",
              f"  - {{key: docs, kind: doc, root: {corpus}, include: ['**/*.md']}}",
              f"  - {{key: code, kind: code, root: {corpus}, include: ['**/*.py', '**/*.ts', '**/*.go']}}"]
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class Env:
    work: Path
    cost: float
    dagster_home: Path

    def vars(self, calls: Path, trace: Path) -> dict:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", KB_STANDIN_EMBEDDER=str(self.cost),
                   KB_STANDIN_LOG=str(calls), KB_STAGE_TRACE=str(trace), DAGSTER_HOME=str(self.dagster_home))
        env.pop("KB_DATABASE_URL", None)
        env.pop("KB_CONFIG", None)
        return env


def start_index(env: Env, config: Path, calls: Path, trace: Path, *extra: str) -> subprocess.Popen:
    # Output to files, not pipes: after a hard exit, Dagster's log-tail helpers can hold a pipe open for a
    # while, and the time to stop is the process's, not theirs.
    out = tempfile.NamedTemporaryFile("w+", prefix="kb-out-", delete=False)
    err = tempfile.NamedTemporaryFile("w+", prefix="kb-err-", delete=False)
    # --wait-index: a large corpus's HNSW build goes to the background; the end state compared includes it
    proc = subprocess.Popen([PY, "-m", "kb_assets.cli", "index", "--config", str(config), "--json", "--wait-index",
                             *extra],
                            env=env.vars(calls, trace), stdout=out, stderr=err, text=True, cwd=str(REPO))
    proc.out_path, proc.err_path = out.name, err.name   # type: ignore[attr-defined]
    out.close()
    err.close()
    return proc


def finish(proc: subprocess.Popen, timeout: float = 900) -> tuple[int, str, str]:
    proc.wait(timeout=timeout)
    texts = []
    for path in (proc.out_path, proc.err_path):   # type: ignore[attr-defined]
        texts.append(Path(path).read_text(errors="replace"))
        os.unlink(path)
    return proc.returncode, texts[0], texts[1]


def texts_embedded(calls: Path) -> int:
    if not calls.exists():
        return 0
    return sum(int(line.split()[1]) for line in calls.read_text().splitlines() if line.strip())


def trace_events(trace: Path) -> list[tuple[float, int, str, str]]:
    if not trace.exists():
        return []
    out = []
    for line in trace.read_text().splitlines():
        t, pid, stage, event = line.split()
        out.append((float(t), int(pid), stage, event))
    return out


def stage_running(trace: Path, pid: int) -> str | None:
    """The stage the process is in now (per the trace), None between stages."""
    open_: list[str] = []
    for _, p, stage, event in trace_events(trace):
        if p != pid or stage not in STAGES:
            continue
        if event == "start":
            open_.append(stage)
        elif stage in open_:
            open_.remove(stage)
    return open_[-1] if open_ else None


def wait_for_stage(trace: Path, pid: int, stage: str, proc: subprocess.Popen, timeout: float = 600) -> float | None:
    """Wait until `stage` starts in process `pid`; its start time, None if the process ended first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for t, p, s, event in trace_events(trace):
            if p == pid and s == stage and event == "start":
                return t
        if proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def stage_durations(trace: Path) -> dict[str, float]:
    starts: dict[str, float] = {}
    total: dict[str, float] = {}
    for t, _, stage, event in trace_events(trace):
        if stage not in STAGES:
            continue
        if event == "start":
            starts[stage] = t
        elif stage in starts:
            total[stage] = total.get(stage, 0.0) + t - starts.pop(stage)
    return total


def embedded_server_processes(data_dir: Path) -> int:
    import psutil

    pg = str((data_dir / "pg").resolve())
    n = 0
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if p.info["name"] == "postgres" and pg in " ".join(p.info["cmdline"] or []):
                n += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return n


def handle_pids(data_dir: Path) -> list[int]:
    f = data_dir / "pg" / ".handle_pids.json"
    return json.loads(f.read_text() or "[]") if f.exists() else []


# ---------------------------------------------------------------- a separate server (database loss trials)
def server_start(pgdata: Path) -> str:
    code = ("import sys, pgserver; s = pgserver.get_server(sys.argv[1], cleanup_mode=None); print(s.get_uri())")
    pgdata.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([PY, "-c", code, str(pgdata)], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def server_stop(pgdata: Path) -> None:
    code = ("import os, sys; from pgserver._commands import pg_ctl;"
            " pg_ctl(['-w', '-m', 'fast', 'stop'], pgdata=sys.argv[1], user='pgserver' if os.geteuid() == 0 else None)")
    subprocess.run([PY, "-c", code, str(pgdata)], capture_output=True, text=True, check=True)


# ---------------------------------------------------------------- the state, by content
def _array(v):
    import numpy as np

    return np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, dtype=np.float32)


def snapshot(url: str) -> dict:
    import numpy as np
    from kb_assets.store.db import connect

    with connect(url) as conn:     # kb's schema (KB_SCHEMA, else kb), the vector type registered
        q = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731
        snap: dict = {}
        snap["documents"] = sorted(q(
            "SELECT source_key, path, status, coalesce(content_hash, ''), coalesce(chunked_hash, ''),"
            " coalesce(skip_reason, '') FROM documents"))
        snap["chunks"] = sorted(q(
            "SELECT d.source_key, d.path, c.ordinal, c.chunk_hash, c.heading, c.start_line, c.end_line, c.token_count"
            " FROM chunks c JOIN documents d ON d.id = c.document_id"))
        active = q("SELECT table_name FROM embedding_spaces WHERE activated_at IS NOT NULL"
                   " ORDER BY activated_at DESC LIMIT 1")
        snap["space"] = active[0][0].split("_", 2)[2] if active else None
        snap["vectors"], snap["doc_vectors"] = {}, {}
        if active:
            table = active[0][0]
            for h, v in q(f'SELECT chunk_hash, embedding FROM "{table}"'):
                snap["vectors"][h] = _array(v)
            docs = f"{table}_docs"[:63]
            if q("SELECT to_regclass(%s)", docs)[0][0] is not None:
                for src, path, v in q(f'SELECT d.source_key, d.path, x.embedding FROM "{docs}" x'
                                      f' JOIN documents d ON d.id = x.document_id'):
                    snap["doc_vectors"][(src, path)] = _array(v)
                snap["doc_vector_orphans"] = q(f'SELECT count(*) FROM "{docs}" x WHERE NOT EXISTS'
                                               f' (SELECT 1 FROM documents d WHERE d.id = x.document_id'
                                               f" AND d.status = 'active')")[0][0]
            snap["vector_orphans"] = q(f'SELECT count(*) FROM "{table}" e WHERE NOT EXISTS'
                                       f' (SELECT 1 FROM chunks c WHERE c.chunk_hash = e.chunk_hash)')[0][0]
            snap["missing_vectors"] = q(f'SELECT count(DISTINCT c.chunk_hash) FROM chunks c WHERE NOT EXISTS'
                                        f' (SELECT 1 FROM "{table}" e WHERE e.chunk_hash = c.chunk_hash)')[0][0]
            snap["vector_index"] = q("SELECT coalesce((SELECT indisvalid FROM pg_index WHERE indexrelid ="
                                     " to_regclass(%s)), false)", f"{table}_hnsw"[:63])[0][0]   # built, valid
        snap["lexemes"] = dict(q("SELECT lexeme, ndoc FROM lexeme_stats"))
        totals = q("SELECT n_chunks, n_lexemes FROM query_stats")
        snap["query_totals"] = tuple(totals[0]) if totals else None
        snap["signposts"] = sorted(q(
            "SELECT d.source_key, d.path, s.content_hash = d.content_hash FROM signpost_state s"
            " JOIN documents d ON d.id = s.document_id WHERE d.status = 'active'"))
        snap["duplicates"] = q(
            "SELECT (SELECT count(*) - count(DISTINCT (source_key, path)) FROM documents)"
            " + (SELECT count(*) - count(DISTINCT (document_id, ordinal)) FROM chunks)")[0][0]
        snap["orphan_chunks"] = q(
            "SELECT count(*) FROM chunks c LEFT JOIN documents d ON d.id = c.document_id"
            " WHERE d.id IS NULL OR d.status <> 'active'")[0][0]
        snap["stale_chunks"] = q(
            "SELECT count(*) FROM documents WHERE status = 'active' AND chunked_hash IS DISTINCT FROM content_hash"
        )[0][0]
    return snap


def projection_files(data_dir: Path) -> dict[str, str]:
    """The projection files under data_dir/machine (relative path → text), and any file left beside them."""
    root = data_dir / "machine"
    return {p.relative_to(root).as_posix(): p.read_text(errors="replace")
            for p in sorted(root.rglob("*")) if p.is_file()} if root.is_dir() else {}


def compare(clean: dict, got: dict) -> list[str]:
    """What differs between a clean index and the end state after a fault ([]: equal)."""
    import numpy as np

    diffs = []
    for key in ("documents", "chunks", "space", "lexemes", "query_totals", "signposts", "projections"):
        if clean.get(key) != got.get(key):
            a, b = clean.get(key), got.get(key)
            n = (len(set(map(str, a)) ^ set(map(str, b))) if isinstance(a, (list, dict)) and isinstance(b, (list, dict))
                 else "")
            diffs.append(f"{key} differ {n}".strip())
    for key, tol in (("vectors", 0.0), ("doc_vectors", 1e-5)):
        a, b = clean.get(key, {}), got.get(key, {})
        if set(a) != set(b):
            diffs.append(f"{key}: {len(set(a) ^ set(b))} keys differ")
            continue
        worst = max((float(np.max(np.abs(a[k] - b[k]))) for k in a), default=0.0)
        if worst > tol:
            diffs.append(f"{key}: max difference {worst:.2e}")
    for key in ("duplicates", "orphan_chunks", "stale_chunks", "vector_orphans", "doc_vector_orphans",
                "missing_vectors"):
        if got.get(key):
            diffs.append(f"{key}: {got[key]}")
    if clean.get("vector_index") and not got.get("vector_index"):
        diffs.append("vector index missing")
    return diffs


# ---------------------------------------------------------------- trials
@dataclass
class Trial:
    kind: str
    target: str = ""              # the stage aimed at
    hit: str | None = None        # the stage running when the fault landed
    delay: float = 0.0            # seconds into the stage
    fault_rc: int | None = None
    stop_seconds: float | None = None
    rerun_rc: int | None = None
    texts: int = 0                # texts embedded by the faulted run and its re-run together
    redone_texts: int = 0
    redone_batches: float = 0.0
    diffs: list[str] = field(default_factory=list)
    server_left: int = 0          # embedded postgres processes left after the re-run exited
    notes: str = ""

    @property
    def ok(self) -> bool:
        return not self.diffs and self.rerun_rc == 0


class Harness:
    def __init__(self, work: Path, *, n_docs: int, cost: float, batch_rows: int, seed: int):
        self.work = work
        self.batch_rows = batch_rows
        self.rng = random.Random(seed)
        self.corpus = make_corpus(work, n_docs)
        self.env = Env(work, cost, work / "dagster")
        self.env.dagster_home.mkdir(exist_ok=True)
        self.n = 0
        self.clean: dict | None = None
        self.clean_texts = 0
        self.durations: dict[str, float] = {}

    def _paths(self, name: str):
        self.n += 1
        d = Path(tempfile.mkdtemp(prefix=f"f{self.n}-", dir="/tmp"))   # short: the server's socket lives here
        return d, d / "kb.yaml", d / "calls.log", d / "trace.log"

    @staticmethod
    def _embedded_url(data_dir: Path) -> str:
        from kb_assets.store.db import embedded_url

        return embedded_url(data_dir)

    def _snapshot_embedded(self, data_dir: Path) -> dict:
        url = self._embedded_url(data_dir)
        try:
            return snapshot(url)
        finally:
            from kb_assets.store.db import release_embedded

            release_embedded(data_dir)   # only this one: a test process holds others

    def reference(self) -> dict:
        d, cfg, calls, trace = self._paths("clean")
        write_config(cfg, self.corpus, d / ".kb", batch_rows=self.batch_rows)
        started = time.perf_counter()
        rc, out, err = finish(start_index(self.env, cfg, calls, trace))
        if rc != 0:
            raise SystemExit(f"clean run failed ({rc}):\n{err[-3000:]}")
        self.clean_seconds = time.perf_counter() - started
        self.durations = stage_durations(trace)
        self.clean_texts = texts_embedded(calls)
        self.clean = self._snapshot_embedded(d / ".kb")
        self.clean_projections = projection_files(d / ".kb")
        self.clean["projections"] = self.clean_projections
        self.clean_summary = {"documents": len(self.clean["documents"]), "chunks": len(self.clean["chunks"]),
                              "vectors": len(self.clean["vectors"]), "doc_vectors": len(self.clean["doc_vectors"]),
                              "lexemes": len(self.clean["lexemes"]), "texts_embedded": self.clean_texts,
                              "seconds": round(self.clean_seconds, 1),
                              "stage_seconds": {k: round(v, 2) for k, v in self.durations.items()}}
        shutil.rmtree(d, ignore_errors=True)
        return self.clean_summary

    def _rerun_and_compare(self, trial: Trial, d: Path, cfg: Path, calls: Path, trace: Path,
                           url: str | None = None) -> Trial:
        rc, out, err = finish(start_index(self.env, cfg, calls, trace))
        trial.rerun_rc = rc
        if rc != 0:
            trial.notes += f" re-run failed: {err.strip().splitlines()[-1] if err.strip() else rc}"
        trial.texts = texts_embedded(calls)
        trial.redone_texts = trial.texts - self.clean_texts
        trial.redone_batches = round(trial.redone_texts / self.batch_rows, 2)
        if url is None:
            trial.server_left = embedded_server_processes(d / ".kb")
            got = self._snapshot_embedded(d / ".kb")
            got["projections"] = projection_files(d / ".kb")
        else:
            got = snapshot(url)
            got["projections"] = projection_files(d / ".kb")
        trial.diffs += compare(self.clean, got)
        return trial

    def _fault_at(self, kind: str, stage: str, sig: int) -> Trial:
        d, cfg, calls, trace = self._paths(kind)
        write_config(cfg, self.corpus, d / ".kb", batch_rows=self.batch_rows)
        trial = Trial(kind=kind, target=stage)
        proc = start_index(self.env, cfg, calls, trace)
        t0 = wait_for_stage(trace, proc.pid, stage, proc)
        if t0 is None:
            trial.notes = "stage never started"
        else:
            trial.delay = round(self.rng.uniform(0, max(0.05, 0.9 * self.durations.get(stage, 0.5))), 3)
            time.sleep(max(0.0, t0 + trial.delay - time.time()))
            trial.hit = stage_running(trace, proc.pid) or "between stages"
            sent = time.perf_counter()
            proc.send_signal(sig)
            try:
                rc, out, err = finish(proc, timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc, out, err = finish(proc)
                trial.notes += " did not stop within 60 s;"
            trial.stop_seconds = round(time.perf_counter() - sent, 2)
            trial.fault_rc = rc
            if sig != signal.SIGKILL:
                lines = [ln for ln in err.splitlines() if ln.startswith("kb index: stopped by")]
                trial.notes += f" line: {lines[-1]}" if lines else " no stop line;"
        if sig == signal.SIGKILL:
            trial.notes += f" handles after kill: {len(handle_pids(d / '.kb'))};"
        self._rerun_and_compare(trial, d, cfg, calls, trace)
        shutil.rmtree(d, ignore_errors=True)
        return trial

    def kill9(self, stage: str) -> Trial:
        return self._fault_at("kill -9", stage, signal.SIGKILL)

    def sigterm(self, stage: str = "kb_embeddings") -> Trial:
        return self._fault_at("SIGTERM", stage, signal.SIGTERM)

    def concurrent(self) -> Trial:
        d, cfg, calls, trace = self._paths("concurrent")
        write_config(cfg, self.corpus, d / ".kb", batch_rows=self.batch_rows)
        trial = Trial(kind="two runs at once", target="whole run")
        first = start_index(self.env, cfg, calls, trace)
        # once the first holds its first source, a second run (which must wait) and a --no-wait run (which
        # must exit 3) start together
        wait_for_stage(trace, first.pid, "kb_documents", first)
        time.sleep(self.rng.uniform(0.0, 1.0))
        second = start_index(self.env, cfg, calls, trace)
        third = start_index(self.env, cfg, calls, trace, "--no-wait")
        rc3, _, err3 = finish(third)
        rc1, out1, err1 = finish(first)
        rc2, out2, err2 = finish(second)
        trial.fault_rc = rc1
        own = []
        for out in (out1, out2):
            try:
                own.append(sum((s["this_run"].get("embeddings") or {}).get("chunks_embedded", 0)
                               for s in json.loads(out)["sources"]))
            except (ValueError, KeyError):
                own.append(None)
        both = texts_embedded(calls)
        trial.notes = (f" rc {rc1}/{rc2}, --no-wait rc {rc3}; summaries: embedded {own[0]} + {own[1]};"
                       f" texts by both: {both} (clean {self.clean_texts});"
                       f" waited: {'waiting for source' in err1 + err2}; --no-wait line: "
                       f"{(err3.strip().splitlines() or [''])[-1][:120]}")
        if rc1 or rc2 or rc3 != 3 or both != self.clean_texts:
            trial.diffs.append("concurrent runs: wrong exit codes or duplicated work")
        self._rerun_and_compare(trial, d, cfg, calls, trace)
        shutil.rmtree(d, ignore_errors=True)
        return trial

    def database_restart(self, down_seconds: float, retry_seconds: float = 10) -> Trial:
        """Server mode: stop the server in the embedding stage, start it again after `down_seconds`."""
        d, cfg, calls, trace = self._paths("db")
        pgdata = d / "server"
        url = server_start(pgdata)
        write_config(cfg, self.corpus, d / ".kb", batch_rows=self.batch_rows, database_url=url,
                     retry_seconds=retry_seconds)
        kind = "database restarted" if down_seconds < retry_seconds else "database down"
        trial = Trial(kind=f"{kind} ({down_seconds:.0f} s)", target="kb_embeddings")
        proc = start_index(self.env, cfg, calls, trace)
        t0 = wait_for_stage(trace, proc.pid, "kb_embeddings", proc)
        if t0 is not None:
            trial.delay = round(self.rng.uniform(0, max(0.05, 0.9 * self.durations.get("kb_embeddings", 0.5))), 3)
            time.sleep(max(0.0, t0 + trial.delay - time.time()))
            trial.hit = stage_running(trace, proc.pid) or "between stages"
            stopped = time.perf_counter()
            server_stop(pgdata)
            if down_seconds < retry_seconds:
                time.sleep(down_seconds)
                server_start(pgdata)
            rc, out, err = finish(proc, timeout=300)
            trial.fault_rc = rc
            trial.stop_seconds = round(time.perf_counter() - stopped, 1)
            last = (err.strip().splitlines() or [""])[-1]
            trial.notes = f" stderr lines: {len(err.strip().splitlines())}; last: {last[:160]}"
            if down_seconds >= retry_seconds:
                server_start(pgdata)
        self._rerun_and_compare(trial, d, cfg, calls, trace, url=url)
        server_stop(pgdata)
        shutil.rmtree(d, ignore_errors=True)
        return trial


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=60)
    ap.add_argument("--cost", type=float, default=0.01, help="stand-in embedder seconds per text")
    ap.add_argument("--batch-rows", type=int, default=50)
    ap.add_argument("--kills-per-stage", type=int, default=2)
    ap.add_argument("--sigterms", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default=None)
    ap.add_argument("--json", help="write the trials here")
    ap.add_argument("--only", default="",
                    help="a short run: comma-separated trials among kill9, kill9:<stage>, sigterm, concurrent, "
                         "restart, down (kill9: --kills-per-stage in embeddings; restart: --restarts trials)")
    ap.add_argument("--restarts", type=int, default=1, help="database-restarted trials")
    args = ap.parse_args(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="kbfaults-", dir="/tmp"))
    h = Harness(work, n_docs=args.docs, cost=args.cost, batch_rows=args.batch_rows, seed=args.seed)
    started = time.perf_counter()
    clean = h.reference()
    print(f"clean: {clean}", flush=True)
    trials: list[Trial] = []

    def run(t: Trial) -> None:
        trials.append(t)
        print(f"{'ok  ' if t.ok else 'FAIL'} {t.kind:<24} target={t.target:<16} hit={t.hit or '-':<16} "
              f"delay={t.delay:<6} rc={t.fault_rc} stop={t.stop_seconds} rerun={t.rerun_rc} "
              f"redone={t.redone_texts} texts ({t.redone_batches} batches) left={t.server_left} "
              f"{'; '.join(t.diffs)}{t.notes}", flush=True)

    only = {x.strip() for x in args.only.split(",") if x.strip()}
    if not only:
        for stage in STAGES:
            for _ in range(args.kills_per_stage):
                run(h.kill9(stage))
        for _ in range(args.sigterms):
            run(h.sigterm("kb_embeddings"))
        run(h.sigterm("kb_documents"))
        run(h._fault_at("SIGINT", "kb_chunks", signal.SIGINT))
        run(h.concurrent())
    else:
        for _ in range(args.kills_per_stage if "kill9" in only else 0):
            run(h.kill9("kb_embeddings"))
        for stage in STAGES:      # e.g. kill9:kb_projections
            for _ in range(args.kills_per_stage if f"kill9:{stage}" in only else 0):
                run(h.kill9(stage))
        for _ in range(args.sigterms if "sigterm" in only else 0):
            run(h.sigterm("kb_embeddings"))
        if "concurrent" in only:
            run(h.concurrent())
    for _ in range(args.restarts if not only or "restart" in only else 0):
        run(h.database_restart(3))
    if not only or "down" in only:
        run(h.database_restart(15))
    report = {"clean": clean, "trials": [dict(asdict(t), ok=t.ok) for t in trials],
              "passed": sum(t.ok for t in trials), "total": len(trials),
              "seconds": round(time.perf_counter() - started, 1), "load_average": os.getloadavg(),
              "args": vars(args)}
    print(f"{report['passed']}/{report['total']} trials ended in the clean state "
          f"({report['seconds']} s, load average {os.getloadavg()[0]:.2f})")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if report["passed"] == report["total"] else 1


if __name__ == "__main__":
    sys.exit(main())
