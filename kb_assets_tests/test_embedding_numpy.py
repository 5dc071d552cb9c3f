"""The torch-free query encoder gives the vectors sentence-transformers gives (same weights, tokenizer,
pooling, normalisation), and a fresh recall process never imports torch."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kb_assets.embedding import LocalEmbedder
from kb_assets.embedding import local as local_mod
from kb_assets.embedding import numpy_bert

SAMPLE = [
    "why did we drop celery?",
    "x",
    "",
    "HNSW index ef_search pgvector 0.6 returns at most ef_search rows",
    "Ünïcödé, emoji 😀 and CJK 漢字 — mixed scripts",
    "def delay(attempt: int) -> float:\n    return random.uniform(0, 2 ** attempt)",
    "word " * 400,                       # beyond the 256-token window: truncated the same way
]


def _corpus_sample(shared: Path | None, n: int = 24) -> list[str]:
    """Real prose: paragraphs of the PEPs evaluation corpus when the shared data is there."""
    if shared is None:
        return []
    texts = []
    for path in sorted((shared / "eval").rglob("*.jsonl"))[:3]:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue
                text = item.get("text") or item.get("query") if isinstance(item, dict) else None
                if isinstance(text, str) and text.strip():
                    texts.append(text[:2000])
                if len(texts) >= n:
                    return texts
    return texts


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return local_mod.packaged_model_dir().resolve()


def test_the_packaged_model_is_supported_and_others_are_not(model_dir, tmp_path):
    assert numpy_bert.supports(model_dir)
    other = tmp_path / "cls_pooled"
    shutil.copytree(model_dir, other, ignore=shutil.ignore_patterns("model.safetensors"))
    (other / "model.safetensors").symlink_to(model_dir / "model.safetensors")
    (other / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 384, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    assert not numpy_bert.supports(other)       # CLS pooling: left to sentence-transformers
    assert not numpy_bert.supports(tmp_path)     # not a model folder at all


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    """Its own cache folder: the graph is built here once for the module (the digest keys it)."""
    folder = tmp_path_factory.mktemp("onnx-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("KB_CACHE_DIR", str(folder))
    yield folder
    mp.undo()


@pytest.mark.parametrize("runtime", ["numpy", "onnx"])
def test_same_vectors_as_sentence_transformers(model_dir, runtime, onnx_cache):
    shared = Path(__file__).resolve().parents[1].parent / "shared"
    texts = SAMPLE + _corpus_sample(shared if shared.exists() else None)
    encoder = numpy_bert.encoder_for(model_dir, runtime)
    assert encoder.runtime == runtime
    ours = encoder.encode(texts)
    reference = local_mod.load_model(model_dir).encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                                                       show_progress_bar=False)
    assert ours.shape == reference.shape == (len(texts), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    cos = (ours * reference).sum(1)
    assert cos.min() >= 0.9999, f"worst cosine {cos.min():.6f} on {texts[int(cos.argmin())][:60]!r}"
    # one text alone (no padding) equals the same text in a padded batch
    for i in (0, 3, 6):
        np.testing.assert_allclose(encoder.encode([texts[i]])[0], ours[i], atol=1e-5)


def test_onnx_graph_is_cached_by_model_digest(model_dir, onnx_cache, tmp_path, monkeypatch):
    """Built once per model digest (no torch, nothing fetched), then reused; other weights, another file."""
    first = numpy_bert.cached_onnx_model(model_dir)
    assert isinstance(first, Path) and first.parent == onnx_cache and first.stat().st_size > 30_000_000
    mtime = first.stat().st_mtime_ns
    assert numpy_bert.cached_onnx_model(model_dir) == first and first.stat().st_mtime_ns == mtime
    # the weights' digest is remembered by their stat: the next process finds the graph without hashing 90 MB
    digests = json.loads((onnx_cache / numpy_bert.DIGESTS_FILE).read_text())
    assert [d["digest"] for d in digests.values()] == [numpy_bert.model_digest(model_dir)]
    with monkeypatch.context() as m:
        m.setattr(numpy_bert, "model_digest", lambda _p: pytest.fail("the weights were hashed again"))
        assert numpy_bert.cached_onnx_model(model_dir) == first
    other = tmp_path / "model"
    shutil.copytree(model_dir, other, ignore=shutil.ignore_patterns("model.safetensors"))
    (other / "model.safetensors").symlink_to(model_dir / "model.safetensors")
    cfg = json.loads((other / "config.json").read_text())
    cfg["layer_norm_eps"] = 1e-6                         # a different model: a different digest
    (other / "config.json").write_text(json.dumps(cfg))
    assert numpy_bert.model_digest(other) != numpy_bert.model_digest(model_dir)
    # a file written just now is not remembered (its next change could keep the same mtime): hashed every time
    assert numpy_bert._known_digest(other, remember=True) == numpy_bert.model_digest(other)
    assert len(json.loads((onnx_cache / numpy_bert.DIGESTS_FILE).read_text())) == 1
    assert numpy_bert.onnx_cache_dir() == onnx_cache
    assert sorted(p.name for p in onnx_cache.glob("*.onnx")) == [first.name]


def test_long_lived_processes_prefer_onnxruntime(model_dir, monkeypatch, onnx_cache):
    monkeypatch.setattr(numpy_bert, "_PREFERRED", {"runtime": "numpy", "threads": 1})
    monkeypatch.delenv(numpy_bert.RUNTIME_ENV, raising=False)
    assert numpy_bert.runtime() == "numpy"                # a one-shot `kb recall`: nothing to build
    numpy_bert.prefer_onnxruntime(threads=1)
    assert numpy_bert.runtime() == "onnx"
    monkeypatch.setenv(numpy_bert.RUNTIME_ENV, "numpy")   # the operator's override wins
    assert numpy_bert.runtime() == "numpy"


def test_embed_query_uses_numpy_until_torch_is_loaded(monkeypatch):
    emb = LocalEmbedder()
    monkeypatch.setattr(local_mod, "_MODEL_CACHE", {})
    assert emb.query_encoder() == "numpy"
    q = emb.embed_query("where are the embeddings stored?")
    monkeypatch.setenv("KB_QUERY_ENCODER", "torch")
    assert emb.query_encoder() == "torch"
    q_torch = emb.embed_query("where are the embeddings stored?")
    assert float(np.dot(q, q_torch)) >= 0.999


def test_a_fresh_recall_process_imports_neither_torch_nor_dagster_nor_pandas(tmp_path, db_url):
    """The cold path: config → database → numpy encoder → SQL. torch (~8 s to import here) never loads."""
    code = (
        "import sys, json\n"
        "from kb_assets.query import recall\n"
        "from kb_assets.embedding import LocalEmbedder\n"
        "import psycopg\n"
        "from kb_assets.store.db import connect\n"
        f"conn = connect({db_url!r}, register=False)\n"
        "vec = LocalEmbedder().embed_query('why did we drop celery?')\n"
        "r = recall('why did we drop celery?', conn=conn)\n"
        "heavy = sorted(m for m in ('torch', 'sentence_transformers', 'transformers', 'dagster', 'pandas',"
        " 'sklearn', 'scipy') if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy, 'dim': len(vec)}))\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("KB_QUERY_ENCODER", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"heavy": [], "dim": 384}


def test_document_jobs_run_without_torch_until_it_is_loaded(monkeypatch, model_dir):
    """Documents are embedded without importing torch, small jobs and large (onnxruntime; same vectors); without
    onnxruntime a large job, and always a loaded model or KB_DOCUMENT_ENCODER=torch, take sentence-transformers."""
    emb = LocalEmbedder()
    monkeypatch.setattr(local_mod, "_MODEL_CACHE", {})
    monkeypatch.delenv("KB_DOCUMENT_ENCODER", raising=False)
    texts = SAMPLE + [f"chunk {i} about vector indexes and {i * 7} rows" for i in range(9)]
    assert emb.document_encoder(len(texts)) == "numpy"
    assert emb.document_encoder(local_mod.SMALL_JOB_TEXTS + 1) == "numpy"
    assert emb.document_encoder(100_000) == "numpy"
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "onnxruntime", None)          # not installed: find_spec says None
        assert emb.document_encoder(local_mod.SMALL_JOB_TEXTS) == "numpy"
        assert emb.document_encoder(local_mod.SMALL_JOB_TEXTS + 1) == "torch"
    small = emb.embed_documents(texts)
    assert not emb.loaded                        # the model was not loaded for it
    assert small.tokens > 0
    monkeypatch.setenv("KB_DOCUMENT_ENCODER", "torch")
    assert emb.document_encoder(len(texts)) == "torch"
    reference = emb.embed_documents(texts)
    assert emb.loaded
    cos = (np.asarray(small.vectors) * np.asarray(reference.vectors)).sum(1)
    assert cos.min() >= 0.999, f"worst cosine {cos.min():.6f}"
    assert small.tokens == reference.tokens
    monkeypatch.delenv("KB_DOCUMENT_ENCODER")
    assert emb.document_encoder(3) == "torch"    # once torch is loaded, it stays the encoder


def test_a_missing_onnxruntime_falls_back_to_numpy_and_says_so_once(monkeypatch, caplog):
    """A venv made before onnxruntime was pinned: the server runs numpy (2-3x slower on long queries) and
    says so once at start, not on every query (a failed import is retried, and paid, on every call)."""
    import onnxruntime

    monkeypatch.setattr(numpy_bert, "_PREFERRED", {"runtime": "onnx", "threads": 1})
    monkeypatch.setattr(numpy_bert, "_ORT_INSTALLED", [])
    monkeypatch.delenv(numpy_bert.RUNTIME_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)      # `import onnxruntime` raises ImportError
    with caplog.at_level("WARNING", logger=numpy_bert.__name__):
        assert [numpy_bert.runtime() for _ in range(5)] == ["numpy"] * 5
    warned = [r for r in caplog.records if "onnxruntime is not installed" in r.getMessage()]
    assert len(warned) == 1 and "./dev setup" in warned[0].getMessage()
    monkeypatch.setattr(numpy_bert, "_ORT_INSTALLED", [])
    monkeypatch.setitem(sys.modules, "onnxruntime", onnxruntime)
    assert numpy_bert.runtime() == "onnx"                      # installed: the preference holds


def test_fused_attention_graph_equals_the_plain_opset_graph(model_dir):
    """The cached graph runs ORT's com.microsoft.Attention kernel; on a padded batch (its 0/1 mask against the
    plain graph's float32-min bias) every real token's hidden state is the plain opset-20 graph's."""
    import onnx
    import onnxruntime as ort

    fused, plain = (numpy_bert.build_onnx_graph(model_dir, fused_attention=f) for f in (True, False))
    ops = {n.op_type for n in onnx.load_from_string(fused).graph.node}
    assert "Attention" in ops and not ops & {"Softmax", "Split", "Transpose"}
    enc = numpy_bert.NumpyBertEncoder(model_dir)          # tokenizer and word rows only
    ids, mask, types = enc._tokens(["why did we drop celery?", "x", SAMPLE[5]])
    n, seq = ids.shape
    feeds = {"word_embeds": enc._words(ids), "token_type_ids": types,
             "position_ids": np.ascontiguousarray(np.broadcast_to(np.arange(seq, dtype=np.int64), (n, seq)))}
    out = {}
    for name, graph, extra in (
            ("fused", fused, {"attention_mask": mask.astype(np.int32)}),
            ("plain", plain, {"attn_bias": ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :]
                              .astype(np.float32)})):
        session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
        out[name] = session.run(["hidden"], {**feeds, **extra})[0]
    real = mask.astype(bool)
    assert 0 < real.sum() < real.size                      # the batch is padded
    np.testing.assert_allclose(out["fused"][real], out["plain"][real], atol=1e-4)


