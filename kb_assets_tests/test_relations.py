"""Relations (issue 13 §2): every "Superseded by" / "Supersedes" of the four shared ADR corpora and the PEPs becomes
an edge in both directions, resolved to documents; edges follow document changes; `related()` walks the graph."""
from __future__ import annotations

import posixpath
import re
import tarfile
from pathlib import Path

import pytest

from kb_assets.config import parse_config
from kb_assets.pipeline import sync_documents
from kb_assets.pipeline.projections import build_projections
from kb_assets.pipeline.relations import edges_for, resolve_relations, text_references
from kb_assets.query.relations import related, successors

CORPORA = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"
# source key -> (tarball, include glob)
CORPUS = {
    "nats": ("adr-nats-io+nats-architecture-and-design-f5f5126268f8", "adr/*.md"),
    "govuk-aws": ("adr-alphagov+govuk-aws-81ee9f6e91fd", "docs/architecture/decisions/*.md"),
    "govuk-infra": ("adr-alphagov+govuk-infrastructure-d9b7454f2606", "docs/architecture/decisions/*.md"),
    "arachne": ("adr-arachne-framework+architecture-060a956277a5", "adr-*.md"),
    "peps": ("python-peps-ba4deeb79695", "peps/pep-*.rst"),
}


@pytest.fixture(scope="module")
def corpus_roots(tmp_path_factory) -> dict[str, Path]:
    if not CORPORA.is_dir():
        pytest.skip(f"{CORPORA} is not available")
    out = tmp_path_factory.mktemp("rel-corpora")
    roots = {}
    for key, (name, _glob) in CORPUS.items():
        with tarfile.open(CORPORA / f"{name}.tar.gz") as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(out, filter="data")
        roots[key] = out / top
    return roots


# ---- the independent pass: a grep over the raw files, sharing no code with the readers -------------------
_MD_TARGET = re.compile(r"\]\(([^)#\s]+\.md)\)")
_ADR_NUM = re.compile(r"\bADR[- #]?0*(\d+)\b", re.I)


def _number_of(name: str) -> int | None:
    m = re.match(r"(?i)(?:adr|pep)?[-_]?0*(\d+)", name)
    return int(m.group(1)) if m else None


def expected_pairs(key: str, root: Path, glob: str) -> set[tuple[str, str]]:
    """(superseded document, successor) as root-relative paths, from the raw text."""
    files = sorted(p.relative_to(root).as_posix() for p in root.glob(glob))
    by_number = {_number_of(posixpath.basename(f)): f for f in files}
    pairs: set[tuple[str, str]] = set()
    for f in files:
        text = (root / f).read_text(encoding="utf-8")
        if key == "peps":
            header = text.split("\n\n", 1)[0]
            for name, later in (("Superseded-By", True), ("Replaces", False)):
                m = re.search(rf"^{name}:\s*(.+)$", header, re.M)
                for n in re.findall(r"\d+", m.group(1)) if m else []:
                    other = by_number.get(int(n))
                    if other:
                        pairs.add((f, other) if later else (other, f))
            continue
        for line in text.splitlines():
            low = line.lower()
            later = "superseded by" in low or "in favor of" in low or "in favour of" in low
            earlier = re.search(r"\bsupersedes\b", low) and "not" not in low.split("supersedes")[0][-12:]
            if not (later or earlier) or "overlap or supersede" in low:
                continue
            targets = [posixpath.normpath(posixpath.join(posixpath.dirname(f), t))
                       for t in _MD_TARGET.findall(line)]
            if not targets:
                targets = [by_number[int(n)] for n in _ADR_NUM.findall(line) if int(n) in by_number]
            for t in targets:
                if t in files and t != f:
                    pairs.add((f, t) if later else (t, f))
    return pairs


