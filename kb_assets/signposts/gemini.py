"""Gemini signposts: JSON mode with a response schema, through the google-genai SDK.

- The response schema is the pydantic model (DocumentSignpost or CodeSignpost). `response.parsed` is silently
  None on invalid or truncated JSON, so the text is validated here with pydantic, and finish_reason MAX_TOKENS
  is checked explicitly.
- Truncated or unparseable output (or a primary model that no longer exists, 404): one retry on the fallback
  model with the higher output limit.
- 429: wait the server's RetryInfo retryDelay (else exponential backoff); 5xx, timeouts and connection errors:
  exponential backoff with jitter; both up to `max_attempts`. 401/403 (or API_KEY_INVALID): SignpostAuthError at
  once. A retry delay longer than MAX_HONOURED_RETRY_DELAY (a daily quota) raises SignpostQuotaError.
- Documents longer than `max_input_tokens` (4 chars/token) are split at paragraph / turn boundaries, signposted
  per segment and merged.
- Lazy: the genai.Client is created at the first generate() and kept (it closes itself when collected).
"""
from __future__ import annotations

import json
import logging
import math
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pydantic import ValidationError

from kb_assets.signposts.base import (
    SignpostAuthError,
    SignpostError,
    SignpostInput,
    SignpostQuotaError,
    SignpostResult,
)
from kb_assets.signposts.schema import (
    MAX_SUMMARY_CHARS,
    PROMPT_VERSION,
    CodeSignpost,
    DocumentSignpost,
    clean_text,
    schema_for,
)

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
PROMPT_OVERHEAD_TOKENS = 700          # system instruction + response schema + the header of the user message
OUTPUT_ESTIMATE_TOKENS = {"document": 450, "code": 350}
MAX_HONOURED_RETRY_DELAY = 300.0       # seconds; longer means a daily quota: stop the run instead of sleeping
BACKOFF_BASE = 1.0
BACKOFF_CAP = 60.0
META_CHARS = 2000

DOC_INSTRUCTION = """You write signposts: short, factual index cards that let a coding agent decide whether a \
document is worth opening, without opening it.

Rules:
- Use only what the document says. Never invent decisions, files or components. Empty lists are fine.
- summary: 2-4 sentences (at most ~80 words): what the document is about, what it concludes or decides, and \
when a developer would need it. No preamble such as "This document".
- key_decisions: each decision the document makes or records (chosen options, adopted approaches, rules), as one \
sentence, with its rationale: the reason, constraint or trade-off the document gives. Rejected options may be \
listed as decisions phrased "Rejected: ...". At most 12.
- artifacts: file paths, directories, modules, database tables and other concrete resources named or touched, \
written exactly as in the document. At most 40.
- components: systems, services, libraries and subsystems involved. At most 25.
- tags: short lowercase topical tags (use the document's own tags when it has them). At most 15.
- work_types: open lowercase labels for the kind of work, e.g. decision, design, migration, bugfix, refactor, \
infrastructure, security, performance, api, documentation, testing, session. At most 8.
- status: the document's status if stated (Accepted, Proposed, Superseded by ..., Draft, Final, ...), else "".
Return only JSON matching the response schema."""

CODE_INSTRUCTION = """You write signposts for source files: short, factual index cards that let a coding agent \
decide whether a file is worth opening, without opening it.

Rules:
- Use only what the code says. Never invent names.
- purpose: 1-2 sentences: what this file is for and when someone would open it.
- key_functions: the public functions, classes and methods that matter, each with one short line on what it \
does. At most 40.
- tables: database tables the code reads or writes (from SQL or ORM definitions). At most 30.
- endpoints: HTTP routes the file serves or calls, as "METHOD /path". At most 40.
Return only JSON matching the response schema."""


# ================================================================================================ estimates

def segment_budget_chars(max_input_tokens: int) -> int:
    return max(2_000, (max_input_tokens - PROMPT_OVERHEAD_TOKENS) * CHARS_PER_TOKEN)


