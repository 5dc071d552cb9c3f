"""Git-merge sensors and the push webhook, on real git repositories and a real HTTP server.

- git_commit_sensor: a run per source whose branch commit moved (run_key source@sha), the configured branch
  (not whatever is checked out), `git fetch <remote>` each tick, a force-push → a full listing (tags, and the
  documents stage), pushes recorded by POST /hooks/git → trigger "push".
- source_listing_sensor: a folder that is not git runs when its listing (paths, sizes, mtimes) changes.
- the webhook: GitHub HMAC and GitLab token, bad signature → 401 logged without the payload, replay ignored.
"""
from __future__ import annotations

import hashlib
import hmac
import importlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import pytest


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.email=t@e", "-c", "user.name=t",
                           "-c", "init.defaultBranch=main", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, rel: str, text: str, msg: str) -> str:
    f = repo / rel
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)
    _git(repo, "add", rel)
    _git(repo, "commit", "-qm", msg)
    return _git(repo, "rev-parse", "HEAD")


DOC = ("# {t}\n\nThis document explains {t} in enough words to be indexed by the documents stage of kb: "
       "the minimum is a hundred characters, so this sentence goes on a little longer.\n")


@pytest.fixture
def repos(tmp_path, db_url, monkeypatch):
    upstream = tmp_path / "upstream"          # the shared repository teammates push to
    upstream.mkdir()
    _git(upstream, "init", "-q", "-b", "main")
    _commit(upstream, "docs/a.md", DOC.format(t="alpha"), "a")
    clone = tmp_path / "clone"                # the checkout kb reads, fetching from origin
    subprocess.run(["git", "clone", "-q", str(upstream), str(clone)], check=True)
    local = tmp_path / "local"                # a checkout whose configured branch is not the checked-out one
    local.mkdir()
    _git(local, "init", "-q", "-b", "main")
    _commit(local, "docs/l.md", DOC.format(t="lima"), "l")
    memory = tmp_path / "memory"              # not git
    memory.mkdir()
    (memory / "m.md").write_text(DOC.format(t="mike"))
    cfg = tmp_path / "kb.yaml"
    cfg.write_text(json.dumps({"database_url": db_url, "sources": [
        {"key": "merged", "kind": "doc", "root": str(clone), "include": ["docs/*.md"], "content": "HEAD",
         "remote": "origin", "branch": "main"},
        {"key": "local", "kind": "doc", "root": str(local), "include": ["docs/*.md"], "content": "HEAD",
         "branch": "main"},
        {"key": "notes", "kind": "memory", "root": str(memory), "enabled": True},
    ]}))
    monkeypatch.setenv("KB_CONFIG", str(cfg))
    for mod in [m for m in sys.modules if m.startswith("kb_assets.defs") or m == "kb_assets.definitions"]:
        del sys.modules[mod]
    return {"upstream": upstream, "clone": clone, "local": local, "memory": memory, "db_url": db_url}


def _defs():
    d = importlib.import_module("kb_assets.definitions").defs
    return d() if callable(d) else d


def _tick(defs, name: str, cursor: str | None):
    sensor = defs.resolve_sensor_def(name)
    with dg.instance_for_test() as instance:
        ctx = dg.build_sensor_context(definitions=defs, cursor=cursor, instance=instance)
        result = sensor(ctx)
    return result


def _by_key(result) -> dict[str, dg.RunRequest]:
    return {r.partition_key: r for r in (result.run_requests or [])}


