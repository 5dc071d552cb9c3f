"""`kb serve` as users run it: a separate process with the real local model, and `kb recall` talking to it
through KB_SERVER / KB_TOKEN — the same output as `kb recall` in-process; SIGTERM stops it cleanly."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

from kb_assets.serving.tokens import create_token
from kb_assets_tests.serve_support import drop_database, free_port, fresh_database, seed, wait_until_healthy


class _RealModel:
    """The local model in the shape the corpus helper wants (.vec)."""

    def __init__(self):
        from kb_assets.embedding import LocalEmbedder

        self.inner = LocalEmbedder()
        self.model, self.dimension = self.inner.model, self.inner.dimension

    def vec(self, text):
        return self.inner.embed_query(text)

    def embed_query(self, text):
        return self.inner.embed_query(text)


def _kb(*args, env, check=True, timeout=300):
    proc = subprocess.run([sys.executable, "-m", "kb_assets.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"kb {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def server(pg_server_url, tmp_path_factory):
    from kb_assets.store.db import connect

    url = fresh_database(pg_server_url)
    conn = connect(url)
    seed(conn, _RealModel())
    token = create_token(conn, "e2e", rate="600/min")["token"]
    cfg = tmp_path_factory.mktemp("serve") / "kb.yaml"
    cfg.write_text("sources: []\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", KB_DATABASE_URL=url, KB_CONFIG=str(cfg))
    env.pop("KB_SERVER", None)
    env.pop("KB_TOKEN", None)
    port = free_port()
    log = tmp_path_factory.mktemp("serve-log") / "stderr.txt"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "kb_assets.cli", "serve", "--port", str(port)], env=env,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    wait_until_healthy(proc, base, log)
    yield {"proc": proc, "base": base, "token": token, "env": env, "log": log}
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    conn.close()
    drop_database(pg_server_url, url)


def test_kb_recall_through_the_server_prints_what_in_process_prints(server):
    remote_env = dict(server["env"], KB_SERVER=server["base"], KB_TOKEN=server["token"])
    args = ["recall", "how do we restart celery workers?", "retry on rate limits", "--limit", "3", "--kind", "adr",
            "--kind", "doc", "--passage"]
    local = json.loads(_kb(*args, "--json", env=server["env"]).stdout)
    remote = json.loads(_kb(*args, "--json", env=remote_env).stdout)
    for d in (local, remote):
        d.pop("timings"), d.pop("token_estimate")
    assert remote == local and remote["documents"]
    assert {"kb:decisions/adr/0001-celery-restart.md", "kb:decisions/adr/0002-retry-backoff.md"} <= {
        d["id"] for d in remote["documents"]}
    assert _kb(*args, env=remote_env).stdout == _kb(*args, env=server["env"]).stdout


def test_client_mode_mistakes_are_one_line_exit_2(server):
    bad_token = dict(server["env"], KB_SERVER=server["base"], KB_TOKEN="kb_nope")
    p = _kb("recall", "celery", env=bad_token, check=False)
    assert p.returncode == 2 and "KB_TOKEN" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    nowhere = dict(server["env"], KB_SERVER=f"http://127.0.0.1:{free_port()}", KB_TOKEN=server["token"])
    p = _kb("recall", "celery", env=nowhere, check=False)
    assert p.returncode == 2 and "KB_SERVER" in p.stderr and "cannot reach" in p.stderr


def test_no_auth_on_loopback_says_so_at_start_and_serves_without_a_token(server, tmp_path):
    port = free_port()
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "kb_assets.cli", "serve", "--no-auth", "--port", str(port)],
                                env=server["env"], stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_healthy(proc, base, log)
        assert "WITHOUT AUTHENTICATION (--no-auth, loopback only)" in log.read_text()
        r = httpx.get(base + "/api/v1/recall", params={"q": "restart celery workers"}, timeout=60)
        assert r.status_code == 200 and r.json()["documents"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_sigterm_stops_gracefully_and_the_log_holds_no_secrets(server):
    r = httpx.get(server["base"] + "/api/v1/knowledge/search", params={"q": "restart the celery workers nightly zqxsecret"},
                  headers={"Authorization": f"Bearer {server['token']}"})
    assert r.status_code == 200 and r.json()["results"]
    proc = server["proc"]
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) in (0, -signal.SIGTERM)     # uvicorn re-raises the signal after its shutdown
    log = server["log"].read_text()
    assert "bearer tokens required" in log and "kb serve: stopped: requests in flight finished" in log
    access = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
    assert any(a["path"] == "/api/v1/knowledge/search" and a["token"] == "e2e" for a in access)
    assert server["token"] not in log and "zqxsecret" not in log and "nightly" not in log
