"""The query-side encoder: a BERT sentence-transformer (all-MiniLM-L6-v2) run with numpy, no torch.

Why: a fresh `kb recall` process spent ~8 s importing torch + sentence-transformers to embed one short
query (docs/BENCHMARKS.md, "cold recall"). The same weights (`model.safetensors`), the same tokenizer
(`tokenizer.json`, truncated at the model's max_seq_length), the same pooling (mean over the attention
mask) and normalisation give the same vectors (cosine ≥ 0.9999 against sentence-transformers, tested in
kb_assets_tests/test_embedding_numpy.py), in ~0.2 s of start-up and a few ms per query.

Only what sentence-transformers would run for such a folder is supported: modules Transformer → Pooling
(mean) [→ Normalize] over a post-LayerNorm BERT with absolute positions and GELU. `supports()` says whether
a folder qualifies; anything else stays on sentence-transformers. Documents are still embedded by
sentence-transformers (batched, torch is faster there), so the stored vectors do not change.

Two runtimes share the tokenizer and pooling: numpy (nothing to build: the one-shot `kb recall`), and
onnxruntime for long-lived servers (`kb serve`, `kb mcp` call `prefer_onnxruntime()`): the same weights as
an ONNX graph built here from `model.safetensors` (no torch; `onnx` only to write it), cached on disk keyed
on the model's digest, run by ORT's fused CPU kernels (Attention, SkipLayerNormalization, BiasGelu): ~2x less
CPU per query than numpy (docs/BENCHMARKS.md, "kb serve" and "kb serve: onnxruntime in the server for real").
Either is checked against sentence-transformers (cosine ≥ 0.9999).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
from pathlib import Path

import numpy as np

from kb_assets.embedding.base import cache_dir

log = logging.getLogger(__name__)

_CACHE: dict[tuple, "NumpyBertEncoder | OnnxBertEncoder"] = {}
_LOCK = threading.Lock()
_CONTROLLER = None       # threadpoolctl.ThreadpoolController, made on the first encode
_PREFERRED = {"runtime": "numpy", "threads": 1}
RUNTIME_ENV = "KB_QUERY_RUNTIME"     # numpy | onnx: overrides the process's preference
ONNX_GRAPH_VERSION = 3               # bump when the graph built below changes: a new cache file


def _read(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def supports(path: Path) -> bool:
    """True when `path` is a sentence-transformers folder this encoder reproduces exactly."""
    path = Path(path)
    if not (path / "model.safetensors").is_file() or not (path / "tokenizer.json").is_file():
        return False
    cfg = _read(path / "config.json")
    if not isinstance(cfg, dict) or cfg.get("model_type") != "bert" or cfg.get("hidden_act") != "gelu" \
            or cfg.get("position_embedding_type", "absolute") != "absolute":
        return False
    modules = _read(path / "modules.json")
    types = [m.get("type", "").rsplit(".", 1)[-1] for m in modules] if isinstance(modules, list) else []
    if types not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return False
    pooling = _read(path / modules[1].get("path", "") / "config.json")
    if not isinstance(pooling, dict) or not pooling.get("pooling_mode_mean_tokens"):
        return False
    others = ("pooling_mode_cls_token", "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
              "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
    return not any(pooling.get(k) for k in others)


def prefer_onnxruntime(threads: int = 1) -> None:
    """A long-lived process (kb serve, kb mcp) answers queries with onnxruntime when it is installed: the
    session costs ~0.3 s once and every query ~half the CPU of numpy. One-shot processes stay on numpy."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    _PREFERRED.update(runtime="onnx", threads=max(1, min(int(threads), cores)))


def runtime() -> str:
    """The query runtime this process uses: $KB_QUERY_RUNTIME, else what prefer_onnxruntime() set, else
    numpy; "onnx" only when onnxruntime imports."""
    wanted = (os.environ.get(RUNTIME_ENV) or _PREFERRED["runtime"]).strip().lower()
    if wanted == "onnx":
        return "onnx" if _onnxruntime_installed() else "numpy"
    return "numpy"


_ORT_INSTALLED: list[bool] = []      # asked once per process: a failed import is retried (and costs) every time


