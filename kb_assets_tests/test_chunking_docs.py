"""Chunking prose: markdown, reStructuredText (PEPs), plain text, transcripts, work items, sessions.

Every test checks the chunk invariants with the real tokenizer of the local model (tokenizers, not our
counter): the text lies within its 1-based line span, token_count is the tokenizer's count of
embedding_text() and never above max_tokens.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from kb_assets.chunking import chunk_document, default_tokenizer_path, detect_shape, make_token_counter
from kb_assets.models import Chunk, SourceDocument

FIXTURES = Path(__file__).parent / "fixtures" / "corpora"
MAX = 254          # all-MiniLM-L6-v2: 256 minus [CLS] and [SEP]


@pytest.fixture(scope="module")
def counter():
    return make_token_counter()


@pytest.fixture(scope="module")
def raw() -> Tokenizer:
    tok = Tokenizer.from_file(str(default_tokenizer_path()))
    tok.no_truncation()
    tok.no_padding()
    return tok


def check(doc: SourceDocument, chunks: list[Chunk], raw: Tokenizer, max_tokens: int = MAX) -> None:
    lines = doc.text.split("\n")
    real = [len(e.ids) for e in raw.encode_batch([c.embedding_text() for c in chunks], add_special_tokens=False)]
    for i, (c, n) in enumerate(zip(chunks, real)):
        assert c.ordinal == i
        assert c.text.strip() and c.text == c.text.strip()
        assert 1 <= c.start_line <= c.end_line <= len(lines)
        assert c.text in "\n".join(lines[c.start_line - 1:c.end_line]), (i, c.start_line, c.end_line)
        assert c.token_count == n, (i, c.token_count, n)
        assert n <= max_tokens, (i, n)


def chunk(text: str, path: str = "doc.md", kind: str = "doc", max_tokens: int = MAX, counter=None, **kw):
    doc = SourceDocument(path=path, kind=kind, title="t", text=text)
    return doc, chunk_document(doc, max_tokens=max_tokens, count_tokens=counter, **kw)


def words(n: int, seed: int = 0) -> str:
    vocab = ["index", "chunk", "vector", "budget", "heading", "section", "paragraph", "token", "model", "query"]
    return " ".join(vocab[(i * 7 + seed) % len(vocab)] for i in range(n)) + "."


# ----------------------------------------------------------------------------------------------- markdown
def test_markdown_heading_paths_and_fenced_hash_lines(counter, raw):
    text = "\n".join([
        "# Guide", "", words(40), "",
        "## Install", "", words(40, 1), "",
        "```bash", "# not a heading: a shell comment", "## nor this", "pip install kb", "```", "",
        "### Linux", "", words(40, 2), "",
        "## Use", "", words(40, 3), "",
        "Setext title", "============", "", words(40, 4), "",
        "    # indented code, not a heading", "",
        "- a list item", "  # heading-looking line inside a list item is not a top-level section", "",
        "> # quoted", "", words(40, 5),
    ])
    doc, chunks = chunk(text, counter=counter)
    check(doc, chunks, raw)
    headings = [c.heading for c in chunks]
    assert headings[:4] == ["Guide", "Guide > Install", "Guide > Install > Linux", "Guide > Use"]
    assert "Setext title" in headings
    assert not any("shell comment" in h or "nor this" in h or "indented" in h or "quoted" in h for h in headings)
    fence = next(c for c in chunks if "pip install kb" in c.text)
    assert "# not a heading" in fence.text and fence.heading == "Guide > Install"


def test_markdown_tiny_sections_merge_forward_and_long_sections_split_with_overlap(counter, raw):
    doc = SourceDocument(path="0017.md", kind="adr", title="",
                         text=(FIXTURES / "govuk-aws-0017-terraform-data-structure.md").read_text())
    chunks = chunk_document(doc, max_tokens=MAX, count_tokens=counter)
    check(doc, chunks, raw)
    # "# 17. ..." and "Date: ..." are too small to stand alone: they open the Status chunk
    assert chunks[0].heading == "17. Terraform Data Structure > Status"
    assert chunks[0].text.startswith("# 17. Terraform Data Structure") and "Accepted" in chunks[0].text
    assert all(c.token_count >= 8 for c in chunks)
    # a long section at a small budget: several pieces, consecutive ones overlap, none crosses a heading
    text = "# T\n\n## Long\n\n" + "\n\n".join(words(60, k) for k in range(12)) + "\n\n## Next\n\n" + words(50)
    doc, chunks = chunk(text, counter=counter, max_tokens=96, overlap_tokens=16)
    check(doc, chunks, raw, 96)
    long = [c for c in chunks if c.heading == "T > Long"]
    assert len(long) >= 4
    assert any(long[i].end_line >= long[i + 1].start_line for i in range(len(long) - 1))   # overlap
    nxt = [c for c in chunks if c.heading == "T > Next"]
    assert len(nxt) == 1 and nxt[0].start_line > long[-1].end_line                          # no overlap across
    # without overlap, pieces do not share lines
    doc, chunks = chunk(text, counter=counter, max_tokens=96, overlap_tokens=0)
    spans = [(c.start_line, c.end_line) for c in chunks if c.heading == "T > Long"]
    assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))


def test_markdown_front_matter_agents_markers_and_line_endings(counter, raw):
    text = ("---\ntitle: x\ntags: [a, b]\n---\n# Rules\n\n" + words(40) + "\n\n<!-- BEGIN: generated -->\n"
            + words(40, 1) + "\n<!-- END: generated -->\n\n## More\r\n\r\n" + words(30, 2) + "\rlone cr\n")
    doc, chunks = chunk(text, path="AGENTS.md", kind="agents_md", counter=counter)
    check(doc, chunks, raw)
    assert chunks[0].text.startswith("---\ntitle: x")                 # front matter is not a setext heading
    assert not any(c.heading.startswith("title") for c in chunks)
    marker = [c for c in chunks if c.text.startswith("<!-- BEGIN")]
    assert marker and marker[0].heading == "Rules"                     # a marker comment starts a chunk
    assert chunks[-1].heading == "Rules > More" and "lone cr" in chunks[-1].text


def test_markdown_deep_nesting_does_not_crash_or_recurse(counter, raw):
    quotes = ">" * 5000 + " deep\n\n# After\n\n" + words(30)
    lists = "".join("  " * i + "- item\n" for i in range(800)) + "\n# After\n\n" + words(30)
    mixed = "".join("> " * i + "- " * i + "x\n" for i in range(300)) + "\n# After\n\n" + words(30)
    for text in (quotes, lists, mixed):
        started = time.perf_counter()
        doc, chunks = chunk(text, counter=counter)
        assert time.perf_counter() - started < 10
        check(doc, chunks, raw)
        assert chunks[-1].heading == "After"


def test_markdown_parser_failure_falls_back_to_paragraphs(counter, raw, monkeypatch):
    import kb_assets.chunking.markdown as md

    def broken(text):
        raise RecursionError("boom")

    monkeypatch.setattr(md, "block_structure", broken)
    text = "# A\n\n" + "\n\n".join(words(80, k) for k in range(6))
    doc, chunks = chunk(text, counter=counter)
    check(doc, chunks, raw)
    assert len(chunks) >= 2 and all(c.heading == "" for c in chunks)


# ---------------------------------------------------------------------------------------------------- reST
def test_pep_header_and_section_titles(counter, raw):
    doc = SourceDocument(path="peps/pep-0616.rst", kind="doc", title="", text=(FIXTURES / "pep-0616.rst").read_text())
    assert detect_shape(doc) == "rst"
    chunks = chunk_document(doc, max_tokens=MAX, count_tokens=counter)
    check(doc, chunks, raw)
    root = "PEP 616: String methods to remove prefixes and suffixes"
    assert chunks[0].heading == root and chunks[0].text.startswith("PEP: 616") and chunks[0].start_line == 1
    headings = [c.heading for c in chunks]
    assert f"{root} > Abstract" in headings
    assert f"{root} > Motivating examples from the Python standard library > deccheck.py" in headings
    assert f"{root} > Rejected Ideas > Accepting a tuple of affixes" in headings
    assert all(h.startswith(root) for h in headings)
    # title underlines are not part of any chunk text
    assert not any(c.text.startswith("=====") for c in chunks)


def test_rst_overlines_transitions_and_levels(counter, raw):
    text = "\n".join([
        "=========", " Title", "=========", "", words(40), "",
        "Part one", "--------", "", words(40, 1), "", "----------", "", words(40, 2), "",
        "Sub", "~~~", "", words(40, 3), "",
        "Part two", "--------", "", words(40, 4), "",
        "=====  =====", "col1   col2", "=====  =====", "a      b", "=====  =====",
    ])
    doc, chunks = chunk(text, path="guide.rst", counter=counter)
    check(doc, chunks, raw)
    headings = [c.heading for c in chunks]
    assert headings[0] == "Title"
    assert "Title > Part one > Sub" in headings and "Title > Part two" in headings
    assert not any("----------" in h or "col1" in h for h in headings)   # a transition and a table


# ------------------------------------------------------------------------------------- text, CJK, huge lines
def test_empty_and_whitespace_documents_give_no_chunks(counter):
    for text in ("", "   \n\n\t  \n"):
        assert chunk(text, counter=counter)[1] == []
    with pytest.raises(ValueError):
        chunk("x", max_tokens=4)


def test_plain_text_paragraph_packing_and_sentence_splitting(counter, raw):
    long_para = " ".join(f"Sentence number {i} talks about vectors and budgets." for i in range(120))
    text = words(20) + "\n\n" + words(20, 1) + "\n\n" + long_para + "\n\n" + words(20, 2)
    doc, chunks = chunk(text, path="notes.txt", counter=counter, max_tokens=128)
    check(doc, chunks, raw, 128)
    assert chunks[0].text.startswith(words(20)) and words(20, 1) in chunks[0].text   # small paragraphs packed
    inner = [c for c in chunks if "Sentence number" in c.text]
    assert len(inner) >= 5
    assert all(c.text.rstrip().endswith(".") for c in inner[:-1])                    # cut at sentence ends


def test_cjk_without_spaces_splits_within_budget(counter, raw):
    text = "# 标题\n\n" + "这是一个没有空格的中文句子用于测试分块" * 300 + "\n\n" + "日本語の文章。" * 200
    doc, chunks = chunk(text, counter=counter, max_tokens=64)
    check(doc, chunks, raw, 64)
    assert len(chunks) > 50 and all(c.heading == "标题" for c in chunks)
    covered = "".join(c.text for c in chunks)
    assert "日本語の文章。" in covered


@pytest.mark.parametrize("unit", ["word ", "x", "中"])
def test_five_megabyte_single_line(counter, raw, unit):
    text = unit * (5_000_000 // len(unit.encode()))
    started = time.perf_counter()
    doc, chunks = chunk(text, path="big.txt", counter=counter)
    elapsed = time.perf_counter() - started
    assert elapsed < 30, elapsed
    assert all(c.start_line == c.end_line == 1 for c in chunks)
    assert all(len(c.text) <= MAX * 12 for c in chunks)          # even where WordPiece sees one [UNK]
    assert sum(len(c.text) for c in chunks) >= len(text.strip()) * 0.99
    sample = chunks[:: max(1, len(chunks) // 40)]
    real = [len(e.ids) for e in raw.encode_batch([c.embedding_text() for c in sample], add_special_tokens=False)]
    assert [c.token_count for c in sample] == real and max(real) <= MAX


# ------------------------------------------------------------------------------ transcripts, items, sessions
def test_transcript_turns_packed_and_long_turn_split(counter, raw):
    text = "\n\n".join([
        "Session s-1 in /repo",
        "### user (2026-01-01T10:00:00Z)\n\nPlease fix the flaky test.",
        "### assistant (2026-01-01T10:00:05Z)\n\nLooking.\n\n### Plan\n\n1. read the test",
        "### tool: Bash pytest -x\n\n" + "\n".join(f"line {i} of output from the test run" for i in range(300)),
        "### tool result: Bash\n\nexit 0",
        "### user (2026-01-01T10:05:00Z)\n\nthanks",
    ])
    doc, chunks = chunk(text, path="s-1.jsonl", kind="transcript", counter=counter)
    check(doc, chunks, raw)
    assert detect_shape(doc) == "transcript"
    first = chunks[0]
    assert first.heading == "user (2026-01-01T10:00:00Z)"                 # preamble + small turns packed
    assert "Please fix" in first.text and "Looking." in first.text and "### Plan" in first.text
    assert not any(c.heading == "Plan" for c in chunks)                   # markdown inside a turn is no turn
    tool = [c for c in chunks if c.heading == "tool: Bash pytest -x"]
    assert len(tool) >= 3


def test_work_item_fields_and_session_notes(counter, raw):
    item = ("# Crash on empty config\n\nkind: bug · status: open · author: ana\n\n## Body\n\n" + words(120)
            + "\n\n## Comment by bo (2026-01-02)\n\n" + words(120, 1) + "\n\n## Comment by ana (2026-01-03)\n\n"
            + words(120, 2))
    doc, chunks = chunk(item, path="issues.jsonl#42", kind="work_item", counter=counter)
    check(doc, chunks, raw)
    assert [c.heading for c in chunks] == ["Crash on empty config > Body",
                                           "Crash on empty config > Comment by bo (2026-01-02)",
                                           "Crash on empty config > Comment by ana (2026-01-03)"]
    notes = "# Session 2026-01-01\n\n## 10:00\n\nshort\n\n## 10:05\n\nshort too\n\n## 10:30\n\n" + words(300)
    doc, chunks = chunk(notes, path="notes/2026-01-01.md", kind="session", counter=counter)
    check(doc, chunks, raw)
    # the small notes are packed together (then, still tiny, lead into the next section), never alone
    assert "short\n" in chunks[0].text and "short too" in chunks[0].text and len(chunks) >= 2
    assert all(c.heading == "Session 2026-01-01 > 10:30" for c in chunks)


def test_shape_detection():
    def shape(path, kind, text="plain words"):
        return detect_shape(SourceDocument(path=path, kind=kind, title="", text=text))

    assert shape("a/README", "readme", "# Title\n\ntext") == "markdown"
    assert shape("a/README", "readme", "just words") == "text"
    assert shape("x.mdx", "doc") == "markdown" and shape("x.markdown", "memory") == "markdown"
    assert shape("notes.md", "session") == "session"
    assert shape("pep-0008.rst", "doc") == "rst" and shape("pep-0008.txt", "doc") == "text"
    assert shape("src/a.py", "code") == "code" and shape("src/a.unknown", "code") == "code"
    assert shape("t.jsonl", "transcript") == "transcript" and shape("x.json#7", "work_item") == "work_item"


# ------------------------------------------------------------------------------ determinism and edit locality
def test_determinism_and_one_edit_changes_only_its_section(counter, raw):
    text = (FIXTURES / "nats-ADR-13.md").read_text()
    doc = SourceDocument(path="adr/ADR-13.md", kind="adr", title="", text=text)
    a = chunk_document(doc, max_tokens=MAX, count_tokens=counter)
    b = chunk_document(SourceDocument(path="elsewhere/renamed.md", kind="adr", title="other", text=text),
                       max_tokens=MAX, count_tokens=make_token_counter())
    check(doc, a, raw)
    assert [c.chunk_hash for c in a] == [c.chunk_hash for c in b]      # same text → same hashes (even renamed)
    assert len({c.heading for c in a}) >= 8

    target = "There are 3 possible fields"
    lines = text.split("\n")
    i = next(k for k, line in enumerate(lines) if line.startswith(target))
    lines[i] = lines[i].replace("3 possible", "three possible")
    edited = SourceDocument(path="adr/ADR-13.md", kind="adr", title="", text="\n".join(lines))
    c = chunk_document(edited, max_tokens=MAX, count_tokens=counter)
    check(edited, c, raw)
    old, new = {x.chunk_hash for x in a}, {x.chunk_hash for x in c}
    changed = [x for x in c if x.chunk_hash not in old]
    assert changed and len(changed) <= 2
    assert {x.heading for x in changed} == {next(x.heading for x in a if x.start_line <= i + 1 <= x.end_line)}
    assert len(old - new) == len(changed)


# ------------------------------------------------------------------------------------ random structure
ATOMS = ["# H1", "## H2", "### H3", "```", "~~~", "    indented", "- item", "> quote", "---", "===", "<div>",
         "</div>", "<!-- c -->", "", "", "", "Title: x", "PEP: 1", "### user (t)", "### assistant", "def f():",
         "    return 1", "class A:", "\t", "\r", "\x00", "\ud800", "  # c", "1. one", "* star", "....", "\u2028",
         "a\x0bb", "WORDS", "CJK", "BLOB", "EMOJI"]


def _atom(rng, a: str) -> str:
    if a == "WORDS":
        return " ".join(f"w{rng.randrange(10**6)}" for _ in range(rng.randint(5, 200)))
    if a == "CJK":
        return "".join(chr(0x4E00 + rng.randrange(20000)) + ("。" if k % 7 == 6 else "") for k in range(rng.randint(5, 400)))
    if a == "BLOB":
        return "".join(chr(97 + rng.randrange(26)) for _ in range(rng.randint(50, 3000)))
    if a == "EMOJI":
        return "".join(chr(0x1F600 + rng.randrange(70)) for _ in range(rng.randint(5, 80)))
    return a


def test_random_structures_keep_invariants_and_lose_nothing(counter, raw, monkeypatch):
    import random

    import kb_assets.chunking.core as core

    seen = {}
    real_run = core.Engine.run

    def spy(self, sections, **kw):
        seen["engine"], seen["heads"] = self, [s.head for s in sections if s.head]
        return real_run(self, sections, **kw)

    monkeypatch.setattr(core.Engine, "run", spy)
    rng = random.Random(2026)
    paths = [("a.md", "doc"), ("a.rst", "doc"), ("a.txt", "doc"), ("a.py", "code"), ("a.ts", "code"),
             ("a.go", "code"), ("a.xyz", "code"), ("t.jsonl", "transcript"), ("w.json#1", "work_item"),
             ("s.md", "session"), ("AGENTS.md", "agents_md")]
    for _ in range(250):
        text = "\n".join(_atom(rng, rng.choice(ATOMS)) for _ in range(rng.randint(0, 50)))
        path, kind = rng.choice(paths)
        budget = rng.choice([16, 40, 254])
        seen.clear()
        doc, chunks = chunk(text, path=path, kind=kind, counter=counter, max_tokens=budget,
                            overlap_tokens=rng.choice([0, 32]))
        if not text.strip():
            assert chunks == []
            continue
        if "\ud800" not in text:                     # the raw tokenizer cannot take a lone surrogate
            check(doc, chunks, raw, budget)
        else:
            assert all(c.token_count <= budget for c in chunks)
        covered = bytearray(len(text))
        for s, e in seen["engine"].spans:
            covered[s:e] = b"\1" * (e - s)
        for s, e in seen["heads"]:
            covered[s:e] = b"\1" * (e - s)           # heading lines: carried by Chunk.heading
        lost = [k for k, ch in enumerate(text) if not covered[k] and not ch.isspace()
                and ch not in "\x00\x0b\x1c\x1d\x1e\x1f\x85\u2028"]
        assert not lost, (path, kind, text[lost[0]:lost[0] + 40])


@pytest.mark.parametrize("front, valid", [
    ("---\ntitle: x\ntags: [a, b]\n---\n", True),
    ("---\ntitle: x\n...\n", True),                                   # YAML's document end closes it too
    ("---\ntitle: [unclosed\nstatus: done: twice\n---\n", False),     # bad YAML: still the block, kept apart
    ("---  \r\ntitle: y\r\n---\r\n", True),
])
def test_front_matter_block_is_the_readers(counter, front, valid):
    """The chunker's front-matter block ends exactly where the readers' one front-matter parser says (valid YAML
    or not): the first chunk is the block and nothing after it, and the next chunk starts on the following line."""
    from kb_assets.sources.textutil import front_matter_end, split_front_matter

    text = front + "# Body\n\n" + words(60) + "\n"
    meta, body, error = split_front_matter(text)
    assert (error is None) == valid and (meta.get("title") is not None) == valid
    assert body.startswith("# Body") if valid else body == text
    end = front_matter_end(text)
    assert text[:end] == front
    _doc, chunks = chunk(text, path="notes.md", kind="doc", max_tokens=40, counter=counter)
    block = front.count("\n")
    assert (chunks[0].heading, chunks[0].start_line, chunks[0].end_line) == ("", 1, block)
    assert chunks[0].text.replace("\r", "").rstrip() == front.replace("\r", "").rstrip()
    assert chunks[1].heading == "Body" and chunks[1].start_line == block + 3     # '# Body', blank, the words


def test_no_front_matter_without_a_closing_line(counter):
    from kb_assets.sources.textutil import front_matter_end, split_front_matter

    text = "---\ntitle: x\n\n# Body\n\n" + words(60) + "\n"
    assert front_matter_end(text) == 0 and split_front_matter(text) == ({}, text, None)
    _doc, chunks = chunk(text, path="notes.md", kind="doc", max_tokens=40, counter=counter)
    assert (chunks[0].start_line, chunks[0].end_line) == (1, 2)      # a rule and a paragraph, not a block
    assert chunks[1].heading == "Body"