def test_commit_sensor_branch_fetch_and_force_push(repos):
    defs = _defs()
    first = _tick(defs, "git_commit_sensor", None)
    reqs = _by_key(first)
    assert set(reqs) == {"merged", "local"}          # "notes" is not git: the listing sensor's
    up_head = _git(repos["upstream"], "rev-parse", "HEAD")
    assert reqs["merged"].run_key == f"merged@{up_head}"
    assert reqs["merged"].tags["kb/listing"] == "first run"
    assert reqs["merged"].tags["kb/ref"] == "refs/remotes/origin/main"

    # nothing moved: no run, the cursor is kept
    again = _tick(defs, "git_commit_sensor", first.cursor)
    assert not again.run_requests and json.loads(again.cursor)["commits"] == json.loads(first.cursor)["commits"]

    # a teammate merges upstream: the tick fetches and requests a run at the merged commit
    merged_sha = _commit(repos["upstream"], "docs/b.md", DOC.format(t="bravo"), "b")
    tick = _tick(defs, "git_commit_sensor", again.cursor)
    r = _by_key(tick)["merged"]
    assert r.run_key == f"merged@{merged_sha}" and r.tags["kb/listing"] == "incremental (git diff)"
    assert set(_by_key(tick)) == {"merged"}
    # the clone's own HEAD did not move: what is indexed is origin/main
    assert _git(repos["clone"], "rev-parse", "HEAD") != merged_sha

    # force-push: upstream drops b and commits c instead
    _git(repos["upstream"], "reset", "-q", "--hard", "HEAD~1")
    rewritten = _commit(repos["upstream"], "docs/c.md", DOC.format(t="charlie"), "c")
    tick2 = _tick(defs, "git_commit_sensor", tick.cursor)
    r2 = _by_key(tick2)["merged"]
    assert r2.run_key == f"merged@{rewritten}"
    assert r2.tags["kb/listing"].startswith("full: history rewritten")
    assert r2.tags["kb/previous_commit"] == merged_sha


def test_commit_sensor_follows_the_configured_branch_not_the_checkout(repos):
    defs = _defs()
    local = repos["local"]
    start = _tick(defs, "git_commit_sensor", None)
    _git(local, "checkout", "-q", "-b", "feature")
    _commit(local, "docs/f.md", DOC.format(t="foxtrot"), "f")
    tick = _tick(defs, "git_commit_sensor", start.cursor)
    assert "local" not in _by_key(tick)                # a feature-branch commit is not a merge
    _git(local, "checkout", "-q", "main")
    _git(local, "merge", "-q", "--no-ff", "-m", "merge feature", "feature")
    tick2 = _tick(defs, "git_commit_sensor", tick.cursor)
    main_sha = _git(local, "rev-parse", "main")
    assert _by_key(tick2)["local"].run_key == f"local@{main_sha}"


def test_force_push_makes_the_documents_stage_list_everything(repos):
    from kb_assets.config import load_config
    from kb_assets.pipeline.documents import sync_documents
    from kb_assets.sources.gitutil import fetch
    from kb_assets.store.db import connect

    cfg = load_config()
    source = cfg.source("merged")
    clone = repos["clone"]
    with connect(repos["db_url"]) as conn:
        first = sync_documents(conn, cfg, source)
        assert first.new == 1
        _commit(repos["upstream"], "docs/b.md", DOC.format(t="bravo"), "b")
        fetch(clone, "origin", "main")
        ff = sync_documents(conn, cfg, source)
        assert ff.listing_mode == "git-diff" and ff.new == 1 and ff.listing_reason == ""
        _git(repos["upstream"], "reset", "-q", "--hard", "HEAD~1")
        _commit(repos["upstream"], "docs/c.md", DOC.format(t="charlie"), "c")
        fetch(clone, "origin", "main")
        rw = sync_documents(conn, cfg, source)
        assert rw.listing_mode == "full" and rw.listing_reason.startswith("history rewritten")
        assert rw.new == 1 and rw.deleted == 1          # c in, b out
        paths = {p for (p,) in conn.execute(
            "SELECT path FROM documents WHERE source_key = 'merged' AND status = 'active'")}
        assert paths == {"docs/a.md", "docs/c.md"}


