"""The Embedder protocol, its result type and errors (no heavy imports here)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np   # numpy is imported where vectors are handled: a pass with none (a delete, a rename) skips it


def cache_dir() -> Path:
    """The machine's KB cache folder, for files derived from a model (its ONNX graph, its tokenizer's piece
    counts): $KB_CACHE_DIR, else $XDG_CACHE_HOME/kb, else ~/.cache/kb. Safe to delete."""
    if os.environ.get("KB_CACHE_DIR"):
        return Path(os.environ["KB_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kb"


class EmbeddingError(Exception):
    """An embedding call failed for a reason a person can read (the message says what and what to do)."""


class EmbeddingAuthError(EmbeddingError):
    """The provider rejected the credentials; retrying cannot help."""


@dataclass
class EmbedResult:
    """Vectors in input order, float32, shape (n, dimension); `tokens` as billed / seen by the model."""

    vectors: np.ndarray
    tokens: int

    def __len__(self) -> int:
        return len(self.vectors)


@runtime_checkable
class Embedder(Protocol):
    model: str          # e.g. "all-MiniLM-L6-v2" or "voyage-3.5": with `dimension`, names the vector space
    dimension: int
    max_tokens: int     # chunks (as counted by count_tokens) must not exceed this

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Cheap per-text token counts (never loads a model or opens a connection)."""
        ...

    def embed_documents(self, texts: list[str], token_counts: list[int] | None = None) -> EmbedResult:
        """Vectors for `texts`, in order. `token_counts`: count_tokens(texts), when the caller has them already
        (the chunk table keeps each chunk's): the embedder need not count again."""
        ...

    def embed_query(self, text: str) -> list[float]:
        ...


def empty_result(dimension: int) -> EmbedResult:
    import numpy as np
    return EmbedResult(np.zeros((0, dimension), dtype=np.float32), 0)


def as_matrix(vectors, n: int, dimension: int, who: str) -> np.ndarray:
    """Coerce provider output to float32 (n, dimension), or raise EmbeddingError naming the mismatch."""
    import numpy as np
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim != 2 or arr.shape != (n, dimension):
        raise EmbeddingError(
            f"{who} returned vectors of shape {tuple(arr.shape)}, expected ({n}, {dimension}) — "
            "check the model and dimension settings")
    return arr
