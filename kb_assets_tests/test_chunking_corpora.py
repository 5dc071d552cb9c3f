"""The chunker on the real corpora in shared/corpora (ADRs from four repositories, PEPs), unpacked here.

Checked with the local model's real tokenizer: spans, budget, token counts, every non-blank line kept
(heading lines live in Chunk.heading), determinism, and that a one-line edit re-hashes only its section.
"""
from __future__ import annotations

import random
import re
import tarfile
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from kb_assets.chunking import chunk_document, default_tokenizer_path, estimate_tokens, make_token_counter
from kb_assets.models import SourceDocument

_ADORNMENT = re.compile(r"^([!-/:-@\[-`{-~])\1+\s*$")


def _unpack(archive: Path, dest: Path, want) -> list[Path]:
    out = []
    with tarfile.open(archive) as tar:
        for member in tar:
            if member.isfile() and want(member.name):
                tar.extract(member, dest, filter="data")
                out.append(dest / member.name)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[SourceDocument]:
    shared = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"
    if not shared.is_dir():
        pytest.skip(f"shared corpora not found at {shared}")
    dest = tmp_path_factory.mktemp("corpora")
    docs = []
    for archive in sorted(shared.glob("adr-*.tar.gz")):
        for f in _unpack(archive, dest, lambda n: n.endswith(".md")):
            docs.append(SourceDocument(path=str(f.relative_to(dest)), kind="adr", title="", text=f.read_text()))
    peps = sorted(shared.glob("python-peps-*.tar.gz"))
    assert peps, "the PEP corpus is missing"
    every = 5   # a fifth of the PEPs keeps this file well under a minute on two busy cores
    for i, f in enumerate(sorted(_unpack(peps[0], dest, lambda n: bool(re.search(r"/pep-\d+\.rst$", n))))):
        if i % every == 0:
            docs.append(SourceDocument(path=str(f.relative_to(dest)), kind="doc", title="", text=f.read_text()))
    assert len(docs) > 250
    return docs


@pytest.fixture(scope="module")
def raw() -> Tokenizer:
    tok = Tokenizer.from_file(str(default_tokenizer_path()))
    tok.no_truncation()
    tok.no_padding()
    return tok


def _problems(doc: SourceDocument, chunks, real: list[int], max_tokens: int) -> list[str]:
    out = []
    lines = doc.text.split("\n")
    for c, n in zip(chunks, real):
        if c.text not in "\n".join(lines[c.start_line - 1:c.end_line]):
            out.append(f"{doc.path}#{c.ordinal}: text not within lines {c.start_line}-{c.end_line}")
        if c.token_count != n or n > max_tokens:
            out.append(f"{doc.path}#{c.ordinal}: token_count {c.token_count}, tokenizer {n}, budget {max_tokens}")
    covered = {i for c in chunks for i in range(c.start_line, c.end_line + 1)}
    headings = " > ".join(c.heading for c in chunks)
    for i, line in enumerate(lines):
        s = line.strip()
        if s and i + 1 not in covered and not _ADORNMENT.match(s):
            title = " ".join(s.lstrip("#").split())
            if title not in headings:
                out.append(f"{doc.path}: line {i + 1} is in no chunk and no heading: {s[:60]!r}")
    return out


@pytest.mark.parametrize("max_tokens", [254, 96])
def test_real_corpora_keep_every_invariant(corpus, raw, max_tokens):
    counter = make_token_counter()
    problems: list[str] = []
    texts, spans = [], []
    results = []
    for doc in corpus:
        chunks = chunk_document(doc, max_tokens=max_tokens, count_tokens=counter)
        assert chunks, doc.path
        results.append((doc, chunks))
        spans.append((len(texts), len(texts) + len(chunks)))
        texts.extend(c.embedding_text() for c in chunks)
    real = [len(e.ids) for e in raw.encode_batch(texts, add_special_tokens=False)]
    for (doc, chunks), (a, b) in zip(results, spans):
        problems += _problems(doc, chunks, real[a:b], max_tokens)
    assert not problems, problems[:10]
    # headings are real structure, not noise: most PEP chunks sit under "PEP n: title > section"
    pep_chunks = [c for doc, chunks in results if doc.path.endswith(".rst") for c in chunks]
    assert sum(" > " in c.heading for c in pep_chunks) > 0.8 * len(pep_chunks)
    mean = sum(real) / len(real)
    assert mean > max_tokens * 0.4, mean          # chunks are packed, not shredded


def test_estimate_mode_keeps_spans_and_its_own_budget(corpus):
    problems = []
    for doc in corpus[::3]:
        chunks = chunk_document(doc, max_tokens=200)
        counts = estimate_tokens([c.embedding_text() for c in chunks])
        problems += _problems(doc, chunks, counts, 200)
    assert not problems, problems[:10]


def test_corpora_determinism_and_edit_locality(corpus):
    counter = make_token_counter()
    rng = random.Random(11)
    docs = [d for d in corpus if d.text.count("\n") > 150]
    checked = 0
    for doc in rng.sample(docs, 12):
        before = chunk_document(doc, max_tokens=254, count_tokens=counter)
        assert [c.chunk_hash for c in before] == [c.chunk_hash for c in
                                                   chunk_document(doc, max_tokens=254, count_tokens=counter)]
        lines = doc.text.split("\n")
        # edit one prose line (a word appended) well inside a chunk that does not overlap its neighbours
        # (not the first chunk: it may hold the title, which heads every chunk)
        candidates = [c for i, c in enumerate(before)
                      if i > 0 and before[i - 1].end_line < c.start_line
                      and (i + 1 == len(before) or before[i + 1].start_line > c.end_line)
                      and c.end_line - c.start_line > 4]
        if not candidates:
            continue
        target = rng.choice(candidates)
        k = next((k for k in range(target.start_line, target.end_line)
                  if re.match(r"^[A-Za-z].{20,}$", lines[k - 1]) and lines[k - 1] in target.text), None)
        if k is None:
            continue
        lines[k - 1] += " amended"
        edited = SourceDocument(path=doc.path, kind=doc.kind, title=doc.title, text="\n".join(lines))
        after = chunk_document(edited, max_tokens=254, count_tokens=counter)
        old = {c.chunk_hash for c in before}
        changed = [c for c in after if c.chunk_hash not in old]
        assert changed, doc.path
        # only chunks of the edited section change (its pieces may re-pack), every other chunk is reused
        assert {c.heading for c in changed} == {target.heading}, (doc.path, target.heading,
                                                                  [c.heading for c in changed])
        untouched = [c for c in before if c.heading != target.heading]
        assert all(c.chunk_hash in {a.chunk_hash for a in after} for c in untouched), doc.path
        checked += 1
    assert checked >= 6