def test_listing_sensor_for_a_folder_that_is_not_git(repos):
    defs = _defs()
    first = _tick(defs, "source_listing_sensor", None)
    assert set(_by_key(first)) == {"notes"}
    assert _by_key(first)["notes"].tags["kb/trigger"] == "listing"
    same = _tick(defs, "source_listing_sensor", first.cursor)
    assert not same.run_requests
    (repos["memory"] / "n.md").write_text(DOC.format(t="november"))
    changed = _tick(defs, "source_listing_sensor", same.cursor)
    assert set(_by_key(changed)) == {"notes"}
    assert _by_key(changed)["notes"].run_key != _by_key(first)["notes"].run_key
    # a touched file (same size, new mtime) is a change too
    st = os.stat(repos["memory"] / "m.md")
    os.utime(repos["memory"] / "m.md", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert _tick(defs, "source_listing_sensor", changed.cursor).run_requests


# ---------------------------------------------------------------- the webhook, over real HTTP
SECRET = "webhook-test-secret"


@pytest.fixture
def webhook(db_url):
    import uvicorn

    from kb_assets.serving.webhooks import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(database_url=db_url, secret=SECRET), host="127.0.0.1",
                                           port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "webhook server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def _github_push(repo_url: str, after: str, before: str = "0" * 39 + "1", forced: bool = False) -> bytes:
    return json.dumps({"ref": "refs/heads/main", "before": before, "after": after, "forced": forced,
                       "repository": {"full_name": "team/upstream", "clone_url": repo_url},
                       "head_commit": {"message": "PAYLOAD-MARKER do not log me"}}).encode()


def _sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_webhook_signatures_replay_and_the_sensor_reads_the_push(repos, webhook, caplog):
    import httpx

    upstream = repos["upstream"]
    after = _commit(upstream, "docs/d.md", DOC.format(t="delta"), "d")
    body = _github_push(f"{upstream}.git", after)   # another spelling of the remote URL
    hdr = {"X-GitHub-Event": "push", "X-GitHub-Delivery": "d-1", "Content-Type": "application/json"}
    with httpx.Client(base_url=webhook, timeout=10) as http:
        ok = http.post("/hooks/git", content=body, headers={**hdr, "X-Hub-Signature-256": _sign(body)})
        assert ok.status_code == 202 and ok.json()["status"] == "recorded"
        replay = http.post("/hooks/git", content=body, headers={**hdr, "X-Hub-Signature-256": _sign(body)})
        assert replay.status_code == 200 and replay.json()["status"] == "duplicate"
        with caplog.at_level(logging.WARNING, logger="kb_assets.webhooks"):
            bad = http.post("/hooks/git", content=body,
                            headers={**hdr, "X-GitHub-Delivery": "d-2", "X-Hub-Signature-256": _sign(body, "wrong")})
            unsigned = http.post("/hooks/git", content=body, headers={**hdr, "X-GitHub-Delivery": "d-3"})
            tampered = http.post("/hooks/git", content=body.replace(b"delta", b"DELTA") + b" ",
                                 headers={**hdr, "X-GitHub-Delivery": "d-4", "X-Hub-Signature-256": _sign(body)})
        assert bad.status_code == unsigned.status_code == tampered.status_code == 401
        rejected = [r.getMessage() for r in caplog.records if r.name == "kb_assets.webhooks"]
        assert len(rejected) == 3 and all("bad signature" in m for m in rejected)
        assert not any("PAYLOAD-MARKER" in m or after in m for m in rejected)   # never the payload
        gl_body = json.dumps({"ref": "refs/heads/main", "before": "1" * 40, "after": after,
                              "project": {"path_with_namespace": "team/upstream", "git_http_url": str(upstream)}}
                             ).encode()
        gl = {"X-Gitlab-Event": "Push Hook", "X-Gitlab-Event-UUID": "g-1"}
        assert http.post("/hooks/git", content=gl_body, headers={**gl, "X-Gitlab-Token": SECRET}).status_code == 202
        assert http.post("/hooks/git", content=gl_body,
                         headers={**gl, "X-Gitlab-Event-UUID": "g-2", "X-Gitlab-Token": "nope"}).status_code == 401
        ping = http.post("/hooks/git", content=b"{}", headers={"X-GitHub-Event": "ping", "X-GitHub-Delivery": "p",
                                                               "X-Hub-Signature-256": _sign(b"{}")})
        assert ping.status_code == 200
    from kb_assets.store.db import connect

    with connect(repos["db_url"]) as conn:
        rows = conn.execute("SELECT provider, delivery_id, after_sha FROM git_pushes ORDER BY id").fetchall()
    assert rows == [("github", "github:d-1", after), ("gitlab", "gitlab:g-1", after)]

    # the sensor reads the recorded pushes: the run is a "push" run at the pushed commit
    defs = _defs()
    tick = _tick(defs, "git_commit_sensor", json.dumps({"commits": {}, "push_id": 0}))
    r = _by_key(tick)["merged"]
    assert r.run_key == f"merged@{after}" and r.tags["kb/trigger"] == "push"
    assert r.tags["kb/push_delivery"] == "gitlab:g-1"
    assert json.loads(tick.cursor)["push_id"] >= 2
    # the next tick does not see the same pushes again
    later = _tick(defs, "git_commit_sensor", tick.cursor)
    assert "merged" not in _by_key(later)
    from kb_assets.sources.watch import prune_pushes

    with connect(repos["db_url"]) as conn:     # recent pushes are kept, old ones forgotten
        assert prune_pushes(conn) == 0 and prune_pushes(conn, keep_days=0) == 2


def test_webhook_without_a_secret_refuses(db_url):
    from starlette.testclient import TestClient

    from kb_assets.serving.webhooks import create_app

    os.environ.pop("KB_WEBHOOK_SECRET", None)
    with TestClient(create_app(database_url=db_url)) as client:
        r = client.post("/hooks/git", content=b"{}", headers={"X-Hub-Signature-256": _sign(b"{}")})
    assert r.status_code == 503 and "KB_WEBHOOK_SECRET" in r.json()["error"]


def test_status_freshness_follows_the_remote_branch(repos):
    from kb_assets.config import load_config
    from kb_assets.pipeline.documents import sync_documents
    from kb_assets.sources.gitutil import fetch
    from kb_assets.store.db import connect
    from kb_assets.store.status import source_status

    cfg = load_config()
    with connect(repos["db_url"]) as conn:
        sync_documents(conn, cfg, cfg.source("merged"))
        fresh = source_status(conn, ["merged"], config=cfg)[0]
        assert fresh["fresh"] is True
        merged = _commit(repos["upstream"], "docs/b.md", DOC.format(t="bravo"), "b")
        fetch(repos["clone"], "origin", "main")
        behind = source_status(conn, ["merged"], config=cfg)[0]
        assert behind["fresh"] is False and behind["head_commit"] == merged


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the repository to another user")
def test_a_repository_git_refuses_is_reported_not_walked(tmp_path):
    """A bind-mounted checkout owned by another uid: git refuses it ("dubious ownership"). kb must say so
    (a skip with the fix) instead of walking the folder as if it were not git."""
    from kb_assets.config import parse_config
    from kb_assets.sources.discovery import list_source

    repo = tmp_path / "mounted"
    repo.mkdir()
    _git(repo, "init", "-q")
    _commit(repo, "docs/a.md", DOC.format(t="alpha"), "a")
    (repo / "untracked.md").write_text(DOC.format(t="untracked"))
    cfg = parse_config({"sources": [{"key": "m", "kind": "doc", "root": str(repo), "content": "HEAD"}]},
                       path="kb.yaml", base_dir=str(tmp_path))
    assert {e.path for e in list_source(repo, cfg.sources[0]).files} == {"docs/a.md"}
    for dirpath, dirnames, filenames in os.walk(repo):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, 65534, 65534)
    listing = list_source(repo, cfg.sources[0])
    assert listing.files == [] and listing.complete is False
    assert listing.skips[0].reason == "unreadable" and "dubious ownership" in listing.skips[0].detail
    assert "safe.directory" in listing.skips[0].detail


def test_branch_and_remote_settings_fail_with_one_line():
    from kb_assets.config import ConfigError, parse_config

    def err(source: dict) -> str:
        with pytest.raises(ConfigError) as e:
            parse_config({"sources": [{"key": "s", "kind": "doc", "root": ".", **source}]}, path="kb.yaml",
                         base_dir=".")
        return str(e.value)

    assert "content: HEAD" in err({"remote": "origin"})              # fetching never moves a working tree
    assert "not a valid git branch" in err({"content": "HEAD", "branch": "--upload-pack=x"})
    assert "not a valid git branch" in err({"content": "HEAD", "branch": "main..evil"})
    ok = parse_config({"sources": [{"key": "s", "kind": "doc", "root": ".", "content": "HEAD",
                                    "branch": "release/2.x", "remote": "upstream"}]}, path="kb.yaml", base_dir=".")
    assert ok.sources[0].branch == "release/2.x"