def _onnxruntime_installed() -> bool:
    if not _ORT_INSTALLED:
        try:
            import onnxruntime  # noqa: F401
            _ORT_INSTALLED.append(True)
        except ImportError:
            # said once, loudly: on numpy a ~250-token query costs ~2-3x the CPU (docs/BENCHMARKS.md); a venv
            # made before onnxruntime was pinned lacks it (./dev setup installs it)
            log.warning("onnxruntime is not installed (pinned in pyproject.toml; ./dev setup installs it): "
                        "the query encoder runs on numpy, ~2-3x slower on long queries")
            _ORT_INSTALLED.append(False)
    return _ORT_INSTALLED[0]


def encoder_for(path: Path, runtime_name: str | None = None):
    """One encoder per (model folder, runtime) per process (weights are read once, ~90 MB)."""
    rt = runtime_name or runtime()
    key = (str(Path(path).resolve()), rt)
    enc = _CACHE.get(key)
    if enc is None:
        with _LOCK:
            enc = _CACHE.get(key)
            if enc is None:
                if rt == "onnx":
                    try:
                        enc = OnnxBertEncoder(Path(key[0]), threads=_PREFERRED["threads"])
                    except Exception as exc:   # noqa: BLE001 — never worse than numpy: fall back, say why
                        log.warning("onnxruntime query encoder unavailable (%s): using numpy", exc)
                        enc = _CACHE.get((key[0], "numpy")) or NumpyBertEncoder(Path(key[0]))
                else:
                    enc = NumpyBertEncoder(Path(key[0]))
                _CACHE[key] = enc
    return enc


# A document job of at least this many texts takes onnxruntime on every core: its session costs ~0.1-0.3 s (the
# graph is cached on disk), and its forward pass on two threads is ~2x numpy's single-threaded one on full-window
# chunks (docs/BENCHMARKS.md, "Small passes without a Dagster run") and ~1.7x torch's on a first load's batches.
ONNX_DOCUMENT_MIN_TEXTS = 8


def document_encoder_for(path: Path, n_texts: int):
    """The torch-free encoder for a document job: onnxruntime with one thread per core when it is installed and
    the job pays for its session, else numpy (one BLAS thread). Same weights, vectors within ~1e-6 of each other
    and of torch's."""
    if n_texts < ONNX_DOCUMENT_MIN_TEXTS or not _onnxruntime_installed():
        return encoder_for(path, "numpy")
    key = (str(Path(path).resolve()), "onnx-documents")
    enc = _CACHE.get(key)
    if enc is None:
        with _LOCK:
            enc = _CACHE.get(key)
            if enc is None:
                try:
                    cores = len(os.sched_getaffinity(0))
                except (AttributeError, OSError):
                    cores = os.cpu_count() or 1
                try:
                    enc = OnnxBertEncoder(Path(key[0]), threads=max(1, cores))
                except Exception as exc:   # noqa: BLE001 — never worse than numpy: fall back, say why
                    log.warning("onnxruntime document encoder unavailable (%s): using numpy", exc)
                    enc = None
                if enc is not None:
                    _CACHE[key] = enc
    return enc if enc is not None else encoder_for(path, "numpy")


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (|error| ≤ 1.5e-7, below float32 resolution); numpy has no erf and
    # scipy would cost more to import than the whole forward pass.
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) \
        * t * np.exp(-a * a)
    return sign * y


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x * (1.0 / math.sqrt(2.0))))


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


