"""The reST parse of the documents stage on the shared PEPs: docutils (the reference parser) beside the index's
own title rules (chunking/rst.rst_structure), what each finds, and what the stored parse saves the chunker and
the extractive signposter (issue 13: parse once).

    .venv/bin/python bench/rst_parse_bench.py [EVERY]       # every EVERY-th PEP (default 1: all); CPU seconds

Needs docutils (the test extra). Prints: PEPs, docutils CPU, rst_structure CPU (+ JSON round trip, as stored),
documents whose section titles / depths differ, and the chunker's and the signposter's CPU over all of them
parsing the text themselves vs reading the stored parse (identical output asserted).
"""
from __future__ import annotations

import json
import re
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # kb_assets_tests (the reference walker)
CORPORA = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"


def main() -> None:
    from kb_assets_tests.rst_reference import docutils_titles   # the reference walker the test uses

    from kb_assets.chunking import chunk_document, document_blocks
    from kb_assets.chunking.rst import rst_structure
    from kb_assets.models import SourceDocument
    from kb_assets.signposts.extractive import parse_document

    every = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    with tarfile.open(sorted(CORPORA.glob("python-peps-*.tar.gz"))[0]) as tar:
        members = sorted((m for m in tar if m.isfile() and re.search(r"/pep-\d+\.rst$", m.name)),
                         key=lambda m: m.name)[::every]
        texts = {m.name.rsplit("/", 1)[1]: tar.extractfile(m).read().decode("utf-8") for m in members}

    t = time.process_time()
    du = {k: docutils_titles(v) for k, v in texts.items()}
    t_du = time.process_time() - t
    t = time.process_time()
    own = {k: rst_structure(v) for k, v in texts.items()}
    t_own = time.process_time() - t
    docs = [SourceDocument(path=k, kind="adr", title="", text=v, meta={}) for k, v in texts.items()]
    t = time.process_time()
    stored = [json.loads(json.dumps(document_blocks(d))) for d in docs]
    t_store = time.process_time() - t
    differ = [k for k in texts if [(lv, ti) for _a, _b, lv, ti in own[k]["titles"]] != du[k]]
    t = time.process_time()
    want = [chunk_document(d, max_tokens=254) for d in docs]
    t_chunk = time.process_time() - t
    t = time.process_time()
    got = [chunk_document(d, max_tokens=254, blocks=s) for d, s in zip(docs, stored)]
    t_chunk_stored = time.process_time() - t
    t = time.process_time()
    pw = [parse_document(d.text) for d in docs]
    t_sp = time.process_time() - t
    t = time.process_time()
    pg = [parse_document(d.text, blocks=s) for d, s in zip(docs, stored)]
    t_sp_stored = time.process_time() - t
    assert got == want and pg == pw
    print(f"{len(texts)} PEPs, {sum(map(len, texts.values())) / 1e6:.1f} MB")
    print(f"docutils parser: {t_du:.2f} s CPU; rst_structure: {t_own:.2f} s ({t_du / t_own:.0f}x cheaper); "
          f"as stored (document_blocks + JSON): {t_store:.2f} s")
    print(f"section titles or depths differ from docutils in {len(differ)} PEPs {differ[:5]}")
    print(f"chunk_document (estimate_tokens): parsing {t_chunk:.2f} s, stored {t_chunk_stored:.2f} s; "
          f"signposter parse_document: parsing {t_sp:.2f} s, stored {t_sp_stored:.2f} s (same output)")


if __name__ == "__main__":
    main()