def estimate_tokens_for_length(n_chars: int, kind: str, *, max_input_tokens: int = 200_000) -> tuple[int, int]:
    """(input, output) tokens one Gemini signpost of a text of n_chars is expected to cost (4 chars/token)."""
    segments = max(1, math.ceil(n_chars / segment_budget_chars(max_input_tokens)))
    input_tokens = math.ceil(n_chars / CHARS_PER_TOKEN) + segments * PROMPT_OVERHEAD_TOKENS
    output_tokens = segments * OUTPUT_ESTIMATE_TOKENS["code" if kind == "code" else "document"]
    return input_tokens, output_tokens


def estimate_signpost_tokens(text: str, kind: str, *, max_input_tokens: int = 200_000) -> tuple[int, int]:
    """(input, output) tokens one Gemini signpost of this text is expected to cost."""
    return estimate_tokens_for_length(len(text), kind, max_input_tokens=max_input_tokens)


def estimate_cost_usd(settings, input_tokens: int, output_tokens: int) -> float:
    return (input_tokens * settings.price_input_per_million_tokens
            + output_tokens * settings.price_output_per_million_tokens) / 1_000_000


# ================================================================================================ segments

def split_segments(text: str, max_chars: int) -> list[str]:
    """Split at paragraph / turn boundaries (blank lines), then lines, then hard cuts; each piece ≤ max_chars."""
    if len(text) <= max_chars:
        return [text]
    blocks = re.split(r"(\n\s*\n)", text)
    pieces: list[str] = []
    for i in range(0, len(blocks), 2):
        block = blocks[i] + (blocks[i + 1] if i + 1 < len(blocks) else "")
        if len(block) <= max_chars:
            pieces.append(block)
            continue
        for line in block.splitlines(keepends=True):
            while len(line) > max_chars:
                pieces.append(line[:max_chars])
                line = line[max_chars:]
            pieces.append(line)
    segments: list[str] = []
    buf: list[str] = []
    size = 0
    for p in pieces:
        if size + len(p) > max_chars and buf:
            segments.append("".join(buf))
            buf, size = [], 0
        buf.append(p)
        size += len(p)
    if buf:
        segments.append("".join(buf))
    return [s for s in segments if s.strip()] or [text[:max_chars]]


def _dedupe(items: list[Any], key: Callable[[Any], str]) -> list[Any]:
    out, seen = [], set()
    for it in items:
        k = key(it)
        if k and k not in seen:
            seen.add(k)
            out.append(it)
    return out


def _norm(s: Any) -> str:
    return re.sub(r"\W+", " ", str(s or "").lower()).strip()


def merge_payloads(kind: str, payloads: list[dict]) -> dict:
    """Merge per-segment signposts: summaries joined then shortened; lists concatenated and deduped."""
    if len(payloads) == 1:
        return payloads[0]
    if kind == "code":
        return {
            "purpose": payloads[0].get("purpose", ""),
            "key_functions": _dedupe([f for p in payloads for f in p.get("key_functions", [])],
                                     lambda f: str(f.get("name", ""))),
            "tables": _dedupe([t for p in payloads for t in p.get("tables", [])], _norm),
            "endpoints": _dedupe([e for p in payloads for e in p.get("endpoints", [])], _norm),
        }
    first = payloads[0].get("summary", "")
    rest = []
    for p in payloads[1:]:
        s = str(p.get("summary", "")).strip()
        if s:
            m = re.match(r"(.+?[.!?])(\s|$)", s)
            rest.append(m.group(1) if m else s)
    summary = clean_text(" ".join([first] + rest), MAX_SUMMARY_CHARS)
    return {
        "summary": summary,
        "work_types": _dedupe([w for p in payloads for w in p.get("work_types", [])], _norm),
        "key_decisions": _dedupe([d for p in payloads for d in p.get("key_decisions", [])],
                                 lambda d: _norm(d.get("decision", ""))),
        "artifacts": _dedupe([a for p in payloads for a in p.get("artifacts", [])], lambda a: str(a).strip()),
        "components": _dedupe([c for p in payloads for c in p.get("components", [])], _norm),
        "tags": _dedupe([t for p in payloads for t in p.get("tags", [])], _norm),
        "status": next((p.get("status") for p in payloads if p.get("status")), ""),
    }


