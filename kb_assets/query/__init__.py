"""The agent-facing query: `recall()` (ranked signposts, documents and code) and `show()` (one document).

    from kb_assets.query import recall
    print(recall(["celery restart", "bid pipeline"]).render_text())

Importing this package loads neither dagster, torch, sentence-transformers, numpy nor pandas; psycopg and the
configuration load on the first call, the embedding model on the first vector query.
"""
from kb_assets.query.engine import (
    DEFAULT_TUNING, MODES, QueryError, RecallResult, Tuning, make_id, parse_id, recall, render_show, show,
)
from kb_assets.query.inputs import QueryInputError
from kb_assets.query.records import Record, estimate_tokens

__all__ = ["recall", "show", "RecallResult", "Record", "QueryError", "make_id", "parse_id", "render_show",
           "estimate_tokens", "MODES", "Tuning", "DEFAULT_TUNING", "QueryInputError"]

