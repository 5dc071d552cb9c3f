"""The compose topology without Docker: the three processes docker/compose.yaml starts — `dagster
code-server start`, `dagster-webserver -w <docker/workspace.yaml, host adapted>`, `dagster-daemon run` —
on the instance config of docker/dagster.yaml (dagster-postgres, psycopg2 URL) against a PostgreSQL of their
own (pgserver). The sensor is turned on through GraphQL; a commit to the watched repository is indexed by
the sensor's run, and recall() finds the new document. Bounded in time; every process group is killed."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
BIN = Path(os.environ.get("VIRTUAL_ENV") or Path(__import__("sys").executable).parent.parent) / "bin"
DEADLINE_SECONDS = 600

ADR_1 = ("# 1. Record architecture decisions\n\n## Status\n\nAccepted\n\n## Decision\n\nWe record decisions "
         "as short markdown files in docs/adr, one per decision, reviewed like code.\n")
ADR_2 = ("# 2. Route webhooks through a queue\n\n## Status\n\nAccepted\n\n## Context\n\nPush notifications "
         "arrive in bursts during merges.\n\n## Decision\n\nWe will put incoming webhooks on a durable "
         "queue (the git_pushes table) and let the sensor drain it, because a burst must never drop a push.\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@e", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def _with_db(url: str, dbname: str) -> str:
    import psycopg.conninfo as ci

    params = ci.conninfo_to_dict(url)
    params["dbname"] = dbname
    return ci.make_conninfo(**params)


def _sqlalchemy_psycopg2_url(conninfo: str) -> str:
    """postgresql+psycopg2:// URL for a libpq conninfo (pgserver listens on a unix socket)."""
    import psycopg.conninfo as ci

    p = ci.conninfo_to_dict(conninfo)
    return f"postgresql+psycopg2://{p.get('user', 'postgres')}:@/{p['dbname']}?host={p['host']}"


