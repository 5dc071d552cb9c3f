"""Voyage AI embeddings through the official `voyageai` SDK (its sync `requests` code path).

- Batches are packed under `max_texts_per_request` (≤ 1,000) and `max_tokens_per_request` using a
  conservative local token estimate (Voyage's tokenizer is a hub download, unavailable offline). If the API
  still rejects a batch for its token total, the batch is halved and re-sent: no text is ever dropped.
- The SDK is told to make one attempt (`max_retries=1`); retries are ours: 429, 5xx, timeouts and
  connection errors, exponential backoff with full jitter, `Retry-After` honoured (seconds or HTTP date; the
  SDK's exceptions carry the response headers). 401/403 raise EmbeddingAuthError at once, never retried.
- `truncation=True`: chunks are cut to `max_tokens` (default 1,024 estimated tokens), far below the model's
  32K per text, so the API never truncates in practice; the flag only keeps one oversize text from failing a
  whole batch.
- `voyageai` is imported on the first request, not at import or construction.
"""
from __future__ import annotations

import math
import os
import random
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Callable

from kb_assets.embedding.base import (
    EmbeddingAuthError, EmbeddingError, EmbedResult, as_matrix, empty_result,
)

if TYPE_CHECKING:
    import numpy as np   # numpy is imported where vectors are handled: a pass with none (a delete, a rename) skips it

VOYAGE_KEY_ENV = "VOYAGE_API_KEY"
AUTH_MESSAGE = "Voyage rejected the API key ({status}): check VOYAGE_API_KEY"

# Models with a fixed output size (they reject `output_dimension`).
FIXED_DIMENSION_MODELS = {
    "voyage-3": 1024, "voyage-3-lite": 512, "voyage-2": 1024, "voyage-large-2": 1536,
    "voyage-large-2-instruct": 1024, "voyage-code-2": 1536, "voyage-law-2": 1024,
    "voyage-finance-2": 1024, "voyage-multilingual-2": 1024, "voyage-lite-02-instruct": 1024,
}
# Models known to accept these output dimensions (newer, unlisted models get `output_dimension` passed
# through and the API decides).
FLEXIBLE_DIMENSIONS = (256, 512, 1024, 2048)
FLEXIBLE_DIMENSION_MODELS = {
    "voyage-3.5", "voyage-3.5-lite", "voyage-3-large", "voyage-code-3", "voyage-context-3",
    "voyage-4", "voyage-4-lite", "voyage-4-large", "voyage-4-nano",
}

# ---------------------------------------------------------------------------------------------- tokens

_PIECE_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]|\s+|[\x21-\x7e]|[^\x00-\x7f]")


