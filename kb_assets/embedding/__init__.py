"""Embedders: a protocol, the local model (default, offline), Voyage, and a fixed-cost benchmark stand-in.

Importing this package loads neither torch, sentence-transformers nor voyageai; constructing an embedder
loads no model and opens no connection. The model loads (once per process) on the first embed call.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from kb_assets.embedding.base import (
    EmbeddingAuthError, EmbeddingError, EmbedResult, Embedder,
)
from kb_assets.embedding.fixed import FIXED_COST_MODEL, FixedCostEmbedder
from kb_assets.embedding.local import DEFAULT_LOCAL_MODEL, LocalEmbedder
from kb_assets.embedding.voyage import VoyageEmbedder, estimate_tokens, parse_retry_after

STANDIN_ENV = "KB_STANDIN_EMBEDDER"
STANDIN_LOG_ENV = "KB_STANDIN_LOG"     # the stand-in appends "pid texts" per call here

if TYPE_CHECKING:
    from kb_assets.config import KbConfig

__all__ = [
    "Embedder", "EmbedResult", "EmbeddingError", "EmbeddingAuthError",
    "LocalEmbedder", "VoyageEmbedder", "FixedCostEmbedder", "make_embedder",
    "DEFAULT_LOCAL_MODEL", "FIXED_COST_MODEL", "estimate_tokens", "parse_retry_after",
]


def make_embedder(cfg: "KbConfig") -> Embedder:
    """The embedder the config selects (lazy: no model load, no connection until the first embed call).

    $KB_STANDIN_EMBEDDER=<seconds per text> swaps in the fixed-cost stand-in (benchmarks, fault-injection
    tests of the real `kb index` process: no model, deterministic vectors, a cost to interrupt)."""
    import os

    standin = os.environ.get(STANDIN_ENV)
    if standin:
        return FixedCostEmbedder(float(standin), settings=cfg.local, call_log=os.environ.get(STANDIN_LOG_ENV))
    if cfg.embedder == "local":
        return LocalEmbedder(cfg.local)
    if cfg.embedder == "voyage":
        return VoyageEmbedder(cfg.voyage)
    raise EmbeddingError(f"unknown embedder {cfg.embedder!r} — use 'local' or 'voyage'")
