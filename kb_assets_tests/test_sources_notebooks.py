"""Jupyter notebooks: markdown and code cells indexed as a markdown document; outputs never stored."""
from __future__ import annotations

import json
from pathlib import Path

from kb_assets.chunking import chunk_document, detect_shape
from kb_assets.config import default_config
from kb_assets.models import Skip
from kb_assets.sources import classify
from kb_assets.sources.discovery import list_source
from kb_assets.sources.readers import read_entry
from kb_assets.config import SourceConfig

SECRET_OUTPUT = "AKIAZ3MOUTPUTSECRET1 printed by a cell"


def _nb(cells, language="python") -> str:
    return json.dumps({"nbformat": 4, "nbformat_minor": 5,
                       "metadata": {"kernelspec": {"language": language, "name": "k"},
                                    "language_info": {"name": language}},
                       "cells": cells})


def _cell(kind, source, outputs=None):
    c = {"cell_type": kind, "metadata": {}, "source": source}
    if kind == "code":
        c.update(execution_count=1, outputs=outputs or [])
    return c


NOTEBOOK = _nb([
    _cell("markdown", ["# Churn analysis\n", "\n", "We chose gradient boosting over a linear model because the "
                       "interactions between tenure and plan matter; the linear baseline missed them.\n"]),
    _cell("code", ["import pandas as pd\n", "df = pd.read_parquet('churn.parquet')\n", "df.describe()"],
          outputs=[{"output_type": "stream", "name": "stdout", "text": [SECRET_OUTPUT]},
                   {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo" * 200}}]),
    _cell("raw", "raw text is not indexed"),
    _cell("markdown", "## Results\n\nRecall at the top decile improved from 0.41 to 0.58 on the held-out month."),
    _cell("code", "print('```')\n```\nweird"),
])


def _read(root: Path, rel: str, text: str, **kw):
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    src = SourceConfig(key="docs", kind="doc", root=str(root), auto_kind=True, include=["**/*.ipynb"], **kw)
    listing = list_source(root, src)                  # a docs source lists notebooks
    [entry] = [e for e in listing.files if e.path == rel]
    return read_entry(root, entry, src)


def test_notebook_is_read_as_markdown_without_outputs(tmp_path):
    [doc] = _read(tmp_path, "analysis/churn.ipynb", NOTEBOOK)
    assert doc.kind == "doc" and doc.title == "Churn analysis"
    assert "```python\nimport pandas as pd" in doc.text and "## Results" in doc.text
    assert SECRET_OUTPUT not in doc.text and "iVBORw0KGgo" not in doc.text      # outputs dropped
    assert "raw text is not indexed" not in doc.text
    assert "````python\nprint('```')\n```\nweird\n````" in doc.text             # a fence inside a cell
    assert doc.meta["notebook"] == {"language": "python", "markdown_cells": 2, "code_cells": 2}
    assert detect_shape(doc) == "markdown"
    chunks = chunk_document(doc, max_tokens=254)
    assert chunks and chunks[0].heading == "Churn analysis"
    assert "Recall at the top decile" in "".join(c.text for c in chunks)


def test_broken_notebooks_are_skipped_with_a_reason(tmp_path):
    bad = _read(tmp_path, "bad.ipynb", '{"cells": [')
    assert isinstance(bad, Skip) and bad.reason == "bad-notebook" and "not valid JSON" in bad.detail
    old = _read(tmp_path, "old.ipynb", json.dumps({"nbformat": 3, "worksheets": []}) + " " * 200)
    assert isinstance(old, Skip) and old.reason == "bad-notebook" and "nbformat 3" in old.detail


def test_default_config_and_auto_kind_treat_notebooks_as_documents(tmp_path):
    assert classify.auto_kind_for("nb/explore.ipynb", "code") == "doc"
    cfg = default_config(tmp_path)
    docs, code = cfg.sources
    assert "**/*.ipynb" in docs.include and "**/*.ipynb" in code.exclude
