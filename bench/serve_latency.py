"""`kb serve` latency and load at 50,000 chunks, with the local model embedding every query.

    python bench/serve_latency.py                 # build (or reuse) the index, start kb serve, measure, print
    python bench/serve_latency.py --write-doc     # also write the "## kb serve" section of docs/BENCHMARKS.md

The index is bench/recall_latency.py's synthetic one (2,000 documents, 50,000 chunks, clustered 384-d vectors,
Zipf texts), filed under the local model's name (all-MiniLM-L6-v2, 384-d) so that `kb serve` embeds each query
with the real model. The synthetic vectors are not MiniLM's, so the relevance gate is opened (min_similarity -1,
min_keyword_coverage 0) to keep every answer at its full 20 + 10 records — the fetch a real answer pays.

1. Latency: one client (this process, httpx, keep-alive) asks GET /api/v1/recall for 150 short and 50
   paragraph-long queries, each of the default server and (--compare numpy) of a second server on the previous
   numpy encoder in turn, so both see the same load: wall time per request (query embedding, search, records,
   JSON, HTTP) and the server's own timings; then 50 of them again (query-vector cache hits).
2. Load: 16 concurrent clients (asyncio + httpx in this process, a second process beside the server on
   loopback) loop over the same queries, each made unique (no cache hit), for --load-seconds (60): throughput,
   p50/p95, errors, the server's RSS before and after.
3. Cold `kb recall --json` in a fresh process through KB_SERVER, against the same call in-process.

The machine is shared: every figure comes with the load average.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

LOCAL_MODEL = "all-MiniLM-L6-v2"


def pct(values, p):
    v = sorted(values)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, max(0, int(round(p / 100 * (len(v) - 1)))))]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def prepare(work: Path, chunks: int):
    import recall_latency as rl

    from kb_assets.store.db import connect, embedded_url, migrate

    rl.MODEL = LOCAL_MODEL          # the space the server's model matches
    url = embedded_url(work)
    conn = connect(url, register=False)
    migrate(conn)
    have = conn.execute("SELECT to_regclass('bench_meta') IS NOT NULL").fetchone()[0]
    if have and conn.execute("SELECT (v->>'chunks')::int FROM bench_meta").fetchone()[0] == chunks:
        meta = conn.execute("SELECT v FROM bench_meta").fetchone()[0]
        print("reusing", work, flush=True)
    else:
        if have:
            sys.exit(f"{work} holds a different corpus: remove it or pass another --work")
        print(f"building {chunks} synthetic chunks in {work} …", flush=True)
        meta = rl.build(conn, chunks)
    (work / "kb.yaml").write_text(
        f"data_dir: {work}\nsources: []\nquery:\n  min_similarity: -1\n  min_keyword_coverage: 0\n")
    return conn, meta, rl.make_queries(conn, 150, 50)


def start_server(work: Path, port: int, extra_env: dict | None = None, log_name: str = "serve.log"):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", KB_CONFIG=str(work / "kb.yaml"))
    env.pop("KB_DATABASE_URL", None)
    env.update(extra_env or {})
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "kb_assets.cli", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(work / log_name, "w"), start_new_session=True)
    import httpx

    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return proc, time.perf_counter() - t0
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            sys.exit("kb serve exited:\n" + (work / log_name).read_text())
        time.sleep(0.2)


def query_runtime(work: Path, log_name: str) -> str:
    """The query encoder a server announced at start ("query encoder: onnx (2 threads)" in its log)."""
    m = re.search(r"query encoder: (\S+) \((\d+) threads?\)", (work / log_name).read_text(errors="replace"))
    return f"{m.group(1)}, {m.group(2)} threads" if m else "unknown"


def word_pieces(queries) -> dict:
    """Word pieces per query as the model counts them (before its 256-piece truncation): the encoder's cost
    grows with them, and the synthetic "w123" words are ~2.5 pieces each."""
    from tokenizers import Tokenizer

    from kb_assets.embedding.local import packaged_model_dir

    tok = Tokenizer.from_file(str(packaged_model_dir() / "tokenizer.json"))
    tok.no_truncation()           # the file's own settings (truncate at 128, pad) are not what the encoder uses
    tok.no_padding()
    out = {}
    for label, sel in (("short", [q for q, _v, _ in queries if len(q.split()) < 20]),
                       ("paragraph", [q for q, _v, _ in queries if len(q.split()) >= 20])):
        n = [len(e.ids) for e in tok.encode_batch(sel)]
        out[label] = {"p50": pct(n, 50), "max": max(n), "truncated": sum(x > 256 for x in n)}
    return out


def cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds: what a request costs whatever else the machine runs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _summary(rows: list[dict]) -> dict:
    """p50/p95 of wall and the server's own timings, overall and per query length."""
    out = {"n": len(rows)}
    for label, sel in (("all", rows), ("short", [r for r in rows if r["short"]]),
                       ("paragraph", [r for r in rows if not r["short"]])):
        out[label] = {k: [pct([r[k] for r in sel], 50), pct([r[k] for r in sel], 95)]
                      for k in ("wall", "embed", "search", "fetch", "server")}
    return out


