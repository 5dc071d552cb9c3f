"""ADRs and PEPs from the real corpora (unpacked from /work/shared/corpora into a temp folder)."""
from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest

from kb_assets.config import SourceConfig
from kb_assets.models import Skip
from kb_assets.sources.discovery import list_source
from kb_assets.sources.readers import read_entry

CORPORA = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"
NAMES = {
    "aws": "adr-alphagov+govuk-aws-81ee9f6e91fd",
    "infra": "adr-alphagov+govuk-infrastructure-d9b7454f2606",
    "arachne": "adr-arachne-framework+architecture-060a956277a5",
    "nats": "adr-nats-io+nats-architecture-and-design-f5f5126268f8",
    "peps": "python-peps-ba4deeb79695",
}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    if not CORPORA.is_dir():
        pytest.skip(f"{CORPORA} is not available")
    out = tmp_path_factory.mktemp("corpora")
    roots = {}
    for key, name in NAMES.items():
        with tarfile.open(CORPORA / f"{name}.tar.gz") as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(out, filter="data")
        roots[key] = out / top
    return roots


def read_all(root: Path, **kw) -> dict[str, object]:
    source = SourceConfig(key="k", kind=kw.pop("kind", "adr"), root=str(root), **kw)
    listing = list_source(root, source)
    assert listing.complete
    out: dict[str, object] = {}
    for e in listing.files:
        r = read_entry(root, e, source)
        out[e.path] = r if isinstance(r, Skip) else r[0]
    return out


def test_govuk_aws(corpora):
    docs = read_all(corpora["aws"], include=["docs/architecture/decisions/*.md"])
    d = "docs/architecture/decisions/"
    a4 = docs[d + "0004-dns-definitions-for-hosts-and-services.md"]
    assert a4.title == "DNS definitions for hosts and services" and a4.meta["number"] == 4
    assert (a4.meta["status"], a4.meta["status_raw"]) == ("Superseded", "Superseded by DNS Infrastructure")
    assert a4.meta["date"] == "2017-07-14"
    assert a4.meta["superseded_by"] == [d + "0015-dns-infrastructure.md"]
    a3 = docs[d + "0003-aws-networking-outline.md"]
    assert (a3.meta["status"], a3.meta["status_raw"]) == ("Partially Superseded", "Partly superseded")
    assert a3.meta["superseded_by"] == [d + "0033-ip-ranges.md"]
    a10, a17 = docs[d + "0010-terraform-directory-structure.md"], docs[d + "0017-terraform-data-structure.md"]
    assert a10.meta["status"] == "Accepted" and a10.meta["amended_by"] == [d + "0017-terraform-data-structure.md"]
    assert a17.meta["amends"] == [d + "0010-terraform-directory-structure.md"]
    assert a17.meta["references"] == [d + "0010-terraform-directory-structure.md"]
    a38 = docs[d + "0038-mongo_replacement_by_documentdb.md"]
    assert (a38.meta["status"], a38.meta["status_raw"], a38.meta["date"]) == ("Accepted", "Approved", "2019-10-17")
    a6 = docs[d + "0006-puppet-architecture.md"]
    assert (a6.meta["status"], a6.meta["status_raw"]) == ("Proposed", "Pending")
    # every ADR of the corpus has a status, a date and a clean title
    adrs = [v for v in docs.values() if not isinstance(v, Skip)]
    assert len(adrs) == 38
    assert all(x.meta.get("status") and x.meta.get("date") and not x.title[0].isdigit() for x in adrs)


def test_govuk_infrastructure(corpora):
    docs = read_all(corpora["infra"], include=["docs/architecture/decisions/*.md"])
    d = "docs/architecture/decisions/"
    a7 = docs[d + "0007-use-fluentbit-elasticsearch-and-kibana-for-application-logs.md"]
    assert a7.title == "Use Fluent Bit, Elasticsearch and Kibana for application logs"
    assert (a7.meta["status"], a7.meta["status_raw"]) == ("Deprecated", "Deprecated (no superseding ADR)")
    assert a7.meta["date"] == "2021-08-16" and "superseded_by" not in a7.meta
    a2 = docs[d + "0002-use-aws-eks-terraform-module.md"]
    assert a2.title == "Use aws-eks Terraform module" and a2.meta["number"] == 2
    template = docs[d + "0000-TEMPLATE.md"]          # the heading inside the template comment is ignored
    assert template.title == "Template" and template.meta["status"] == "Proposed"


