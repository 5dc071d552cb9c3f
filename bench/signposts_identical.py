"""Every extractive signpost payload of a set of corpora, dumped to one JSON file, so a change meant to make the
extractive stage cheaper can prove it changes no signpost (issue 14): dump before, dump after, compare.
    python bench/signposts_identical.py dump OUT.json ROOT[:KIND] ...   (KIND defaults to doc; each file is run as
                                                                       that kind, as "adr" and with its stem as title)
    python bench/signposts_identical.py compare A.json B.json
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

from kb_assets.signposts.base import SignpostInput
from kb_assets.signposts.extractive import ExtractiveSignposter
from kb_assets.signposts.schema import validate_payload

SUFFIXES = {".md", ".markdown", ".rst", ".txt", ".py", ".go", ".rs", ".js", ".ts"}


def inputs(spec: str):
    root, _, kind = spec.partition(":")
    base = pathlib.Path(root)
    for p in sorted(base.rglob("*")):
        if not p.is_file() or p.suffix not in SUFFIXES:
            continue
        text = p.read_text(errors="replace")
        rel = str(p.relative_to(base))
        kinds = ["code"] if p.suffix in {".py", ".go", ".rs", ".js", ".ts"} else [kind or "doc", "adr"]
        for k in dict.fromkeys(kinds):
            yield f"{spec}|{rel}|{k}|notitle", SignpostInput(title="", kind=k, path=rel, text=text, meta={})
            yield f"{spec}|{rel}|{k}|title", SignpostInput(title=p.stem, kind=k, path=rel, text=text,
                                                           meta={"tags": ["x"], "status": "accepted"})


def main() -> int:
    if sys.argv[1] == "dump":
        sp = ExtractiveSignposter()
        out, t = {}, 0.0
        for spec in sys.argv[3:]:
            for key, inp in inputs(spec):
                t0 = time.perf_counter()
                r = sp.generate(inp)
                t += time.perf_counter() - t0
                out[key] = validate_payload(inp.kind, r.payload)
        pathlib.Path(sys.argv[2]).write_text(json.dumps(out, sort_keys=True, ensure_ascii=False, indent=0))
        print(f"{len(out)} payloads, generate {t:.2f} s")
        return 0
    a, b = (json.loads(pathlib.Path(x).read_text()) for x in sys.argv[2:4])
    diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    for k in diff[:10]:
        print("DIFF", k, "\n  before:", json.dumps(a.get(k))[:600], "\n  after: ", json.dumps(b.get(k))[:600])
    print(f"{len(a)} vs {len(b)} payloads, {len(diff)} differ")
    return 1 if diff or not a else 0


if __name__ == "__main__":
    sys.exit(main())
