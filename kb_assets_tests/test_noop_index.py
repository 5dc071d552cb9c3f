"""A `kb index` with nothing changed costs nothing: no embedding call, no model load (torch and
sentence-transformers are never imported), and the regression check reports its stored result. When the real
index changes, the check still reports it (it depends on its own schema only); when its own index changes, it
runs again, its query vectors from the cache. Whole `kb index` processes
(the CLI runs the Dagster job with its checks), real embedded PostgreSQL, real local model. Not timed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

HEAVY = ("torch", "sentence_transformers", "transformers", "voyageai", "google.genai", "pandas")   # pandas: the UI tables use tabulate

# every git process the run starts, seen by an audit hook (subprocess.Popen's event: executable, args, ...)
_RUN = (
    "import json, os, sys\n"
    "gits = []\n"
    "def hook(event, args):\n"
    "    if event == 'subprocess.Popen' and os.path.basename(str(args[1][0])) == 'git':\n"
    "        gits.append([str(a) for a in args[1]])\n"
    "sys.addaudithook(hook)\n"
    "from kb_assets.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "heavy = sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in %r))\n"
    "print('HEAVY=' + json.dumps(heavy), file=sys.stderr)\n"
    "print('GIT=' + json.dumps(gits), file=sys.stderr)\n"
    "sys.exit(rc)\n" % (HEAVY,))


def _kb_index_run(cfg: Path) -> tuple[dict, list[str], list[list[str]]]:
    """(kb index --json's output, the heavy modules it imported, the git processes it started)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("KB_CONFIG", None)
    proc = subprocess.run([sys.executable, "-c", _RUN, "index", "--config", str(cfg), "--json"],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    heavy = json.loads(next(line for line in lines if line.startswith("HEAVY="))[6:])
    gits = json.loads(next(line for line in lines if line.startswith("GIT="))[4:])
    return json.loads(proc.stdout), heavy, gits


def _kb_index(cfg: Path) -> tuple[dict, list[str]]:
    out, heavy, _ = _kb_index_run(cfg)
    return out, heavy


def _embedded(out: dict) -> int:
    return sum(s["this_run"]["embeddings"].get("chunks_embedded", 0) for s in out["sources"])


def _check_state(db_url: str) -> tuple[str, str, int]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        checked_at, fp = conn.execute("SELECT checked_at::text, fingerprint FROM kb_regression.check_results"
                                      " WHERE name = 'recall_regression_set'").fetchone()
        n_vectors = conn.execute("SELECT count(*) FROM kb_regression.query_vectors").fetchone()[0]
    return checked_at, fp, n_vectors


def _check_outcome(db_url: str, out: dict) -> dict:
    """The regression check's outcome in the run `out` reported: a small change runs without Dagster, and
    stores what its checks found in direct_runs."""
    assert out["sources"][0]["runner"] == "direct", out["sources"][0]
    with psycopg.connect(db_url, autocommit=True) as conn:
        checks = conn.execute("SELECT checks FROM kb.direct_runs ORDER BY id DESC LIMIT 1").fetchone()[0]
    found = next(c for c in checks if c["name"] == "recall_regression_set")
    return {"passed": found["passed"], **found["metadata"]}


def write_adrs(docs: Path, n_docs: int = 3) -> Path:
    """A folder of small ADRs (also the corpus of test_vector_index_background's whole-process test)."""
    docs.mkdir()
    for n in range(1, n_docs + 1):
        (docs / f"ADR-{n}.md").write_text(
            f"# ADR {n}: decision number {n}\n\n## Context\n\nStreams need retention rule {n} because storage "
            f"grows without bound.\n\n## Decision\n\nWe keep {n * 7} days of messages per stream.\n")
    return docs


def test_unchanged_reindex_makes_no_embedding_call_and_loads_no_model(tmp_path, db_url):
    from kb_assets.query.regression import load_queries

    docs = write_adrs(tmp_path / "docs")
    cfg = tmp_path / "kb.yaml"
    cfg.write_text(json.dumps({"data_dir": str(tmp_path / "data"), "database_url": db_url,
                               "sources": [{"key": "adrs", "kind": "adr", "root": str(docs),
                                            "include": ["*.md"]}]}))
    first, _ = _kb_index(cfg)
    assert _embedded(first) >= 3
    checked_1, fp_1, n_vectors = _check_state(db_url)
    assert n_vectors == len({q["query"] for q in load_queries()})   # every regression query, cached once

    second, heavy = _kb_index(cfg)
    assert _embedded(second) == 0
    assert second["sources"][0]["this_run"]["documents"]["unchanged"] == 3
    assert heavy == [], f"a nothing-changed kb index imported {heavy}"
    # the regression check reported its stored result (same fingerprint, not run again)
    assert _check_state(db_url) == (checked_1, fp_1, n_vectors)

    # the real index changes: the regression check depends on nothing of it (its own schema, the embedder,
    # kb's code), so it reports its stored result without indexing its corpus or running a query
    (docs / "ADR-2.md").write_text(
        "# ADR 2: decision number 2, revised\n\n## Context\n\nStreams need a longer retention because replays "
        "of old messages are common.\n\n## Decision\n\nWe keep 30 days of messages per stream from now on.\n")
    third, _ = _kb_index(cfg)
    assert _embedded(third) >= 1
    assert _check_state(db_url) == (checked_1, fp_1, n_vectors)
    assert _check_outcome(db_url, third)["reused"] is True

    # its own index is damaged: the corpus is indexed again and the set runs again, with the cached query
    # vectors (no query embedded again)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SET search_path TO kb_regression")    # its triggers read their schema's tables
        assert conn.execute("DELETE FROM documents WHERE path = (SELECT min(path) FROM documents"
                            " WHERE status = 'active')").rowcount == 1
    (docs / "ADR-3.md").write_text("# ADR 3: decision number 3, withdrawn\n\nWe keep no extra days.\n")
    fourth, _ = _kb_index(cfg)
    checked_4, fp_4, n_vectors_4 = _check_state(db_url)
    assert fp_4 != fp_1 and checked_4 != checked_1
    assert n_vectors_4 == n_vectors
    outcome = _check_outcome(db_url, fourth)
    assert outcome["reused"] is False and outcome["passed"] is True and outcome["query_vectors_embedded"] == 0


def test_small_passes_of_a_folder_outside_git_start_no_git_process(tmp_path, db_url):
    """No folder above the source holds a repository, so git has nothing to say about it: asking cost four
    processes (~20 ms, each briefly a fork of the whole process) on every pass (docs/BENCHMARKS.md, "Passes
    without git processes"). The same folder inside a work tree is still listed by git."""
    from kb_assets.sources.gitutil import outside_any_repository

    docs = write_adrs(tmp_path / "docs")
    assert outside_any_repository(docs), f"{tmp_path} is inside a git repository: this test needs one that is not"
    cfg = tmp_path / "kb.yaml"
    cfg.write_text(json.dumps({"data_dir": str(tmp_path / "data"), "database_url": db_url,
                               "sources": [{"key": "plain", "kind": "adr", "root": str(docs),
                                            "include": ["*.md"]}]}))
    first, _, gits = _kb_index_run(cfg)
    assert first["sources"][0]["runner"] == "dagster" and _embedded(first) >= 3
    assert gits == [], f"a first load started {gits}"    # the regression check's corpus is walked too
    unchanged, _, gits = _kb_index_run(cfg)
    assert unchanged["sources"][0]["this_run"]["documents"]["unchanged"] == 3
    assert gits == [], f"a nothing-changed pass started {gits}"
    (docs / "ADR-2.md").write_text(
        "# ADR 2: decision number 2, revised\n\n## Context\n\nStreams need a longer retention because replays "
        "of old messages are common.\n\n## Decision\n\nWe keep 30 days of messages per stream from now on.\n")
    (docs / "ADR-3.md").unlink()
    changed, _, gits = _kb_index_run(cfg)
    assert changed["sources"][0]["runner"] == "direct"
    assert _embedded(changed) >= 1
    assert gits == [], f"a small pass started {gits}"

    # the same folder made a work tree: listed by git again (git mode records the commit)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "docs"]):
        subprocess.run(["git", *args], cwd=docs, check=True, env=env, capture_output=True)
    assert not outside_any_repository(docs) and not outside_any_repository(docs / "missing" / "deeper")
    in_git, _, gits = _kb_index_run(cfg)
    assert any(g[1:4] == ["-c", "core.quotePath=false", "rev-parse"] for g in gits), gits
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=docs, capture_output=True, text=True).stdout.strip()
    assert in_git["sources"][0]["indexed_commit"] == head, in_git["sources"][0]


def test_a_bare_repository_or_a_git_file_counts_as_a_repository(tmp_path):
    """What git's discovery would find is never ruled out: a `.git` file (worktrees, submodules), a folder
    that is itself a git directory (bare repositories, a path inside .git/)."""
    from kb_assets.sources.gitutil import outside_any_repository, work_tree_top

    plain = tmp_path / "plain" / "sub"
    plain.mkdir(parents=True)
    assert outside_any_repository(plain) and work_tree_top(plain) is None
    wt = tmp_path / "wt"
    (wt / "sub").mkdir(parents=True)
    (wt / ".git").write_text("gitdir: /elsewhere\n")
    assert not outside_any_repository(wt / "sub")
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    (bare / "info" / "x").mkdir(parents=True)
    assert not outside_any_repository(bare / "info" / "x")