def test_arachne(corpora):
    docs = read_all(corpora["arachne"], include=["adr-*.md"])
    a17 = docs["adr-017-simplify-chimera-model.md"]
    assert a17.title == "Simplification of Chimera Model" and a17.meta["number"] == 17
    assert (a17.meta["status"], a17.meta["status_raw"]) == ("Proposed", "PROPOSED")
    assert a17.meta["supersedes"] == ["adr-015-data-abstraction-model.md", "adr-016-db-migrations.md"]
    a1 = docs["adr-001-use-adrs.md"]
    assert (a1.title, a1.meta["status"]) == ("Use ADRs", "Accepted")
    a7 = docs["adr-007-configuration-updates.md"]
    assert a7.meta["references"] == ["adr-006-core-runtime.md"]       # link written without ".md"
    assert len(docs) == 17 and all(x.meta.get("status") for x in docs.values())


def test_nats(corpora):
    docs = read_all(corpora["nats"], include=["adr/*.md"])
    a15 = docs["adr/ADR-15.md"]
    assert (a15.title, a15.meta["status"], a15.meta["date"]) == ("JetStream Subscribe Workflow", "Deprecated",
                                                                 "2021-08-11")
    assert a15.meta["author"] == "@kozlovic" and a15.meta["tags"] == ["deprecated"]
    assert a15.meta["superseded_by"] == ["adr/ADR-37.md"]             # "Deprecate in favor of ADR-37"
    assert a15.meta["updated"] == "2024-07-17"                        # revision history table
    a48 = docs["adr/ADR-48.md"]
    assert a48.meta["tags"] == ["jetstream", "client", "kv", "refinement", "2.11"]
    assert (a48.meta["status"], a48.meta["date"], a48.meta["updates"]) == ("Implemented", "2025-04-09",
                                                                          ["adr/ADR-8.md"])
    assert "adr/ADR-43.md" in a48.meta["references"]
    a13 = docs["adr/ADR-13.md"]
    assert (a13.meta["status"], a13.meta["author"]) == ("Partially Implemented", "wallyqs")
    a14 = docs["adr/ADR-14.md"]
    assert a14.meta["authors"] == ["@mhanel", "@aricart"] and a14.meta["tags"] == ["client", "security"]
    assert (a14.meta["status"], a14.meta["status_raw"]) == ("Accepted", "Approved")
    assert len(docs) == 52 and all(x.meta.get("status") and x.meta.get("date") and x.meta.get("tags")
                                   for x in docs.values())


def test_peps(corpora):
    docs = read_all(corpora["peps"], include=["peps/pep-*.rst"])
    p8 = docs["peps/pep-0008.rst"]
    assert p8.title == "PEP 8 – Style Guide for Python Code"
    assert (p8.meta["status"], p8.meta["created"], p8.meta["type"]) == ("Active", "2001-07-05", "Process")
    assert p8.meta["authors"] == ["Guido van Rossum", "Barry Warsaw", "Alyssa Coghlan"]
    assert "peps/pep-0257.rst" in p8.meta["references"]
    p386 = docs["peps/pep-0386.rst"]
    assert (p386.meta["status"], p386.meta["superseded_by"], p386.meta["topic"]) == (
        "Superseded", ["peps/pep-0440.rst"], "Packaging")
    p440 = docs["peps/pep-0440.rst"]
    assert p440.meta["supersedes"] == ["peps/pep-0386.rst"] and p440.meta["status"] == "Final"
    assert "ncoghlan@gmail.com" not in str(p440.meta)                 # e-mail addresses are dropped
    statuses = [d.meta.get("status") for d in docs.values() if not isinstance(d, Skip)]
    assert len(statuses) == 736
    assert sum(1 for s in statuses if s) >= 735
    assert set(statuses) <= {"Active", "Accepted", "Deferred", "Draft", "Final", "Provisional", "Rejected",
                             "Superseded", "Withdrawn", None}


