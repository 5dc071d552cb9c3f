"""The local embedder with the real all-MiniLM-L6-v2 (bundled, offline) on tiny inputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kb_assets.config import KbConfig, LocalEmbedderSettings
from kb_assets.embedding import EmbeddingError, LocalEmbedder, make_embedder
from kb_assets.embedding import local as local_mod


@pytest.fixture(scope="module")
def emb() -> LocalEmbedder:
    return LocalEmbedder()


def _cos(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_similar_sentences_are_closer_than_unrelated(emb):
    texts = [
        "We store vectors in PostgreSQL with the pgvector extension.",
        "Embeddings are kept in Postgres using pgvector.",
        "The recipe needs two eggs, flour and a pinch of salt.",
    ]
    res = emb.embed_documents(texts)
    v = res.vectors
    assert v.shape == (3, 384) and v.dtype == np.float32 and emb.dimension == 384
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert _cos(v[0], v[1]) > 0.6 > _cos(v[0], v[2]) + 0.3
    q = emb.embed_query("where are the embeddings stored?")
    assert len(q) == 384
    assert _cos(q, v[1]) > _cos(q, v[2]) and _cos(q, v[0]) > _cos(q, v[2])
    # no query prompt for this model: a query vector equals the document vector of the same text
    np.testing.assert_allclose(emb.embed_query(texts[2]), v[2], atol=1e-5)
    # tokens: word pieces plus [CLS]/[SEP] per text
    assert res.tokens == sum(emb.count_tokens(texts)) + 2 * len(texts)


def test_count_tokens_matches_the_models_tokenizer(emb):
    texts = ["hello world", "Ünïcödé, emoji 😀 and CJK 漢字", "def f(x):\n    return x ** 2  # square",
             "", "a" * 300, "word " * 400]
    counts = emb.count_tokens(texts)
    model = local_mod.load_model(emb.path)
    expected = [len(model.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    assert counts == expected
    assert counts[-1] == 400                       # no truncation at the tokenizer file's 128
    assert emb.max_tokens == 254 and emb.window == 256


def test_a_chunk_of_max_tokens_is_seen_whole_and_beyond_it_is_cut(emb):
    words = "river mountain forest ocean desert valley island canyon".split()
    text = " ".join(words[i % len(words)] for i in range(emb.max_tokens))
    assert emb.count_tokens([text]) == [emb.max_tokens]
    shorter = text.rsplit(" ", 3)[0]
    longer = text + " volcano glacier meadow tundra" * 5
    v = emb.embed_documents([text, shorter, longer]).vectors
    assert not np.allclose(v[0], v[1], atol=1e-4)   # the last words of a max_tokens chunk count
    np.testing.assert_allclose(v[0], v[2], atol=1e-5)  # words beyond the window are truncated away


def test_model_is_loaded_once_per_process(emb):
    emb.embed_query("warm")
    other = make_embedder(KbConfig())
    assert other.loaded
    assert local_mod.load_model(other.path) is local_mod.load_model(emb.path)
    assert list(local_mod._MODEL_CACHE) == [str(emb.path)]
    assert emb.embed_documents([]).vectors.shape == (0, 384)


def test_batch_size_setting_used(emb, monkeypatch):
    seen = {}
    model = local_mod.load_model(emb.path)
    real = model.encode

    def spy(*a, **k):
        seen.update(k)
        return real(*a, **k)

    monkeypatch.setattr(model, "encode", spy)
    LocalEmbedder(LocalEmbedderSettings(batch_size=7)).embed_documents(["a", "b"])
    assert seen["batch_size"] == 7 and seen["normalize_embeddings"] is True


def test_document_batches_reach_the_model_in_word_piece_order(emb, monkeypatch):
    """sentence-transformers pads a batch to its longest text and orders a call by characters: texts with few
    characters per word piece (numbers, code) then pad a batch of prose. Each batch is its own call, in word-piece
    order; the vectors are those of one plain encode() call."""
    prose = ["The deployment guide explains how the queue retries work after a failure of the worker. " * k
             for k in range(1, 9)]
    dense = ["0x1f 0x2e 0x3d 0x4c 0x5b 3.14159 2.71828 " * k for k in range(1, 9)]   # ~4x the pieces per char
    texts = [t for pair in zip(prose * 5, dense * 5) for t in pair][:70]
    model = local_mod.load_model(emb.path)
    reference = model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
    calls = []
    real = model.encode

    def spy(sentences, *a, **k):
        calls.append(list(sentences))
        return real(sentences, *a, **k)

    monkeypatch.setattr(model, "encode", spy)
    counts = emb.count_tokens(texts)
    batched = LocalEmbedder(LocalEmbedderSettings(batch_size=16))
    monkeypatch.setattr(batched, "count_tokens", lambda _: pytest.fail("the counts were given: no counting"))
    res = batched.embed_documents(texts, counts)
    np.testing.assert_allclose(res.vectors, reference, atol=1e-5)
    assert res.tokens == sum(min(n + 2, 256) for n in counts)
    assert [len(c) for c in calls] == [16, 16, 16, 16, 6]
    window = emb.max_tokens
    seen = [min(counts[texts.index(t)], window) for call in calls for t in call]
    assert seen == sorted(seen, reverse=True)
    # the padding this saves, on these texts: each call pads to its longest
    padded = sum(max(min(counts[texts.index(t)], window) for t in call) * len(call) for call in calls)
    by_chars = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    padded_by_chars = sum(max(min(counts[i], window) for i in by_chars[s:s + 16]) * len(by_chars[s:s + 16])
                          for s in range(0, len(texts), 16))
    assert padded < 0.8 * padded_by_chars, (padded, padded_by_chars)


def test_unknown_local_model_is_a_clear_error(tmp_path):
    with pytest.raises(EmbeddingError, match="neither 'all-MiniLM-L6-v2' nor a folder"):
        LocalEmbedder(LocalEmbedderSettings(model="bge-small-en"))
    with pytest.raises(EmbeddingError, match="no tokenizer.json"):
        LocalEmbedder(LocalEmbedderSettings(model=str(tmp_path)))


def test_lazy_imports_and_offline_load_in_a_fresh_process(tmp_path):
    """Import/construct/count_tokens load neither torch nor sentence-transformers nor voyageai; the first
    embed loads the model from the package with an empty HF cache and the hub switched off."""
    script = textwrap.dedent("""
        import json, os, sys
        heavy = ("torch", "sentence_transformers", "transformers", "voyageai")
        out = {}
        import kb_assets.embedding as E
        from kb_assets.config import KbConfig
        out["after_import"] = [m for m in heavy if m in sys.modules]
        e = E.make_embedder(KbConfig())
        v = E.make_embedder(KbConfig(embedder="voyage"))
        f = E.FixedCostEmbedder(0.0)
        out["counts"] = e.count_tokens(["hello world", "pgvector"]) + v.count_tokens(["x"]) + f.count_tokens(["hello world"])
        f.embed_documents(["a", "b"])
        out["max_tokens"] = e.max_tokens
        out["after_count"] = [m for m in heavy if m in sys.modules]
        vec = e.embed_query("hello world")
        out["dim"] = len(vec)
        out["after_query"] = [m for m in heavy if m in sys.modules]   # the numpy query encoder: no torch
        small = e.embed_documents(["hello world"]).vectors        # a small job: the numpy encoder
        out["after_small_embed"] = [m for m in heavy if m in sys.modules]
        from kb_assets.embedding.local import SMALL_JOB_TEXTS
        big = e.embed_documents(["hello world"] * (SMALL_JOB_TEXTS + 1)).vectors   # a large job: onnxruntime
        out["after_big_embed"] = [m for m in heavy if m in sys.modules]
        os.environ["KB_DOCUMENT_ENCODER"] = "torch"
        on_torch = e.embed_documents(["hello world"]).vectors
        out["after_embed"] = [m for m in heavy if m in sys.modules]
        out["small_vs_torch_cosine"] = float((small[0] * on_torch[0]).sum())
        out["big_vs_torch_cosine"] = float((big[0] * on_torch[0]).sum())
        out["offline"] = [os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE")]
        import torch
        out["threads"] = torch.get_num_threads()
        out["hf_cache"] = os.listdir(os.environ["HF_HOME"])
        print(json.dumps(out))
    """)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "TRANSFORMERS_", "VOYAGE_")) and k != "KB_DOCUMENT_ENCODER"}
    env["HF_HOME"] = str(tmp_path / "hf")
    (tmp_path / "hf").mkdir()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["after_import"] == [] and out["after_count"] == []
    assert out["counts"][:2] == [2, 3] and out["max_tokens"] == 254
    assert out["dim"] == 384 and out["after_query"] == []
    assert out["after_small_embed"] == [] and out["after_big_embed"] == []
    assert "torch" in out["after_embed"] and "sentence_transformers" in out["after_embed"]
    assert out["small_vs_torch_cosine"] >= 0.9999     # same weights, same vector
    assert out["big_vs_torch_cosine"] >= 0.9999
    assert "voyageai" not in out["after_embed"]
    assert out["offline"] == ["1", "1"]
    assert 1 <= out["threads"] <= (len(os.sched_getaffinity(0)))
    assert out["hf_cache"] == []          # nothing was downloaded or cached


def test_warm_up_readies_the_encoder_in_a_thread_once(monkeypatch):
    """A first load's warm-up creates the onnxruntime session without importing torch; with
    KB_DOCUMENT_ENCODER=torch it loads sentence-transformers' model instead. One warm-up at a time."""
    from kb_assets.embedding import numpy_bert

    monkeypatch.setattr(local_mod, "_MODEL_CACHE", {})
    monkeypatch.setattr(numpy_bert, "_CACHE", {})
    monkeypatch.delenv(local_mod.DOCUMENT_ENCODER_ENV, raising=False)
    e = LocalEmbedder()
    thread = e.warm_up()
    assert thread is not None and thread.name == "kb-model-warm-up"
    assert e.warm_up() is None or not thread.is_alive()   # one warm-up at a time
    thread.join(timeout=300)
    assert not e.loaded and (str(e.path.resolve()), "onnx-documents") in numpy_bert._CACHE
    assert e.document_encoder(local_mod.SMALL_JOB_TEXTS + 1) == "numpy"

    monkeypatch.setenv(local_mod.DOCUMENT_ENCODER_ENV, "torch")
    thread = e.warm_up()
    assert thread is not None
    thread.join(timeout=300)
    assert e.loaded and e.warm_up() is None               # loaded: nothing to do
    monkeypatch.delenv(local_mod.DOCUMENT_ENCODER_ENV)
    assert e.document_encoder(3) == "torch"               # and the embed calls use it


def test_a_first_loads_warm_up_builds_the_graph_in_a_child_process(monkeypatch, tmp_path):
    """On a new machine the document encoder's onnxruntime graph is built once, by a child process of the first
    load's warm-up — never in the indexing process (the build peaks ~250 MB above its process) — and the warm-up
    then opens the session on the cached file. Nothing is built once it is cached, or when every document job runs
    on torch."""
    from kb_assets.embedding import numpy_bert

    real = numpy_bert.cached_onnx_model
    built_here = []

    def only_cached(path):
        if numpy_bert.onnx_graph_cached(path) is not True:
            built_here.append(path)
        return real(path)

    monkeypatch.setattr(numpy_bert, "cached_onnx_model", only_cached)
    monkeypatch.setattr(local_mod, "load_model", lambda path: None)
    for folder, forced in ((tmp_path / "default", None), (tmp_path / "torch", "torch")):
        monkeypatch.setenv("KB_CACHE_DIR", str(folder))
        if forced:
            monkeypatch.setenv(local_mod.DOCUMENT_ENCODER_ENV, forced)
        else:
            monkeypatch.delenv(local_mod.DOCUMENT_ENCODER_ENV, raising=False)
        monkeypatch.setattr(local_mod, "_MODEL_CACHE", {})
        monkeypatch.setattr(numpy_bert, "_CACHE", {})
        e = LocalEmbedder()
        assert numpy_bert.onnx_graph_cached(e.path) is False
        e.warm_up().join(timeout=300)
        if forced:       # every document job on torch: no graph is wanted
            assert not folder.exists() and numpy_bert.onnx_graph_cached(e.path) is False
            continue
        assert numpy_bert.onnx_graph_cached(e.path) is True
        assert (str(e.path.resolve()), "onnx-documents") in numpy_bert._CACHE     # the session, on that file
        assert built_here == []
        [graph] = folder.glob("*.onnx")
        assert graph.stat().st_size > 30_000_000 and not list(folder.glob("*.tmp"))
        assert graph.read_bytes() == numpy_bert.build_onnx_graph(e.path)    # whole, the graph itself
        assert e._cache_graph_aside() is None      # cached: no child the next time


def test_a_hanging_graph_child_does_not_hold_up_the_first_load(monkeypatch, tmp_path, caplog):
    """Embed calls wait for the warm-up, and the warm-up for the graph-caching child: a child that hangs is stopped
    after GRAPH_CHILD_TIMEOUT_S, said once, and the session is opened anyway (the graph built in this process)."""
    import subprocess
    import sys
    import time

    from kb_assets.embedding import numpy_bert

    monkeypatch.setenv("KB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(local_mod.DOCUMENT_ENCODER_ENV, raising=False)
    monkeypatch.setattr(local_mod, "_MODEL_CACHE", {})
    monkeypatch.setattr(numpy_bert, "_CACHE", {})
    monkeypatch.setattr(local_mod, "GRAPH_CHILD_TIMEOUT_S", 1)
    children = []

    def hanging_child(self):
        children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]))
        return children[-1]

    monkeypatch.setattr(LocalEmbedder, "_cache_graph_aside", hanging_child)
    e = LocalEmbedder()
    started = time.monotonic()
    with caplog.at_level("WARNING", logger=local_mod.__name__):
        e.warm_up().join(timeout=300)
    assert time.monotonic() - started < 120
    assert children and children[0].poll() is not None                 # stopped, and reaped
    assert any("ran past 1 s" in r.getMessage() for r in caplog.records)
    assert (str(e.path.resolve()), "onnx-documents") in numpy_bert._CACHE
    assert numpy_bert.onnx_graph_cached(e.path) is True
