"""`ast.parse` of a source's Python text, safe from several threads at once.

CPython 3.11 keeps the AST constructor's recursion depth in shared state: a thread switch in the middle of one
parse (a garbage collection running a finalizer, another thread's parse) can make it raise
`SystemError: AST constructor recursion depth mismatch` for valid code (python/cpython#106905, fixed in later
releases). kb parses Python in more than one thread (the chunk stage's cut worker; the signposts stage, which
runs beside the chunk stage in a Dagster step that materializes the chunks and signposts without the
embeddings; a test suite's leftover threads), and a spurious failure meant a failed signpost (seen in CI) or a
file cut without its definitions. So every parse of ours takes one lock, and that error is retried once.
"""
from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()
_parse = ast.parse      # (a name of ours: tests replace it, never the ast module's own)


def parse_python(text: str) -> ast.Module:
    """ast.parse(text); raises what it raises for bad input (SyntaxError, ValueError, RecursionError...)."""
    with _LOCK:
        try:
            return _parse(text)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
            return _parse(text)      # the depth is set afresh by each parse: a second try is clean
