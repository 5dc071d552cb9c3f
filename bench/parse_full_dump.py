"""The parse pin's computation over *every* document of its corpora (not every 10th) and every extractive
signpost, token counts by estimate_tokens (fast): proves a parser change moves only what it means to.

    .venv/bin/python bench/parse_full_dump.py dump OUT.json         # run in the tree to measure
    .venv/bin/python bench/parse_full_dump.py compare A.json B.json # documents / signposts that differ
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def dump(out: str) -> None:
    import kb_assets.chunking as chunking
    import kb_assets_tests.parse_pin as pin

    chunking.make_token_counter = lambda: None      # chunk_document then counts with estimate_tokens
    pin.EVERY = 1
    pin.SIGNPOST_EVERY = 1
    t = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        data = pin.compute(Path(tmp))
    Path(out).write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False, default=str))
    print(len(data["documents"]), "documents", len(data["signposts"]), "signposts", round(time.time() - t, 1), "s")


def compare(a_path: str, b_path: str) -> None:
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    for part in ("documents", "signposts"):
        common = set(a[part]) & set(b[part])
        diff = sorted(k for k in common if a[part][k] != b[part][k])
        print(part, "common", len(common), "only in A", len(set(a[part]) - set(b[part])),
              "only in B", len(set(b[part]) - set(a[part])), "differ", len(diff))
        for k in diff:
            x, y = a[part][k], b[part][k]
            print("  ", k, {f: (x.get(f), y.get(f)) for f in sorted(set(x) | set(y)) if x.get(f) != y.get(f)}
                  if isinstance(x, dict) else "")


if __name__ == "__main__":
    if sys.argv[1] == "dump":
        dump(sys.argv[2])
    else:
        compare(sys.argv[2], sys.argv[3])
