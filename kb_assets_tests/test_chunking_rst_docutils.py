"""The reST title rules (chunking/rst.rst_titles, stored by the documents stage as documents.blocks "rst") held
to docutils, the reference reST parser: the same section titles at the same depths, on every 10th PEP of the
shared corpus and on the two PEPs where the rules once differed (a one-character title, a title right under
another title's underline), and on small cases. docutils itself is ~50x dearer on the PEPs (BENCHMARKS,
"parse once: reST stored"), which is why the documents stage does not run it."""
from __future__ import annotations

import io
import re
import tarfile

import pytest

from kb_assets.chunking.rst import rst_structure

docutils = pytest.importorskip("docutils")
from docutils import nodes  # noqa: E402
from docutils.frontend import get_default_settings  # noqa: E402
from docutils.parsers.rst import Parser  # noqa: E402
from docutils.utils import new_document  # noqa: E402

_PARSER = Parser()


def _docutils_titles(text: str) -> list[tuple[int, str]]:
    settings = get_default_settings(Parser)
    settings.report_level = 5
    settings.halt_level = 5
    settings.warning_stream = io.StringIO()
    settings.file_insertion_enabled = False
    settings.raw_enabled = False
    doc = new_document("<test>", settings)
    _PARSER.parse(text, doc)
    out: list[tuple[int, str]] = []

    def walk(node, depth):
        for child in node.children:
            if isinstance(child, nodes.section):
                title = child.next_node(nodes.title)
                out.append((depth, title.rawsource.strip() if title is not None else ""))
                walk(child, depth + 1)
            elif isinstance(child, nodes.Element) and not isinstance(child, (nodes.literal_block, nodes.comment)):
                walk(child, depth)

    walk(doc, 1)
    return out


def _ours(text: str) -> list[tuple[int, str]]:
    return [(level, title) for _a, _b, level, title in rst_structure(text)["titles"]]


CASES = {
    "one-char": "Intro\n=====\n\nLanguages:\n\nR\n-\n\nA statistics language.\n\nJulia\n-----\n\nAnother.\n",
    "stacked": "Hooks:\n------\ninvoke_install\n^^^^^^^^^^^^^^\nInstalls.\n\nuninstall\n^^^^^^^^^\n\nRemoves.\n",
    "overline": "=====\nTitle\n=====\n\nSub\n---\n\ntext\n\n-----\n\nafter a transition\n",
    "table": "Data\n====\n\n=====  =====\na      b\n=====  =====\n1      2\n=====  =====\n",
    "short": "Para line\n--\n\ntext\n",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_small_cases_match_docutils(name):
    assert _ours(CASES[name]) == _docutils_titles(CASES[name])


def test_peps_match_docutils(shared_dir):
    archive = sorted((shared_dir / "corpora").glob("python-peps-*.tar.gz"))
    if not archive:
        pytest.skip("no PEP corpus")
    with tarfile.open(archive[0]) as tar:
        members = sorted((m for m in tar if m.isfile() and re.search(r"/pep-\d+\.rst$", m.name)),
                         key=lambda m: m.name)
        chosen = members[::10] + [m for m in members if m.name.endswith(("/pep-0450.rst", "/pep-0650.rst"))]
        assert len(chosen) > 70
        for m in chosen:
            text = tar.extractfile(m).read().decode("utf-8")
            assert _ours(text) == _docutils_titles(text), m.name
