"""A benchmark stand-in: the local embedder's interface and chunk window, a fixed cost per text, no model."""
from __future__ import annotations

import hashlib
import os
import time
from typing import TYPE_CHECKING, Callable

from kb_assets.embedding.base import EmbedResult, empty_result

if TYPE_CHECKING:
    import numpy as np   # numpy is imported where vectors are handled: a pass with none (a delete, a rename) skips it

FIXED_COST_MODEL = "fixed-cost-standin"


class FixedCostEmbedder:
    """Deterministic pseudo-random unit vectors seeded by the text's SHA-256; sleeps `cost_per_text` per text.

    Token counting and `max_tokens` are the local model's (its tokenizer.json, no torch), so a pipeline run
    with the stand-in produces the same chunks as one with the real model: only the embedding cost differs.
    """

    model = FIXED_COST_MODEL

    def __init__(self, cost_per_text: float = 0.002, *, dimension: int = 384, settings=None,
                 sleep: Callable[[float], None] = time.sleep, call_log: str | None = None):
        from kb_assets.embedding.local import LocalEmbedder

        self.dimension = dimension
        self.cost_per_text = float(cost_per_text)
        self.sleep = sleep
        self._counter = LocalEmbedder(settings)    # tokenizer only; its model is never loaded from here
        self.texts_embedded = 0
        # one line "pid texts" appended per call as it starts (what a paid API bills): the fault harness counts
        # the work a killed run and its re-run did between them
        self.call_log = call_log

    def __repr__(self) -> str:
        return f"FixedCostEmbedder(cost_per_text={self.cost_per_text}, dimension={self.dimension})"

    @property
    def max_tokens(self) -> int:
        return self._counter.max_tokens

    def count_tokens(self, texts: list[str]) -> list[int]:
        return self._counter.count_tokens(texts)

    def vector(self, text: str) -> np.ndarray:
        import numpy as np
        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(self.dimension).astype(np.float32)
        return v / np.linalg.norm(v)

    def embed_documents(self, texts: list[str], token_counts: list[int] | None = None) -> EmbedResult:
        import numpy as np
        texts = list(texts)
        if not texts:
            return empty_result(self.dimension)
        if self.call_log:
            fd = os.open(self.call_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{os.getpid()} {len(texts)}\n".encode())
            finally:
                os.close(fd)
        started = time.perf_counter()
        out = np.stack([self.vector(t) for t in texts])
        tokens = sum(token_counts if token_counts is not None else self.count_tokens(texts))
        self._pay(len(texts), started)
        self.texts_embedded += len(texts)
        return EmbedResult(out, tokens)

    def embed_query(self, text: str) -> list[float]:
        started = time.perf_counter()
        v = self.vector(text)
        self._pay(1, started)
        return v.tolist()

    def _pay(self, n: int, started: float) -> None:
        # The cost is wall time per call: n texts cost n * cost_per_text, including our own hashing time.
        remaining = n * self.cost_per_text - (time.perf_counter() - started)
        if remaining > 0:
            self.sleep(remaining)
