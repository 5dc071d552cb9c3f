"""The four answers every front door gives — recall, show, search, status — as plain JSON-ready dicts.

The JSON is exactly what the CLI prints with `--json` (`kb recall`, `kb show`, `kb search`, `kb status`);
the MCP tools (serving/mcp.py) and the HTTP API call these functions so that no door drifts from the others.
Outputs an agent reads are bounded: caller-set limits within hard caps, and an explicit `truncated` flag
wherever something was cut. Bad input raises `ToolInputError` with a one-line message naming the argument.

No MCP, Starlette or Dagster import here; nothing heavy at module load.
"""
from __future__ import annotations

from typing import Any, Sequence

from kb_assets.models import DOCUMENT_KINDS

MAX_QUERIES = 8               # several focused queries, not a dump of every phrasing
MAX_QUERY_CHARS = 2000
MAX_LIMIT = 50                # documents per recall
MAX_CODE_LIMIT = 30
MAX_SEARCH_LIMIT = 50
SEARCH_TEXT_CHARS = 1200      # per chunk in `search`
SHOW_MAX_CHARS = 20_000       # `show` text default cap (a transcript can hold a million characters)
SHOW_HARD_MAX_CHARS = 200_000
STATUS_SKIPPED_FILES = 20     # skipped files listed per source in `status`


class ToolInputError(ValueError):
    """Bad input from a caller: str() is one line naming the argument and what to pass instead."""


# ---------------------------------------------------------------------------------------------- checks
def _text(name: str, value: Any, *, allow_empty: bool = False, max_chars: int = MAX_QUERY_CHARS) -> str:
    if not isinstance(value, str):
        raise ToolInputError(f"{name}: expected a string, got {type(value).__name__}")
    if "\x00" in value:
        raise ToolInputError(f"{name}: contains a NUL byte (\\x00) — remove it")
    if not allow_empty and not value.strip():
        raise ToolInputError(f"{name}: empty — pass a non-empty string")
    if len(value) > max_chars:
        raise ToolInputError(f"{name}: {len(value)} characters, at most {max_chars} — split it into focused queries")
    return value


def _strings(name: str, value: str | Sequence[str] | None) -> list[str] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    out = [_text(f"{name}[{i}]" if len(items) > 1 else name, v, max_chars=200) for i, v in enumerate(items)]
    return out or None