def test_every_supersedes_pair_of_the_corpora_is_an_edge_both_ways(db_url, conn, corpus_roots, tmp_path):
    cfg = parse_config({"data_dir": str(tmp_path / "kb"), "sources": [
        {"key": k, "kind": "adr", "root": str(corpus_roots[k]), "include": [g]} for k, (_n, g) in CORPUS.items()]},
        path="kb.yaml", base_dir=str(tmp_path))
    for source in cfg.sources:
        sync_documents(conn, cfg, source)
    stats = resolve_relations(conn)

    edges = set(conn.execute(
        "SELECT fd.source_key, fd.path, r.kind, td.path FROM relations r JOIN documents fd ON fd.id = r.document_id"
        " JOIN documents td ON td.id = r.target_document_id AND td.source_key = fd.source_key"
        " WHERE r.kind IN ('supersedes', 'superseded_by')").fetchall())
    expected_total = 0
    for key, (_name, glob) in CORPUS.items():
        pairs = expected_pairs(key, corpus_roots[key], glob)
        expected_total += len(pairs)
        for old, new in sorted(pairs):
            assert (key, old, "superseded_by", new) in edges, f"{key}: {old} superseded_by {new} missing"
            assert (key, new, "supersedes", old) in edges, f"{key}: {new} supersedes {old} missing"
        if key == "govuk-infra":
            assert not pairs            # its "in favour of" sentences are about roles and charts, not ADRs
        else:
            assert pairs, f"the grep found no pair in {key}"
    # ADRs: aws 0003→0033 and 0004→0015, arachne 015/016→017, nats 15→37; the PEPs: dozens
    assert expected_total >= 5 + 40
    # every resolved supersedes / superseded_by edge has its inverse (stated or derived)
    for src, a, kind, b in edges:
        inverse = "supersedes" if kind == "superseded_by" else "superseded_by"
        assert (src, b, inverse, a) in edges, (src, a, kind, b)
    assert stats.resolved > 0 and stats.by_kind["superseded_by"] >= stats.by_kind.get("supersedes", 0) // 2
    assert stats.unresolved == sum(stats.unresolved_by_kind.values())

    # A second pass over an unchanged index changes nothing.
    before = conn.execute("SELECT id, document_id, kind, target, target_document_id, origin FROM relations"
                          " ORDER BY id").fetchall()
    resolve_relations(conn)
    assert conn.execute("SELECT id, document_id, kind, target, target_document_id, origin FROM relations"
                        " ORDER BY id").fetchall() == before

    # T0 over the shared corpora: at most 30 tokens per entry on average (the local model's tokenizer; folder
    # header lines count too)
    proj = build_projections(conn, cfg)
    assert proj.entries == sum(1 for _ in conn.execute("SELECT 1 FROM documents WHERE status = 'active'"))
    assert 0 < proj.t0_tokens_per_entry <= 30, proj.t0_tokens_per_entry
    t0 = (tmp_path / "kb" / "machine" / "index.dsl").read_text()
    assert "## kb:peps/peps/\npep-0001.rst | adr | PEP 1 – PEP Purpose and Guidelines | = | Active\n" in t0

    # recall()'s view: PEP 386 is superseded by PEP 440
    d386 = conn.execute("SELECT id FROM documents WHERE source_key = 'peps' AND path = 'peps/pep-0386.rst'"
                        ).fetchone()[0]
    assert [n for _, n in successors(conn, [d386])[d386]] == ["kb:peps/peps/pep-0440.rst"]
    near = related(conn, "nats", "adr/ADR-15.md")
    assert {"from": "kb:nats/adr/ADR-15.md", "kind": "superseded_by", "to": "kb:nats/adr/ADR-37.md",
            "resolved": True, "depth": 1} in near["edges"]
    assert any(e["from"] == "kb:nats/adr/ADR-37.md" and e["kind"] == "supersedes" for e in near["edges"])


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")


ADR = "# {n}. {title}\n\nDate: 2024-01-0{n}\n\n## Status\n\n{status}\n\n## Context\n\n{body}\n" + ("Filler text. " * 10)


