"""Throughput of LocalEmbedder.embed_documents vs raw SentenceTransformer.encode on the same texts.

    /work/venv/bin/python bench/embedder_throughput.py [--n 256] [--rounds 3] [--corpus PATH.tar.gz]

Texts are full windows (max_tokens word pieces, i.e. what the chunker produces at its limit) cut from the
PEPs corpus. Both paths share one loaded model; rounds alternate which goes first; medians are reported.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb_assets.embedding import LocalEmbedder  # noqa: E402
from kb_assets.embedding.local import load_model  # noqa: E402

DEFAULT_CORPUS = str(Path(__file__).resolve().parents[1].parent / "shared" / "corpora" / "python-peps-ba4deeb79695.tar.gz")


def full_windows(corpus: str, emb: LocalEmbedder, n: int) -> list[str]:
    tok = emb.tokenizer
    out: list[str] = []
    with tarfile.open(corpus) as tf:
        for m in tf:
            if not (m.isfile() and m.name.endswith(".rst")):
                continue
            text = tf.extractfile(m).read().decode("utf-8", "replace")
            enc = tok.encode(text, add_special_tokens=False)
            w = emb.max_tokens
            for i in range(0, len(enc.offsets) - w + 1, w):
                piece = text[enc.offsets[i][0]:enc.offsets[i + w - 1][1]]
                if emb.count_tokens([piece])[0] <= w:
                    out.append(piece)
                if len(out) >= n:
                    return out
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    args = ap.parse_args()

    emb = LocalEmbedder()
    texts = full_windows(args.corpus, emb, args.n)
    counts = emb.count_tokens(texts)
    print(f"{len(texts)} texts, word pieces per text: mean {statistics.mean(counts):.0f}, "
          f"min {min(counts)}, max {max(counts)} (window {emb.max_tokens})")

    t0 = time.perf_counter()
    model = load_model(emb.path)
    print(f"model load: {time.perf_counter() - t0:.1f} s")
    import torch
    print(f"torch threads: {torch.get_num_threads()}, batch_size: {emb.batch_size}")
    model.encode(texts[:32], batch_size=emb.batch_size, show_progress_bar=False)   # warm-up

    def raw():
        return model.encode(texts, batch_size=emb.batch_size, show_progress_bar=False, convert_to_numpy=True)

    def ours():
        return emb.embed_documents(texts).vectors

    rates: dict[str, list[float]] = {"raw": [], "ours": []}
    results = {}
    for r in range(args.rounds):
        order = [("raw", raw), ("ours", ours)] if r % 2 == 0 else [("ours", ours), ("raw", raw)]
        for name, fn in order:
            t = time.perf_counter()
            results[name] = fn()
            dt = time.perf_counter() - t
            rates[name].append(len(texts) / dt)
            print(f"round {r + 1} {name:4s}: {len(texts) / dt:6.1f} texts/s ({dt:.2f} s)", flush=True)
    diff = float(abs(results["raw"] - results["ours"]).max())
    raw_rate, our_rate = statistics.median(rates["raw"]), statistics.median(rates["ours"])
    print(f"raw SentenceTransformer.encode: {raw_rate:.1f} chunks/s (median of {args.rounds})")
    print(f"LocalEmbedder.embed_documents : {our_rate:.1f} chunks/s (median of {args.rounds})")
    print(f"ratio ours/raw: {our_rate / raw_rate:.3f}   max |vector difference|: {diff:.2e}")


if __name__ == "__main__":
    main()
