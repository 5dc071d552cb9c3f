"""How much a batch of documents is padded, and what it costs the local model, by the order texts are batched in.

    .venv/bin/python bench/batch_order_probe.py --database-url URL [--n 1000] [--call 250] [--texts more.json]

sentence-transformers orders a call's texts by characters and pads each batch to its longest text in word pieces;
kb cuts batches in word-piece order, each its own encode() call (LocalEmbedder._encode_in_length_order). Samples:
`--n` random chunks of a kb database (`heading\\ntext`, as kb embeds them) and, with `--texts`, a JSON list of
other texts (e.g. another system's chunks of the same corpus). For each sample it prints the padded word pieces
against the texts' own (character order, word-piece order; batches of 16 and 32) and the model's time per text
in calls of `--call` texts: one plain encode() call, and kb's embed_documents with the chunk table's counts.
docs/BENCHMARKS.md, "Batches in word-piece order".
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb_assets.config import LocalEmbedderSettings  # noqa: E402
from kb_assets.embedding.local import LocalEmbedder, load_model  # noqa: E402


def kb_sample(url: str, n: int, seed: int) -> list[str]:
    from kb_assets.store.db import connect

    with connect(url) as conn:
        rows = conn.execute("SELECT heading, text FROM chunks ORDER BY chunk_hash").fetchall()
    random.Random(seed).shuffle(rows)
    return [f"{h}\n{t}" if h else t for h, t in rows[:n]]


def padded(counts: list[int], order: list[int], batch: int, window: int) -> int:
    return sum(max(min(counts[i], window) for i in order[s:s + batch]) * len(order[s:s + batch])
               for s in range(0, len(order), batch))


def padding_ratios(texts: list[str], counts: list[int], call: int, window: int) -> dict[str, float]:
    own = sum(min(c, window) for c in counts)
    out = {}
    for batch in (32, 16):
        by_chars = by_pieces = 0
        for s in range(0, len(texts), call):
            idx = list(range(s, min(s + call, len(texts))))
            by_chars += padded(counts, sorted(idx, key=lambda i: -len(texts[i])), batch, window)
            by_pieces += padded(counts, sorted(idx, key=lambda i: -counts[i]), batch, window)
        out[f"characters, batches of {batch}"] = by_chars / own
        out[f"word pieces, batches of {batch}"] = by_pieces / own
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--database-url", required=True, help="a kb database whose chunks are sampled")
    ap.add_argument("--texts", help="a JSON list of other texts to measure beside kb's")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--call", type=int, default=250, help="texts per embed call (the embedding stage's half batch)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    samples = {"kb chunks": kb_sample(args.database_url, args.n, args.seed)}
    if args.texts:
        other = json.loads(Path(args.texts).read_text(encoding="utf-8"))
        random.Random(args.seed).shuffle(other)
        samples[Path(args.texts).stem] = other[:args.n]
    embedders = {b: LocalEmbedder(LocalEmbedderSettings(batch_size=b)) for b in (32, 16)}
    window = embedders[32].max_tokens
    model = load_model(embedders[32].path)
    for name, texts in samples.items():
        counts = embedders[32].count_tokens(texts)
        print(f"{name}: {len(texts)} texts, {sum(min(c, window) for c in counts) / len(texts):.1f} word pieces each")
        for k, v in padding_ratios(texts, counts, args.call, window).items():
            print(f"  padded / own word pieces, {k}: {v:.3f}")
        model.encode(texts[:32])     # warm
        runs = {"one encode() call per call (the library's order, batches of 32)":
                lambda: [model.encode(texts[s:s + args.call], batch_size=32, normalize_embeddings=True)
                         for s in range(0, len(texts), args.call)]}
        for b, emb in embedders.items():
            runs[f"embed_documents, word-piece order, batches of {b}"] = \
                lambda emb=emb: [emb.embed_documents(texts[s:s + args.call], counts[s:s + args.call])
                                 for s in range(0, len(texts), args.call)]
        for r in range(args.rounds):
            for label, run in runs.items():
                t = time.perf_counter()
                run()
                print(f"  round {r + 1}: {label}: {(time.perf_counter() - t) / len(texts) * 1000:.1f} ms per text",
                      flush=True)


if __name__ == "__main__":
    main()
