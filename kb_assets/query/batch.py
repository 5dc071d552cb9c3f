"""`kb recall --queries Q.jsonl`: every line gets an answer line, in order.

A line that is not JSON, not UTF-8, has no usable query, or a query recall refuses (a number, a NUL byte,
a lone surrogate…) gets an error line `{"id", "line", "error"}` and the batch goes on. Errors that are not
about the line (the database unreachable, the index built with another model) still stop the batch.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Callable, TextIO


def _dumps(obj: Any) -> str:
    s = json.dumps(obj, default=str, ensure_ascii=False)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:      # an id with a lone surrogate: \u escapes keep the line valid JSON
        s = json.dumps(obj, default=str)
    return s


def _line_error(qid: Any, n: int, message: str) -> dict[str, Any]:
    return {"id": qid, "line": n, "error": message}


def run_batch(path: str, recall: Callable[..., Any], kwargs: dict[str, Any], *, as_json: bool,
              out: TextIO | None = None) -> int:
    """Answer every line of the JSONL file at `path` with recall(query, **kwargs); returns the error lines."""
    from psycopg import DataError

    from kb_assets.query.inputs import QueryInputError, check_query_text
    from kb_assets.sources.safe_names import escape_surrogates, printable

    out = out or sys.stdout
    errors = 0
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, 1):
            qid: Any = None
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                result: Any = _line_error(None, n, f"the line is not UTF-8 ({exc.reason} at byte {exc.start})")
            else:
                if not line.strip():
                    continue
                result = None
                try:
                    item = json.loads(line)
                    if not isinstance(item, dict):
                        raise ValueError
                    qid, q = item.get("id", item.get("_id")), item.get("query", item.get("text"))
                except ValueError:
                    result = _line_error(None, n, 'expected a JSON object {"id", "query"}')
                else:
                    if q is None or q == "":
                        result = _line_error(qid, n, 'expected {"id", "query"}: no query')
                    else:
                        try:
                            result = recall(check_query_text(q), **kwargs)
                        except (QueryInputError, DataError, TypeError, UnicodeError) as exc:
                            result = _line_error(qid, n, f"{exc}" if isinstance(exc, QueryInputError)
                                                 else f"{type(exc).__name__}: {exc}")
            if isinstance(result, dict):
                errors += 1
                text = _dumps(result) if as_json else f"# {printable(escape_surrogates(str(result['id'])))}\nerror: {result['error']}\n"
            elif as_json:
                text = _dumps(result.to_batch_line(qid))
            else:
                text = f"# {printable(escape_surrogates(str(qid)))}\n{result.render_text()}\n"
            print(text, file=out, flush=True)
    return errors