def _bounded_int(name: str, value: Any, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolInputError(f"{name}: expected an integer from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise ToolInputError(f"{name}: {value} is out of range — use {low} to {high}")
    return value


def _queries(queries: str | Sequence[str]) -> list[str]:
    qs = [queries] if isinstance(queries, str) else list(queries or [])
    if not qs:
        raise ToolInputError("queries: empty — pass one query or a list of focused queries")
    if len(qs) > MAX_QUERIES:
        raise ToolInputError(f"queries: {len(qs)} given, at most {MAX_QUERIES} — keep the most focused ones")
    return [_text(f"queries[{i}]" if len(qs) > 1 else "query", q) for i, q in enumerate(qs)]


def _kinds(kind: str | Sequence[str] | None) -> list[str] | None:
    kinds = _strings("kind", kind)
    for k in kinds or []:
        if k not in DOCUMENT_KINDS:
            raise ToolInputError(f"kind: unknown kind {k!r} — use one of {', '.join(DOCUMENT_KINDS)}")
    return kinds


def _date(name: str, value: str | None) -> str | None:
    if value is None or value == "":
        return None
    from kb_assets.query.engine import parse_date

    _text(name, value, max_chars=40)
    if parse_date(value) is None:
        raise ToolInputError(f"{name}: cannot read the date {value!r} — use YYYY-MM-DD")
    return value


def _query_error(exc: Exception) -> ToolInputError:
    return ToolInputError(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)


# ---------------------------------------------------------------------------------------------- answers
def recall_json(cfg, queries: str | Sequence[str], *, limit: int | None = None, code_limit: int | None = None,
                source: str | Sequence[str] | None = None, kind: str | Sequence[str] | None = None,
                tag: str | Sequence[str] | None = None, since: str | None = None, until: str | None = None,
                path_prefix: str | None = None, passage: bool = False, embedder=None) -> dict[str, Any]:
    """The JSON of `kb recall --json` (one query, or the union of several). `embedder`: the query encoder to
    use (kb serve passes its own: one pass at a time, the query-vector cache); default the config's."""
    from kb_assets.query import QueryError, recall

    qs = _queries(queries)
    kwargs = dict(limit=_bounded_int("limit", limit, 1, MAX_LIMIT),
                  code_limit=_bounded_int("code_limit", code_limit, 0, MAX_CODE_LIMIT),
                  source=_strings("source", source), kind=_kinds(kind), tag=_strings("tag", tag),
                  since=_date("since", since), until=_date("until", until),
                  path_prefix=_text("path_prefix", path_prefix, max_chars=500) if path_prefix else None,
                  include_passage=bool(passage))
    try:
        result = recall(qs if len(qs) > 1 else qs[0], config=cfg, embedder=embedder, **kwargs)
    except QueryError as exc:
        raise _query_error(exc) from None
    return result.to_dict()


def show_json(cfg, doc_id: str, *, max_chars: int | None = None) -> dict[str, Any]:
    """The JSON of `kb show --json`; `text` cut to `max_chars` (default 20,000) with `truncated: true` and
    `text_chars` (the whole length) when longer."""
    from kb_assets.query import QueryError, show

    doc_id = _text("id", doc_id, max_chars=2000)
    cap = _bounded_int("max_chars", max_chars, 1000, SHOW_HARD_MAX_CHARS) or SHOW_MAX_CHARS
    try:
        doc = show(doc_id, config=cfg)
    except QueryError as exc:
        raise _query_error(exc) from None
    return bound_show(doc, cap)


def bound_show(doc: dict[str, Any], max_chars: int) -> dict[str, Any]:
    text = doc.get("text") or ""
    if len(text) <= max_chars:
        return doc
    cut = text.rfind("\n", 0, max_chars)
    cut = cut if cut > max_chars * 0.8 else max_chars
    return {**doc, "text": text[:cut], "truncated": True, "text_chars": len(text),
            "truncated_note": f"text cut at {cut} of {len(text)} characters; pass a larger max_chars "
                              f"(≤ {SHOW_HARD_MAX_CHARS}) or open {doc.get('path')} in the source"}


def search_json(cfg, query: str, *, limit: int | None = None) -> dict[str, Any]:
    """The JSON of `kb search --json`, each chunk's text cut to 1,200 characters (`truncated` per chunk and
    overall)."""
    from kb_assets.query import QueryError
    from kb_assets.query.chunk_search import search_chunks
    from kb_assets.query.engine import _connection_for

    query = _text("query", query)
    n = _bounded_int("limit", limit, 1, MAX_SEARCH_LIMIT) or 10
    try:
        hits = search_chunks(_connection_for(cfg), cfg, query, limit=n)
    except (QueryError, RuntimeError) as exc:   # e.g. the index was built with another model
        raise _query_error(exc) from None
    any_cut = False
    for h in hits:
        text = h.get("text") or ""
        h["truncated"] = len(text) > SEARCH_TEXT_CHARS
        if h["truncated"]:
            h["text"] = text[:SEARCH_TEXT_CHARS]
            any_cut = True
    return {"query": query, "chunks": hits, "truncated": any_cut}


def status_json(cfg, *, skipped_files: int = STATUS_SKIPPED_FILES) -> dict[str, Any]:
    """`status_report` with at most `skipped_files` skipped files listed per source (`skipped_files_truncated`
    says when more exist; `skipped` and `skip_reasons` always count them all)."""
    from kb_assets.query.engine import _connection_for
    from kb_assets.store.status import status_report   # the one the CLI and the HTTP API use

    report = status_report(_connection_for(cfg), [s.key for s in cfg.sources], config=cfg)
    for r in report["sources"]:
        files = r.get("skipped_files") or []
        r["skipped_files_truncated"] = len(files) > skipped_files
        r["skipped_files"] = files[:skipped_files]
        r["signpost_failures"] = (r.get("signpost_failures") or [])[:skipped_files]
    return report


def warm_up(cfg) -> None:
    """Start the database and load the query encoder ahead of the first call (a long-lived server calls this
    in a background thread at start, so an agent's first question does not pay for them). Failures are
    left for the first real call to report."""
    try:
        from kb_assets.query.engine import _connection_for, _embedder_for

        _connection_for(cfg)
        emb = _embedder_for(cfg)
        if getattr(emb, "query_encoder", None) is not None and emb.query_encoder() == "numpy":
            from kb_assets.embedding.numpy_bert import encoder_for

            encoder_for(emb.path).encode(["warm up"])
    except Exception:   # noqa: BLE001 — reported by the first call instead, with its one-line message
        pass


# ---------------------------------------------------------------------------------------------- projections
TIER_MAX_CHARS = 60_000        # a T0 of ~2,000 entries; more is cut with `truncated` (pass max_chars)
TIER_HARD_MAX_CHARS = 1_000_000
MAX_RELATED_DEPTH = 3


def tier_json(cfg, tier: int, type_: str | None = None, *, max_chars: int | None = None) -> dict[str, Any]:
    """A projection file as `kb tier TIER [TYPE]` prints it: {"tier", "type", "text", "chars", "truncated"}.
    0 = the index (one line per entry), 1 = the list of types, 1 + type = that type's entries with "use when"
    (type `code`: the code maps), 3 = the relations graph. Tier 2 is one document: use `show`."""
    from kb_assets.projections.commands import ProjectionsMissing, tier_text

    if isinstance(tier, bool) or tier not in (0, 1, 3):
        raise ToolInputError(f"tier: {tier!r} — use 0 (the index), 1 [type] (per type) or 3 (relations); "
                             "tier 2 is one document: use show (kb:<id>)")
    if type_ is not None:
        type_ = _text("type", type_, max_chars=60).strip()
        if not type_.replace("_", "").replace("-", "").isalnum():
            raise ToolInputError(f"type: {type_!r} is not a type name — tier 1 without a type lists them")
        if tier != 1:
            raise ToolInputError("type: only tier 1 takes a type")
    cap = _bounded_int("max_chars", max_chars, 1000, TIER_HARD_MAX_CHARS) or TIER_MAX_CHARS
    try:
        text = tier_text(cfg, tier, type_ or None)
    except ProjectionsMissing as exc:
        raise ProjectionsNotFound(str(exc)) from None
    out: dict[str, Any] = {"tier": tier, "type": type_ or None, "chars": len(text), "truncated": len(text) > cap}
    if out["truncated"]:
        cut = text.rfind("\n", 0, cap)
        text = text[:cut + 1 if cut > 0 else cap]
        out["truncated_note"] = (f"cut at {len(text)} of {out['chars']} characters (whole lines); pass a larger "
                                 f"max_chars (≤ {TIER_HARD_MAX_CHARS}), or read tier 1 per type")
    out["text"] = text
    return out


class ProjectionsNotFound(ToolInputError):
    """No projection file yet, or no such type (str(): what to run or which types exist)."""


def tags_json(cfg, *, conn=None) -> dict[str, Any]:
    """The JSON of `kb tags --json`: tags in use with their by-tag files, vocabulary tags unused, tags outside."""
    from kb_assets.projections.report import tags_report
    from kb_assets.query.engine import _connection_for

    return tags_report(conn if conn is not None else _connection_for(cfg), cfg)


def related_json(cfg, doc_id: str, *, depth: int | None = None, conn=None) -> dict[str, Any]:
    """The JSON of `kb related ID --json`: the document's edges (supersedes, amends, references, touches…)
    up to `depth` hops (1-3, default 1), both directions."""
    from kb_assets.query import QueryError, parse_id
    from kb_assets.query.engine import _connection_for
    from kb_assets.query.relations import related

    doc_id = _text("id", doc_id, max_chars=2000).strip()
    hops = _bounded_int("depth", depth, 1, MAX_RELATED_DEPTH) or 1
    try:
        src, path = parse_id(doc_id)
    except QueryError as exc:
        raise _query_error(exc) from None
    out = related(conn if conn is not None else _connection_for(cfg), src, path, depth=hops)
    if not out["found"]:
        raise ProjectionsNotFound(f"no document {out['id']} in the index (ids as printed by recall / tier 0)")
    return out