# ================================================================================================ errors

def _transient_exceptions() -> tuple[type[BaseException], ...]:
    found: list[type[BaseException]] = [TimeoutError, ConnectionError]
    for mod in ("httpx", "httpx2"):
        try:
            m = __import__(mod)
        except ImportError:
            continue
        for name in ("TimeoutException", "TransportError"):
            cls = getattr(m, name, None)
            if isinstance(cls, type):
                found.append(cls)
    return tuple(found)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*s\s*$")


def retry_delay_seconds(exc: Any) -> float | None:
    """RetryInfo.retryDelay ("7s", "0.5s") from a google.rpc error body, else a Retry-After header."""
    body = getattr(exc, "details", None)
    err = body.get("error", body) if isinstance(body, dict) else {}
    details = err.get("details", []) if isinstance(err, dict) else []
    for d in details or []:
        if isinstance(d, dict) and str(d.get("@type", "")).endswith("google.rpc.RetryInfo"):
            raw = d.get("retryDelay")
            if isinstance(raw, dict):          # {"seconds": 7, "nanos": 0}
                return float(raw.get("seconds", 0)) + float(raw.get("nanos", 0)) / 1e9
            m = _DURATION.match(str(raw or ""))
            if m:
                return float(m.group(1))
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is not None:
        try:
            ra = headers.get("retry-after")
        except Exception:
            ra = None
        if ra:
            try:
                return float(ra)
            except ValueError:
                return None
    return None


def _is_key_rejection(exc: Any) -> bool:
    code = getattr(exc, "code", None)
    if code in (401, 403):
        return True
    if code == 400:
        text = f"{getattr(exc, 'message', '')} {json.dumps(getattr(exc, 'details', ''), default=str)}"
        return "API_KEY_INVALID" in text or "API key not valid" in text or "API key expired" in text
    return False


class _ModelMissing(Exception):
    pass


# ================================================================================================ the signposter

@dataclass
class _Usage:
    calls: int = 0
    attempts: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    rate_limited: int = 0
    models: list[str] = field(default_factory=list)


