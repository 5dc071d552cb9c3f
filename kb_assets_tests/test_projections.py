"""The projections stage (issue 13 §3): T0/T1/by-tag/relates/code-map files from a real index, deterministic,
rewriting nothing when nothing changed, tags governed by the kb.yaml vocabulary; `kb tier|tags|related`."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from kb_assets.config import ConfigError, parse_config
from kb_assets.embedding import FixedCostEmbedder
from kb_assets.pipeline import index_sources
from kb_assets.pipeline.projections import build_projections
from kb_assets.projections.files import FileSync, write_if_changed
from kb_assets.projections.vocabulary import TagVocabulary, normalise_tag, tag_file_name
from kb_assets.signposts.extractive import ExtractiveSignposter

FILLER = "The team discussed the trade-offs at length and wrote them down for later readers. " * 3


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")


def _adr(n: int, title: str, status: str, tags: str, decision: str) -> str:
    return (f"# {n}. {title}\n\nDate: 2024-02-0{n}\nTags: {tags}\n\n## Status\n\n{status}\n\n## Context\n\n{FILLER}\n\n"
            f"## Decision\n\n{decision}\n\n## Consequences\n\nOperators follow `src/queue/worker.py`. {FILLER}\n")


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    _write(root, "docs/adr/0001-use-rabbitmq.md", _adr(1, "Use RabbitMQ | for jobs", "Superseded by [ADR 2](0002-use-kafka.md)",
                                                   "queues, ops", "We will use RabbitMQ because it is what we run."))
    _write(root, "docs/adr/0002-use-kafka.md", _adr(2, "Use Kafka for jobs", "Approved", "MQ, streaming",
                                                 "We will use Kafka because replay matters to us."))
    _write(root, "docs/guide.md", "# Operator guide\n\nHow to run the workers; see [the decision](adr/0002-use-kafka.md)"
           " for why.\n\n" + FILLER)
    _write(root, "src/queue/worker.py", '"""Job worker: takes jobs off the queue and runs them."""\n\n'
           "import time\n\n\ndef run_forever(queue):\n    \"\"\"Take jobs until stopped.\"\"\"\n"
           "    while True:\n        job = queue.get()\n        job.run()\n        time.sleep(0.1)\n\n\n"
           "class Backoff:\n    \"\"\"Retry delays.\"\"\"\n\n    def next(self):\n        return 1\n\n\n"
           "SQL = \"SELECT id FROM jobs WHERE state = 'ready'\"\n")
    return root


def _config(tmp_path: Path, repo: Path, db_url: str, **extra):
    data = {"data_dir": str(tmp_path / "kb"), "database_url": db_url, "sources": [
        {"key": "decisions", "kind": "adr", "root": str(repo), "include": ["docs/adr/*.md"]},
        {"key": "docs", "kind": "doc", "root": str(repo), "include": ["docs/*.md"]},
        {"key": "code", "kind": "code", "root": str(repo), "include": ["src/**/*.py"]}], **extra}
    path = tmp_path / "kb.yaml"
    path.write_text(json.dumps(data))
    return parse_config(data, path=str(path), base_dir=str(tmp_path)), path


def _index(cfg, conn):
    return index_sources(cfg, conn, embedder=FixedCostEmbedder(0.0), signposter=ExtractiveSignposter(),
                         projections=True)


def _mtimes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def test_tier_files_from_a_real_index(tmp_path, repo, db_url, conn):
    cfg, _ = _config(tmp_path, repo, db_url)
    runs = _index(cfg, conn)
    stats = runs["code"].extra["projections"]
    machine = tmp_path / "kb" / "machine"
    assert stats.directory == str(machine)
    files = sorted(p.relative_to(machine).as_posix() for p in machine.rglob("*.dsl"))
    assert files == ["adr.dsl", "by-tag/mq.dsl", "by-tag/ops.dsl", "by-tag/queues.dsl", "by-tag/streaming.dsl",
                     "code/code.dsl", "doc.dsl", "index.dsl", "relates.dsl"]

    t0 = (machine / "index.dsl").read_text().splitlines()
    body = [ln for ln in t0 if not ln.startswith("#")]
    assert body == [
        "0001-use-rabbitmq.md | adr | Use RabbitMQ / for jobs | = | Superseded",    # "|" never breaks a line
        "0002-use-kafka.md | adr | Use Kafka for jobs | = | Accepted",
        "guide.md | doc | Operator guide | = | -",
    ]
    assert [ln for ln in t0 if ln.startswith("## ")] == ["## kb:decisions/docs/adr/", "## kb:docs/docs/"]
    assert not any("worker.py" in ln for ln in t0)                  # code: the code map, not T0
    assert 0 < stats.t0_tokens_per_entry <= 30 and stats.entries == 3

    t1 = (machine / "adr.dsl").read_text().splitlines()
    old = next(ln for ln in t1 if ln.startswith("kb:decisions/docs/adr/0001"))
    assert " | Superseded → kb:decisions/docs/adr/0002-use-kafka.md | " in old
    new = next(ln for ln in t1 if ln.startswith("kb:decisions/docs/adr/0002"))
    assert " | Accepted (Approved) | " in new                      # the ADR's own word beside the normalised one
    use_when = new.rsplit(" | ", 1)[1]
    assert len(use_when) > 20 and use_when != "-" and not use_when.startswith("Use Kafka for jobs")

    relates = (machine / "relates.dsl").read_text()
    assert ("kb:decisions/docs/adr/0001-use-rabbitmq.md | superseded_by | kb:decisions/docs/adr/0002-use-kafka.md"
            in relates)
    assert ("kb:decisions/docs/adr/0002-use-kafka.md | supersedes | kb:decisions/docs/adr/0001-use-rabbitmq.md"
            in relates)
    assert "kb:docs/docs/guide.md | references | kb:decisions/docs/adr/0002-use-kafka.md" in relates
    assert "kb:decisions/docs/adr/0002-use-kafka.md | touches | kb:code/src/queue/worker.py" in relates

    code = (machine / "code" / "code.dsl").read_text().splitlines()
    line = next(ln for ln in code if ln.startswith("src/queue/worker.py | "))
    assert "Job worker" in line and "run_forever" in line and "Backoff" in line and line.endswith("| jobs")

    tag = (machine / "by-tag" / "queues.dsl").read_text()
    assert "kb:decisions/docs/adr/0001-use-rabbitmq.md | adr |" in tag and "0002" not in tag
    # world-readable like any file the user writes (mkstemp alone makes 0600)
    assert (machine / "index.dsl").stat().st_mode & 0o044


def test_unchanged_index_rewrites_nothing_and_changes_touch_only_their_files(tmp_path, repo, db_url, conn):
    cfg, _ = _config(tmp_path, repo, db_url)
    _index(cfg, conn)
    machine = tmp_path / "kb" / "machine"
    (machine / "README.md").write_text("not ours")
    before = _mtimes(machine)
    snapshot = {p: (machine / p).read_bytes() for p in before}
    again = build_projections(conn, cfg)
    assert again.written == [] and again.removed == [] and again.unchanged == again.files
    assert _mtimes(machine) == before                               # not even rewritten with the same bytes
    # the same index renders the same bytes in a fresh folder (no timestamps, stable order; at the same depth,
    # as the source roots are shown relative to the folder)
    other = cfg.model_copy(update={"projections_dir": str(tmp_path / "kb" / "other")})
    build_projections(conn, other)
    assert {p: (tmp_path / "kb" / "other" / p).read_bytes() for p in before if p != "README.md"} == \
        {p: b for p, b in snapshot.items() if p != "README.md"}

    # the guide drops its link and the streaming tag goes: only the files that show them change
    _write(repo, "docs/guide.md", "# Operator guide\n\nHow to run the workers.\n\n" + FILLER)
    _write(repo, "docs/adr/0002-use-kafka.md", _adr(2, "Use Kafka for jobs", "Approved", "MQ",
                                                    "We will use Kafka because replay matters to us."))
    runs = _index(cfg, conn)
    stats = runs["code"].extra["projections"]
    assert "relates.dsl" in stats.written and stats.removed == ["by-tag/streaming.dsl"]
    assert "index.dsl" not in stats.written and "code/code.dsl" not in stats.written
    after = _mtimes(machine)
    assert after["index.dsl"] == before["index.dsl"] and after["README.md"] == before["README.md"]


def test_tag_vocabulary_governs_by_tag_files(tmp_path, repo, db_url, conn):
    cfg, path = _config(tmp_path, repo, db_url, tags=["ops", {"tag": "messaging", "aliases": ["mq", "Queues"]}])
    stats = _index(cfg, conn)["code"].extra["projections"]
    machine = tmp_path / "kb" / "machine"
    assert sorted(p.name for p in (machine / "by-tag").iterdir()) == ["messaging.dsl", "ops.dsl"]
    messaging = (machine / "by-tag" / "messaging.dsl").read_text()
    assert "0001-use-rabbitmq.md" in messaging and "0002-use-kafka.md" in messaging       # via both aliases
    assert stats.tags_outside_vocabulary == {"streaming": 1}                              # reported, not added

    from kb_assets.projections.report import tags_report
    report = tags_report(conn, cfg)
    assert report["governed"] and report["outside"] == {"streaming": 1} and report["unused"] == []
    assert report["tags"]["messaging"] == {"documents": 2, "file": "by-tag/messaging.dsl"}


def test_tags_in_vocabulary_asset_check(tmp_path, repo, db_url, conn, monkeypatch):
    cfg, path = _config(tmp_path, repo, db_url, tags=["ops"])
    _index(cfg, conn)
    import dagster as dg

    from kb_assets.defs.checks import tags_in_vocabulary
    from kb_assets.defs.resources import KbResource

    result = tags_in_vocabulary(KbResource(config_path=str(path)))
    assert isinstance(result, dg.AssetCheckResult) and result.passed is False
    assert result.metadata["outside"].value == 3          # queues, mq, streaming
    assert result.metadata["outside_tags"].value == {"mq": 1, "queues": 1, "streaming": 1}


def test_cli_tier_tags_related(tmp_path, repo, db_url, conn, capsys):
    from kb_assets.cli import main

    cfg, path = _config(tmp_path, repo, db_url)
    assert main(["tier", "0", "--config", str(path)]) == 1           # nothing built yet: says what to run
    assert "run `kb index`" in capsys.readouterr().err
    _index(cfg, conn)
    assert main(["tier", "0", "--config", str(path)]) == 0
    assert capsys.readouterr().out == (tmp_path / "kb" / "machine" / "index.dsl").read_text()
    assert main(["tier", "1", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "adr | 2 entries" in out and "doc | 1 entries" in out and "code | 1 sources" in out
    assert main(["tier", "1", "adr", "--config", str(path)]) == 0
    assert capsys.readouterr().out.startswith("# kb T1 adr: id | title | status | use when")
    assert main(["tier", "1", "code", "--config", str(path)]) == 0
    assert "src/queue/worker.py | " in capsys.readouterr().out
    assert main(["tier", "1", "memo", "--config", str(path)]) == 1
    assert "types are adr, doc, code" in capsys.readouterr().err
    assert main(["tier", "2", "kb:docs/docs/guide.md", "--config", str(path)]) == 0     # T2 is `kb show`
    assert capsys.readouterr().out.startswith("kb:docs/docs/guide.md  [doc]")
    assert main(["tier", "2", "--config", str(path)]) == 1
    assert "one document at a time" in capsys.readouterr().err

    assert main(["tags", "--json", "--config", str(path)]) == 0
    tags = json.loads(capsys.readouterr().out)
    assert set(tags["tags"]) == {"mq", "ops", "queues", "streaming"} and not tags["governed"]

    assert main(["related", "kb:decisions/docs/adr/0002-use-kafka.md", "--json", "--config", str(path)]) == 0
    rel = json.loads(capsys.readouterr().out)
    kinds = {(e["from"], e["kind"], e["to"]) for e in rel["edges"]}
    assert ("kb:decisions/docs/adr/0002-use-kafka.md", "supersedes", "kb:decisions/docs/adr/0001-use-rabbitmq.md") \
        in kinds
    assert ("kb:docs/docs/guide.md", "references", "kb:decisions/docs/adr/0002-use-kafka.md") in kinds
    assert all(e["depth"] == 1 for e in rel["edges"])
    assert main(["related", "kb:docs/docs/guide.md", "--depth", "2", "--config", str(path)]) == 0
    text = capsys.readouterr().out
    assert "2 | kb:decisions/docs/adr/0002-use-kafka.md | supersedes | kb:decisions/docs/adr/0001-use-rabbitmq.md" \
        in text
    assert main(["related", "kb:docs/nope.md", "--config", str(path)]) == 1
    assert "no document kb:docs/nope.md" in capsys.readouterr().err


def test_config_errors_for_tags_and_projections_dir(tmp_path):
    with pytest.raises(ConfigError) as e:
        parse_config({"tags": [{"tag": "ops", "alias": ["x"]}]}, path="kb.yaml", base_dir=str(tmp_path))
    assert "kb.yaml: tags" in str(e.value) and "unknown key" in str(e.value)
    cfg = parse_config({"projections_dir": "docs/machine"}, path="kb.yaml", base_dir=str(tmp_path))
    assert cfg.projections_path() == tmp_path / "docs" / "machine"
    assert parse_config({}, path="kb.yaml", base_dir=str(tmp_path)).projections_path() == tmp_path / ".kb" / "machine"


def test_vocabulary_and_file_names():
    v = TagVocabulary(["Ops", {"tag": "jet stream", "aliases": ["JS", "jetstream"]}])
    assert v.governed and v.tags == ["ops", "jet-stream"]
    assert [v.map(t) for t in ("ops", "OPS", "Jet_Stream", "js", "JetStream", "kv")] == \
        ["ops", "ops", "jet-stream", "jet-stream", "jet-stream", None]
    assert TagVocabulary().map(" Some Tag ") == "some-tag"
    assert normalise_tag("a  b__c") == "a-b-c"
    assert tag_file_name("../../etc/passwd") == "etc-passwd" and tag_file_name("...") == "_"


def test_write_if_changed_is_atomic_and_lazy(tmp_path):
    p = tmp_path / "a" / "x.dsl"
    assert write_if_changed(p, "one\n") and not write_if_changed(p, "one\n")
    assert write_if_changed(p, "two\n") and p.read_text() == "two\n"
    assert [q.name for q in p.parent.iterdir()] == ["x.dsl"]            # no temp file left behind
    sync = FileSync(tmp_path / "a")
    (tmp_path / "a" / "by-tag").mkdir()
    (tmp_path / "a" / "by-tag" / "old.dsl").write_text("x")
    (tmp_path / "a" / "notes.txt").write_text("keep")
    sync.apply({"x.dsl": "two\n", "by-tag/new.dsl": "n\n"})
    assert sync.written == ["by-tag/new.dsl"] and sync.unchanged == 1 and sync.removed == ["by-tag/old.dsl"]
    assert (tmp_path / "a" / "notes.txt").exists()


def test_projections_on_this_repository_code(tmp_path, db_url, conn):
    """The code map of this repository's own query engine lists its real definitions."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists() and subprocess.run(["git", "-C", str(root), "rev-parse"],
                                                       capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    cfg = parse_config({"data_dir": str(tmp_path / "kb"), "sources": [
        {"key": "self", "kind": "code", "root": str(root), "include": ["kb_assets/query/*.py"]}]},
        path="kb.yaml", base_dir=str(tmp_path))
    _index(cfg, conn)
    code = (tmp_path / "kb" / "machine" / "code" / "self.dsl").read_text().splitlines()
    engine = next(ln for ln in code if ln.startswith("kb_assets/query/engine.py | "))
    assert "recall" in engine.split(" | ")[2]


