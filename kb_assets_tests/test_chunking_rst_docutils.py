"""The reST title rules (chunking/rst.rst_titles, stored by the documents stage as documents.blocks "rst") held
to docutils, the reference reST parser: the same section titles at the same depths, on every 10th PEP of the
shared corpus and on the two PEPs where the rules once differed (a one-character title, a title right under
another title's underline), and on small cases. docutils itself is ~50x dearer on the PEPs (BENCHMARKS,
"parse once: reST stored"), which is why the documents stage does not run it."""
from __future__ import annotations

import re
import tarfile

import pytest

from kb_assets.chunking.rst import rst_structure

pytest.importorskip("docutils")
from kb_assets_tests.rst_reference import docutils_titles as _docutils_titles  # noqa: E402


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
