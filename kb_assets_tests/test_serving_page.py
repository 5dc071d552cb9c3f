"""The /knowledge page in a real browser: Debian's chromium (headless) driven by Playwright, against a real
server on a free port. Log in, search, click a facet, open a result.

Never `playwright install`: the browser is /usr/bin/chromium (`apt-get install -y chromium`; .ci/run does it).
Outside CI a missing chromium skips this test with a message; in CI (CI set) it fails.
Screenshots: KB_UPDATE_SCREENSHOTS=1 writes them to docs/img/ (committed, shown in the README); otherwise to
the test's temp folder.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from kb_assets.config import KbConfig
from kb_assets.serving.tokens import create_token
from kb_assets_tests.serve_support import MALICIOUS_TITLE, drop_database, fresh_database, running_server, seed
from kb_assets_tests.test_query_support import ToyEmbedder

CHROMIUM = os.environ.get("KB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
DOCS_IMG = Path(__file__).resolve().parents[1] / "docs" / "img"


def _need_chromium():
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        msg = f"chromium not found at {CHROMIUM}: apt-get install -y chromium (never `playwright install`)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def live(pg_server_url):
    from kb_assets.store.db import connect

    url = fresh_database(pg_server_url)
    conn = connect(url)
    seed(conn)
    # the decisions source is a git checkout that moved on since it was indexed: the header shows the drift
    repo = Path(tempfile.mkdtemp(prefix="kbpage-"))
    git = lambda *a: subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", *a], cwd=repo,  # noqa: E731
                                    check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    (repo / "adr").mkdir()
    (repo / "adr" / "0001-celery-restart.md").write_text("# Restart celery workers nightly\n")
    git("add", ".")
    git("commit", "-qm", "one")
    indexed = git("rev-parse", "HEAD")
    (repo / "adr" / "0001-celery-restart.md").write_text("# Restart celery workers nightly\n\nEdited.\n")
    git("commit", "-qam", "two")
    conn.execute("UPDATE sources SET root = %s, indexed_commit = %s, last_run_at = now() - interval '2 hours'"
                 " WHERE key = 'decisions'", (str(repo), indexed))
    conn.execute("UPDATE sources SET last_run_at = now() - interval '3 hours' WHERE key <> 'decisions'")
    token = create_token(conn, "browser", rate="1000/min")["token"]
    with running_server(KbConfig(), url, ToyEmbedder()) as (srv, _):
        yield srv, token
    conn.close()
    drop_database(pg_server_url, url)
    shutil.rmtree(repo, ignore_errors=True)


def test_log_in_search_facet_open(live, tmp_path):
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    srv, token = live
    shots = DOCS_IMG if os.environ.get("KB_UPDATE_SCREENSHOTS") else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    dialogs = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"),
                                    headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 720})
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))   # an XSS would alert()
            resp = page.goto(srv.url + "/knowledge")
            assert resp.status == 401
            expect(page.get_by_role("heading", name="kb knowledge — sign in")).to_be_visible()
            page.fill("#token", "kb_wrong")
            page.click("button[type=submit]")
            expect(page.get_by_role("alert")).to_contain_text("not valid")
            page.screenshot(path=str(shots / "knowledge-login.png"))
            page.fill("#token", token)
            page.click("button[type=submit]")
            expect(page.get_by_role("searchbox")).to_be_visible()
            # the cookie is HttpOnly: page scripts cannot read it (and the CSP lets none run anyway)
            cookie = [c for c in page.context.cookies() if c["name"] == "kb_token"][0]
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            expect(page.locator("header")).to_contain_text("decisions: 2 docs · behind HEAD (1 changed since)")
            expect(page.locator("header")).not_to_contain_text("last indexed: never")

            page.get_by_role("searchbox").fill("restart celery workers retry policy")
            page.get_by_role("button", name="Search").click()
            results = page.locator("article.result")
            expect(results.first).to_be_visible()
            n_all = results.count()
            assert n_all >= 3
            titles = results.locator("h2").all_inner_texts()
            assert MALICIOUS_TITLE in titles            # shown as text, not run
            expect(page.locator("ul.decisions").first).to_contain_text("because")
            page.screenshot(path=str(shots / "knowledge-search.png"))

            page.locator("ul.facet[data-facet=kind] a", has_text="adr").click()
            expect(page.locator("ul.facet[data-facet=kind] li.on")).to_contain_text("adr")
            kinds = page.locator("article.result .badge:first-child").all_inner_texts()
            assert kinds and set(kinds) == {"adr"} and len(kinds) < n_all
            page.screenshot(path=str(shots / "knowledge-facet.png"))

            page.locator("article.result a.open", has_text="Restart celery workers nightly").click()
            expect(page.locator("#doc-title")).to_have_text("Restart celery workers nightly")
            expect(page.locator("#doc-text")).to_contain_text("graceful warm shutdown")
            page.screenshot(path=str(shots / "knowledge-document.png"))

            page.goto(srv.url + "/knowledge/doc?id=kb:decisions/adr/0002-retry-backoff.md")
            expect(page.locator("#doc-title")).to_have_text(MALICIOUS_TITLE)
            assert page.locator("#doc-title script, #doc-title img").count() == 0
        finally:
            browser.close()
    assert dialogs == []