def test_use_when_drawn_from_the_signpost():
    from kb_assets.projections.load import Entry
    from kb_assets.projections.render import use_when

    e = Entry(1, "s", "a.md", "adr", "Use ADRs", summary="Use ADRs — We record decisions. Then more.")
    assert use_when(e) == "We record decisions."                      # the title's repetition dropped
    e = Entry(1, "s", "a.md", "adr", "Goals", summary="Arachne has goals that make this important:",
              first_decision="We will keep a decision log. Because.")
    assert use_when(e) == "We will keep a decision log."              # an introduction says nothing: the decision
    e = Entry(1, "s", "a.md", "doc", "T", summary="word " * 80)
    assert len(use_when(e)) <= 180 and use_when(e).endswith("…")


def test_a_killed_writers_temp_file_is_removed_once_stale(tmp_path):
    """A kill -9 between mkstemp and rename leaves `.<name>.dsl.<random>.tmp` (issue 12: the fault harness kills
    the projections stage too): the next run removes it once it is older than a live writer could be."""
    import os
    import time as _time

    from kb_assets.projections.files import STALE_TEMP_SECONDS, FileSync

    (tmp_path / "by-tag").mkdir()
    stale = tmp_path / "by-tag" / ".x.dsl.k3j2.tmp"
    fresh = tmp_path / ".index.dsl.q9z8.tmp"       # a concurrent writer's, mid-write
    for p in (stale, fresh):
        p.write_text("half a file")
    old = _time.time() - STALE_TEMP_SECONDS - 5
    os.utime(stale, (old, old))
    sync = FileSync(tmp_path)
    sync.apply({"index.dsl": "a | doc | A | a.md | active\n"})
    assert not stale.exists() and fresh.exists()
    assert (tmp_path / "index.dsl").read_text().startswith("a | doc")


def test_squash_and_first_sentence_equal_their_regex_forms():
    """Issue 14: the tier files' whitespace squashing (str.split) and sentence end (the mark scanned for first)
    give what the substitution and the lookbehind-first pattern gave, on every kind of whitespace and end."""
    import random
    import re

    from kb_assets.projections.render import first_sentence, squash

    ws = re.compile(r"\s+")
    end = re.compile(r"(?<=[a-z0-9)\]`'\"])[.!?](?=\s+[A-Z(`\"'])")
    pieces = ["a", "Z", "0", ")", "]", "`", "'", '"', "(", ".", "!", "?", " ", "\t", "\n", "\r", "\x0b", "\x0c",
              "\x1c", "\x1f", "\x85", "\xa0", "\u2003", "\u2028", "\u3000", "\u200b", "é", "É", "|", "word"]
    rng = random.Random(14)
    texts = ["", " ", "One. Two", "Done!  Next (x)", "e.g. This", "v1.2. Next", "A.\u00a0B", "end.\nNext"]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))) for _ in range(20_000)]
    for t in texts:
        s = ws.sub(" ", t).strip()
        assert squash(t) == s, repr(t)
        m = end.search(s)
        assert first_sentence(t) == (s[: m.start() + 1] if m else s), repr(t)
