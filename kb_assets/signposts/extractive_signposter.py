"""The offline signposter's identity and its entry point: the generator's name and version, and generate().

Its heuristics (signposts/extractive.py: ~150 patterns compiled at import, ~13 ms) load on the first generate(),
so a pass with no document to signpost (a delete, a rename) names the generator and its version without them.
"""
from __future__ import annotations

import time

from kb_assets.signposts.base import SignpostInput, SignpostResult
from kb_assets.signposts.schema import SCHEMA_VERSION, CodeSignpost, DocumentSignpost

# Bump when the heuristics change: extractive signposts are then regenerated (cheaply) on the next run, without
# touching LLM signposts. The schema version is part of it.
ALGORITHM_VERSION = 4     # 2: rationales are reasons (issue 13 §4), artifacts are file paths, no CTE tables;
#                           3: markdown headings from the index's one heading parser (HTML blocks, indented ATX),
#                              reST titles from the chunker's adornment parser (a simple-table border is no title)
#                           4: the chunker's shape decision (work items, markdown-looking notes read as markdown;
#                              reST headings are its titles only), the reST title rules docutils agrees with


class ExtractiveSignposter:
    generator = "extractive"
    model = ""
    # Python work, no waiting: a large run generates in a process of its own (pipeline/signposts.py)
    cpu_bound = True

    def __init__(self) -> None:
        self.prompt_version = f"extractive-{ALGORITHM_VERSION}.s{SCHEMA_VERSION}"

    def generate(self, doc: SignpostInput) -> SignpostResult:
        from kb_assets.signposts.extractive import extract_code, extract_document

        t0 = time.perf_counter()
        if doc.kind == "code":
            payload = CodeSignpost.model_validate(extract_code(doc)).model_dump()
        else:
            payload = DocumentSignpost.model_validate(extract_document(doc)).model_dump()
        return SignpostResult(payload=payload, seconds=time.perf_counter() - t0, model_used="", calls=0)
