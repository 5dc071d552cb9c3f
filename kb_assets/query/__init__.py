"""The agent-facing query: `recall()` (ranked signposts, documents and code) and `show()` (one document).

    from kb_assets.query import recall
    print(recall(["celery restart", "bid pipeline"]).render_text())

Importing this package loads neither dagster, torch, sentence-transformers, numpy nor pandas; psycopg and the
configuration load on the first call, the embedding model on the first vector query. Its names load on first
use (PEP 562): a module that needs one helper of the package (the projections' `query.records.first_prose`)
does not import the query engine with it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from kb_assets.lazy_names import lazy_names

_HOMES = {
    "recall": "engine", "show": "engine", "RecallResult": "engine", "QueryError": "engine", "make_id": "engine",
    "parse_id": "engine", "render_show": "engine", "MODES": "engine", "Tuning": "engine",
    "DEFAULT_TUNING": "engine", "QueryInputError": "inputs", "Record": "records", "estimate_tokens": "records",
}

__all__ = list(_HOMES)

if TYPE_CHECKING:
    from kb_assets.query.engine import (
        DEFAULT_TUNING, MODES, QueryError, RecallResult, Tuning, make_id, parse_id, recall, render_show, show,
    )
    from kb_assets.query.inputs import QueryInputError
    from kb_assets.query.records import Record, estimate_tokens


__getattr__, __dir__ = lazy_names(__name__, _HOMES)
