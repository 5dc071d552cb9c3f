"""Precision of the extractive signposter's decisions, rationales and artifacts on a hand-labelled sample.

    .venv/bin/python bench/signpost_sample/measure.py [--labels bench/signpost_sample/labels.json] [--unlabelled]

The sample: 40 documents across the shared corpora (10 NATS ADRs, 10 govuk-aws, 8 govuk-infrastructure,
6 arachne, 6 PEPs; drawn with random.seed(13)), their signposts labelled by hand item by item
(labels_before.json: the signposter before the issue-13 changes; labels.json: every item either version
produced). An item the labels do not know is reported (--unlabelled lists them) and left out of the
precision, so a changed output must be labelled before its figures mean anything.

Also: coverage — of the ADRs (four ADR corpora) with a Decision / Design / Solution section, the share whose
signpost has a decision with a rationale (issue 13 §4 asks ≥ 80%).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPORA = HERE.parents[1].parent / "shared" / "corpora"
TARBALLS = {
    "nats": ("adr-nats-io+nats-architecture-and-design-f5f5126268f8", "adr/*.md"),
    "govuk-aws": ("adr-alphagov+govuk-aws-81ee9f6e91fd", "docs/architecture/decisions/*.md"),
    "govuk-infra": ("adr-alphagov+govuk-infrastructure-d9b7454f2606", "docs/architecture/decisions/*.md"),
    "arachne": ("adr-arachne-framework+architecture-060a956277a5", "adr-*.md"),
    "peps": ("python-peps-ba4deeb79695", "peps/pep-*.rst"),
}
_DECISION_HEADING = re.compile(r"(?im)^(?:#{1,6}\s*(?:the\s+)?(?:decision|design|solution|decision outcome)\b"
                               r"|(?:decision|design|solution)\s*\n[=\-~^]{3,})")


def unpack(out: Path) -> dict[str, Path]:
    roots = {}
    for key, (name, _glob) in TARBALLS.items():
        with tarfile.open(CORPORA / f"{name}.tar.gz") as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(out, filter="data")
        roots[key] = out / top
    return roots


def signpost(root: Path, key: str, path: str) -> dict:
    from kb_assets.config import SourceConfig
    from kb_assets.signposts.base import SignpostInput
    from kb_assets.signposts.extractive import ExtractiveSignposter
    from kb_assets.sources.discovery import list_paths
    from kb_assets.sources.readers import read_entry

    source = SourceConfig(key=key, kind="adr", root=str(root), include=[TARBALLS[key][1]])
    entry = list_paths(root, source, [path]).files[0]
    doc = read_entry(root, entry, source)[0]
    return ExtractiveSignposter().generate(SignpostInput(doc.title, doc.kind, doc.path, doc.text, doc.meta)).payload


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--labels", default=str(HERE / "labels.json"))
    ap.add_argument("--unlabelled", action="store_true", help="print the items the labels do not know")
    ap.add_argument("--dump", help="write this run's sample signposts (JSON) here")
    args = ap.parse_args()
    labels = json.loads(Path(args.labels).read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        roots = unpack(Path(tmp))
        dec, rat, art, unknown, dump = [], [], [], [], []
        for doc in labels:
            sp = signpost(roots[doc["source"]], doc["source"], doc["path"])
            known_d = {(d["decision"], d["rationale"]): d for d in doc["decisions"]}
            known_dec = {d["decision"]: d["decision_ok"] for d in doc["decisions"]}
            known_a = {a["artifact"]: a["ok"] for a in doc["artifacts"]}
            dump.append({"source": doc["source"], "path": doc["path"], "decisions": sp["key_decisions"],
                         "artifacts": sp["artifacts"]})
            for d in sp["key_decisions"]:
                lab = known_d.get((d["decision"], d["rationale"]))
                if d["decision"] in known_dec:
                    dec.append(known_dec[d["decision"]])
                else:
                    unknown.append((doc["source"], doc["path"], "decision", d["decision"]))
                if d["rationale"]:
                    if lab is not None and lab["rationale_ok"] is not None:
                        rat.append(lab["rationale_ok"])
                    else:
                        unknown.append((doc["source"], doc["path"], "rationale", d["decision"][:60], d["rationale"]))
            for a in sp["artifacts"]:
                if a in known_a:
                    art.append(known_a[a])
                else:
                    unknown.append((doc["source"], doc["path"], "artifact", a))
        # coverage over every ADR with a decision-like section
        with_section = with_rationale = 0
        for key in ("nats", "govuk-aws", "govuk-infra", "arachne"):
            root = roots[key]
            for p in sorted(root.glob(TARBALLS[key][1])):
                rel = p.relative_to(root).as_posix()
                if not _DECISION_HEADING.search(p.read_text(encoding="utf-8")):
                    continue
                with_section += 1
                sp = signpost(root, key, rel)
                if any(d["rationale"] for d in sp["key_decisions"]):
                    with_rationale += 1
    if args.dump:
        Path(args.dump).write_text(json.dumps(dump, indent=1, ensure_ascii=False), encoding="utf-8")

    def p(xs):
        return f"{sum(xs) / len(xs):.2f} ({sum(xs)}/{len(xs)})" if xs else "n/a"

    print(f"decisions  precision {p(dec)}")
    print(f"rationales precision {p(rat)}")
    print(f"artifacts  precision {p(art)}")
    print(f"ADRs with a Decision/Design/Solution section having a decision with a rationale: "
          f"{with_rationale}/{with_section} = {with_rationale / max(1, with_section):.2f}")
    print(f"unlabelled items: {len(unknown)} (left out)")
    if args.unlabelled:
        for u in unknown:
            print("  ", json.dumps(u, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
