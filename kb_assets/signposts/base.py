"""The Signposter protocol, its input/result shapes, errors, and the factory from a KbConfig."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class SignpostInput:
    title: str
    kind: str                    # one of kb_assets.models.DOCUMENT_KINDS
    path: str                    # POSIX, relative to the source root
    text: str                    # redacted text
    meta: dict[str, Any] = field(default_factory=dict)
    blocks: dict | None = None   # documents.blocks: the documents stage's block scan of `text` (migration 008)


@dataclass
class SignpostResult:
    payload: dict                # validated DocumentSignpost / CodeSignpost as a dict
    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    model_used: str = ""         # the model that produced it (the fallback model if the primary's output failed)
    calls: int = 0               # API calls made (all attempts, including failed ones); 0 for extractive
    rate_limited: int = 0        # 429 answers seen while generating (feeds the runner's AIMD pool)
    segments: int = 1            # > 1 when a long document was split and merged


class SignpostError(Exception):
    """Generation failed for this document; the message is readable and goes into signpost_state.last_error."""

    def __init__(self, message: str, *, attempts: int = 0, calls: int = 0, rate_limited: int = 0,
                 input_tokens: int = 0, output_tokens: int = 0):
        super().__init__(message)
        self.attempts = attempts
        self.calls = calls
        self.rate_limited = rate_limited
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens


class SignpostAuthError(SignpostError):
    """The API rejected the key (401/403 or API_KEY_INVALID): the run stops; no document is marked failed."""


class SignpostQuotaError(SignpostError):
    """The API asked us to wait longer than is sensible (quota exhausted for the day, ...): the run stops."""


@runtime_checkable
class Signposter(Protocol):
    generator: str               # "extractive" | "gemini"
    model: str                   # '' for extractive; the primary model for an LLM
    prompt_version: str

    def generate(self, doc: SignpostInput) -> SignpostResult: ...


def gemini_api_key() -> str:
    from kb_assets.config import GEMINI_KEY_ENVS

    for name in GEMINI_KEY_ENVS:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return ""


def make_signposter(cfg) -> Signposter:
    """The configured signposter. Lazy: no client and no network until the first generate()."""
    if cfg.signposter == "gemini":
        from kb_assets.signposts.gemini import GeminiSignposter

        return GeminiSignposter(cfg.gemini, gemini_api_key())
    from kb_assets.signposts.extractive_signposter import ExtractiveSignposter

    return ExtractiveSignposter()
