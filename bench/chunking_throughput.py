"""Chunking throughput on a synthetic corpus (no test, no database): python bench/chunking_throughput.py

Builds N deterministic markdown documents (sections, paragraphs, lists, fenced code with '#' lines),
chunks them with the bundled all-MiniLM-L6-v2 token counter (cold: a fresh counter, every word new;
then warm: the same counter again) and with the offline estimate, and prints chunks per second.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

from kb_assets.chunking import chunk_document, estimate_tokens, make_token_counter
from kb_assets.models import SourceDocument

_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "ven", "dar", "qui", "sel", "tor", "ban", "ex",
              "ing", "al", "con", "pre", "ment", "ist", "ure", "ob", "ly", "ra", "tic", "ous", "ive", "per", "um"]
_COMMON = ("the of and to in is that for it as with was on be by this are or from at an which have not has "
           "but were can all their will one would there been if more when so what about into out than them "
           "index chunk document source model vector query token cache schema table decision because").split()


def _vocabulary(rng: random.Random, size: int) -> list[str]:
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4))))
    return _COMMON + sorted(words)


def _sentence(rng: random.Random, vocab: list[str], weights: list[float]) -> str:
    words = rng.choices(vocab, weights, k=rng.randint(6, 24))
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", ".", "?", "!"])


def synthetic_markdown(n_docs: int, seed: int = 7) -> list[SourceDocument]:
    rng = random.Random(seed)
    vocab = _vocabulary(rng, 6000)
    weights = [1.0 / (i + 1) ** 0.9 for i in range(len(vocab))]
    docs = []
    for d in range(n_docs):
        out = [f"# {_sentence(rng, vocab, weights)[:-1]}", "", "Status: accepted", ""]
        for s in range(rng.randint(4, 9)):
            out += [f"## {' '.join(rng.choices(vocab, weights, k=rng.randint(1, 4))).title()}", ""]
            for p in range(rng.randint(1, 4)):
                r = rng.random()
                if r < 0.12:
                    out += ["```python", "# a comment that is not a heading"]
                    out += [f"def {rng.choice(vocab)}_{i}(x):\n    return x + {i}" for i in range(rng.randint(1, 6))]
                    out += ["```", ""]
                elif r < 0.25:
                    out += [f"- {_sentence(rng, vocab, weights)}" for _ in range(rng.randint(2, 6))] + [""]
                else:
                    out += [" ".join(_sentence(rng, vocab, weights) for _ in range(rng.randint(2, 9))), ""]
            if rng.random() < 0.3:
                out += [f"### {rng.choice(vocab).title()}", "", _sentence(rng, vocab, weights), ""]
        docs.append(SourceDocument(path=f"docs/adr/{d:04d}-synthetic.md", kind="adr", title="",
                                   text="\n".join(out)))
    return docs


def pipeline_corpus(n_docs: int, seed: int = 7) -> list[SourceDocument] | None:
    """The pipeline benchmark's corpus (bench/synth_corpus.py in a checkout: 70% markdown, 30% code), if present."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent / "synth_corpus.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("_kb_synth_corpus", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = mod  # type: ignore[union-attr]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    vocab = mod.build_vocab(seed)
    docs = []
    for i in range(n_docs):
        rel, text = mod.document(i, seed, vocab, mod.DEFAULT_SIZE)
        kind = "doc" if rel.endswith(".md") else "code"
        docs.append(SourceDocument(path=rel, kind=kind, title="", text=text))
    return docs


def run(docs: list[SourceDocument], max_tokens: int, counter) -> tuple[int, float]:
    started = time.perf_counter()
    n = 0
    for doc in docs:
        n += len(chunk_document(doc, max_tokens=max_tokens, count_tokens=counter))
    return n, time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=254)
    ap.add_argument("--no-pipeline-corpus", action="store_true", help="skip bench/synth_corpus.py")
    args = ap.parse_args(argv)
    corpora = [("synthetic markdown (this module)", synthetic_markdown(args.docs))]
    pipeline = None if args.no_pipeline_corpus else pipeline_corpus(args.docs)
    if pipeline is not None:
        corpora.insert(0, ("bench/synth_corpus.py (md + py/ts/go)", pipeline))
    for name, docs in corpora:
        mb = sum(len(d.text) for d in docs) / 1e6
        print(f"{name}: {len(docs)} documents, {mb:.1f} MB")
        counter = make_token_counter()
        for label, fn in (("MiniLM counter, cold", counter), ("MiniLM counter, warm", counter),
                          ("estimate_tokens", estimate_tokens)):
            n, secs = run(docs, args.max_tokens, fn)
            print(f"  {label:22s} {n:7d} chunks  {secs:6.2f} s  {n / secs:8.0f} chunks/s  {mb / secs:5.1f} MB/s")


if __name__ == "__main__":
    main()