def test_edges_follow_the_documents(conn, tmp_path):
    root = tmp_path / "repo"
    _write(root, "adr/0001-first.md", ADR.format(n=1, title="First", status="Superseded by [2](0002-second.md)",
                                                 body="We pick a queue."))
    _write(root, "adr/0002-second.md", ADR.format(n=2, title="Second", status="Accepted",
                                                  body="See also ADR-3, which is not written yet."))
    _write(root, "notes/guide.md", "# Guide\n\nRead [the first ADR](../adr/0001-first.md) and kb:docs/notes/x.md."
           " Also [a site](https://example.com/a.md) and [a folder](../adr/).\n" + ("More words here. " * 10))
    cfg = parse_config({"data_dir": str(tmp_path / "kb"), "sources": [
        {"key": "adrs", "kind": "adr", "root": str(root), "include": ["adr/*.md"]},
        {"key": "docs", "kind": "doc", "root": str(root), "include": ["notes/*.md"]}]},
        path="kb.yaml", base_dir=str(tmp_path))
    for s in cfg.sources:
        sync_documents(conn, cfg, s)
    # written by the documents stage, unresolved until the resolve pass
    assert conn.execute("SELECT count(*) FROM relations WHERE target_document_id IS NOT NULL").fetchone()[0] == 0
    resolve_relations(conn)

    def edges():
        return sorted(conn.execute(
            "SELECT fd.path, r.kind, r.target, td.path, r.origin FROM relations r"
            " JOIN documents fd ON fd.id = r.document_id LEFT JOIN documents td ON td.id = r.target_document_id"
        ).fetchall())

    got = edges()
    assert ("adr/0001-first.md", "superseded_by", "adr/0002-second.md", "adr/0002-second.md", "document") in got
    assert ("adr/0002-second.md", "supersedes", "kb:adrs/adr/0001-first.md", "adr/0001-first.md", "inverse") in got
    # the reference to ADR-3 is kept, unresolved; the guide's relative link resolves across sources (same root)
    assert ("adr/0002-second.md", "references", "ADR-3", None, "document") in got
    assert ("notes/guide.md", "references", "adr/0001-first.md", "adr/0001-first.md", "document") in got
    assert ("notes/guide.md", "references", "kb:docs/notes/x.md", None, "document") in got
    assert not any("example.com" in str(e) or e[2] == "adr" for e in got)

    # ADR-3 appears later: the next pass resolves it; the first ADR loses its successor: edges go, inverse too
    _write(root, "adr/0003-third.md", ADR.format(n=3, title="Third", status="Accepted", body="A third one."))
    _write(root, "adr/0001-first.md", ADR.format(n=1, title="First", status="Accepted", body="We pick a queue."))
    sync_documents(conn, cfg, cfg.sources[0])
    resolve_relations(conn)
    got = edges()
    assert ("adr/0002-second.md", "references", "ADR-3", "adr/0003-third.md", "document") in got
    assert not any(e[1] in ("supersedes", "superseded_by") for e in got)
    # a deleted document takes its edges along; edges pointing at it become unresolved
    (root / "adr/0003-third.md").unlink()
    sync_documents(conn, cfg, cfg.sources[0])
    resolve_relations(conn)
    assert ("adr/0002-second.md", "references", "ADR-3", None, "document") in edges()


def test_edges_for_and_text_references():
    meta = {"superseded_by": ["adr/b.md"], "references": ["adr/b.md", "ADR-9"], "updates": ["adr/c.md"]}
    assert edges_for("adr", "adr/a.md", meta, None) == [
        ("superseded_by", "adr/b.md"), ("amends", "adr/c.md"), ("references", "ADR-9")]
    refs = text_references("docs/x/guide.md", "[a](../y.md) [b](/top.rst#s) [c](http://h/z.md) [d](./) "
                                              "[e](../../../out.md) `kb:src/p/q.md` see kb:code/a.py. ## kb:src/folder/")
    assert refs == ["docs/y.md", "top.rst", "kb:src/p/q.md", "kb:code/a.py"]
    assert edges_for("transcript", "t.jsonl", {}, "[a](x.md)") == []