def latency(servers: dict, token: str, queries) -> dict:
    """One client asks every query once of each server in turn (A/B within one run: the same load for both);
    then asks 50 of them again (query-vector cache hits)."""
    import httpx

    clients = {name: httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60)
               for name, (base, _pid) in servers.items()}
    rows = {name: [] for name in servers}
    cpu = {}
    try:
        for c in clients.values():                          # warm-up with other texts: caches stay cold
            for i in range(10):
                c.get("/api/v1/recall", params={"q": f"warm up {i} w{i} w{i + 40}"})
        cpu0 = {name: cpu_s(pid) for name, (_b, pid) in servers.items()}

        def ask(name: str, q: str) -> dict:
            t0 = time.perf_counter()
            r = clients[name].get("/api/v1/recall", params={"q": q})
            ms = (time.perf_counter() - t0) * 1000
            assert r.status_code == 200, r.text
            body = r.json()
            assert len(body["documents"]) == 20, len(body["documents"])
            t = body["timings"]
            return {"short": len(q.split()) < 20, "wall": ms, "embed": t["embed_ms"], "search": t["search_ms"],
                    "fetch": t["fetch_ms"], "server": t["total_ms"]}

        for k, (q, _v, _) in enumerate(queries):
            order = list(servers) if k % 2 == 0 else list(servers)[::-1]
            for name in order:
                rows[name].append(ask(name, q))
        cpu = {name: (cpu_s(pid) - cpu0[name]) * 1000 / len(queries) for name, (_b, pid) in servers.items()}
        first = list(servers)[0]
        again = [ask(first, q) for q, _v, _ in queries[::4]]
    finally:
        for c in clients.values():
            c.close()
    out = {name: {**_summary(r), "server_cpu_ms_per_request": cpu[name]} for name, r in rows.items()}
    out["repeat"] = _summary(again)
    return out


async def _load(base: str, token: str, queries, clients: int, seconds: float) -> dict:
    import httpx

    lat, errors, statuses = [], 0, {}
    stop_at = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def worker(i: int, c: httpx.AsyncClient):
        nonlocal errors
        k = i
        while time.perf_counter() < stop_at:
            q = f"{queries[k % len(queries)][0]} r{k}"   # unique text: every request runs the encoder
            k += clients
            t0 = time.perf_counter()
            try:
                r = await c.get("/api/v1/recall", params={"q": q})
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code != 200:
                    errors += 1
            except httpx.HTTPError:
                errors += 1
                continue
            lat.append((time.perf_counter() - t0) * 1000)

    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60,
                                 limits=limits) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i, c) for i in range(clients)))
        elapsed = time.perf_counter() - t0
    return {"clients": clients, "seconds": round(elapsed, 1), "requests": len(lat) + errors, "errors": errors,
            "statuses": statuses, "throughput_rps": len(lat) / elapsed, "p50_ms": pct(lat, 50),
            "p95_ms": pct(lat, 95)}