class _BertShape:
    """What both runtimes share: the model's shape, the tokenizer as sentence-transformers runs it, pooling."""

    def _setup(self, path: Path) -> dict:
        from tokenizers import Tokenizer

        cfg = _read(path / "config.json")
        st_cfg = _read(path / "sentence_bert_config.json")
        self.layers = int(cfg["num_hidden_layers"])
        self.heads = int(cfg["num_attention_heads"])
        self.hidden = int(cfg["hidden_size"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        max_len = int(st_cfg.get("max_seq_length") or cfg.get("max_position_embeddings", 512))
        self.max_len = min(max_len, int(cfg.get("max_position_embeddings", 512)))
        modules = _read(path / "modules.json")
        self.normalize = any(m.get("type", "").endswith("Normalize") for m in modules)
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        tok.enable_truncation(max_length=self.max_len)   # counts [CLS]/[SEP], as sentence-transformers does
        tok.enable_padding(pad_id=int(cfg.get("pad_token_id", 0)))
        self.tokenizer = tok
        return cfg

    def _tokens(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        encs = self.tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encs], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encs], dtype=np.float32)
        types = np.array([e.type_ids for e in encs], dtype=np.int64)
        return ids, mask, types

    def _open_words(self, path: Path) -> dict[str, str]:
        """The word-embedding table (30522 x 384, half the file) stays in the file: only the rows of the
        tokens seen are read, once. Returns {short name: tensor name} of the file's tensors."""
        from safetensors import safe_open

        self._file = safe_open(str(path / "model.safetensors"), framework="np")
        names = {(n[5:] if n.startswith("bert.") else n): n for n in self._file.keys()}
        self._word_name = names["embeddings.word_embeddings.weight"]
        self._word_rows: dict[int, np.ndarray] = {}
        return names

    def _words(self, ids: np.ndarray) -> np.ndarray:
        rows = self._word_rows
        # a set, not np.unique: numpy 2 imports numpy.ma for it (~25 ms, the first call of every small pass)
        missing = sorted(i for i in set(ids.ravel().tolist()) if i not in rows)
        if missing:
            table = self._file.get_slice(self._word_name)
            with _LOCK:
                for i in missing:
                    rows[i] = table[i:i + 1][0].astype(np.float32, copy=False)
        return np.stack([rows[int(i)] for i in ids.ravel()]).reshape(*ids.shape, -1)

    def _pool(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        pooled = (x * mask[:, :, None]).sum(1) / np.clip(mask.sum(1, keepdims=True), 1e-9, None)
        if self.normalize:
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return pooled.astype(np.float32)


class NumpyBertEncoder(_BertShape):
    runtime = "numpy"

    def __init__(self, path: Path):
        self._setup(path)
        # The other tensors are read once; linear weights are used as stored (out, in), multiplied
        # transposed (BLAS takes the transpose flag, no copy).
        names = self._open_words(path)
        self.w = {k: self._file.get_tensor(n).astype(np.float32, copy=False) for k, n in names.items()
                  if not k.endswith("position_ids") and k != "embeddings.word_embeddings.weight"}

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        shape = x.shape
        out = x.reshape(-1, shape[-1]) @ self.w[name + ".weight"].T + self.w[name + ".bias"]
        return out.reshape(*shape[:-1], -1)

    def encode(self, texts: list[str]) -> np.ndarray:
        """(len(texts), hidden) float32, mean-pooled (and unit length when the folder normalises)."""
        global _CONTROLLER
        if _CONTROLLER is None:
            from threadpoolctl import ThreadpoolController
            _CONTROLLER = ThreadpoolController()
        # One BLAS thread: these matrices are small, and on a busy machine OpenBLAS's spinning worker
        # threads made a 10-token query 10-100x slower (measured: 0.25-2.6 s vs 0.02 s).
        with _CONTROLLER.limit(limits=1, user_api="blas"):
            return self._encode(texts)

    def _encode(self, texts: list[str]) -> np.ndarray:
        ids, mask, types = self._tokens(texts)
        n, seq = ids.shape
        w = self.w
        x = (self._words(ids) + w["embeddings.position_embeddings.weight"][:seq][None]
             + w["embeddings.token_type_embeddings.weight"][types])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], self.eps)
        h, d = self.heads, self.hidden // self.heads
        additive = ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :]
        scale = np.float32(1.0 / math.sqrt(d))
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def split(t: np.ndarray) -> np.ndarray:
                return t.reshape(n, seq, h, d).transpose(0, 2, 1, 3)

            q = split(self._linear(x, p + "attention.self.query"))
            k = split(self._linear(x, p + "attention.self.key"))
            v = split(self._linear(x, p + "attention.self.value"))
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + additive
            scores -= scores.max(-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(-1, keepdims=True)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(n, seq, self.hidden)
            x = _layer_norm(self._linear(ctx, p + "attention.output.dense") + x,
                            w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"],
                            self.eps)
            inner = _gelu(self._linear(x, p + "intermediate.dense"))
            x = _layer_norm(self._linear(inner, p + "output.dense") + x,
                            w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], self.eps)
        return self._pool(x, mask)


