"""The signpost shapes: what an agent reads to decide whether a document is worth opening.

Two shapes, validated with pydantic and versioned:
- DocumentSignpost for every document kind except code (ADRs, docs, sessions, transcripts, work items, ...);
- CodeSignpost, lighter, for source files.

The same models are the Gemini response schema (JSON mode) and the validator of whatever comes back, and the
extractive generator fills them too, so the query layer sees one shape per kind whoever made it.

SCHEMA_VERSION changes when the shape changes (stored with each signpost). PROMPT_VERSION changes when the LLM
instructions change; it is part of an LLM signpost's identity, so bumping it regenerates every LLM signpost. Bump
it together with SCHEMA_VERSION. (The extractive generator versions itself: extractive_signposter.ALGORITHM_VERSION.)
"""
from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

SCHEMA_VERSION = 1
PROMPT_VERSION = "sp-2026.11-1"

# Caps applied when validating (what an agent reads must stay short; an LLM sometimes rambles).
MAX_SUMMARY_CHARS = 1200
MAX_ITEM_CHARS = 400
MAX_LIST = {"work_types": 8, "key_decisions": 12, "artifacts": 40, "components": 25, "tags": 15,
            "key_functions": 40, "tables": 30, "endpoints": 40}

_WS = re.compile(r"\s+")


def clean_text(value: Any, limit: int) -> str:
    text = _WS.sub(" ", str(value or "")).strip()
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    sp = cut.rfind(" ")
    if sp > limit * 0.6:
        cut = cut[:sp]
    return cut.rstrip(" ,;:-") + "…"


def dedupe_strings(values: Any, limit: int, *, item_chars: int = MAX_ITEM_CHARS, lower: bool = False) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for v in values or []:
        s = clean_text(v, item_chars)
        if lower:
            s = s.lower()
        key = s.lower()
        if not s or key in seen:
            continue
        seen.add(key)
        out.append(s)
        if len(out) >= limit:
            break
    return out


class _Model(BaseModel):
    # LLM output may carry extra keys: ignore them rather than fail the document.
    model_config = ConfigDict(extra="ignore")


class Decision(_Model):
    decision: str = Field(description="What was decided, one sentence, imperative or declarative.")
    rationale: str = Field("", description="Why: the reason, trade-off or constraint behind it.")

    @field_validator("decision", "rationale", mode="before")
    @classmethod
    def _clean(cls, v: Any) -> str:
        return clean_text(v, MAX_ITEM_CHARS)


class KeyFunction(_Model):
    name: str = Field(description="Function, class or method name as written in the code.")
    does: str = Field("", description="What it does, one short line.")

    @field_validator("name", "does", mode="before")
    @classmethod
    def _clean(cls, v: Any) -> str:
        return clean_text(v, MAX_ITEM_CHARS)


class DocumentSignpost(_Model):
    summary: str = Field(description="2-4 sentences: what the document is about, what it concludes or decides, "
                                     "and when a developer or agent would need it.")
    work_types: list[str] = Field(default_factory=list, description="Open labels for the kind of work, e.g. "
                                  "decision, migration, bugfix, refactor, infrastructure, security, api.")
    key_decisions: list[Decision] = Field(default_factory=list, description="Decisions made, each with rationale.")
    artifacts: list[str] = Field(default_factory=list, description="File paths, modules or resources touched or "
                                 "named, exactly as written.")
    components: list[str] = Field(default_factory=list, description="Systems, services, libraries or components.")
    tags: list[str] = Field(default_factory=list, description="Short topical tags, lowercase.")
    status: str = Field("", description="Document status if stated (Accepted, Proposed, Superseded, Draft, ...).")

    @field_validator("summary", mode="before")
    @classmethod
    def _summary(cls, v: Any) -> str:
        return clean_text(v, MAX_SUMMARY_CHARS)

    @field_validator("status", mode="before")
    @classmethod
    def _status(cls, v: Any) -> str:
        return clean_text(v, 80)

    @field_validator("work_types", "tags", mode="before")
    @classmethod
    def _labels(cls, v: Any, info) -> list[str]:
        return dedupe_strings(v, MAX_LIST[info.field_name], item_chars=60, lower=True)

    @field_validator("artifacts", "components", mode="before")
    @classmethod
    def _lists(cls, v: Any, info) -> list[str]:
        return dedupe_strings(v, MAX_LIST[info.field_name], item_chars=200)

    @field_validator("key_decisions", mode="before")
    @classmethod
    def _decisions(cls, v: Any) -> list[Any]:
        out, seen = [], set()
        for d in v or []:
            text = d.get("decision", "") if isinstance(d, dict) else getattr(d, "decision", d)
            key = _WS.sub(" ", str(text or "")).strip().lower()
            if not key or key in seen:
                continue
            seen.add(key)
            out.append(d)
            if len(out) >= MAX_LIST["key_decisions"]:
                break
        return out


class CodeSignpost(_Model):
    purpose: str = Field(description="1-2 sentences: what this file is for and when to open it.")
    key_functions: list[KeyFunction] = Field(default_factory=list, description="Public functions/classes.")
    tables: list[str] = Field(default_factory=list, description="Database tables read or written.")
    endpoints: list[str] = Field(default_factory=list, description="HTTP routes served or called, "
                                 "e.g. 'GET /users/{id}'.")

    @field_validator("purpose", mode="before")
    @classmethod
    def _purpose(cls, v: Any) -> str:
        return clean_text(v, MAX_SUMMARY_CHARS)

    @field_validator("tables", "endpoints", mode="before")
    @classmethod
    def _lists(cls, v: Any, info) -> list[str]:
        return dedupe_strings(v, MAX_LIST[info.field_name], item_chars=200)

    @field_validator("key_functions", mode="before")
    @classmethod
    def _functions(cls, v: Any) -> list[Any]:
        out, seen = [], set()
        for f in v or []:
            name = f.get("name", "") if isinstance(f, dict) else getattr(f, "name", f)
            key = str(name or "").strip()
            if not key or key in seen:
                continue
            seen.add(key)
            out.append(f)
            if len(out) >= MAX_LIST["key_functions"]:
                break
        return out


def schema_for(kind: str) -> type[DocumentSignpost] | type[CodeSignpost]:
    return CodeSignpost if kind == "code" else DocumentSignpost


def validate_payload(kind: str, payload: dict) -> dict:
    """Validate and normalise a payload for a document kind; raises pydantic.ValidationError."""
    return schema_for(kind).model_validate(payload).model_dump()