class Topology:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, args: list[str], env: dict) -> None:
        log = open(self.tmp / f"{name}.log", "wb")
        # own session = own process group: stopped as a group at the end (dagster children included)
        proc = subprocess.Popen(args, env=env, cwd=self.tmp, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append((name, proc))

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log(name)[-3000:]}")

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for sig, wait in ((signal.SIGINT, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
            alive = [(n, p) for n, p in self.procs if p.poll() is None]
            for _, p in alive:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + wait
            while time.monotonic() < end and any(p.poll() is None for _, p in alive):
                time.sleep(0.2)
        for _, p in self.procs:    # children of a group leader that already exited
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _gql(http, query: str, variables: dict | None = None) -> dict:
    r = http.post("/graphql", json={"query": query, "variables": variables or {}})
    r.raise_for_status()
    body = r.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


LOCATION_Q = """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
START_SENSOR = """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename
  ... on Sensor { name sensorState { status } } ... on PythonError { message } } }"""
RUNS_Q = """query($f: RunsFilter) { runsOrError(filter: $f) { __typename ... on Runs { results { runId status
  tags { key value } } } } }"""


def _wait(what: str, fn, deadline: float, topo: Topology, every: float = 1.0):
    while True:
        topo.check_alive()
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {n}\n{topo.log(n)[-2500:]}" for n, _ in topo.procs)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(every)


@pytest.mark.timeout(DEADLINE_SECONDS + 60)
def test_compose_topology_sensor_run_and_recall(tmp_path, pg_server_url):
    import httpx
    import psycopg

    for exe in ("dagster", "dagster-webserver", "dagster-daemon"):
        assert (BIN / exe).exists(), f"{exe} not installed in {BIN}"
    deadline = time.monotonic() + DEADLINE_SECONDS
    suffix = uuid.uuid4().hex[:8]
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "dagster_{suffix}"')
        admin.execute(f'CREATE DATABASE "kb_{suffix}"')
    kb_url = _with_db(pg_server_url, f"kb_{suffix}")
    dagster_url = _sqlalchemy_psycopg2_url(_with_db(pg_server_url, f"dagster_{suffix}"))

    repo = tmp_path / "repo"
    (repo / "docs" / "adr").mkdir(parents=True)
    (repo / "docs" / "adr" / "0001-record-decisions.md").write_text(ADR_1)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "adr 1")
    kb_yaml = tmp_path / "kb.yaml"
    kb_yaml.write_text(json.dumps({"database_url": kb_url, "data_dir": str(tmp_path / "kbdata"), "sources": [
        {"key": "decisions", "kind": "adr", "root": str(repo), "include": ["docs/adr/*.md"], "content": "HEAD"}]}))

    # the deployment's own files, host adapted: DAGSTER_HOME/dagster.yaml is docker/dagster.yaml as is
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(DOCKER / "dagster.yaml", home / "dagster.yaml")
    code_port, web_port = _free_port(), _free_port()
    workspace = yaml.safe_load((DOCKER / "workspace.yaml").read_text())
    grpc = workspace["load_from"][0]["grpc_server"]
    assert grpc["host"] == "code"
    grpc.update(host="127.0.0.1", port=code_port)
    (tmp_path / "workspace.yaml").write_text(yaml.safe_dump(workspace))
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    cmds = {n: compose["services"][n]["command"] for n in ("code", "webserver", "daemon")}

    def host_cmd(cmd: list[str]) -> list[str]:
        out = [str(BIN / cmd[0]), *cmd[1:]]
        out = [{"0.0.0.0": "127.0.0.1", "4000": str(code_port), "3000": str(web_port),
                "/opt/kb_assets/docker/workspace.yaml": str(tmp_path / "workspace.yaml")}.get(a, a) for a in out]
        return out

    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_", "DAGSTER_"))}
    env.update(DAGSTER_HOME=str(home), DAGSTER_PG_URL=dagster_url, KB_CONFIG=str(kb_yaml),
               KB_GIT_SENSOR_INTERVAL_SECONDS="5", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=str(ROOT))
    # the one-shot `pools` service: pool limits into the instance's storage (compose's $$ is a literal $)
    pools = [a.replace("$$", "$") for a in compose["services"]["pools"]["command"]]
    done = subprocess.run(pools, env={**env, "PATH": f"{BIN}:{env.get('PATH', '')}"}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    topo = Topology(tmp_path)
    try:
        topo.start("code", host_cmd(cmds["code"]), env)
        topo.start("webserver", host_cmd(cmds["webserver"]), env)
        topo.start("daemon", host_cmd(cmds["daemon"]), env)
        with httpx.Client(base_url=f"http://127.0.0.1:{web_port}", timeout=30) as http:
            def location_loaded():
                try:
                    data = _gql(http, LOCATION_Q)
                except (httpx.HTTPError, AssertionError):
                    return None
                entries = data["workspaceOrError"].get("locationEntries") or []
                ok = [e for e in entries if e["name"] == "kb_assets" and e["loadStatus"] == "LOADED"
                      and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"]
                return ok or None
            _wait("the code location to load in the webserver", location_loaded, deadline, topo, every=2)

            started = _gql(http, START_SENSOR, {"s": {"repositoryLocationName": "kb_assets",
                                                      "repositoryName": "__repository__",
                                                      "sensorName": "git_commit_sensor"}})["startSensor"]
            assert started["__typename"] == "Sensor" and started["sensorState"]["status"] == "RUNNING", started

            def run_for(sha: str):
                def find():
                    data = _gql(http, RUNS_Q, {"f": {"tags": [{"key": "kb/commit", "value": sha}]}})
                    runs = data["runsOrError"]["results"]
                    if any(r["status"] in ("FAILURE", "CANCELED") for r in runs):
                        raise AssertionError(f"run for {sha} failed: {runs}\n{topo.log('code')[-4000:]}")
                    return [r for r in runs if r["status"] == "SUCCESS"] or None
                return find

            first = _git(repo, "rev-parse", "HEAD")
            _wait(f"the sensor's first run (commit {first[:8]}) to succeed", run_for(first), deadline, topo, 3)

            # a merge lands in the watched repository: the next tick indexes it
            (repo / "docs" / "adr" / "0002-queue-webhooks.md").write_text(ADR_2)
            _git(repo, "add", ".")
            _git(repo, "commit", "-qm", "adr 2")
            second = _git(repo, "rev-parse", "HEAD")
            runs = _wait(f"the sensor's run for the new commit {second[:8]}", run_for(second), deadline, topo, 3)
            tags = {t["key"]: t["value"] for t in runs[0]["tags"]}
            assert tags["dagster/partition"] == "decisions"
            assert tags["dagster/run_key"] == f"decisions@{second}"
            assert tags["kb/listing"] == "incremental (git diff)"

        # Dagster's storage is dagster-postgres in its own database; kb's index in another
        with psycopg.connect(_with_db(pg_server_url, f"dagster_{suffix}")) as c:
            assert c.execute("SELECT count(*) FROM runs").fetchone()[0] >= 2
            # docker/dagster.yaml's PromptRunCoordinator: with the queue empty and room under the run limit
            # the sensor's runs started at once (Dagster's QueuedRunCoordinator enqueues every run first)
            assert c.execute("SELECT count(*) FROM event_logs WHERE dagster_event_type = 'PIPELINE_ENQUEUED'"
                             ).fetchone()[0] == 0
        from kb_assets.query import recall

        result = recall("why do webhooks go through a durable queue?", config=str(kb_yaml))
        assert result.documents and result.documents[0].to_dict()["path"].endswith("0002-queue-webhooks.md")
    finally:
        topo.stop()
    assert all(p.poll() is not None for _, p in topo.procs)
