"""bench/quality.py's vector seed: refused exactly when document vectors could differ.

The harness seeds a new build of a set with the previous build's chunk vectors (chunk hash -> vector). That
is only right while the vectors a chunk would get are unchanged: same model files, same document-side
embedding path. A query-side change (the numpy query encoder) or a chunking/pipeline change must not refuse
it, or every re-build after such a change pays for a full re-embedding.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quality():
    spec = importlib.util.spec_from_file_location("kb_bench_quality", REPO / "bench" / "quality.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kb_bench_quality"] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("kb_bench_quality", None)


@pytest.fixture(scope="module")
def cfg():
    from kb_assets.config import LocalEmbedderSettings

    class Cfg:
        local = LocalEmbedderSettings()
    return Cfg()


def test_identity_names_the_model_and_is_stable(quality, cfg):
    a, b = quality.document_vector_identity(cfg), quality.document_vector_identity(cfg)
    assert a == b
    assert a["model"] == "all-MiniLM-L6-v2" and a["dimension"] == 384 and len(a["weights_sha256"]) == 64


def test_document_side_change_refuses_the_seed(quality, cfg, monkeypatch):
    import kb_assets.pipeline.embeddings as stage

    before = quality.document_vector_identity(cfg)

    def _texts(rows):   # another model input text: the heading no longer embedded with the chunk
        return [text for _, _heading, text in rows]

    monkeypatch.setattr(stage, "_texts", _texts)
    after = quality.document_vector_identity(cfg)
    assert after["document_code_sha256"] != before["document_code_sha256"]


def test_query_side_and_chunking_changes_keep_the_seed(quality, cfg, monkeypatch):
    import kb_assets.chunking as chunking
    import kb_assets.embedding.local as local
    import kb_assets.embedding.numpy_bert as numpy_bert

    before = quality.document_vector_identity(cfg)

    def encoder_for(path):      # a rewritten query encoder
        raise AssertionError("not called")

    def embed_query(self, text):
        return [0.0] * self.dimension

    def chunk_document(doc, *a, **k):   # a rewritten chunker
        return []

    monkeypatch.setattr(numpy_bert, "encoder_for", encoder_for)
    monkeypatch.setattr(local.LocalEmbedder, "embed_query", embed_query)
    monkeypatch.setattr(chunking, "chunk_document", chunk_document)
    assert quality.document_vector_identity(cfg) == before