# ------------------------------------------------------------------------------------------ onnxruntime
def model_digest(path: Path) -> str:
    """sha256 of what the graph is made of (weights, config) and of the builder's version."""
    h = hashlib.sha256(f"kb-bert-onnx-v{ONNX_GRAPH_VERSION}".encode())
    for name in ("config.json", "model.safetensors"):
        with open(path / name, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()


def onnx_cache_dir() -> Path:
    """Where the graphs are kept: the machine's KB cache folder (embedding/base.cache_dir)."""
    return cache_dir()


def build_onnx_graph(path: Path, *, fused_attention: bool = True) -> bytes:
    """The model as an ONNX graph (opset 20: LayerNormalization, exact Gelu), weights from model.safetensors.

    Inputs word_embeds (float32, [batch, seq, hidden]: the word-embedding rows of the tokens, which stay in
    model.safetensors — half the weights, read a row at a time as the numpy encoder does), position_ids /
    token_type_ids (int64, [batch, seq]) and attention_mask (int32, [batch, seq]: 1 for tokens, 0 for padding);
    output the last hidden state [batch, seq, hidden].
    Self-attention is ORT's fused CPU `com.microsoft.Attention` (Q, K, V in one GEMM; scores, softmax and
    context in one kernel: no Split / Reshape / Transpose nodes; ~4-7% less CPU per query than the plain opset
    pattern, same vectors); ORT fuses the rest (bias + Gelu, Add + LayerNorm) when it loads the graph.
    `fused_attention=False`: the plain opset-20 graph (MatMul / Softmax, with attn_bias float32 [batch, 1, 1,
    seq]: 0 for tokens, float32 min for padding, instead of attention_mask)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from safetensors import safe_open

    cfg = _read(path / "config.json")
    layers, heads, hidden = int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    eps = float(cfg.get("layer_norm_eps", 1e-12))
    d = hidden // heads
    # Memory: the build once peaked at ~380 MB above the process for a 43 MB graph (every weight held as the file's
    # tensors, a float32 copy, the initializers, the graph's and the model's copies of them, two serialisations).
    # Now: only the tensors the graph uses (not the word embeddings), no copy of float32 ones, each initializer
    # made as the model takes it, one serialisation, checked as bytes; the same graph, byte for byte.
    with safe_open(str(path / "model.safetensors"), framework="numpy") as f:
        w = {(k[5:] if k.startswith("bert.") else k): f.get_tensor(k).astype(np.float32, copy=False)
             for k in f.keys() if not k.endswith(("position_ids", "word_embeddings.weight"))}
    inits, nodes = [], []

    def init(name: str, arr: np.ndarray) -> str:
        inits.append((name, arr))     # made a tensor only when the model takes it (below): one copy at a time
        return name

    def op(kind: str, ins: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(kind, ins, [out], **attrs))
        return out

    def layer_norm(x: str, prefix: str, out: str) -> str:
        return op("LayerNormalization", [x, init(out + ".g", w[prefix + ".weight"]), init(out + ".b", w[prefix + ".bias"])],
                  out, axis=-1, epsilon=eps)

    def linear(x: str, weight: np.ndarray, bias: np.ndarray, out: str) -> str:
        return op("Add", [op("MatMul", [x, init(out + ".w", weight.T)], out + ".mm"), init(out + ".bias", bias)], out)

    e = op("Add", ["word_embeds", op("Gather", [init("pos", w["embeddings.position_embeddings.weight"]), "position_ids"],
                                     "e.pos")], "e.wp")
    e = op("Add", [e, op("Gather", [init("type", w["embeddings.token_type_embeddings.weight"]), "token_type_ids"],
                         "e.type")], "e.sum")
    x = layer_norm(e, "embeddings.LayerNorm", "x0")
    if not fused_attention:
        init("shape.bshd", np.array([0, 0, heads, d], dtype=np.int64))
        init("shape.bsh", np.array([0, 0, hidden], dtype=np.int64))
        init("scale", np.array(1.0 / math.sqrt(d), dtype=np.float32))
    for i in range(layers):
        p, n = f"encoder.layer.{i}.", f"l{i}."
        qkv_w = np.concatenate([w[p + f"attention.self.{t}.weight"] for t in ("query", "key", "value")], 0)
        qkv_b = np.concatenate([w[p + f"attention.self.{t}.bias"] for t in ("query", "key", "value")], 0)
        if fused_attention:
            ctx = op("Attention", [x, init(n + "qkv.w", qkv_w.T), init(n + "qkv.bias", qkv_b), "attention_mask"],
                     n + "ctx", domain="com.microsoft", num_heads=heads)
        else:
            qkv = linear(x, qkv_w, qkv_b, n + "qkv")
            nodes.append(helper.make_node("Split", [qkv], [n + "q", n + "k", n + "v"], axis=-1, num_outputs=3))
            q, k, v = (op("Transpose", [op("Reshape", [n + t, "shape.bshd"], n + t + ".r")], n + t + ".h", perm=perm)
                       for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])))
            scores = op("Add", [op("Mul", [op("MatMul", [q, k], n + "s"), "scale"], n + "s.scaled"), "attn_bias"],
                        n + "s.masked")
            ctx = op("MatMul", [op("Softmax", [scores], n + "p", axis=-1), v], n + "ctx.h")
            ctx = op("Reshape", [op("Transpose", [ctx], n + "ctx.t", perm=[0, 2, 1, 3]), "shape.bsh"], n + "ctx")
        a = linear(ctx, w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"], n + "attn")
        x = layer_norm(op("Add", [a, x], n + "res1"), p + "attention.output.LayerNorm", n + "x1")
        h = op("Gelu", [linear(x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"], n + "inter")],
               n + "gelu")
        o = linear(h, w[p + "output.dense.weight"], w[p + "output.dense.bias"], n + "out")
        x = layer_norm(op("Add", [o, x], n + "res2"), p + "output.LayerNorm", n + "x2")
    op("Identity", [x], "hidden")
    i64, f32 = TensorProto.INT64, TensorProto.FLOAT
    graph = helper.make_graph(nodes, "bert", [
        helper.make_tensor_value_info("word_embeds", f32, ["batch", "seq", hidden])] + [
        helper.make_tensor_value_info(name, i64, ["batch", "seq"]) for name in ("position_ids", "token_type_ids")
    ] + [helper.make_tensor_value_info("attention_mask", TensorProto.INT32, ["batch", "seq"]) if fused_attention
         else helper.make_tensor_value_info("attn_bias", f32, ["batch", 1, 1, "seq"])],
        [helper.make_tensor_value_info("hidden", f32, ["batch", "seq", hidden])])
    opsets = [helper.make_opsetid("", 20)] + ([helper.make_opsetid("com.microsoft", 1)] if fused_attention else [])
    model = helper.make_model(graph, opset_imports=opsets, producer_name="kb_assets")
    for name, arr in inits:           # straight into the model (make_graph and make_model would copy them twice)
        model.graph.initializer.add().CopyFrom(numpy_helper.from_array(np.ascontiguousarray(arr), name))
    inits.clear()
    w.clear()
    model.ir_version = 10
    data = model.SerializeToString()
    del model
    onnx.checker.check_model(data)
    return data


def cached_onnx_model(path: Path) -> Path | bytes:
    """The cached graph file for this model's digest, built (and written atomically) on first use; when the
    cache folder cannot be written, the graph's bytes."""
    target = _graph_file(path, remember=True)
    folder = target.parent
    if target.is_file():
        return target
    data = build_onnx_graph(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
        return target
    except OSError as exc:
        log.warning("cannot cache the ONNX graph in %s (%s): built in memory", folder, exc)
        return data


def _graph_file(path: Path, *, remember: bool = False) -> Path:
    return onnx_cache_dir() / f"{path.name}-{_known_digest(path, remember=remember)[:24]}.onnx"


DIGESTS_FILE = "model-digests.json"
RACY_SECONDS = 2.0       # a file changed this recently may change again within its mtime's resolution


def _known_digest(path: Path, *, remember: bool = False) -> str:
    """model_digest(path), remembered beside the graphs while the files' (size, mtime, inode) stay the same:
    hashing the 90 MB of weights cost ~45 ms of CPU in every process that opens the graph (a small pass's
    encoder warm-up), as git's index remembers a file's hash by its stat. Written only by the processes that
    build or open the graph (`remember`); a file modified within RACY_SECONDS of the hash is hashed again next
    time."""
    import time

    try:
        stats = [(path / name).stat() for name in ("config.json", "model.safetensors")]
    except OSError:
        return model_digest(path)
    key = f"v{ONNX_GRAPH_VERSION}:{path.resolve()}"
    seen = [[s.st_size, s.st_mtime_ns, s.st_ino] for s in stats]
    store = onnx_cache_dir() / DIGESTS_FILE
    try:
        known = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):          # none yet, unreadable or torn: hashed again below
        known = {}
    known = known if isinstance(known, dict) else {}
    entry = known.get(key)
    if isinstance(entry, dict) and entry.get("stat") == seen and isinstance(entry.get("digest"), str):
        return entry["digest"]
    digest = model_digest(path)
    if remember and time.time() - max(s.st_mtime for s in stats) > RACY_SECONDS:
        known[key] = {"stat": seen, "digest": digest}
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            tmp = store.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known), encoding="utf-8")
            os.replace(tmp, store)
        except OSError:          # an optional saving: the next process hashes again
            pass
    return digest


