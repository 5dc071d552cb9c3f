"""Extractive signposts an agent can decide from (issue 13 §4): rationales are reasons, artifacts are file paths,
code signposts list tables (not CTE names), the ADR's own status word is kept; and the hand-labelled sample of 40
signposts (bench/signpost_sample) keeps its precision."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kb_assets.signposts.base import SignpostInput
from kb_assets.signposts.extractive import ExtractiveSignposter, extract_code, normalise_status

REPO = Path(__file__).resolve().parents[1]
FILLER = "The team wrote this down for later readers to find. "


def _sign(text: str, meta: dict | None = None, kind: str = "adr", path: str = "docs/adr/0001-x.md") -> dict:
    return ExtractiveSignposter().generate(SignpostInput("X", kind, path, text, meta or {})).payload


def test_artifacts_are_file_paths_not_slashed_words():
    text = ("# Notes\n\nThe bucket supports add/delete/lock operations through input/stream/reader and "
            "output/stream/writer; the header is NATS/1.0 and the body text/markdown. Code lives at "
            "github.com/hukkin/tomli. Errors are listed in `server/errors.json`, the ADRs in "
            "docs/architecture/decisions, the image in images/0003-trace.png, the binary is ./cosign-linux-amd64.\n")
    arts = _sign(text)["artifacts"]
    assert arts == ["server/errors.json", "docs/architecture/decisions", "images/0003-trace.png"]


def test_code_signpost_tables_exclude_cte_names():
    for rel in ("kb_assets/query/engine.py", "kb_assets/pipeline/query_stats.py"):
        text = (REPO / rel).read_text(encoding="utf-8")
        tables = extract_code(SignpostInput(rel, "code", rel, text, {}))["tables"]
        assert {"chunks", "documents"} <= set(tables), (rel, tables)
        assert not {"sel", "top", "allw", "cd", "d", "up"} & set(tables), (rel, tables)
    sql = ("WITH RECURSIVE walk(id) AS (SELECT id FROM nodes), recent AS MATERIALIZED (SELECT * FROM events) "
           "SELECT * FROM walk JOIN recent ON true JOIN edges e ON e.a = walk.id")
    assert extract_code(SignpostInput("q.sql", "code", "q.sql", sql, {}))["tables"] == ["nodes", "events", "edges"]


def test_status_keeps_the_documents_own_word():
    text = "# 1. Use X\n\n## Status\n\nApproved\n\n## Decision\n\nWe will use X because it is simpler.\n" + FILLER
    assert _sign(text, {"status": "Accepted", "status_raw": "Approved"})["status"] == "Accepted (Approved)"
    assert _sign(text, {"status": "Accepted", "status_raw": "Accepted"})["status"] == "Accepted"
    assert normalise_status("done") == "Implemented (Done)"      # one canonical vocabulary with the readers
    assert normalise_status("Superseded by [ADR-12](ADR-12.md)") == "Superseded by ADR-12"


def test_rationale_is_a_reason_not_the_contexts_opening():
    adr = ("# 2. Queue\n\n## Context\n\nWe run many workers on one host today. The old broker is painful to operate "
           "and loses jobs on restart.\n\n## Decision\n\nWe will use Kafka for the job queue.\n\n## Consequences\n\n"
           "Operators will have to learn a new tool. Replays become easier for support.\n")
    d = _sign(adr)["key_decisions"][0]
    assert d["decision"] == "We will use Kafka for the job queue."
    # the consequence that is a benefit, not the downside before it, nor the context's first sentence
    assert d["rationale"] == "Replays become easier for support."
    no_reason = ("# 3. Colour\n\n## Context\n\nWe have a web site with a header.\n\n## Decision\n\n"
                 "The header will be blue.\n\n## Consequences\n\nThe header will be blue on every page.\n")
    d = _sign(no_reason)["key_decisions"][0]
    assert d["decision"] == "The header will be blue." and d["rationale"] == ""
    options = ("# 4. DB\n\n## Context\n\nWe need a database.\n\n## Decision\n\nWe discussed three options:\n\n"
               " 1. one instance each\n 2. terraform users\n 3. one shared instance\n\nThe final option is the one "
               "we've chosen, in order to simplify our connectivity code.\n")
    decisions = [x["decision"] for x in _sign(options)["key_decisions"]]
    assert not any(x.startswith(("We discussed", "one instance each", "terraform users")) for x in decisions)


@pytest.fixture(scope="module")
def sample_report():
    if not (REPO.parent / "shared" / "corpora").is_dir():
        pytest.skip("shared corpora not available")
    sys.path.insert(0, str(REPO / "bench" / "signpost_sample"))
    try:
        import measure
    finally:
        sys.path.pop(0)
    return measure


def test_hand_labelled_sample_precision(sample_report, tmp_path):
    """The 40 hand-labelled signposts: every item the signposter produces is labelled, and precision holds."""
    m = sample_report
    labels = json.loads((REPO / "bench" / "signpost_sample" / "labels.json").read_text(encoding="utf-8"))
    assert len(labels) == 40 and len({d["source"] for d in labels}) == 5
    roots = m.unpack(tmp_path)
    dec, rat, art, unknown = [], [], [], []
    for doc in labels:
        sp = m.signpost(roots[doc["source"]], doc["source"], doc["path"])
        known_dec = {d["decision"]: d["decision_ok"] for d in doc["decisions"]}
        known_rat = {(d["decision"], d["rationale"]): d["rationale_ok"] for d in doc["decisions"]}
        known_art = {a["artifact"]: a["ok"] for a in doc["artifacts"]}
        for d in sp["key_decisions"]:
            (dec.append(known_dec[d["decision"]]) if d["decision"] in known_dec else unknown.append(d["decision"]))
            if d["rationale"]:
                ok = known_rat.get((d["decision"], d["rationale"]))
                (rat.append(ok) if ok is not None else unknown.append(d["rationale"]))
        for a in sp["artifacts"]:
            (art.append(known_art[a]) if a in known_art else unknown.append(a))
    assert not unknown, f"label these in bench/signpost_sample/labels.json first: {unknown[:5]}"
    assert sum(dec) / len(dec) >= 0.85 and len(dec) >= 50
    assert sum(rat) / len(rat) >= 0.75 and len(rat) >= 25
    assert sum(art) / len(art) >= 0.90 and len(art) >= 25