def test_small_document_jobs_take_onnxruntime_on_every_core_when_it_pays(model_dir, monkeypatch, onnx_cache):
    """A few changed files' chunks (>= ONNX_DOCUMENT_MIN_TEXTS) go through onnxruntime with a thread per core
    (~2x numpy's single thread on full windows); fewer stay on numpy (no session to pay for); without
    onnxruntime, numpy. The vectors are numpy's within float rounding."""
    monkeypatch.setattr(numpy_bert, "_ORT_INSTALLED", [])
    n = numpy_bert.ONNX_DOCUMENT_MIN_TEXTS
    texts = (SAMPLE + [f"paragraph {i}: " + "streams keep their messages for thirty days " * (i + 1)
                       for i in range(n)])[:max(n, len(SAMPLE))]
    big = numpy_bert.document_encoder_for(model_dir, len(texts))
    assert big.runtime == "onnx" and big.threads == len(os.sched_getaffinity(0))
    assert numpy_bert.document_encoder_for(model_dir, n - 1).runtime == "numpy"
    a = big.encode(texts)
    b = numpy_bert.encoder_for(model_dir, "numpy").encode(texts)
    assert np.abs(a - b).max() < 1e-5
    monkeypatch.setattr(numpy_bert, "_ORT_INSTALLED", [False])
    assert numpy_bert.document_encoder_for(model_dir, len(texts)).runtime == "numpy"