class GeminiSignposter:
    generator = "gemini"

    def __init__(self, settings, api_key: str, *, sleep: Callable[[float], None] = time.sleep,
                 rand: Callable[[], float] = random.random):
        self.settings = settings
        self.model = settings.model
        self.fallback_model = settings.fallback_model
        self.prompt_version = PROMPT_VERSION
        self._api_key = (api_key or "").strip()
        self._sleep = sleep
        self._rand = rand
        self._client = None
        self._client_lock = threading.Lock()
        # Called (from worker threads) on every 429, so a runner's worker pool can shrink at once.
        self.rate_limit_listener: Callable[[], None] | None = None

    # -- plumbing -------------------------------------------------------------------------------------------
    def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
        return estimate_cost_usd(self.settings, input_tokens, output_tokens)

    def _get_client(self):
        with self._client_lock:
            if self._client is None:
                from google import genai
                from google.genai import types

                opts: dict[str, Any] = {"timeout": int(self.settings.timeout_seconds * 1000)}
                if self.settings.base_url:
                    opts["base_url"] = self.settings.base_url
                self._client = genai.Client(api_key=self._api_key, http_options=types.HttpOptions(**opts))
            return self._client

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                try:
                    self._client.close()
                finally:
                    self._client = None

    def _backoff(self, attempt: int) -> float:
        base = min(BACKOFF_CAP, BACKOFF_BASE * (2 ** (attempt - 1)))
        return base * (0.5 + self._rand())          # jitter: 0.5x – 1.5x

    @staticmethod
    def _thinking(model: str):
        """Signposts need no long reasoning. 2.5 models take a budget, 3.x a level; aliases: leave the default."""
        from google.genai import types

        m = model.lower()
        try:
            if m.startswith("gemini-2.5-flash"):
                return types.ThinkingConfig(thinking_budget=0)
            if m.startswith("gemini-2.5-pro"):
                return types.ThinkingConfig(thinking_budget=128)
            if m.startswith("gemini-3"):
                return types.ThinkingConfig(thinking_level="LOW")
        except Exception:  # an older SDK without thinking_level: let the server decide
            return None
        return None

    # -- the API call with retries --------------------------------------------------------------------------
    def _call(self, model: str, max_output_tokens: int, contents: str, kind: str, usage: _Usage):
        from google.genai import errors, types

        schema = schema_for(kind)
        config = types.GenerateContentConfig(
            system_instruction=CODE_INSTRUCTION if kind == "code" else DOC_INSTRUCTION,
            temperature=self.settings.temperature,
            max_output_tokens=max_output_tokens,
            response_mime_type="application/json",
            response_schema=schema,
            thinking_config=self._thinking(model),
        )
        client = self._get_client()
        transient = _transient_exceptions()
        max_attempts = self.settings.max_attempts
        attempt = 0
        while True:
            attempt += 1
            usage.calls += 1
            usage.attempts = max(usage.attempts, attempt)
            try:
                response = client.models.generate_content(model=model, contents=contents, config=config)
            except errors.ClientError as exc:
                code = exc.code
                if _is_key_rejection(exc):
                    said = f" Server said: {exc.message}" if exc.message else ""
                    raise SignpostAuthError(f"Gemini rejected the API key ({code} {exc.status or ''}".rstrip()
                                            + f"): check GEMINI_API_KEY.{said}", attempts=attempt) from None
                if code == 429:
                    usage.rate_limited += 1
                    if self.rate_limit_listener is not None:
                        self.rate_limit_listener()
                    delay = retry_delay_seconds(exc)
                    if delay is not None and delay > MAX_HONOURED_RETRY_DELAY:
                        raise SignpostQuotaError(
                            f"Gemini quota exhausted for {model} (429, retry in {delay:.0f}s): {exc.message}",
                            attempts=attempt) from None
                    if attempt >= max_attempts:
                        raise SignpostError(f"rate limited by Gemini (429) on {attempt} attempts for {model}: "
                                            f"{exc.message}", attempts=attempt) from None
                    wait = delay + self._rand() * min(1.0, 0.1 * delay) if delay is not None \
                        else self._backoff(attempt)
                    log.info("Gemini 429 for %s: waiting %.1fs (attempt %d/%d)", model, wait, attempt, max_attempts)
                    self._sleep(wait)
                    continue
                if code == 404:
                    raise _ModelMissing(f"model {model} not found (404): {exc.message}") from None
                if code == 408:
                    err_text = f"request timeout (408) from {model}"
                else:
                    raise SignpostError(f"Gemini rejected the request for {model} ({code} {exc.status}): "
                                        f"{exc.message}", attempts=attempt) from None
            except errors.ServerError as exc:
                err_text = f"Gemini server error {exc.code} {exc.status or ''} from {model}: {exc.message}"
            except transient as exc:  # timeouts, connection resets
                err_text = f"{type(exc).__name__} calling Gemini {model} (timeout {self.settings.timeout_seconds:g}s)"
            else:
                meta = getattr(response, "usage_metadata", None)
                if meta is not None:
                    usage.input_tokens += int(meta.prompt_token_count or 0)
                    usage.output_tokens += int(meta.candidates_token_count or 0) + int(meta.thoughts_token_count or 0)
                return response
            if attempt >= max_attempts:
                raise SignpostError(f"{err_text} — gave up after {attempt} attempts", attempts=attempt)
            wait = self._backoff(attempt)
            log.info("%s: retrying in %.1fs (attempt %d/%d)", err_text, wait, attempt, max_attempts)
            self._sleep(wait)

    @staticmethod
    def _parse(response, kind: str) -> tuple[dict | None, str]:
        from google.genai import types

        candidates = getattr(response, "candidates", None) or []
        if not candidates:
            fb = getattr(response, "prompt_feedback", None)
            reason = getattr(fb, "block_reason", None) if fb else None
            return None, f"no output (blocked: {reason})" if reason else "no output (no candidates)"
        cand = candidates[0]
        finish = cand.finish_reason
        parts = (cand.content.parts if cand.content and cand.content.parts else [])
        text = "".join(p.text for p in parts if getattr(p, "text", None) and not getattr(p, "thought", False))
        if finish == types.FinishReason.MAX_TOKENS:
            return None, f"output truncated (finish_reason MAX_TOKENS after {len(text)} chars)"
        body = text.strip()
        fence = re.match(r"^```(?:json)?\s*(.*?)\s*```$", body, re.S)
        if fence:
            body = fence.group(1)
        try:
            obj = schema_for(kind).model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {}
            what = first.get("msg", str(exc))[:160]
            fin = getattr(finish, "name", finish)
            return None, f"unparseable output (finish_reason {fin}): {what}; starts {body[:60]!r}"
        return obj.model_dump(), ""

    # -- one segment: primary, then the fallback once --------------------------------------------------------
    def _segment(self, contents: str, kind: str, usage: _Usage) -> dict:
        problem = ""
        try:
            response = self._call(self.model, self.settings.max_output_tokens, contents, kind, usage)
            payload, problem = self._parse(response, kind)
            if payload is not None:
                usage.models.append(self.model)
                return payload
        except _ModelMissing as exc:
            problem = str(exc)
        fallback = self.fallback_model
        if not fallback:
            raise SignpostError(f"{self.model}: {problem} (no fallback model configured)", attempts=usage.attempts)
        log.info("Gemini %s: %s — retrying once on %s", self.model, problem, fallback)
        try:
            response = self._call(fallback, self.settings.fallback_max_output_tokens, contents, kind, usage)
        except _ModelMissing as exc:
            raise SignpostError(f"{self.model}: {problem}; fallback {exc}", attempts=usage.attempts) from None
        payload, problem2 = self._parse(response, kind)
        if payload is None:
            raise SignpostError(f"{self.model}: {problem}; fallback {fallback}: {problem2}", attempts=usage.attempts)
        usage.models.append(fallback)
        return payload

    @staticmethod
    def _contents(doc: SignpostInput, segment: str, index: int, total: int) -> str:
        meta = {k: v for k, v in (doc.meta or {}).items() if v not in (None, "", [], {})}
        meta_text = json.dumps(meta, ensure_ascii=False, default=str)
        if len(meta_text) > META_CHARS:
            meta_text = meta_text[:META_CHARS] + "…"
        head = [f"Kind: {doc.kind}", f"Path: {doc.path}", f"Title: {doc.title}"]
        if meta:
            head.append(f"Metadata: {meta_text}")
        if total > 1:
            head.append(f"This is part {index + 1} of {total} of a long document; describe only this part "
                        "(the parts are merged afterwards).")
        tag = "code" if doc.kind == "code" else "document"
        return "\n".join(head) + f"\n\n<{tag}>\n{segment}\n</{tag}>"

    def generate(self, doc: SignpostInput) -> SignpostResult:
        if not self._api_key:
            raise SignpostAuthError("GEMINI_API_KEY is not set: export GEMINI_API_KEY=... "
                                    "or set 'signposter: extractive'")
        t0 = time.perf_counter()
        usage = _Usage()
        segments = split_segments(doc.text, segment_budget_chars(self.settings.max_input_tokens))
        try:
            payloads = [self._segment(self._contents(doc, seg, i, len(segments)), doc.kind, usage)
                        for i, seg in enumerate(segments)]
            model_cls = CodeSignpost if doc.kind == "code" else DocumentSignpost
            payload = model_cls.model_validate(merge_payloads(doc.kind, payloads)).model_dump()
        except SignpostError as exc:
            exc.calls, exc.rate_limited = usage.calls, usage.rate_limited
            exc.input_tokens, exc.output_tokens = usage.input_tokens, usage.output_tokens
            exc.attempts = max(exc.attempts, usage.attempts)
            raise
        used = [m for m in usage.models if m != self.model]
        return SignpostResult(
            payload=payload,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            seconds=time.perf_counter() - t0,
            model_used=used[0] if used else self.model,
            calls=usage.calls,
            rate_limited=usage.rate_limited,
            segments=len(segments),
        )
