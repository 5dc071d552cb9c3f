"""Checks of what callers pass to recall() and search (issue 12 §1, §7): bad input is one clear error, never a
psycopg.DataError (a NUL byte), a TypeError in the tokenizer (a lone surrogate) or in the engine (a number),
and never silently ignored (a limit past what can be returned, `since` after `until`, an empty search).

QueryInputError is a QueryError (library callers catch both alike); the CLI exits 2 on it, as on a
configuration mistake. Kept free of heavy imports (kb_assets.query must stay cheap to import).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import date
from typing import Any

from kb_assets.query.engine import QueryError

# recall returns documents from one candidate window (QuerySettings.documents_limit has the same bound):
# a larger limit could not be honoured, so it is refused with the maximum rather than silently capped.
MAX_LIMIT = 200
MAX_SEARCH_LIMIT = 200
_SURROGATE_RE = re.compile("[\ud800-\udfff]")


class QueryInputError(QueryError):
    """The caller's input cannot be a query: str() says what is wrong and what is accepted."""


def check_query_text(q: Any, what: str = "query") -> str:
    if not isinstance(q, str):
        raise QueryInputError(f"{what} must be a string, not {type(q).__name__} ({q!r:.40})")
    if "\x00" in q:
        raise QueryInputError(f"{what} contains a NUL character: remove it")
    m = _SURROGATE_RE.search(q)
    if m:
        raise QueryInputError(f"{what} is not valid Unicode (a lone surrogate \\u{ord(m.group()):04x} at "
                              f"position {m.start()}): send UTF-8 text")
    if not q.strip():
        raise QueryInputError(f"{what} is empty: pass a non-empty string")
    return q


def check_queries(queries: Any) -> list[str]:
    """One query (str) or several (a list of str), each checked."""
    if isinstance(queries, str):
        return [check_query_text(queries)]
    if not isinstance(queries, Sequence) or isinstance(queries, (bytes, bytearray)):
        raise QueryInputError(f"query must be a string or a list of strings, not {type(queries).__name__} "
                              f"({queries!r:.40})")
    if not queries:
        raise QueryInputError("no query given: pass a non-empty string or list of strings")
    return [check_query_text(q, f"query {i + 1}" if len(queries) > 1 else "query") for i, q in enumerate(queries)]


def check_limit(name: str, value: Any, *, lowest: int = 0, highest: int = MAX_LIMIT) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(value)
        except (TypeError, ValueError):
            raise QueryInputError(f"{name} must be a whole number from {lowest} to {highest}, not {value!r}") from None
    if not lowest <= value <= highest:
        raise QueryInputError(f"{name} must be from {lowest} to {highest} (got {value}): "
                              f"{highest} is the most one call returns")
    return value


def check_date_range(since: date | None, until: date | None) -> None:
    if since is not None and until is not None and since > until:
        raise QueryInputError(f"since ({since.isoformat()}) is later than until ({until.isoformat()}): "
                              "nothing can match; swap them")
