"""The extractive signposts stage alone (run_signposts over one source), old code beside new in one process, on
an embedded PostgreSQL (issue 14). The old extractive module and runner are loaded from a git revision, so both
run on the same documents, database and load, alternating:
    python bench/signposts_stage_bench.py CORPUS_DIR --old-rev 0670907 --rounds 3
Per round and version: stage wall, time inside generate() (the algorithm), and the rest (reads, writes, commits).
Each round deletes the signposts first, so every document is generated again.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import types
import uuid

from kb_assets.models import SourceDocument


def _module_at(rev: str, path: str, name: str) -> types.ModuleType:
    src = subprocess.run(["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=True).stdout
    mod = types.ModuleType(name)
    mod.__file__ = f"<{rev}:{path}>"
    sys.modules[name] = mod
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod


class Timed:
    """A signposter wrapper that adds up the time spent inside generate()."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0
        self.generator, self.model, self.prompt_version = inner.generator, inner.model, inner.prompt_version

    def generate(self, doc):
        t0 = time.perf_counter()
        try:
            return self.inner.generate(doc)
        finally:
            self.seconds += time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("--old-rev", default="0670907")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kind", default="doc")
    args = ap.parse_args()
    os.environ.setdefault("KB_DB_LINGER", "0")
    import psycopg

    from kb_assets.signposts import extractive as new_ex
    from kb_assets.pipeline import signposts as new_runner
    from kb_assets.store.db import connect, embedded_url, migrate

    old_ex = _module_at(args.old_rev, "kb_assets/signposts/extractive.py", "old_extractive")
    old_runner = _module_at(args.old_rev, "kb_assets/signposts/runner.py", "old_runner")
    base = pathlib.Path(tempfile.mkdtemp(prefix="kbsp-", dir="/tmp"))
    server = embedded_url(base)
    name = "sp_" + uuid.uuid4().hex[:8]
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    import psycopg.conninfo as ci
    params = ci.conninfo_to_dict(server)
    params["dbname"] = name
    url = ci.make_conninfo(**params)
    conn = connect(url)
    migrate(conn)
    root = pathlib.Path(args.corpus)
    conn.execute("INSERT INTO sources (key, kind, root) VALUES ('corpus', %s, %s)", (args.kind, str(root)))
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".md", ".rst", ".txt"))
    with conn.transaction():
        for p in files:
            text = p.read_text(errors="replace")
            rel = str(p.relative_to(root))
            h = SourceDocument(path=rel, kind=args.kind, title=p.stem, text=text).content_hash
            conn.execute("""INSERT INTO documents (source_key, path, kind, title, status, content_hash, meta, text)
                            VALUES ('corpus', %s, %s, %s, 'active', %s, '{}'::jsonb, %s)""",
                         (rel, args.kind, p.stem, h, text))
    print(f"{len(files)} documents; load {os.getloadavg()}", flush=True)
    versions = {"old": (old_runner, old_ex), "new": (new_runner, new_ex)}
    payloads: dict[str, dict] = {}
    results: dict[str, list] = {"old": [], "new": []}
    for rnd in range(args.rounds):
        for label in (("old", "new") if rnd % 2 == 0 else ("new", "old")):
            runner, ex = versions[label]
            with conn.transaction():
                conn.execute("DELETE FROM signpost_state")
                conn.execute("DELETE FROM signposts")
            conn.execute("CHECKPOINT")
            sp = Timed(ex.ExtractiveSignposter())
            t0 = time.perf_counter()
            stats = runner.run_signposts(conn, "corpus", sp)
            wall = time.perf_counter() - t0
            assert stats.generated == len(files) - 0 or stats.generated + stats.reused == len(files), stats
            results[label].append((wall, sp.seconds))
            print(f"round {rnd} {label}: stage {wall:.2f} s, generate {sp.seconds:.2f} s, rest {wall - sp.seconds:.2f} s"
                  f" (generated {stats.generated}, reused {stats.reused}); load {os.getloadavg()[0]:.2f}", flush=True)
            rows = conn.execute("""SELECT d.path, s.payload FROM documents d JOIN signpost_state st ON st.document_id = d.id
                                   JOIN signposts s ON s.content_hash = st.content_hash AND s.generator = st.generator
                                    AND s.model = st.model AND s.prompt_version = st.prompt_version""").fetchall()
            got = {p: json.dumps(pl, sort_keys=True) for p, pl in rows}
            if label in payloads:
                assert payloads[label] == got, f"{label} payloads changed between rounds"
            payloads[label] = got
    same = payloads["old"] == payloads["new"]
    print(f"stored payloads old == new: {same} ({len(payloads['new'])} documents)")
    for label, rs in results.items():
        walls = sorted(w for w, _ in rs)
        print(f"{label}: median stage {walls[len(walls) // 2]:.2f} s over {len(rs)} rounds, "
              f"{1000 * walls[len(walls) // 2] / len(files):.1f} ms/document")
    conn.close()
    from kb_assets.store.db import release_embedded
    release_embedded(base)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