def test_madr_and_nygard_variants(tmp_path):
    d = tmp_path / "docs" / "adr"
    d.mkdir(parents=True)
    body = "\n\n## Context and Problem Statement\n\nWe need a database for the ledger service and its reports.\n"
    (d / "0005-use-postgres.md").write_text(
        "---\nstatus: accepted\ndate: 2020-05-01\ndeciders: [Ann, Bob]\ntags: [db, infra]\n---\n"
        "# ADR-0005: Use Postgres\n\nSupersedes ADR 3 and [ADR-0004](0004-use-mysql.md)." + body)
    (d / "0004-use-mysql.md").write_text(
        "# Use MySQL\n\n* Status: superseded by [ADR-0005](0005-use-postgres.md)\n* Deciders: Ann\n"
        "* Date: 2019-03-04\n" + body)
    (d / "0003-use-sqlite.md").write_text(
        "# 3. Use SQLite\n\nDate: 2018-01-02\n\n## Status\n\nRejected\n\nSuperseded by ADR-5.\n" + body)
    docs = read_all(tmp_path, include=["docs/adr/*.md"])
    a5, a4, a3 = docs["docs/adr/0005-use-postgres.md"], docs["docs/adr/0004-use-mysql.md"], docs["docs/adr/0003-use-sqlite.md"]
    assert (a5.title, a5.meta["number"], a5.meta["status"], a5.meta["date"]) == ("Use Postgres", 5, "Accepted", "2020-05-01")
    assert (a5.meta["deciders"], a5.meta["tags"]) == (["Ann", "Bob"], ["db", "infra"])
    assert a5.meta["supersedes"] == ["docs/adr/0004-use-mysql.md", "ADR-3"]
    assert "ADR-5" not in a5.meta["references"]                       # no self-reference from the title
    assert (a4.meta["status"], a4.meta["date"], a4.meta["superseded_by"]) == (
        "Superseded", "2019-03-04", ["docs/adr/0005-use-postgres.md"])
    assert (a3.title, a3.meta["status"], a3.meta["superseded_by"]) == ("Use SQLite", "Rejected", ["ADR-5"])


# --- issue 13 §1 reader fixes ---------------------------------------------------------------------------------

def test_pep_replaces_and_superseded_by_name_the_padded_sibling_file_in_the_real_corpus():
    """pep-3333.rst has no leading zero, yet its siblings are pep-0245.rst: every Replaces / Superseded-By number
    of every shared PEP resolves to a file of the corpus (the unpadded pep-245.rst resolved to nothing)."""
    import tarfile
    from pathlib import Path

    from kb_assets.sources.decisions import parse_pep

    shared = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"
    archives = sorted(shared.glob("python-peps-*.tar.gz"))
    if not archives:
        pytest.skip("shared PEP corpus not found")
    with tarfile.open(archives[0]) as tar:
        texts = {m.name: tar.extractfile(m).read().decode() for m in tar
                 if m.isfile() and re.search(r"/pep-\d+\.rst$", m.name)}
    checked = 0
    for name, text in texts.items():
        meta = parse_pep(text, name)
        for key in ("supersedes", "superseded_by"):
            for target in meta.get(key, []):
                checked += 1
                assert target in texts, (name, key, target)
    assert checked >= 20


@pytest.mark.parametrize("raw, status", [
    ("Not implemented", "Not Implemented"), ("not yet implemented", "Not Implemented"),
    ("Implemented", "Implemented"), ("done", "Implemented"), ("Not accepted", "Rejected"),
    ("Accepted (not deprecated)", "Accepted"), ("never accepted; rejected", "Rejected")])
def test_a_negated_status_word_is_not_the_status(raw, status):
    from kb_assets.sources.decisions import normalize_status

    assert normalize_status(raw) == status
