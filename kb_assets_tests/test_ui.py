"""The Dagster UI, seen: dagster-webserver on a free port, driven by headless Debian chromium through
Playwright (executable_path; no browser download, ever): the asset graph, one partition's page, the checks
and the automation page. Screenshots go to a temp folder, or to docs/img/ with KB_UPDATE_SCREENSHOTS=1.
Outside CI the test skips when chromium is absent; in CI (.ci/run installs it) a missing chromium fails."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
BIN = Path(sys.executable).parent
ADR = ("# 1. Use PostgreSQL with pgvector\n\n## Status\n\nAccepted\n\n## Context\n\nWe need one database for "
       "documents, chunks and vectors so that deletes and swaps are transactional.\n\n## Decision\n\nWe will use "
       "PostgreSQL with the pgvector extension because it keeps vectors beside the rows they describe.\n")


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), "-c", "user.email=t@e", "-c", "user.name=t", *args], check=True,
                   capture_output=True)


@pytest.fixture
def chromium() -> str:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} missing in CI (.ci/run installs Debian's chromium)")
        pytest.skip(f"{CHROMIUM} not installed: apt-get install -y chromium (never `playwright install`)")
    return CHROMIUM


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(600)
def test_dagster_ui_asset_graph_partition_checks_automation(tmp_path, db_url, chromium, monkeypatch):
    import dagster as dg
    import httpx
    from playwright.sync_api import sync_playwright

    repo = tmp_path / "repo"
    (repo / "docs" / "adr").mkdir(parents=True)
    (repo / "docs" / "adr" / "0001-use-postgres.md").write_text(ADR)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "init")
    cfg = tmp_path / "kb.yaml"
    cfg.write_text(json.dumps({"database_url": db_url, "sources": [
        {"key": "decisions", "kind": "adr", "root": str(repo), "include": ["docs/adr/*.md"], "content": "HEAD"},
        {"key": "notes", "kind": "memory", "root": str(tmp_path / "notes"), "enabled": True}]}))
    (tmp_path / "notes").mkdir()
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("KB_CONFIG", str(cfg))
    for mod in [m for m in sys.modules if m.startswith("kb_assets.defs") or m == "kb_assets.definitions"]:
        del sys.modules[mod]
    from kb_assets.definitions import defs

    # one materialized partition (and its checks) in the instance the webserver reads
    instance = dg.DagsterInstance.from_config(str(home))
    result = (defs() if callable(defs) else defs).resolve_job_def("kb_index").execute_in_process(
        partition_key="decisions", instance=instance)
    assert result.success
    instance.dispose()

    out = ROOT / "docs" / "img" if os.environ.get("KB_UPDATE_SCREENSHOTS") else tmp_path / "img"
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "KB_CONFIG": str(cfg), "PYTHONPATH": str(ROOT)}
    log = open(tmp_path / "webserver.log", "wb")
    # the repository's workspace.yaml: the location is named kb_assets, as in dg dev and the deployment
    proc = subprocess.Popen([str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port), "-w",
                             str(ROOT / "workspace.yaml")], env=env, cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        with httpx.Client(base_url=base, timeout=10) as http:
            while True:
                assert proc.poll() is None, (tmp_path / "webserver.log").read_text()[-3000:]
                try:
                    body = http.post("/graphql", json={"query": "{ workspaceOrError { ... on Workspace {"
                                     " locationEntries { name loadStatus } } } }"}).json()
                    entries = body["data"]["workspaceOrError"]["locationEntries"]
                    if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                        break
                except (httpx.HTTPError, KeyError, TypeError, ValueError):
                    pass
                assert time.monotonic() < deadline, "webserver did not load the code location"
                time.sleep(1)
            # the first-visit "Join the Dagster community" dialog: marked seen for this instance
            http.post("/graphql", json={"query": "mutation { setNuxSeen }"})

        seen: dict[str, str] = {}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"])
            page = browser.new_page(viewport={"width": 1920, "height": 1200})

            def visit(path: str, expect: list[str], shot: str, click: str | None = None) -> None:
                page.goto(base + path, wait_until="domcontentloaded")
                if click:
                    page.get_by_text(click, exact=True).first.click(timeout=90_000)
                for text in expect:
                    page.get_by_text(text, exact=False).first.wait_for(state="visible", timeout=90_000)
                dialog = page.get_by_role("dialog")
                if dialog.count() and dialog.first.is_visible():     # the community dialog, if still shown
                    page.keyboard.press("Escape")
                page.wait_for_timeout(1500)    # let the graph layout settle before the picture
                page.screenshot(path=str(out / shot))
                seen[shot] = page.inner_text("body")

            # the group's graph: every stage with its partitions filled, checks passed and kinds
            visit("/locations/kb_assets/asset-groups/kb",
                  ["kb_documents", "kb_search_index", "kb_signposts", "50% filled", "extractive"],
                  "dagster-asset-graph.png")
            visit("/assets/kb_documents?view=partitions&partition=decisions", ["decisions", "listing_mode"],
                  "dagster-partition.png")
            visit("/assets/kb_search_index?view=checks", ["recall_regression_set", "without_keywords"],
                  "dagster-checks.png", click="vector_keyword_parity")
            visit("/automation", ["git_commit_sensor", "source_listing_sensor", "nightly_index"],
                  "dagster-automation.png")
            browser.close()
        assert "Join the Dagster community" not in seen["dagster-automation.png"]
        for shot in seen:
            assert (out / shot).stat().st_size > 10_000, shot
    finally:
        for sig in (signal.SIGINT, signal.SIGKILL):
            if proc.poll() is None:
                os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        log.close()
