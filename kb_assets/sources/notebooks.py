"""Jupyter notebooks (.ipynb) as documents: the narrative and the code, not the outputs.

A notebook is JSON (nbformat 4: https://nbformat.readthedocs.io/en/latest/format_description.html). It is
indexed as a markdown document: markdown cells as they are, code cells as fenced blocks in the kernel's
language. Outputs are dropped: plots, tables and logs are data (often large, sometimes secret), not knowledge.
Raw cells are dropped too. Lines refer to this rendering, not to the JSON file.
"""
from __future__ import annotations

import json


class NotebookError(ValueError):
    """Not a notebook we can read; `str(exc)` is the reason a person reads in `kb status`."""


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    if isinstance(src, list):     # nbformat stores multi-line strings as lists of lines
        src = "".join(s for s in src if isinstance(s, str))
    return src if isinstance(src, str) else ""


def render_notebook(text: str) -> tuple[str, dict]:
    """(markdown text, metadata) of a notebook's JSON text; NotebookError if it is not an nbformat 4 notebook."""
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(f"not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        fmt = nb.get("nbformat") if isinstance(nb, dict) else None
        raise NotebookError(f"no cell list (nbformat {fmt!r}; only nbformat 4 notebooks are read)")
    meta = nb.get("metadata") if isinstance(nb.get("metadata"), dict) else {}
    kernel = meta.get("kernelspec") if isinstance(meta.get("kernelspec"), dict) else {}
    info = meta.get("language_info") if isinstance(meta.get("language_info"), dict) else {}
    language = str(info.get("name") or kernel.get("language") or "python")
    parts: list[str] = []
    counts = {"markdown": 0, "code": 0}
    for cell in nb["cells"]:
        if not isinstance(cell, dict):
            continue
        kind = cell.get("cell_type")
        src = _source(cell).strip("\n")
        if not src.strip() or kind not in counts:
            continue
        counts[kind] += 1
        if kind == "markdown":
            parts.append(src)
        else:
            fence = "```"
            while fence in src:       # a code cell that itself holds a fence
                fence += "`"
            parts.append(f"{fence}{language}\n{src}\n{fence}")
    return "\n\n".join(parts) + "\n", {"notebook": {"language": language, "markdown_cells": counts["markdown"],
                                                    "code_cells": counts["code"]}}