def graph_wanted(path: Path) -> bool:
    """A folder this encoder reproduces, and onnxruntime installed — asked without importing it (~18 MB) and
    without the model's digest: whether document jobs of any size can run torch-free (LocalEmbedder.document_encoder)."""
    import importlib.util

    return supports(path) and importlib.util.find_spec("onnxruntime") is not None


def onnx_graph_cached(path: Path) -> bool | None:
    """Whether the model's onnxruntime graph is cached; None when no graph would be used (onnxruntime missing, or
    a model folder this encoder does not reproduce)."""
    path = Path(path)
    return _graph_file(path).is_file() if graph_wanted(path) else None


def ensure_onnx_graph(path: str | Path) -> bool:
    """Build and cache the model's graph unless it is cached already (a first load's warm-up runs this in a child
    process: LocalEmbedder._cache_graph_aside). True when the cached file is there afterwards."""
    path = Path(path)
    return graph_wanted(path) and isinstance(cached_onnx_model(path), Path)


def _give_back_freed_memory() -> None:
    """Return freed heap pages to the system (glibc keeps them). Creating the session parses the graph and
    copies its weights: without this ~28 MB of freed buffers stayed in the process, and a modify pass's peak
    RSS (the calls' activations come after) stood that much higher (docs/BENCHMARKS.md). A no-op elsewhere."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class OnnxBertEncoder(_BertShape):
    """The same forward pass in onnxruntime (CPU). `threads`: intra-op threads; spinning is off so a busy
    machine's other work is not starved by idle-waiting threads."""

    runtime = "onnx"

    def __init__(self, path: Path, *, threads: int = 1):
        import onnxruntime as ort

        self._setup(path)
        self._open_words(path)
        self.threads = threads
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # every call has its own shape (texts padded to the longest of the call): a memory plan per shape only
        # holds more (~9 MB over 30 windows, the same time)
        opts.enable_mem_pattern = False
        opts.log_severity_level = 3
        model = cached_onnx_model(path)
        self.model_file = model if isinstance(model, Path) else None
        self.session = ort.InferenceSession(str(model) if isinstance(model, Path) else model, opts,
                                            providers=["CPUExecutionProvider"])
        self._fused_attention = "attention_mask" in {i.name for i in self.session.get_inputs()}
        _give_back_freed_memory()

    def encode(self, texts: list[str]) -> np.ndarray:
        """(len(texts), hidden) float32, mean-pooled (and unit length when the folder normalises)."""
        ids, mask, types = self._tokens(texts)
        n, seq = ids.shape
        positions = np.broadcast_to(np.arange(seq, dtype=np.int64), (n, seq))
        feeds = {"word_embeds": self._words(ids), "position_ids": np.ascontiguousarray(positions),
                 "token_type_ids": types}
        if self._fused_attention:
            feeds["attention_mask"] = mask.astype(np.int32)
        else:
            feeds["attn_bias"] = ((1.0 - mask) * np.finfo(np.float32).min)[:, None, None, :].astype(np.float32)
        return self._pool(self.session.run(["hidden"], feeds)[0], mask)
