"""Projections over the shared corpora: T0 tokens per entry, relations found, the stage's time.

    .venv/bin/python bench/projections_corpora.py

Unpacks the four ADR corpora and the PEPs into a temp folder, runs the documents stage (edges are written with
the documents) and the projections stage (resolve, render, write) on a fresh embedded PostgreSQL, prints the
figures, then runs the projections stage again to show that nothing is rewritten. No embedding: the relations
and the tier files need neither chunks nor vectors (signposts absent: "use when" falls back to the first prose).
"""
from __future__ import annotations

import json
import os
import tarfile
import tempfile
import time
from pathlib import Path

CORPORA = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"
CORPUS = {
    "nats": ("adr-nats-io+nats-architecture-and-design-f5f5126268f8", "adr/*.md"),
    "govuk-aws": ("adr-alphagov+govuk-aws-81ee9f6e91fd", "docs/architecture/decisions/*.md"),
    "govuk-infra": ("adr-alphagov+govuk-infrastructure-d9b7454f2606", "docs/architecture/decisions/*.md"),
    "arachne": ("adr-arachne-framework+architecture-060a956277a5", "adr-*.md"),
    "peps": ("python-peps-ba4deeb79695", "peps/pep-*.rst"),
}


def main() -> None:
    from kb_assets.config import parse_config
    from kb_assets.pipeline import sync_documents
    from kb_assets.pipeline.projections import build_projections
    from kb_assets.store.db import connect, embedded_url, migrate

    with tempfile.TemporaryDirectory(prefix="kbproj-", dir="/tmp") as tmp:
        tmp = Path(tmp)
        roots = {}
        for key, (name, _g) in CORPUS.items():
            with tarfile.open(CORPORA / f"{name}.tar.gz") as tar:
                top = tar.getnames()[0].split("/")[0]
                tar.extractall(tmp / "c", filter="data")
            roots[key] = tmp / "c" / top
        cfg = parse_config({"data_dir": str(tmp / "kb"), "sources": [
            {"key": k, "kind": "adr", "root": str(roots[k]), "include": [g]} for k, (_n, g) in CORPUS.items()]},
            path=str(tmp / "kb.yaml"), base_dir=str(tmp))
        url = embedded_url(tmp / "kb")
        with connect(url, register=False) as c:
            migrate(c)
        with connect(url) as conn:
            t0 = time.perf_counter()
            for s in cfg.sources:
                sync_documents(conn, cfg, s)
            docs_s = time.perf_counter() - t0
            first = build_projections(conn, cfg)
            again = build_projections(conn, cfg)
        print(json.dumps({
            "entries": first.entries, "t0_tokens_per_entry": first.t0_tokens_per_entry, "files": first.files,
            "relations": first.relations, "documents_stage_seconds": round(docs_s, 2),
            "projections_seconds_first": first.seconds, "projections_seconds_again": again.seconds,
            "rewritten_again": again.written, "load_average": os.getloadavg(),
        }, indent=1))


if __name__ == "__main__":
    main()
