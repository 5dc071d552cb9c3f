"""The `kb` command end to end, as a user runs it: a separate process, the embedded PostgreSQL under
data_dir, the real local model, the Dagster assets in-process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ADR = """# 3. Retry embedding calls with backoff

Date: 2025-06-02

## Status

Accepted

## Context

The embedding provider answers 429 under load. Failing the whole run on a rate limit wasted hours of work.

## Decision

We will retry 429 and 5xx answers with exponential backoff and full jitter because the provider asks
clients to slow down, and we will honour the Retry-After header when it is present.

## Consequences

Runs take longer under load but finish; a 401 still stops at once.
"""


def _kb(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("KB_DATABASE_URL", None)
    env.pop("KB_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "kb_assets.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"kb {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    # A short path: the embedded server's unix socket lives under data_dir.
    root = Path(tempfile.mkdtemp(prefix="kbcli-", dir="/tmp"))
    (root / "docs" / "adr").mkdir(parents=True)
    (root / "docs" / "adr" / "0003-retry-with-backoff.md").write_text(ADR)
    (root / "docs" / "guide.md").write_text(
        "# Operator guide\n\n## Restarting workers\n\nRestart the celery workers with `make restart-workers` "
        "after changing the queue settings; they drain their current task first.\n\n" + "More detail. " * 20)
    (root / "src").mkdir()
    (root / "src" / "backoff.py").write_text(
        '"""Backoff delays for API retries."""\nimport random\n\n\ndef delay(attempt: int) -> float:\n'
        '    """Full-jitter exponential delay in seconds."""\n    return random.uniform(0, 2 ** attempt)\n')
    (root / "binary.md").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" * 50)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "add", "."], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "init"], cwd=root,
                   check=True)
    (root / "kb.yaml").write_text(
        "data_dir: .kb\nsources:\n"
        "  - {key: decisions, kind: adr, root: ., include: ['docs/adr/*.md']}\n"
        "  - {key: docs, kind: doc, root: ., include: ['docs/*.md', '*.md']}\n"
        "  - {key: code, kind: code, root: ., include: ['src/**/*.py']}\n")
    first = _kb(root, "index", "--json")
    return root, json.loads(first.stdout)


def test_index_reports_per_source(indexed):
    root, report = indexed
    by = {s["source"]: s for s in report["sources"]}
    assert set(by) == {"decisions", "docs", "code"} and not report["failures"]
    assert by["decisions"]["documents"] == 1 and by["decisions"]["embedded"] == by["decisions"]["chunks"] > 0
    assert by["docs"]["skip_reasons"].get("binary") == 1
    assert by["code"]["this_run"]["documents"]["new"] == 1
    assert (root / ".kb" / "pg").is_dir()


def test_second_index_pays_nothing(indexed):
    root, _ = indexed
    again = json.loads(_kb(root, "index", "--json").stdout)
    for s in again["sources"]:
        assert s["this_run"]["embeddings"]["chunks_embedded"] == 0, s
        assert s["this_run"]["documents"]["unchanged"] == s["documents"], s
        assert s["this_run"]["signposts"].get("llm_calls", 0) == 0


def test_status_json(indexed):
    root, _ = indexed
    status = json.loads(_kb(root, "status", "--json").stdout)
    by = {s["source"]: s for s in status["sources"]}
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    assert by["decisions"]["indexed_commit"] == head and by["decisions"]["fresh"] is True
    assert by["docs"]["skipped_files"][0]["reason"] == "binary"
    assert by["decisions"]["signposted"] == 1


def test_search_and_recall(indexed):
    root, _ = indexed
    hits = json.loads(_kb(root, "search", "rate limit retry-after", "--json").stdout)["chunks"]
    assert hits and hits[0]["path"] == "docs/adr/0003-retry-with-backoff.md"
    out = json.loads(_kb(root, "recall", "how do we handle 429 rate limits from the provider?", "--json").stdout)
    assert out["documents"][0]["path"] == "docs/adr/0003-retry-with-backoff.md"
    top = out["documents"][0]
    assert top["status"] == "Accepted" and top["id"].startswith("kb:")
    assert any("backoff" in d["decision"].lower() for d in top["signpost"]["key_decisions"])
    code = json.loads(_kb(root, "recall", "exponential backoff delay with jitter", "--json").stdout)["code"]
    assert [c["path"] for c in code] == ["src/backoff.py"]
    assert "backoff" in code[0]["signpost"]["purpose"].lower()
    text = _kb(root, "recall", "restart celery workers").stdout
    assert "guide.md" in text and "tokens" in text.splitlines()[-1]
    shown = json.loads(_kb(root, "show", top["id"], "--json").stdout)
    assert "Retry-After" in shown["text"]


def test_edit_is_seen_and_status_goes_stale_until_indexed(indexed):
    root, _ = indexed
    p = root / "docs" / "adr" / "0003-retry-with-backoff.md"
    p.write_text(p.read_text() + "\n## Addendum\n\nWe cap the delay at sixty seconds.\n")
    subprocess.run(["git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qam", "cap"], cwd=root,
                   check=True)
    status = json.loads(_kb(root, "status", "--json").stdout)
    assert {s["source"]: s for s in status["sources"]}["decisions"]["fresh"] is False
    run = json.loads(_kb(root, "index", "--source", "decisions", "--json").stdout)
    d = run["sources"][0]
    assert d["this_run"]["documents"]["changed"] == 1
    assert 1 <= d["this_run"]["embeddings"]["chunks_embedded"] <= 2
    status = json.loads(_kb(root, "status", "--json").stdout)
    assert {s["source"]: s for s in status["sources"]}["decisions"]["fresh"] is True


def test_version_names_the_package_and_the_code(tmp_path):
    """`kb --version` (what a benchmark harness records): the package version and the digest of the installed
    code, the same digest `kb index` compares to decide whether its code changed."""
    from importlib.metadata import version

    from kb_assets.pipeline.source_state import code_version

    proc = _kb(tmp_path, "--version")
    assert proc.stdout.strip() == f"kb {version('kb_assets')} (code {code_version()})"