def cold_cli(work: Path, base: str, token: str, runs: int) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", KB_CONFIG=str(work / "kb.yaml"))
    env.pop("KB_DATABASE_URL", None)
    q = "w101 w2002 w30 retry backoff"

    def run(extra) -> float:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "kb_assets.cli", "recall", q, "--json"], env={**env, **extra},
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
        return time.perf_counter() - t0

    remote = [run({"KB_SERVER": base, "KB_TOKEN": token}) for _ in range(runs)]
    local = [run({}) for _ in range(max(1, runs // 2))]
    return {"via_server_s": statistics.median(remote), "via_server_all": [round(x, 2) for x in remote],
            "in_process_s": statistics.median(local), "in_process_all": [round(x, 2) for x in local]}


def write_doc(section: str) -> Path:
    doc = ROOT / "docs" / "BENCHMARKS.md"
    text = doc.read_text(encoding="utf-8") if doc.exists() else "# Benchmarks\n"
    pattern = re.compile(r"^## kb serve\n.*?(?=^## |\Z)", re.S | re.M)
    m = pattern.search(text)
    text = (text[:m.start()] + section.rstrip("\n") + "\n\n" + text[m.end():]) if m else \
        text.rstrip("\n") + "\n\n" + section
    doc.write_text(text.rstrip("\n") + "\n", encoding="utf-8")
    return doc


def _row(label: str, lat: dict, key: str = "wall") -> str:
    return (f"| {label} | {lat['all'][key][0]:.1f} | {lat['all'][key][1]:.1f} | {lat['short'][key][0]:.1f} | "
            f"{lat['short'][key][1]:.1f} | {lat['paragraph'][key][0]:.1f} | {lat['paragraph'][key][1]:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "kb-bench-serve"))
    ap.add_argument("--chunks", type=int, default=50_000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--load-seconds", type=float, default=60.0)
    ap.add_argument("--cold-runs", type=int, default=4)
    ap.add_argument("--compare", action="append",
                    help="another server with these environment settings (space-separated KEY=VALUE), asked in "
                         "turn with the default one in the latency phase; repeatable. Default: the previous "
                         "state (numpy encoder, embed then search) and the onnxruntime encoder without the "
                         "overlap of embedding and keyword search")
    ap.add_argument("--write-doc", action="store_true")
    ap.add_argument("--allow-numpy", action="store_true",
                    help="measure even when the default server's query encoder is not onnxruntime")
    args = ap.parse_args()
    if args.compare is None:
        args.compare = ["KB_QUERY_RUNTIME=numpy KB_RECALL_OVERLAP=0", "KB_RECALL_OVERLAP=0"]
    args.compare = [c for c in args.compare if c.strip()]

    from kb_assets.serving.tokens import create_token
    from kb_assets_tests.serve_support import free_port

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    conn, meta, queries = prepare(work, args.chunks)
    conn.execute("DELETE FROM api_tokens WHERE name = 'bench'")
    token = create_token(conn, "bench", rate="1000000/min")["token"]
    pieces = word_pieces(queries)
    print("word pieces per query", json.dumps(pieces), flush=True)
    procs = {}
    try:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc, start_s = start_server(work, port)
        procs["default"] = (base, proc)
        servers = {"default": (base, proc.pid)}
        runtimes = {"default": query_runtime(work, "serve.log")}
        print(f"kb serve up in {start_s:.1f} s (model loaded, pool open; query encoder {runtimes['default']}); "
              f"RSS {rss_mb(proc.pid):.0f} MB", flush=True)
        if not runtimes["default"].startswith("onnx") and not args.allow_numpy:
            # the 21:00 quiet run measured a venv without onnxruntime (numpy in both "runtimes"): refuse that
            sys.exit(f"the default server's query encoder is {runtimes['default']}, not onnxruntime: this venv "
                     "lacks onnxruntime (./dev setup installs the pinned version); --allow-numpy measures anyway")
        rss_start = rss_mb(proc.pid)
        for n, spec in enumerate(args.compare):
            cport = free_port()
            extra = dict(kv.split("=", 1) for kv in spec.split())
            cproc, _ = start_server(work, cport, extra, f"serve-compare-{n}.log")
            runtimes[spec] = query_runtime(work, f"serve-compare-{n}.log")
            print(f"compare server `{spec}`: query encoder {runtimes[spec]}", flush=True)
            procs[spec] = (f"http://127.0.0.1:{cport}", cproc)
            servers[spec] = (f"http://127.0.0.1:{cport}", cproc.pid)
        load0 = os.getloadavg()
        lat = latency(servers, token, queries)
        load1 = os.getloadavg()
        print("latency", json.dumps(lat), f"load {load0[0]:.1f} -> {load1[0]:.1f}", flush=True)
        for spec in args.compare:
            cproc = procs.pop(spec)[1]
            os.killpg(cproc.pid, signal.SIGTERM)
            cproc.wait(30)
        rss_before = rss_mb(proc.pid)
        samples, sampling = [], threading.Event()

        def sample():
            while not sampling.wait(args.load_seconds / 6):
                samples.append(round(rss_mb(proc.pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        load = asyncio.run(_load(base, token, queries, args.clients, args.load_seconds))
        sampling.set()
        rss_after = rss_mb(proc.pid)
        load["rss_samples_mb"] = samples
        load2 = os.getloadavg()
        print("load", json.dumps(load), f"RSS {rss_before:.0f} -> {rss_after:.0f} MB; load avg {load2[0]:.1f}",
              flush=True)
        cold = cold_cli(work, base, token, args.cold_runs)
        load3 = os.getloadavg()
        print("cold kb recall", json.dumps(cold), f"load {load3[0]:.1f}", flush=True)
    finally:
        for _b, p in procs.values():
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(30)
    if args.write_doc:
        d = lat["default"]
        table = ["| server | all p50 | all p95 | short p50 | short p95 | paragraph p50 | paragraph p95 |",
                 "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
                 _row(f"**default** (query encoder {runtimes['default']}, keyword search while embedding): wall "
                      "at the client", d),
                 _row("… query embedding (server; runs beside the keyword search)", d, "embed"),
                 _row("… candidates: search + fusion (server; includes any wait for the embedding)", d, "search"),
                 _row("… records (server)", d, "fetch")]
        for spec in args.compare:
            c = lat[spec]
            table += [_row(f"`{spec}` ({runtimes[spec]}): wall at the client", c),
                      _row("… query embedding (server)", c, "embed"),
                      _row("… candidates: search + fusion (server)", c, "search")]
        table.append(_row("default, the same queries again (query-vector cache hits)", lat["repeat"]))
        cpu_line = f"**{d['server_cpu_ms_per_request']:.1f} ms of server CPU per request** (default)"
        for spec in args.compare:
            cpu_line += f"; {lat[spec]['server_cpu_ms_per_request']:.1f} ms with `{spec}`"
        section = "\n".join([
            "## kb serve",
            "",
            f"Command: `python bench/serve_latency.py --write-doc` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}). "
            f"The synthetic 50K index of bench/recall_latency.py ({meta['chunks']:,} chunks, {meta['documents']:,} "
            f"documents) filed under {LOCAL_MODEL}, so `kb serve` embeds every query with the real local model "
            "(its own weights, the torch-free encoder of kb_assets/embedding/numpy_bert.py); the relevance gate is "
            "opened so every answer carries its full 20 documents + 10 code records. "
            f"{os.cpu_count()} cores **shared with the other engineers' work**: the load average is given with each "
            "figure; ratios within one run are the honest comparison. "
            f"Python {platform.python_version()}, uvicorn, embedded PostgreSQL 16 + pgvector 0.6.2.",
            "",
            f"Start-up: `kb serve` answers /healthz {start_s:.1f} s after launch (imports, database, query encoder "
            f"session, pool), once; RSS {rss_start:.0f} MB (no torch in the process).",
            "",
            f"**Latency**, one client, {d['n']} requests per server (150 short 3-8-word queries, 50 paragraph-long "
            f"60-100-word ones: {pieces['short']['p50']} and {pieces['paragraph']['p50']} word pieces at the median, "
            f"{pieces['paragraph']['truncated']} of {sum(1 for q in queries if len(q[0].split()) >= 20)} paragraphs "
            "beyond the model's 256 and truncated to it; GET /api/v1/recall, wall time at the client: query embedding "
            "+ search + records + JSON + HTTP)" + (", asked in turn of the default server and of servers with other settings on the "
                              "same index (`KB_QUERY_RUNTIME=numpy`: the previous numpy encoder; "
                              "`KB_RECALL_OVERLAP=0`: embed first, then search, as before)" if args.compare else "")
            + f"; load average {load0[0]:.1f} → {load1[0]:.1f}. Milliseconds:",
            "",
            *table,
            "",
            f"{cpu_line}: utime + stime over the requests (embedding, search, records, JSON, HTTP, token check) "
            "— the figure the machine's load does not inflate. Targets: p50 ≤ 40 ms, p95 ≤ 120 ms.",
            "",
            f"**Load**: {load['clients']} concurrent clients from a second process on loopback (asyncio + httpx, "
            f"keep-alive), {load['seconds']} s, every request a query text not asked before (the encoder runs "
            f"every time; no cache hit): {load['requests']} requests, **{load['throughput_rps']:.1f} req/s**, "
            f"p50 {load['p50_ms']:.0f} ms, p95 {load['p95_ms']:.0f} ms, **{load['errors']} errors** "
            f"(statuses {load['statuses']}); server RSS {rss_before:.0f} MB before, {rss_after:.0f} MB after "
            f"(every {args.load_seconds / 6:.0f} s during the run: {load['rss_samples_mb']} MB); "
            f"load average {load2[0]:.1f} at the end. Query embeddings run one at a time (serve.embed_threads "
            "threads each); searches and record fetches run in parallel on the connection pool.",
            "",
            f"**Cold `kb recall --json`** in a fresh process (load average {load3[0]:.1f}): through the server "
            f"(KB_SERVER + KB_TOKEN) {cold['via_server_s']:.2f} s median of {cold['via_server_all']}; in-process "
            f"(numpy encoder, opens the database) {cold['in_process_s']:.2f} s median of {cold['in_process_all']}.",
            ""])
        print("wrote", write_doc(section))


if __name__ == "__main__":
    main()
