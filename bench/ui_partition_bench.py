"""An unchanged partition materialized from the Dagster UI (issue target: <= 5 s, 0 embedding and 0 LLM calls).

    .venv/bin/python bench/ui_partition_bench.py [--runs 3] [--storage sqlite|postgres] [--write-doc] \\
        [--corpus /work/shared/corpora/adr-nats-io+nats-architecture-and-design-*.tar.gz] [--work DIR] [--keep]

1. Extracts the NATS ADRs into a fresh work folder, writes a kb.yaml over them (one source `nats`, kind adr, the
   local model, extractive signposts, the embedded PostgreSQL under the work folder; noop_bench's helpers) and
   indexes it once with `kb index` (the real model: the slow first run). --work DIR reuses a folder indexed before.
2. Starts what a user has behind the UI: `dagster-webserver -w workspace.yaml` (kb_assets.definitions, as the
   repo's workspace.yaml) and `dagster-daemon run`, with a temporary DAGSTER_HOME whose dagster.yaml is the
   repo's (default sqlite storage, telemetry off, the pool limits) and KB_CONFIG = that kb.yaml; waits for the
   code location to be LOADED and the daemon's run queue to be healthy.
3. Launches job `kb_index`, partition `nats`, --runs times, one after the other, as the UI's "Materialize" button
   does for one partition (LaunchAssetChoosePartitionsDialog → single run): the partition's tags and run config
   from `partitionSetOrError`, then mutation `launchPipelineExecution` with the job's assets and asset checks in
   the selector. Per run: seconds from the mutation to SUCCESS as seen polling `runOrError` (what the user
   waits for), the run's own startTime→endTime, chunks embedded, LLM calls, whether the regression check was
   `reused`, and where the time went (from the run's event log: queue, run worker start, steps, step workers).
4. Prints a table with `uptime`'s load average before and after; --write-doc puts it in docs/BENCHMARKS.md
   under "## unchanged partition materialized from the UI (NATS ADRs)" (replacing that section).
--storage postgres runs Dagster's instance as the deployment does (docker/dagster.yaml: dagster-postgres run,
event and schedule storage) against a PostgreSQL of its own (pgserver, database `dagster`); the default, sqlite,
is the repo's dagster.yaml (a developer's `dg dev`). --executor multiprocess sets KB_DAGSTER_EXECUTOR for every
process (a process per step, Dagster's default: the "before" of issue 11). --dequeue-interval N overrides
`run_queue: dequeue_interval_seconds` (the repo's files: 1). --coordinator prompt|queued|default puts kb's
PromptRunCoordinator (the repo's files), Dagster's QueuedRunCoordinator or its DefaultRunCoordinator in the temp
dagster.yaml (default: the copied file's).
--py-spy PREFIX profiles the webserver and the daemon during the runs (py-spy --subprocesses; on this machine
it sampled the webserver's own process only, not the run workers its code server spawns).

Bounded: every wait has a timeout (--deadline for the whole UI part); every process group is killed and the
work folder removed at the end (unless --work or --keep).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from noop_bench import _corpus_root, run_index, write_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SECTION = "## unchanged partition materialized from the UI (NATS ADRs)"
JOB, PARTITION, LOCATION, REPOSITORY = "kb_index", "nats", "kb_assets", "__repository__"

LOCATION_Q = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
DAEMON_Q = """{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }"""
# what the UI loads before the dialog (LaunchAssetLoaderJobQuery, trimmed to what the launch uses)
ASSETS_Q = """query($job: PipelineSelector!) { assetNodes(pipeline: $job) { assetKey { path } jobNames
  assetChecksOrError { ... on AssetChecks { checks { name jobNames canExecuteIndividually } } } } }"""
PARTITION_SETS_Q = """query($repo: RepositorySelector!, $job: String!) {
  partitionSetsOrError(repositorySelector: $repo, pipelineName: $job) { __typename
    ... on PartitionSets { results { name } } ... on PythonError { message } } }"""
# the dialog's CONFIG_PARTITION_SELECTION_QUERY
PARTITION_Q = """query($repo: RepositorySelector!, $set: String!, $partition: String!) {
  partitionSetOrError(repositorySelector: $repo, partitionSetName: $set) { __typename
    ... on PartitionSet { partition(partitionName: $partition) { name mode
      runConfigOrError { __typename ... on PartitionRunConfig { yaml } ... on PythonError { message } }
      tagsOrError { __typename ... on PartitionTags { results { key value } } ... on PythonError { message } } } }
    ... on PythonError { message } } }"""
LAUNCH_M = """mutation LaunchPipelineExecution($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) { __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on PythonError { message stack }
    ... on InvalidSubsetError { message }
    ... on PipelineNotFoundError { message }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on UnauthorizedError { message } } }"""
RUN_Q = """query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { runId status creationTime startTime
  endTime stepStats { stepKey status startTime endTime } } ... on PythonError { message } } }"""
_META = """metadataEntries { label __typename ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry
  { floatValue } ... on BoolMetadataEntry { boolValue } ... on TextMetadataEntry { text } }"""
LOGS_Q = """query($id: ID!, $cursor: String) { logsForRun(runId: $id, afterCursor: $cursor, limit: 1000) {
  __typename ... on EventConnection { cursor hasMore events { __typename
    ... on MessageEvent { timestamp eventType stepKey message }
    ... on MaterializationEvent { assetKey { path } %s }
    ... on AssetCheckEvaluationEvent { evaluation { checkName success %s } } } }
  ... on PythonError { message } } }""" % (_META, _META)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:
        load = os.getloadavg()
        return f"load average: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}"


def _load(up: str) -> str:
    m = re.search(r"load average: (.+)$", up)
    return m.group(1) if m else up


class Procs:
    """Processes in their own sessions (process groups), stopped as groups: dagster's children included."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs = tmp, []

    def start(self, name: str, args: list[str], env: dict) -> None:
        log = open(self.tmp / f"{name}.log", "wb")
        self.procs.append((name, subprocess.Popen(args, env=env, cwd=self.tmp, stdout=log,
                                                  stderr=subprocess.STDOUT, start_new_session=True)))

    def log(self, name: str) -> str:
        p = self.tmp / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def check_alive(self) -> None:
        for name, p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.log(name)[-3000:]}")

    def stop(self, only: str | None = None) -> None:
        procs = [(n, p) for n, p in self.procs if only is None or n == only]
        for sig, wait in ((signal.SIGINT, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            alive = [p for _, p in procs if p.poll() is None]
            for p in alive:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + wait
            while time.monotonic() < end and any(p.poll() is None for p in alive):
                time.sleep(0.2)
        for _, p in procs:    # children left in a group whose leader already exited
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.procs = [(n, p) for n, p in self.procs if (n, p) not in procs]


def _stop_embedded_pg(work: Path) -> None:
    """The embedded PostgreSQL under work/data stops with its last holder; if one was killed, stop it here."""
    pidfile = work / "data" / "pg" / "postmaster.pid"
    if not pidfile.exists():
        return
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, signal.SIGINT)     # postgres "fast" shutdown
    except (ValueError, IndexError, ProcessLookupError, PermissionError):
        return
    end = time.monotonic() + 15
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


PROMPT = {"module": "kb_assets.defs.run_coordinator", "class": "PromptRunCoordinator"}


def _set_dequeue_interval(dagster_yaml: Path, seconds: int) -> None:
    import yaml

    conf = yaml.safe_load(dagster_yaml.read_text()) or {}
    if "run_coordinator" in conf:
        conf["run_coordinator"].setdefault("config", {})["dequeue_interval_seconds"] = seconds
    else:
        conf.setdefault("run_queue", {})["dequeue_interval_seconds"] = seconds
    dagster_yaml.write_text(yaml.safe_dump(conf, sort_keys=False))


def _set_coordinator(dagster_yaml: Path, coordinator: str) -> None:
    """`prompt`: kb's PromptRunCoordinator (the repo's files); `queued`: Dagster's QueuedRunCoordinator
    (`run_queue:` config); `default`: the DefaultRunCoordinator (the process that receives the launch starts
    the run at once, no run limit)."""
    import yaml

    conf = yaml.safe_load(dagster_yaml.read_text()) or {}
    queue = dict((conf.pop("run_coordinator", None) or {}).get("config") or conf.pop("run_queue", None)
                 or {"dequeue_interval_seconds": 1})
    conf.pop("run_queue", None)
    if coordinator == "default":
        conf["run_coordinator"] = {"module": "dagster._core.run_coordinator", "class": "DefaultRunCoordinator"}
    elif coordinator == "prompt":
        conf["run_coordinator"] = {**PROMPT, "config": queue}
    else:   # the run limits go to `concurrency: runs:` (Dagster refuses them in run_queue beside `concurrency:`)
        runs = {k: queue.pop(k) for k in ("max_concurrent_runs", "tag_concurrency_limits") if k in queue}
        if runs:
            conf.setdefault("concurrency", {}).setdefault("runs", {}).update(runs)
        conf["run_queue"] = queue
    dagster_yaml.write_text(yaml.safe_dump(conf, sort_keys=False))


def _coordinator_of(dagster_yaml: Path) -> str:
    import yaml

    conf = yaml.safe_load(dagster_yaml.read_text()) or {}
    cls = str((conf.get("run_coordinator") or {}).get("class"))
    return "default" if "DefaultRunCoordinator" in cls else "prompt" if cls == PROMPT["class"] else "queued"


def _start_dagster_pg(pgdata: Path) -> str:
    """A PostgreSQL for Dagster's storage (as compose's `dagster` database): its psycopg2 URL."""
    code = ("import sys, psycopg, pgserver; s = pgserver.get_server(sys.argv[1], cleanup_mode=None); u = s.get_uri()\n"
            "with psycopg.connect(u, autocommit=True) as c:\n"
            "    if not c.execute(\"SELECT 1 FROM pg_database WHERE datname = 'dagster'\").fetchone():\n"
            "        c.execute('CREATE DATABASE dagster')\n"
            "print(u)")
    pgdata.mkdir(parents=True, exist_ok=True)
    out = subprocess.run([sys.executable, "-c", code, str(pgdata)], capture_output=True, text=True, check=True)
    import psycopg.conninfo as ci

    p = ci.conninfo_to_dict(out.stdout.strip().splitlines()[-1])
    # postgresql+psycopg2: with SQLAlchemy 2.1 a plain postgresql:// picks psycopg 3 (FACTS.md)
    return f"postgresql+psycopg2://{p.get('user', 'postgres')}:@/dagster?host={p['host']}"


def _stop_dagster_pg(pgdata: Path) -> None:
    code = ("import os, sys; from pgserver._commands import pg_ctl;"
            " pg_ctl(['-w', '-m', 'fast', 'stop'], pgdata=sys.argv[1], user='pgserver' if os.geteuid() == 0 else None)")
    if (pgdata / "postmaster.pid").exists():
        subprocess.run([sys.executable, "-c", code, str(pgdata)], capture_output=True, text=True, timeout=60)


def _kill_leftovers(marker: str) -> None:
    """Processes whose command line names our own work folder (a kb index killed by a timeout leaves its child)."""
    spare, pid = set(), os.getpid()        # this process and its ancestors (a shell naming --work DIR)
    while pid > 1 and pid not in spare:
        spare.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in spare:
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            try:
                os.kill(int(d.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _start_py_spy(prefix: str, procs: Procs) -> list:
    """py-spy on the processes that launch runs: the daemon (queued runs) and the webserver (runs that start
    at once are launched by the process that received the mutation)."""
    exe = os.environ.get("PY_SPY") or shutil.which("py-spy")
    if not exe:
        raise SystemExit("--py-spy: no py-spy ($PY_SPY or PATH)")
    spies = []
    for name, p in procs.procs:
        out = f"{prefix}.{name}.raw"
        spies.append(subprocess.Popen([exe, "record", "--subprocesses", "-r", "100", "-f", "raw", "-o", out,
                                       "-p", str(p.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    time.sleep(2)   # py-spy attached before the first launch
    return spies


def _stop_py_spy(spies: list) -> None:
    for s in spies:
        s.send_signal(signal.SIGINT)
    for s in spies:
        try:
            s.wait(timeout=30)
        except subprocess.TimeoutExpired:
            s.kill()


class Bench:
    def __init__(self, http, procs: Procs, deadline: float):
        self.http, self.procs, self.deadline = http, procs, deadline

    def gql(self, query: str, variables: dict | None = None) -> dict:
        r = self.http.post("/graphql", json={"query": query, "variables": variables or {}})
        r.raise_for_status()
        body = r.json()
        if body.get("errors"):
            raise RuntimeError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def wait(self, what: str, fn, every: float = 1.0):
        while True:
            self.procs.check_alive()
            got = fn()
            if got:
                return got
            if time.monotonic() > self.deadline:
                logs = "\n".join(f"--- {n}\n{self.procs.log(n)[-2500:]}" for n, _ in self.procs.procs)
                raise TimeoutError(f"timed out waiting for {what}\n{logs}")
            time.sleep(every)

    def location_loaded(self):
        import httpx

        try:
            entries = self.gql(LOCATION_Q)["workspaceOrError"].get("locationEntries") or []
        except (httpx.HTTPError, RuntimeError):
            return None
        for e in entries:
            if e["name"] == LOCATION and e["loadStatus"] == "LOADED":
                if e["locationOrLoadError"]["__typename"] != "RepositoryLocation":
                    raise RuntimeError(f"the code location failed to load: {e['locationOrLoadError']}")
                return True
        return None

    def queue_daemon_healthy(self):
        """The daemon's run queue (QueuedRunCoordinator); without one (DefaultRunCoordinator) every daemon
        the instance requires (the sensors, schedules: what starts runs on its own)."""
        statuses = self.gql(DAEMON_Q)["instance"]["daemonHealth"]["allDaemonStatuses"]
        if any(s["daemonType"] == "QUEUED_RUN_COORDINATOR" for s in statuses):
            return any(s["daemonType"] == "QUEUED_RUN_COORDINATOR" and s["healthy"] for s in statuses) or None
        required = [s for s in statuses if s["required"]]
        return (bool(required) and all(s["healthy"] for s in required)) or None

    def launch_params(self) -> dict:
        """What the UI sends for one partition of job kb_index (executionParamsForAssetJob + partition tags)."""
        repo = {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}
        nodes = self.gql(ASSETS_Q, {"job": {**repo, "pipelineName": JOB}})["assetNodes"]
        sets = self.gql(PARTITION_SETS_Q, {"repo": repo, "job": JOB})["partitionSetsOrError"]
        if sets["__typename"] != "PartitionSets" or not sets["results"]:
            raise RuntimeError(f"no partition set for {JOB}: {sets}")
        part = self.gql(PARTITION_Q, {"repo": repo, "set": sets["results"][0]["name"], "partition": PARTITION})
        part = part["partitionSetOrError"]["partition"]
        tags = [{"key": t["key"], "value": t["value"]} for t in part["tagsOrError"]["results"]]
        checks = [{"assetKey": {"path": n["assetKey"]["path"]}, "name": c["name"]} for n in nodes
                  for c in (n["assetChecksOrError"].get("checks") or []) if not c["jobNames"] or JOB in c["jobNames"]]
        return {"mode": part["mode"] or "default", "runConfigData": part["runConfigOrError"].get("yaml") or "{}",
                "executionMetadata": {"tags": tags},
                "selector": {**repo, "pipelineName": JOB,
                             "assetSelection": [{"path": n["assetKey"]["path"]} for n in nodes],
                             "assetCheckSelection": checks}}

    def events(self, run_id: str) -> list[dict]:
        out, cursor = [], None
        for _ in range(50):
            conn = self.gql(LOGS_Q, {"id": run_id, "cursor": cursor})["logsForRun"]
            if conn["__typename"] != "EventConnection":
                raise RuntimeError(f"logsForRun: {conn}")
            out += conn["events"]
            cursor = conn["cursor"]
            if not conn["hasMore"]:
                break
        return out

    def one_run(self, params: dict, timeout: float, label: str) -> dict:
        t0, wall0 = time.monotonic(), time.time()
        res = self.gql(LAUNCH_M, {"executionParams": params})["launchPipelineExecution"]
        if res["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launch failed: {res}")
        run_id = res["run"]["runId"]
        launched_s = time.monotonic() - t0
        end = min(self.deadline, time.monotonic() + timeout)
        while True:
            run = self.gql(RUN_Q, {"id": run_id})["runOrError"]
            if run["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
                seen_s = time.monotonic() - t0
                break
            self.procs.check_alive()
            if time.monotonic() > end:
                raise TimeoutError(f"run {run_id} still {run['status']} after {timeout:.0f} s\n"
                                   f"{self.procs.log('daemon')[-3000:]}")
            time.sleep(0.25)
        row = {"label": label, "run_id": run_id, "status": run["status"], "ui_s": round(seen_s, 2),
               "launch_mutation_s": round(launched_s, 2),
               "run_s": round(run["endTime"] - run["startTime"], 2) if run["startTime"] and run["endTime"] else None}
        row.update(_breakdown(wall0, run, self.events(run_id)))
        return row


def _meta(entries: list[dict]) -> dict:
    out = {}
    for e in entries or []:
        for k in ("intValue", "floatValue", "boolValue", "text"):
            if k in e:
                out[e["label"]] = e[k]
                break
    return out


def _breakdown(wall0: float, run: dict, events: list[dict]) -> dict:
    """Chunks embedded, LLM calls, the regression check, and where the seconds went (event timestamps)."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    embedded = llm = None
    reused = None
    worker_start = []          # per step: STEP_WORKER_STARTING → STEP_START (a process per step)
    starting: dict[str, float] = {}
    for e in events:
        ts = float(e["timestamp"]) / 1000 if e.get("timestamp") else None
        et = e.get("eventType")
        if ts is not None and et:
            first.setdefault(et, ts)
            last[et] = ts
            if et == "STEP_WORKER_STARTING" and e.get("stepKey"):
                starting[e["stepKey"]] = ts
            if et == "STEP_START" and e.get("stepKey") in starting:
                worker_start.append(ts - starting[e["stepKey"]])
        if e["__typename"] == "MaterializationEvent":
            m = _meta(e.get("metadataEntries"))
            name = e["assetKey"]["path"][-1]
            if name == "kb_embeddings":
                embedded = m.get("chunks_embedded")
            if name == "kb_signposts":
                llm = m.get("llm_calls", 0)
        if e["__typename"] == "AssetCheckEvaluationEvent" and e["evaluation"]["checkName"] == "recall_regression_set":
            reused = _meta(e["evaluation"].get("metadataEntries")).get("reused")
    steps = [s for s in run.get("stepStats") or [] if s["startTime"] and s["endTime"]]
    out = {"chunks_embedded": embedded, "llm_calls": llm, "regression_reused": reused, "steps": len(steps),
           "step_s_sum": round(sum(s["endTime"] - s["startTime"] for s in steps), 2),
           "step_s": {s["stepKey"]: round(s["endTime"] - s["startTime"], 2) for s in steps}}

    def gap(a, b):
        return round(b - a, 2) if a is not None and b is not None else None

    # launch → RUN_STARTING: in the daemon's run queue (dequeued every dequeue_interval_seconds, default 5),
    # then the run launcher spawning the run worker (there is no RUN_DEQUEUED event)
    out["queued_s"] = gap(wall0, first.get("RUN_STARTING"))
    out["enqueued"] = bool({"RUN_ENQUEUED", "PIPELINE_ENQUEUED"} & set(first))   # False: started without the queue
    out["worker_start_s"] = gap(first.get("RUN_STARTING"), first.get("RUN_START"))   # process + imports + defs
    out["steps_wall_s"] = gap(first.get("RUN_START"), last.get("RUN_SUCCESS"))       # executor: steps + workers
    out["step_worker_s_sum"] = round(sum(worker_start), 2) if worker_start else None
    out["step_worker_s_max"] = round(max(worker_start), 2) if worker_start else None
    if steps:
        out["critical_path_s"] = round(max(s["endTime"] for s in steps) - min(s["startTime"] for s in steps), 2)
    return out


def _table(rows: list[dict]) -> str:
    cols = [("run", None), ("status", "status"), ("launch → SUCCESS seen (s)", "ui_s"), ("run start → end (s)", "run_s"),
            ("queued: launch → RUN_STARTING (s)", "queued_s"), ("run worker start (s)", "worker_start_s"),
            ("steps (s)", "steps_wall_s"), ("step process starts Σ / max (s)", None),
            ("Σ step time (s)", "step_s_sum"), ("chunks embedded", "chunks_embedded"), ("LLM calls", "llm_calls"),
            ("regression check reused", "regression_reused")]
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for i, r in enumerate(rows, 1):
        cells = []
        for c, k in cols:
            if c == "run":
                cells.append(f"{i} {r['label']}".strip())
            elif k is None:
                cells.append(f"{r['step_worker_s_sum']} / {r['step_worker_s_max']} ({r['steps']} steps)"
                             if r.get("step_worker_s_sum") is not None else f"– ({r['steps']} steps in-process)")
            else:
                cells.append(str(r.get(k)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_doc(text: str) -> None:
    doc = ROOT / "docs" / "BENCHMARKS.md"
    body = doc.read_text()
    heading = text.split("\n", 1)[0]
    start = body.find(heading + "\n")
    if start < 0:
        body = body.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    else:
        nxt = body.find("\n## ", start + len(heading))
        body = body[:start] + text.rstrip("\n") + "\n" + (body[nxt:] if nxt >= 0 else "")
    doc.write_text(body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="/work/shared/corpora/adr-nats-io+nats-architecture-and-design-*.tar.gz")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", default=None, help="a work folder indexed before (kept); default a fresh temp folder")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (logs, DAGSTER_HOME)")
    ap.add_argument("--index-timeout", type=float, default=900, help="the first kb index (the real model)")
    ap.add_argument("--deadline", type=float, default=420, help="seconds for the whole UI part (start → last run)")
    ap.add_argument("--run-timeout", type=float, default=120)
    ap.add_argument("--write-doc", action="store_true")
    ap.add_argument("--storage", choices=("sqlite", "postgres"), default="sqlite",
                    help="Dagster's instance storage: the repo's dagster.yaml (sqlite) or docker/dagster.yaml "
                         "(dagster-postgres, on a pgserver of its own)")
    ap.add_argument("--executor", choices=("in_process", "multiprocess"), default=None,
                    help="KB_DAGSTER_EXECUTOR for every process (default: the code location's, in_process)")
    ap.add_argument("--py-spy", default=None, metavar="PREFIX",
                    help="profile the runs: py-spy (from $PY_SPY or PATH) records the webserver and the daemon "
                         "(--subprocesses, 100 Hz, raw stacks) into PREFIX.<process>.raw")
    ap.add_argument("--coordinator", choices=("prompt", "queued", "default"), default=None,
                    help="the run coordinator in the temp dagster.yaml (default: as the copied file says)")
    ap.add_argument("--dequeue-interval", type=int, default=None,
                    help="run_queue dequeue_interval_seconds in the temp dagster.yaml (the repo's: 1; Dagster's: 5)")
    args = ap.parse_args()

    import httpx

    for exe in ("dagster-webserver", "dagster-daemon"):
        if not (BIN / exe).exists():
            raise SystemExit(f"{exe} is not installed in {BIN}")
    work = Path(args.work or tempfile.mkdtemp(prefix="kb-uibench-", dir="/tmp")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    fresh = args.work is None
    up_before = _uptime()
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"work {work} · {up_before}", flush=True)
    procs = None
    try:
        root = _corpus_root(args.corpus, work) if fresh or not (work / "kb.yaml").exists() else None
        cfg = write_config(work, root) if root else work / "kb.yaml"
        t = time.monotonic()
        try:
            first = run_index(cfg, timeout=args.index_timeout)
        except subprocess.TimeoutExpired:
            _kill_leftovers(str(cfg))
            raise SystemExit(f"the first kb index took more than {args.index_timeout:.0f} s")
        print(f"kb index: {time.monotonic() - t:.1f} s, {first['documents']} documents, {first['chunks']} chunks, "
              f"{first['embedded']} embedded · {_uptime()}", flush=True)

        ui = work / "ui"
        home = ui / "dagster_home"
        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_", "DAGSTER_"))}
        if args.storage == "postgres":   # as deployed: dagster-postgres storage (docker/dagster.yaml)
            shutil.copy(ROOT / "docker" / "dagster.yaml", home / "dagster.yaml")
            dagster_pg = _start_dagster_pg(ui / "dagster_pg")
            env["DAGSTER_PG_URL"] = dagster_pg
        else:
            shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")   # sqlite storage, telemetry off, pools
        if args.executor:
            env["KB_DAGSTER_EXECUTOR"] = args.executor
        if args.coordinator:
            _set_coordinator(home / "dagster.yaml", args.coordinator)
        if args.dequeue_interval is not None:
            _set_dequeue_interval(home / "dagster.yaml", args.dequeue_interval)
        args.coordinator = _coordinator_of(home / "dagster.yaml")   # what ran, for the doc
        shutil.copy(ROOT / "workspace.yaml", ui / "workspace.yaml")  # python_module kb_assets.definitions
        env.update(DAGSTER_HOME=str(home), KB_CONFIG=str(cfg), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   PYTHONPATH=str(ROOT), PATH=f"{BIN}:{env.get('PATH', '')}")
        port = _free_port()
        procs = Procs(ui)
        t_start = time.monotonic()
        deadline = t_start + args.deadline
        procs.start("webserver", [str(BIN / "dagster-webserver"), "-w", str(ui / "workspace.yaml"),
                                  "-h", "127.0.0.1", "-p", str(port)], env)
        daemon_cmd = [str(BIN / "dagster-daemon"), "run", "-w", str(ui / "workspace.yaml")]
        procs.start("daemon", daemon_cmd, env)
        rows = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            b = Bench(http, procs, deadline)
            b.wait("the code location to load", b.location_loaded, every=1)
            loaded_s = time.monotonic() - t_start
            b.wait("the daemon's run queue", b.queue_daemon_healthy, every=1)
            ready_s = time.monotonic() - t_start
            print(f"code location LOADED after {loaded_s:.1f} s, daemon healthy after {ready_s:.1f} s", flush=True)
            params = b.launch_params()
            print(f"launching {JOB} partition {PARTITION}: {len(params['selector']['assetSelection'])} assets, "
                  f"{len(params['selector']['assetCheckSelection'])} checks, tags "
                  f"{[t['key'] for t in params['executionMetadata']['tags']]}", flush=True)
            plan = [("", params)] * args.runs
            spies = _start_py_spy(args.py_spy, procs) if args.py_spy else []
            for i, (label, p) in enumerate(plan):
                r = b.one_run(p, args.run_timeout, label)
                rows.append(r)
                print(f"run {i + 1} {label}: {r['status']} · launch → SUCCESS seen {r['ui_s']} s · run {r['run_s']} s · "
                      f"queued {r['queued_s']} s (enqueued {r['enqueued']}) · worker start {r['worker_start_s']} s · steps {r['steps_wall_s']} s "
                      f"· embedded {r['chunks_embedded']} · llm {r['llm_calls']} · reused {r['regression_reused']}",
                      flush=True)
                print("   steps: " + ", ".join(f"{k} {v}" for k, v in sorted(r["step_s"].items(), key=lambda x: -x[1])),
                      flush=True)
            _stop_py_spy(spies)
        up_after = _uptime()
    finally:
        if procs:
            procs.stop()
        if args.storage == "postgres":
            _stop_dagster_pg(work / "ui" / "dagster_pg")
        _stop_embedded_pg(work)
        _kill_leftovers(str(work))
        if fresh and not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    table = _table(rows)
    print(f"\nload before: {_load(up_before)} · after: {_load(up_after)} · {os.cpu_count()} cores")
    print(table)
    out = Path(__file__).resolve().parent / "out"
    out.mkdir(exist_ok=True)
    (out / "ui_partition_bench.json").write_text(json.dumps(
        {"when": when, "uptime_before": up_before, "uptime_after": up_after, "index": first,
         "location_loaded_s": loaded_s, "ready_s": ready_s, "rows": rows}, indent=1))
    if args.write_doc:
        cmd = " ".join([".venv/bin/python", "bench/ui_partition_bench.py", *sys.argv[1:]])
        _write_doc(_doc_text(cmd, when, up_before, up_after, first, loaded_s, ready_s, rows, table, args))
        print(f"wrote the section to {ROOT / 'docs' / 'BENCHMARKS.md'}")
    misses = [f"run {i}: {why}" for i, r in enumerate(rows, 1) for why, bad in (
        ("not SUCCESS", r["status"] != "SUCCESS"), ("> 5 s", (r["ui_s"] or 1e9) > 5),
        ("embedded chunks", (r["chunks_embedded"] or 0) != 0), ("LLM calls", (r["llm_calls"] or 0) != 0)) if bad]
    if misses:
        print("target missed: " + "; ".join(misses))
        return 1
    return 0


def _median(xs: list) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def _fill(text: str, indent: str = "") -> str:
    import textwrap

    return textwrap.fill(text, width=115, subsequent_indent=indent, break_on_hyphens=False)


def _doc_text(cmd, when, up_before, up_after, first, loaded_s, ready_s, rows, table, args) -> str:
    ui = rows
    last = ui[-1] if ui else {}
    steps = ", ".join(f"{k} {v}" for k, v in sorted(last.get("step_s", {}).items(), key=lambda x: -x[1]))
    med = {k: _median([r.get(k) for r in ui]) for k in ("ui_s", "queued_s", "worker_start_s", "steps_wall_s",
                                                         "step_s_sum")}
    storage = ("dagster-postgres (docker/dagster.yaml, as deployed; its own pgserver)" if args.storage == "postgres"
               else "sqlite (the repo's dagster.yaml, a developer's `dg dev`)")
    executor = args.executor or "in_process (the code location's default)"
    interval = args.dequeue_interval if args.dequeue_interval is not None else 1
    dq = {"queued": f"QueuedRunCoordinator, dequeue_interval_seconds: {interval}",
          "prompt": f"kb's PromptRunCoordinator (the queue, dequeue_interval_seconds: {interval}; a run that "
                    "finds the queue empty and room under the run limit is started by the webserver at once)",
          "default": "none (DefaultRunCoordinator: the webserver starts the run when it receives the launch)",
          }[args.coordinator]
    verdict = _fill(f"**Median {med['ui_s']} s from the click to SUCCESS against the 5 s target "
                    f"({'met' if (med['ui_s'] or 1e9) <= 5 else 'missed'})**, with "
                    f"{', '.join(sorted({str(r['chunks_embedded']) for r in ui}))} chunks embedded, "
                    f"{', '.join(sorted({str(r['llm_calls']) for r in ui}))} LLM calls and the regression check "
                    f"reused = {', '.join(sorted({str(r['regression_reused']) for r in ui}))} in every run.")
    intro = _fill(
        "What a data engineer waits for after \"Materialize\" → partition `nats` → \"Launch 1 run\": "
        "`dagster-webserver -w workspace.yaml` + `dagster-daemon run`, Dagster storage: " + storage + "; executor: "
        + executor + "; run queue " + dq + ". The launch is what the UI's single-partition dialog sends "
        "(`launchPipelineExecution` with job `kb_index`, its assets and checks, the partition's tags); timed from the "
        "mutation to SUCCESS seen by polling `runOrError` every 0.25 s.")
    setup = _fill(
        f"{when} · {os.cpu_count()} cores · load average before: {_load(up_before)} · after: {_load(up_after)}. "
        f"The NATS ADRs ({first['documents']} documents, {first['chunks']} chunks) indexed first by `kb index`. "
        f"Code location LOADED {loaded_s:.1f} s after the webserver started; daemon healthy at {ready_s:.1f} s.")
    bullets = "\n".join(_fill(b, "  ") for b in (
        (f"- *queued* {med['queued_s']} s — mutation → RUN_STARTING: the run queue (polled every second) and the "
         "run launcher starting the run worker." if args.coordinator == "queued" else
         f"- *queued* {med['queued_s']} s — mutation → RUN_STARTING: no wait in a queue ({args.coordinator} "
         "coordinator); the webserver creating the run and checking the run limit."),
        f"- *run worker start* {med['worker_start_s']} s — RUN_STARTING → RUN_START: a fresh Python process "
        "(multiprocessing spawn from the code server) importing dagster, its storage (SQLAlchemy, alembic) and "
        "kb_assets, and loading the definitions.",
        f"- *steps* {med['steps_wall_s']} s — RUN_START → RUN_SUCCESS, the {last.get('steps')} steps "
        + ("each in a process of its own (two at a time at most), which imports dagster and kb_assets again"
           if args.executor == "multiprocess" else "one after the other in the run worker")
        + f"; {med['step_s_sum']} s summed STEP_START → STEP_SUCCESS, which includes Dagster "
        "writing each step's events (a new storage connection per event: dagster-postgres and sqlite both use "
        "NullPool; sqlite also commits with an fsync each time).",
        f"- Step times of the last run (s): {steps or 'n/a'}."))
    title = f"{SECTION} — storage {args.storage}, executor {args.executor or 'in_process'}" + (
        {"default": ", DefaultRunCoordinator", "prompt": ", PromptRunCoordinator"}.get(args.coordinator, ""))
    return f"""{title}

{intro}

```
{cmd}
```

{setup}

{table}

{verdict}

Where the time goes (from the run's event log; medians):
{bullets}

{_fill("Figures are wall times on a shared 2-core machine; the load average above says how busy it was. "
       "CPU-bound phases (process starts, imports) grow with the load.")}
"""


if __name__ == "__main__":
    sys.exit(main())
