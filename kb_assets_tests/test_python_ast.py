"""Python text is parsed under one lock, and CPython 3.11's spurious "AST constructor recursion depth mismatch"
(python/cpython#106905: shared state, hit when a thread switch lands inside a parse) is retried, so neither the
code chunker nor the extractive signposter turns valid code into a failure. The race itself cannot be provoked
on demand; these tests pin our handling of it: one retry, real errors untouched, one parse at a time."""
from __future__ import annotations

import ast
import threading
import time

import pytest

from kb_assets.chunking.code import python_sections
from kb_assets.chunking.core import Lines
from kb_assets.signposts.base import SignpostInput
from kb_assets.signposts.extractive import extract_code
from kb_assets.sources import python_ast

CODE = '"""Backoff delays."""\n\n\ndef delay(attempt):\n    """Full jitter."""\n    return 2 ** attempt\n\n\nclass Policy:\n    pass\n'


def _flaky_parse(monkeypatch, failures: int, message: str = "AST constructor recursion depth mismatch (before=27, after=91)"):
    real = ast.parse
    calls = {"n": 0}

    def parse(text, *a, **kw):
        calls["n"] += 1
        if calls["n"] <= failures:
            raise SystemError(message)
        return real(text, *a, **kw)

    monkeypatch.setattr(python_ast, "_parse", parse)
    return calls


def test_the_spurious_depth_mismatch_is_retried_once_for_the_chunker_and_the_signposter(monkeypatch):
    calls = _flaky_parse(monkeypatch, failures=1)
    assert python_sections(CODE, Lines(CODE)) is not None and calls["n"] == 2
    calls["n"] = 0
    sp = extract_code(SignpostInput(title="backoff.py", kind="code", path="src/backoff.py", text=CODE))
    assert [f["name"] for f in sp["key_functions"]][:2] == ["delay", "Policy"] and calls["n"] == 2


def test_other_errors_are_not_retried(monkeypatch):
    calls = _flaky_parse(monkeypatch, failures=5, message="something else")
    with pytest.raises(SystemError):
        python_ast.parse_python(CODE)
    assert calls["n"] == 1
    monkeypatch.undo()
    with pytest.raises(SyntaxError):
        python_ast.parse_python("def (:\n")


def test_one_parse_at_a_time(monkeypatch):
    real = ast.parse
    inside, most = [0], [0]
    guard = threading.Lock()

    def slow(text, *a, **kw):
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.01)
        try:
            return real(text, *a, **kw)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(python_ast, "_parse", slow)
    threads = [threading.Thread(target=lambda: [python_ast.parse_python(CODE) for _ in range(5)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