def estimate_tokens(text: str) -> int:
    """A deliberately high estimate of Voyage's token count for `text`.

    Letter runs, split at case changes (camelCase, base64): 1 token per 4 letters (rounded up); each digit and each ASCII punctuation mark: 1;
    whitespace: each newline 1, runs of 2+ spaces/tabs 1 per 4; non-ASCII: 1 per character outside the
    basic multilingual plane counts 3, CJK-range (3-byte UTF-8) 2, others 1; plus 1 per text. On prose
    and code this runs ~1.3–2x above a WordPiece/BPE count, so packing never trips the API's batch cap.
    """
    n = 1
    for m in _PIECE_RE.finditer(text):
        s = m.group()
        c = s[0]
        if c.isascii():
            if c.isalpha():
                n += (len(s) + 3) // 4
            elif c.isspace():
                nl = s.count("\n")
                rest = len(s) - nl
                n += nl + ((rest + 3) // 4 if rest > 1 else 0)
            else:
                n += 1
        else:
            cp = ord(c)
            n += 3 if cp > 0xFFFF else 2 if cp >= 0x800 else 1
    return n


# ---------------------------------------------------------------------------------------------- retry

def parse_retry_after(value: Any, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header value (delta-seconds or HTTP date); None if unusable."""
    if value is None:
        return None
    value = str(value).strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:      # HTTP dates are GMT
            from datetime import timezone
            when = when.replace(tzinfo=timezone.utc)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)


def _header(headers: Any, name: str) -> Any:
    if not headers:
        return None
    try:
        value = headers.get(name)          # requests' CaseInsensitiveDict
    except AttributeError:
        return None
    if value is None and isinstance(headers, dict):
        for k, v in headers.items():
            if str(k).lower() == name.lower():
                return v
    return value


@dataclass
class RetryEvent:
    attempt: int            # the attempt that failed (1-based)
    reason: str             # e.g. "HTTP 429", "timeout", "connection error"
    delay: float            # seconds we waited before the next attempt
    retry_after: float | None


class _BatchTooLarge(Exception):
    pass


_TOKEN_LIMIT_RE = re.compile(r"token", re.I)
_BATCH_RE = re.compile(r"batch|request|total", re.I)


# ---------------------------------------------------------------------------------------------- embedder

class VoyageEmbedder:
    """Embedder over the Voyage API. Construction is free: no import of voyageai, no connection."""

    backoff_base: float = 1.0       # seconds; attempt k waits uniform(0, min(cap, base * 2**(k-1)))
    backoff_cap: float = 60.0
    max_retry_after: float = 300.0  # a server asking for more is obeyed up to this long per wait

    def __init__(self, settings=None, *, api_key: str | None = None,
                 sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.time):
        from kb_assets.config import VoyageSettings

        self.settings = settings or VoyageSettings()
        s = self.settings
        self.model: str = s.model
        self.dimension: int = s.dimension
        self.max_tokens: int = s.max_tokens
        self._api_key = api_key
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.clock = clock
        self._client = None
        # counters for metadata / `kb status`
        self.requests = 0
        self.tokens = 0
        self.retries: list[RetryEvent] = []
        self.split_batches = 0

        native = FIXED_DIMENSION_MODELS.get(s.model)
        if native is not None:
            if s.dimension != native:
                raise EmbeddingError(f"voyage.dimension is {s.dimension} but {s.model} only returns {native}-d "
                                     f"vectors — set voyage.dimension: {native}")
            self._output_dimension = None
        else:
            if s.model in FLEXIBLE_DIMENSION_MODELS and s.dimension not in FLEXIBLE_DIMENSIONS:
                raise EmbeddingError(f"voyage.dimension is {s.dimension} but {s.model} accepts "
                                     f"{', '.join(map(str, FLEXIBLE_DIMENSIONS))} — pick one of those")
            self._output_dimension = s.dimension

    def __repr__(self) -> str:   # never shows the key
        return f"VoyageEmbedder(model={self.model!r}, dimension={self.dimension}, base_url={self.settings.base_url!r})"

    # -------------------------------------------------------------------------------- public API

    def count_tokens(self, texts: list[str]) -> list[int]:
        return [estimate_tokens(t) for t in texts]

    def plan_batches(self, texts: list[str], token_counts: list[int] | None = None) -> list[tuple[int, int]]:
        """[start, end) ranges, in order, each within the text and (estimated) token caps."""
        s = self.settings
        batches: list[tuple[int, int]] = []
        start, tokens = 0, 0
        for i, n in enumerate(token_counts if token_counts is not None else self.count_tokens(texts)):
            if i > start and (i - start >= s.max_texts_per_request or tokens + n > s.max_tokens_per_request):
                batches.append((start, i))
                start, tokens = i, 0
            tokens += n
        if start < len(texts):
            batches.append((start, len(texts)))
        return batches

    def embed_documents(self, texts: list[str], token_counts: list[int] | None = None) -> EmbedResult:
        import numpy as np
        texts = list(texts)
        if not texts:
            return empty_result(self.dimension)
        self._check_texts(texts)
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        total = 0
        pending = list(reversed(self.plan_batches(texts, token_counts)))
        while pending:
            start, end = pending.pop()
            try:
                vectors, tokens = self._request(texts[start:end], "document")
            except _BatchTooLarge:
                mid = (start + end) // 2
                self.split_batches += 1
                pending.extend([(mid, end), (start, mid)])     # stack: first half is sent first
                continue
            out[start:end] = vectors
            total += tokens
        return EmbedResult(out, total)

    def embed_query(self, text: str) -> list[float]:
        self._check_texts([text])
        try:
            vectors, _ = self._request([text], "query")
        except _BatchTooLarge as exc:
            raise EmbeddingError("Voyage rejected the query as too long for one request") from exc
        return vectors[0].tolist()

    # -------------------------------------------------------------------------------- internals

    def _check_texts(self, texts: list[str]) -> None:
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
        if bad:
            shown = ", ".join(map(str, bad[:10])) + (" …" if len(bad) > 10 else "")
            raise EmbeddingError(f"Voyage does not embed empty or non-string texts: input #{shown} — "
                                 "drop empty chunks before embedding")

    def _api_key_value(self) -> str:
        key = self._api_key or os.environ.get(VOYAGE_KEY_ENV)
        if not key:
            raise EmbeddingAuthError("VOYAGE_API_KEY is not set — export VOYAGE_API_KEY=... "
                                     "or set 'embedder: local'")
        return key

    def client(self):
        if self._client is None:
            import voyageai

            self._client = voyageai.Client(
                api_key=self._api_key_value(),
                max_retries=1,                     # one attempt: we retry ourselves (Retry-After, jitter)
                timeout=self.settings.timeout_seconds,
                base_url=self.settings.base_url,
            )
        return self._client

    def _backoff(self, attempt: int) -> float:
        return self.rng.uniform(0.0, min(self.backoff_cap, self.backoff_base * (2 ** (attempt - 1))))

    def _classify(self, exc: Exception) -> tuple[str, str, float | None]:
        """-> (kind, reason, retry_after) with kind in auth | too_large | retry | fatal."""
        from voyageai import error as verr

        status = getattr(exc, "http_status", None)
        message = getattr(exc, "user_message", None) or str(exc)
        if isinstance(exc, verr.AuthenticationError) or status in (401, 403):
            return "auth", f"HTTP {status or 401}", None
        if isinstance(exc, verr.Timeout):
            return "retry", "timeout", None
        if isinstance(exc, verr.APIConnectionError):
            return "retry", "connection error", None
        if isinstance(exc, (verr.RateLimitError, verr.ServerError, verr.ServiceUnavailableError, verr.TryAgain)) \
                or status in (408, 425, 429) or (isinstance(status, int) and status >= 500):
            ra = parse_retry_after(_header(getattr(exc, "headers", None), "Retry-After"), self.clock())
            return "retry", f"HTTP {status}" if status else type(exc).__name__, ra
        if status == 400 and _TOKEN_LIMIT_RE.search(message) and _BATCH_RE.search(message):
            return "too_large", f"HTTP 400: {message}", None
        return "fatal", f"HTTP {status}: {message}" if status else f"{type(exc).__name__}: {message}", None

    def _request(self, texts: list[str], input_type: str) -> tuple[np.ndarray, int]:
        from voyageai import error as verr

        client = self.client()
        attempts = self.settings.max_attempts
        for attempt in range(1, attempts + 1):
            self.requests += 1
            try:
                result = client.embed(texts, model=self.model, input_type=input_type, truncation=True,
                                      output_dimension=self._output_dimension)
            except verr.VoyageError as exc:
                kind, reason, retry_after = self._classify(exc)
                if kind == "auth":
                    raise EmbeddingAuthError(AUTH_MESSAGE.format(status=reason.removeprefix("HTTP "))) from exc
                if kind == "too_large" and len(texts) > 1:
                    raise _BatchTooLarge(reason) from exc
                if kind != "retry":
                    raise EmbeddingError(f"Voyage rejected the request ({reason}) — not retried") from exc
                if attempt == attempts:
                    raise EmbeddingError(f"Voyage request failed after {attempts} attempts "
                                         f"(last: {reason})") from exc
                delay = min(retry_after, self.max_retry_after) if retry_after is not None else self._backoff(attempt)
                self.retries.append(RetryEvent(attempt, reason, delay, retry_after))
                self.sleep(delay)
                continue
            except Exception as exc:   # the SDK reads an odd body (e.g. HTTP 52x with JSON) as a success
                raise EmbeddingError(f"Voyage returned an unexpected response ({type(exc).__name__}: {exc}) "
                                     "— not retried") from exc
            try:
                vectors = as_matrix(result.embeddings, len(texts), self.dimension, f"Voyage {self.model}")
                tokens = int(result.total_tokens)
            except EmbeddingError:
                raise
            except Exception as exc:
                raise EmbeddingError(f"Voyage returned an unexpected response ({type(exc).__name__}: {exc}) "
                                     "— not retried") from exc
            self.tokens += tokens
            return vectors, tokens
        raise AssertionError("unreachable")
