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
"""
from __future__ import annotations

import json
import math
import threading
from pathlib import Path

import numpy as np

_CACHE: dict[str, "NumpyBertEncoder"] = {}
_LOCK = threading.Lock()
_CONTROLLER = None       # threadpoolctl.ThreadpoolController, made on the first encode


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


def encoder_for(path: Path) -> "NumpyBertEncoder":
    """One encoder per model folder per process (weights are read once, ~90 MB)."""
    key = str(Path(path).resolve())
    enc = _CACHE.get(key)
    if enc is None:
        with _LOCK:
            enc = _CACHE.get(key)
            if enc is None:
                enc = _CACHE[key] = NumpyBertEncoder(Path(key))
    return enc


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


class NumpyBertEncoder:
    def __init__(self, path: Path):
        from safetensors import safe_open
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
        # The word-embedding table (30522 x 384, half the file) stays in the file: only the rows of the
        # tokens seen are read. The other tensors are read once; linear weights are used as stored
        # (out, in), multiplied transposed (BLAS takes the transpose flag, no copy).
        self._file = safe_open(str(path / "model.safetensors"), framework="np")
        names = {(n[5:] if n.startswith("bert.") else n): n for n in self._file.keys()}
        self._word_name = names["embeddings.word_embeddings.weight"]
        self._word_rows: dict[int, np.ndarray] = {}
        self.w = {k: self._file.get_tensor(n).astype(np.float32, copy=False) for k, n in names.items()
                  if not k.endswith("position_ids") and k != "embeddings.word_embeddings.weight"}

    def _words(self, ids: np.ndarray) -> np.ndarray:
        rows = self._word_rows
        missing = [int(i) for i in np.unique(ids) if int(i) not in rows]
        if missing:
            table = self._file.get_slice(self._word_name)
            with _LOCK:
                for i in missing:
                    rows[i] = table[i:i + 1][0].astype(np.float32, copy=False)
        return np.stack([rows[int(i)] for i in ids.ravel()]).reshape(*ids.shape, -1)

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
        encs = self.tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encs], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encs], dtype=np.float32)
        types = np.array([e.type_ids for e in encs], dtype=np.int64)
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
        pooled = (x * mask[:, :, None]).sum(1) / np.clip(mask.sum(1, keepdims=True), 1e-9, None)
        if self.normalize:
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return pooled.astype(np.float32)
