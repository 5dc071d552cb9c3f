"""recall() over a small corpus inserted straight into a fresh database, with a deterministic toy embedder."""
from __future__ import annotations

import re
import subprocess

import pytest

from kb_assets.query import QueryError, Tuning, recall, show
from kb_assets_tests.test_query_support import Corpus, ToyEmbedder

NO_GATE = Tuning(gate=False)

FILLER_TOPICS = [
    "tomato seedlings need warm soil and steady watering in spring",
    "sourdough bread rises slowly in a cool kitchen overnight",
    "the choir rehearses harmonies for the winter concert",
    "mountain hiking boots must be broken in before long trails",
    "watercolor paint dries lighter than it looks when wet",
    "chess openings reward development of minor pieces early",
    "bicycle chains last longer when cleaned and oiled",
    "birds migrate south following coastlines and rivers",
    "pottery glaze cracks when the kiln cools too quickly",
    "marathon training alternates long runs with rest days",
    "origami cranes fold from a single square of paper",
    "beekeepers inspect hives for the queen every week",
]


@pytest.fixture
def corpus(conn):
    c = Corpus(conn)
    c.doc("adr/0001-celery-restart.md", [
        ("Context", "Celery workers leak memory and hang after long uptimes, so tasks pile up in the queue."),
        ("Decision", "We restart celery workers nightly with a graceful warm shutdown and SIGHUP restart."),
    ], source="decisions", kind="adr", title="Restart celery workers nightly",
        meta={"status": "Accepted", "date": "2023-05-01", "tags": ["celery", "ops"]},
        signpost={"summary": "Nightly graceful restart of celery workers to contain memory leaks.",
                  "work_types": ["decision", "ops"],
                  "key_decisions": [{"decision": "Restart celery workers nightly", "rationale": "memory leaks"}],
                  "artifacts": ["deploy/celery.service"], "components": ["celery", "redis"], "tags": ["celery"]})
    c.doc("adr/0002-bid-pipeline.md", [
        ("Context", "The bid pipeline ingests auction bids from partners in large batches every hour."),
        ("Decision", "Stream bids through kafka into the bid pipeline instead of hourly batch files."),
    ], source="decisions", kind="adr", title="Stream the bid pipeline",
        meta={"status": "Proposed", "date": "2024-02-10", "tags": ["pipeline"]})
    c.doc("adr/0003-postgres-backups.md", [
        "Postgres backups run with pg_dump nightly and are copied to object storage for thirty days.",
    ], source="decisions", kind="adr", title="Back up postgres nightly",
        meta={"status": "Accepted", "date": "2022-11-20", "tags": ["postgres", "ops"]})
    c.doc("notes/celery-restart-runbook.md", [
        "Runbook: to restart celery workers, drain the queue, send SIGHUP, watch the worker restart logs.",
    ], source="notes", kind="doc", title="Celery restart runbook", meta={"date": "2024-06-01"})
    c.doc("app/tasks.py", [
        ("send_invoice", "@celery.task(bind=True)\ndef send_invoice(self, invoice_id):\n    retry celery task on failure"),
    ], source="code", kind="code", title="app/tasks.py",
        signpost={"purpose": "Celery tasks for invoices: sending and retrying.",
                  "key_functions": [{"name": "send_invoice", "does": "sends one invoice"}], "tables": ["invoices"]})
    for i, topic in enumerate(FILLER_TOPICS):
        c.doc(f"misc/{i:02d}.md", [topic], source="notes", kind="doc", title=f"Note {i}")
    c.refresh()
    return c


def ids(records):
    return [r.id for r in records]


def test_hybrid_finds_both_channels_and_separates_code(corpus, conn):
    emb = ToyEmbedder()
    r = recall("restart celery workers", conn=conn, embedder=emb, tuning=NO_GATE)
    assert ids(r.documents)[:2] == ["kb:decisions/adr/0001-celery-restart.md", "kb:notes/notes/celery-restart-runbook.md"] \
        or set(ids(r.documents)[:2]) == {"kb:decisions/adr/0001-celery-restart.md",
                                         "kb:notes/notes/celery-restart-runbook.md"}
    assert all(rec.kind != "code" for rec in r.documents)
    assert ids(r.code) == ["kb:code/app/tasks.py"]
    assert r.code[0].signpost["purpose"].startswith("Celery tasks")
    assert emb.calls == 1
    assert r.timings["embed_ms"] >= 0 and r.timings["search_ms"] > 0
    # no code section asked for
    r0 = recall("restart celery workers", conn=conn, embedder=emb, code_limit=0, tuning=NO_GATE)
    assert r0.code == []


def test_record_fields_and_json_shape(corpus, conn):
    r = recall("restart celery workers", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE)
    top = next(x for x in r.documents if x.path == "adr/0001-celery-restart.md")
    d = top.to_dict()
    assert d["id"] == "kb:decisions/adr/0001-celery-restart.md"
    assert (d["title"], d["kind"], d["source"], d["status"], d["created"]) == (
        "Restart celery workers nightly", "adr", "decisions", "Accepted", "2023-05-01")
    sp = d["signpost"]
    assert sp["summary"].startswith("Nightly graceful restart")
    assert sp["key_decisions"] == [{"decision": "Restart celery workers nightly", "rationale": "memory leaks"}]
    assert sp["components"] == ["celery", "redis"] and sp["artifacts"] == ["deploy/celery.service"]
    assert "omitted" not in sp
    assert d["stale"] is False and d["truncated"] is False
    out = r.to_dict()
    assert set(out) >= {"query", "queries", "documents", "code", "truncated", "token_estimate"}
    assert out["query"] == "restart celery workers" and out["queries"] == ["restart celery workers"]
    # a document without a signpost falls back to its first lines, marked as such
    bid = recall("stream bids kafka", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE).documents[0]
    assert bid.path == "adr/0002-bid-pipeline.md"
    assert bid.signpost["generator"] == "none" and "bid pipeline" in bid.signpost["summary"]


def test_text_render_ends_with_token_estimate(corpus, conn):
    r = recall(["restart celery workers", "bid pipeline kafka"], conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE)
    text = r.render_text()
    m = re.search(r"\n~(\d+) tokens$", text)
    assert m and abs(int(m.group(1)) - len(text) / 4) < 3
    assert "## documents" in text and "## code" in text
    assert "kb:decisions/adr/0001-celery-restart.md" in text


def test_one_document_with_many_matching_chunks_cannot_take_the_list(conn):
    c = Corpus(conn)
    # a transcript with 300 chunks that all match, more than the 200-chunk candidate window
    c.doc("t/huge.jsonl", [f"turn {i}: the celery worker restart failed again, retry celery restart" for i in range(300)],
          source="transcripts", kind="transcript", title="huge session")
    for i in range(12):
        c.doc(f"d/{i:02d}.md", [f"celery worker restart note {i}: restart celery after deploy {i}"], source="docs",
              kind="doc")
    for i, topic in enumerate(FILLER_TOPICS):
        c.doc(f"f/{i:02d}.md", [topic], source="docs", kind="doc")
    c.refresh()
    r = recall("celery worker restart", conn=conn, embedder=ToyEmbedder(), limit=20, tuning=NO_GATE)
    got = ids(r.documents)
    assert len(got) == len(set(got))                              # collapsed: one record per document
    assert got.count("kb:transcripts/t/huge.jsonl") == 1
    notes = [i for i in got if i.startswith("kb:docs/d/")]
    assert len(notes) == 12                                       # every short note still made the list
    # the same in vector-only mode: the window is 200 chunks, the transcript alone has 300 matching chunks
    rv = recall("celery worker restart", conn=conn, embedder=ToyEmbedder(), limit=20, mode="vector", tuning=NO_GATE)
    assert len([i for i in ids(rv.documents) if i.startswith("kb:docs/d/")]) == 12


def test_per_document_cap_bounds_a_documents_score(conn):
    c = Corpus(conn)
    # copies of one passage (trailing spaces make distinct chunk hashes): same vector, same keyword score
    copy = "celery restart procedure step one"
    c.doc("t/long.md", [copy + " " * i for i in range(80)], source="a", text="long")
    c.doc("t/short.md", [copy + " " * i for i in range(3)], source="b", text="short")
    c.refresh()
    r = recall("celery restart procedure", conn=conn, embedder=ToyEmbedder(), tuning=Tuning(gate=False, doc_decay=0.5),
               ranked_ids=True)
    scores = r.channel_scores
    long_v, long_k = scores["kb:a/t/long.md"]["vector"], scores["kb:a/t/long.md"]["keyword"]
    short_v, short_k = scores["kb:b/t/short.md"]["vector"], scores["kb:b/t/short.md"]["keyword"]
    # 77 more equally good chunks add nothing beyond the per-document cap (3 chunks)
    assert long_v == pytest.approx(short_v, rel=1e-6)
    assert long_k <= short_k * 1.0001 + 1e-9


def test_threshold_drops_weak_results(corpus, conn):
    emb = ToyEmbedder()
    strong = recall("restart celery workers", conn=conn, embedder=emb, tuning=Tuning(min_similarity=0.35))
    assert "kb:decisions/adr/0001-celery-restart.md" in ids(strong.documents)
    assert len(strong.documents) < 8                     # filler notes are not used to fill the list
    none = recall("quantum chromodynamics lattice", conn=conn, embedder=emb, tuning=Tuning(min_similarity=0.35))
    assert none.documents == [] and none.code == []
    assert "none above threshold" in none.render_text()
    # the fused-score threshold too
    full = recall("restart celery workers", conn=conn, embedder=emb, tuning=NO_GATE)
    cut = recall("restart celery workers", conn=conn, embedder=emb, tuning=NO_GATE, min_score=0.7)
    assert 0 < len(cut.documents) < len(full.documents)
    assert all(x.score >= 0.7 for x in cut.documents)


def test_filters(corpus, conn):
    emb = ToyEmbedder()

    def run(**kw):
        return ids(recall("celery restart bid pipeline postgres backups", conn=conn, embedder=emb, tuning=NO_GATE,
                          **kw).documents)

    assert set(run(source="decisions")) == {"kb:decisions/adr/0001-celery-restart.md",
                                            "kb:decisions/adr/0002-bid-pipeline.md",
                                            "kb:decisions/adr/0003-postgres-backups.md"}
    assert all(i.startswith("kb:notes/") for i in run(source=["notes"]))
    assert all(i.startswith("kb:decisions/") for i in run(kind="adr"))
    assert set(run(tag="ops")) == {"kb:decisions/adr/0001-celery-restart.md", "kb:decisions/adr/0003-postgres-backups.md"}
    assert set(run(tag="OPS", source="decisions", kind="adr")) == set(run(tag="ops"))
    assert run(path_prefix="adr/000") and all("/adr/000" in i for i in run(path_prefix="adr/000"))
    assert run(path_prefix="nothing/") == []
    assert set(run(since="2023-01-01", until="2024-03-01")) == {"kb:decisions/adr/0001-celery-restart.md",
                                                                  "kb:decisions/adr/0002-bid-pipeline.md"}
    assert set(run(since="2024-05-01")) == {"kb:notes/notes/celery-restart-runbook.md"}
    code = recall("celery task retry", conn=conn, embedder=emb, tuning=NO_GATE, kind="code")
    assert code.documents == [] and ids(code.code) == ["kb:code/app/tasks.py"]
    with pytest.raises(QueryError, match="YYYY-MM-DD"):
        recall("x", conn=conn, embedder=emb, since="last tuesday")


def test_filtered_vector_search_uses_the_whole_filtered_set(conn):
    """pgvector < 0.8 returns at most ef_search rows before filtering: a filter must not starve the window."""
    c = Corpus(conn)
    for i in range(300):
        c.doc(f"big/{i:03d}.md", [f"celery worker restart story number {i}"], source="big")
    c.doc("small/only.md", ["gardening tomato seedlings"], source="small")
    c.refresh()
    r = recall("celery worker restart", conn=conn, embedder=ToyEmbedder(), mode="vector", source="small",
               tuning=NO_GATE)
    assert ids(r.documents) == ["kb:small/small/only.md"]


def test_multi_query_union_notes_matching_queries(corpus, conn):
    r = recall(["restart celery workers", "bid pipeline kafka"], conn=conn, embedder=ToyEmbedder(), limit=4,
               tuning=Tuning(min_similarity=0.3))
    got = {x.id: x for x in r.documents}
    assert "kb:decisions/adr/0001-celery-restart.md" in got and "kb:decisions/adr/0002-bid-pipeline.md" in got
    assert 0 in got["kb:decisions/adr/0001-celery-restart.md"].queries
    assert 1 in got["kb:decisions/adr/0002-bid-pipeline.md"].queries
    assert got["kb:decisions/adr/0002-bid-pipeline.md"].to_dict(r.queries)["queries"][0] == "bid pipeline kafka"
    assert len(r.documents) <= 4
    assert r.to_dict()["queries"] == ["restart celery workers", "bid pipeline kafka"]
    assert " q" in r.render_text()


def test_modes_and_space_mismatch(corpus, conn):
    kw = recall("celery restart", conn=conn, mode="keyword", tuning=NO_GATE)   # no embedder needed
    assert ids(kw.documents)[0] in {"kb:decisions/adr/0001-celery-restart.md", "kb:notes/notes/celery-restart-runbook.md"}
    vec = recall("celery restart", conn=conn, mode="vector", embedder=ToyEmbedder(), tuning=NO_GATE)
    assert vec.documents

    class Other(ToyEmbedder):
        model, dimension = "voyage-3.5", 1024

    with pytest.raises(QueryError, match="built with toy-bag-of-words .*config says voyage-3.5.*kb index"):
        recall("celery", conn=conn, embedder=Other())
    with pytest.raises(QueryError, match="mode"):
        recall("celery", conn=conn, mode="semantic")
    with pytest.raises(QueryError, match="empty"):
        recall(["celery", "  "], conn=conn)


def test_hybrid_without_vectors_falls_back_to_keyword(conn):
    conn.execute("INSERT INTO sources (key, kind, root) VALUES ('s', 'doc', '/x')")
    did = conn.execute("INSERT INTO documents (source_key, path, kind, title, status, text) VALUES"
                       " ('s', 'a.md', 'doc', 'A', 'active', 'celery restart') RETURNING id").fetchone()[0]
    conn.execute("INSERT INTO chunks (document_id, ordinal, start_line, end_line, token_count, chunk_hash, text)"
                 " VALUES (%s, 0, 1, 1, 2, 'h', 'celery restart')", (did,))
    r = recall("celery restart", conn=conn, tuning=NO_GATE)     # no stats either: bounded fallback
    assert ids(r.documents) == ["kb:s/a.md"]
    assert r.mode == "keyword" and any("no vectors" in w for w in r.warnings)
    assert any("statistics" in w for w in r.warnings)
    with pytest.raises(QueryError, match="no vectors"):
        recall("celery restart", conn=conn, mode="vector", embedder=ToyEmbedder())


def test_passage_option(corpus, conn):
    r = recall("graceful warm shutdown SIGHUP", conn=conn, embedder=ToyEmbedder(), include_passage=True,
               tuning=NO_GATE)
    top = r.documents[0]
    assert top.path == "adr/0001-celery-restart.md"
    assert top.passage["heading"] == "Decision" and "SIGHUP" in top.passage["text"]
    assert top.passage["lines"][0] >= 1
    assert "passage" in top.to_dict()
    assert recall("graceful warm shutdown", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE).documents[0].passage is None


def test_ids_are_stable_across_reindexing_and_show_accepts_them(corpus, conn):
    first = recall("stream bids kafka", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE).documents[0].id
    # delete and re-add the document: its row id changes, its kb id does not
    conn.execute("DELETE FROM documents WHERE path = 'adr/0002-bid-pipeline.md'")
    corpus.doc("adr/0002-bid-pipeline.md", [("Decision", "Stream bids through kafka into the bid pipeline.")],
               source="decisions", kind="adr", title="Stream the bid pipeline")
    corpus.refresh()     # as every `kb index` ends (the keyword postings and document vectors are refreshed)
    again = recall("stream bids kafka", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE).documents[0].id
    assert first == again == "kb:decisions/adr/0002-bid-pipeline.md"
    doc = show(again, conn=conn)
    assert doc["title"] == "Stream the bid pipeline" and "kafka" in doc["text"]
    assert doc["chunks"][0]["heading"] == "Decision"
    assert show("decisions/adr/0002-bid-pipeline.md", conn=conn)["id"] == again   # the prefix is optional
    with pytest.raises(QueryError, match="no document kb:decisions/adr/9999.md.*") as e:
        show("kb:decisions/adr/9999.md", conn=conn)
    with pytest.raises(QueryError, match="kb:<source>/<path>"):
        show("kb:nonsense", conn=conn)
    full = show("kb:decisions/adr/0001-celery-restart.md", conn=conn)
    assert full["signpost"]["generator"] == "extractive" and full["signpost"]["key_decisions"]


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_stale_flag_follows_the_source(conn, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "docs").mkdir()
    (repo / "docs" / "a.md").write_text("celery restart decision\n")
    (repo / "docs" / "b.md").write_text("bid pipeline decision\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "one")
    head1 = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    c = Corpus(conn)
    c.source("repo", root=str(repo), commit=head1)
    c.doc("docs/a.md", ["celery restart decision"], source="repo", commit=head1)
    c.doc("docs/b.md", ["bid pipeline decision"], source="repo", commit=head1)
    c.refresh()

    def stale():
        r = recall("celery restart bid pipeline decision", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE)
        return {x.path: x.stale for x in r.documents}

    assert stale() == {"docs/a.md": False, "docs/b.md": False}
    (repo / "docs" / "a.md").write_text("celery restart decision, revised\n")
    _git(repo, "commit", "-q", "-am", "two")
    assert stale() == {"docs/a.md": True, "docs/b.md": False}     # HEAD moved; only a.md changed
    # working-tree signature (size:mtime_ns): an uncommitted edit is stale too
    st = (repo / "docs" / "b.md").stat()
    conn.execute("UPDATE documents SET file_sig = %s WHERE path = 'docs/b.md'", (f"{st.st_size}:{st.st_mtime_ns}",))
    assert stale()["docs/b.md"] is False
    (repo / "docs" / "b.md").write_text("bid pipeline decision, edited but not committed\n")
    assert stale()["docs/b.md"] is True
    assert show("kb:repo/docs/b.md", conn=conn)["stale"] is True


def test_dates_and_status_from_metadata(conn):
    c = Corpus(conn)
    c.doc("peps/pep-0572.rst", ["assignment expressions walrus operator"], source="peps", kind="adr",
          meta={"status": "Final", "created": "28-Feb-2018"})
    c.refresh()
    r = recall("walrus operator", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE)
    rec = r.documents[0]
    assert (rec.status, rec.created) == ("Final", "2018-02-28")
    assert recall("walrus operator", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE, until="2017-12-31").documents == []


def test_evaluate_recall_and_batch_lines(corpus, conn):
    from kb_assets.query.metrics import evaluate_recall

    queries = {"q1": "restart celery workers", "q2": "stream bids through kafka", "q3": "tomato seedlings watering"}
    qrels = {"q1": {"kb:decisions/adr/0001-celery-restart.md": 1}, "q2": {"kb:decisions/adr/0002-bid-pipeline.md": 1},
             "q3": {"kb:notes/misc/00.md": 1}}
    m = evaluate_recall(queries, qrels, conn=conn, embedder=ToyEmbedder())
    assert m["queries"] == 3 and m["recall@100"] == 1.0 and m["ndcg@10"] > 0.8
    assert m["run"]["q1"][0] in {"kb:decisions/adr/0001-celery-restart.md", "kb:notes/notes/celery-restart-runbook.md"}
    # the same judged by path, and by file stem
    by_path = {q: {k.split("/", 1)[1]: g for k, g in rels.items()} for q, rels in qrels.items()}
    assert evaluate_recall(queries, by_path, conn=conn, embedder=ToyEmbedder())["ndcg@10"] == pytest.approx(m["ndcg@10"])
    by_stem = {"q1": {"0001-celery-restart": 1}}
    assert evaluate_recall({"q1": queries["q1"]}, by_stem, conn=conn, embedder=ToyEmbedder())["recall@10"] == 1.0
    line = recall("restart celery workers", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE).to_batch_line("q1")
    assert line["id"] == "q1" and line["documents"][0]["id"].startswith("kb:") and "code" in line
    assert set(line["documents"][0]) >= {"id", "path", "source", "kind", "title", "score"}


def test_whole_answer_stays_within_its_token_budget(conn):
    """30 records (20 documents, 10 code files), each with an overflowing signpost: the answer is ≤ 6,000 tokens."""
    rng_words = ("celery worker restart queue broker redis memory leak graceful shutdown deploy pipeline kafka "
                 "stream postgres backup retention partition").split()

    def words(n, seed):
        return " ".join(rng_words[(seed * 7 + i * 3) % len(rng_words)] for i in range(n))

    c = Corpus(conn)
    for i in range(25):
        c.doc(f"adr/{i:03d}-celery.md", [f"celery worker restart decision {i} " + words(30, i)], source="adr",
              kind="adr", title="Celery restart decision " + words(12, i),
              signpost={"summary": words(200, i), "key_decisions": [
                  {"decision": words(30, i + j), "rationale": words(40, i + j)} for j in range(6)],
                  "artifacts": [f"src/{words(3, i + j).replace(' ', '/')}.py" for j in range(30)],
                  "components": [words(2, j) for j in range(20)], "tags": rng_words[:12]})
        c.doc(f"src/{i:03d}_celery.py", [f"def restart_celery_worker_{i}(): celery worker restart " + words(20, i)],
              source="code", kind="code", signpost={"purpose": words(120, i),
                                                      "key_functions": [{"name": f"fn_{j}_{words(2, j).replace(' ', '_')}"}
                                                                        for j in range(30)]})
    c.refresh()
    r = recall("celery worker restart", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE)
    assert len(r.documents) == 20 and len(r.code) == 10
    text = r.render_text()
    n = int(re.search(r"~(\d+) tokens$", text).group(1))
    assert n <= 6000, n
    assert r.truncated and all(len(x.text) <= 1000 for x in r.documents + r.code)
    # 20 documents alone fit at the full per-record budget
    r20 = recall("celery worker restart", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE, code_limit=0)
    assert r20.candidates["record_chars"] == 1000
    assert int(re.search(r"~(\d+) tokens$", r20.render_text()).group(1)) <= 6000


def test_boilerplate_shared_by_many_documents_is_ignored(conn):
    c = Corpus(conn)
    footer = "This document is placed in the public domain or under the CC0 licence."
    for i, topic in enumerate(FILLER_TOPICS):
        # the footer sits under each document's own heading (different chunk hashes, same text)
        c.doc(f"d/{i:02d}.md", [(f"Doc {i}", topic), (f"Doc {i} > Copyright", footer)], source="s")
    c.refresh()
    r = recall(footer, conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE, mode="vector", include_passage=True)
    assert r.candidates["per_query"][0]["vector_chunks"] == 24          # footers and topics all in the window
    assert len(r.documents) == 12
    # the footer (the closest chunk of every document) never counts: each passage is the document's own text
    assert all(footer not in x.passage["text"] for x in r.documents)


def test_summary_repeating_the_title_is_not_printed_twice(conn):
    c = Corpus(conn)
    c.doc("adr/9.md", ["walrus operator assignment expressions"], source="s", kind="adr",
          title="PEP 572 – Assignment Expressions",
          signpost={"summary": "PEP 572 – Assignment Expressions — This PEP proposes the walrus operator."})
    c.refresh()
    rec = recall("walrus operator", conn=conn, embedder=ToyEmbedder(), tuning=NO_GATE).documents[0]
    assert rec.signpost["summary"] == "This PEP proposes the walrus operator."
    assert rec.text.count("Assignment Expressions") == 1


def test_gate_formula():
    """Unit test of the relevance gate on hand-made hits (floor 0.25, margin 0.15, coverage 0.6)."""
    from kb_assets.config import QuerySettings
    from kb_assets.query.engine import _DocHit, _gate

    def hit(i, sim=None, cov=0.0):
        h = _DocHit(i, "doc")
        if sim is not None:
            h.vec.append((sim, i))
        if cov:
            h.kw.append((cov, i))
            h.coverage = cov
        return h

    s = QuerySettings()
    hyb = ["vector", "document", "keyword"]
    # a strong field: everything clearly similar (>= 0.40) stays, the rest must be within 0.15 of the best
    kept = [h.doc_id for h in _gate([hit(1, 0.80), hit(2, 0.45), hit(3, 0.39), hit(4, 0.30)], hyb, 0.25, s)]
    assert kept == [1, 2]
    # a weak field (a paraphrase the model barely matches): the best and its neighbours stay, down to the floor
    kept = [h.doc_id for h in _gate([hit(1, 0.31), hit(2, 0.27), hit(3, 0.24), hit(4, 0.10)], hyb, 0.25, s)]
    assert kept == [1, 2]
    # nothing similar: nothing left ...
    assert _gate([hit(1, 0.12), hit(2, 0.05)], hyb, 0.25, s) == []
    # ... unless exact keyword matches cover most of the query
    assert [h.doc_id for h in _gate([hit(1, 0.12, cov=0.9), hit(2, 0.05, cov=0.4)], hyb, 0.25, s)] == [1]
    # keyword-only mode: coverage is the only evidence, relative to the best (long queries cover little)
    kw = ["keyword"]
    assert [h.doc_id for h in _gate([hit(1, cov=0.35), hit(2, cov=0.2), hit(3, cov=0.1)], kw, 0.25, s)] == [1, 2]


def test_run_eval_reports_each_mode(corpus, conn, tmp_path):
    import json as _json

    from kb_assets.query.evaluate import run_eval

    q = tmp_path / "q.jsonl"
    q.write_text("\n".join(_json.dumps(x) for x in [
        {"_id": "q1", "text": "restart celery workers"}, {"_id": "q2", "text": "stream bids through kafka"}]))
    r = tmp_path / "r.tsv"
    r.write_text("query-id\tcorpus-id\tscore\nq1\t0001-celery-restart\t1\nq2\t0002-bid-pipeline\t1\n")
    emb = ToyEmbedder()
    report = run_eval(None, queries_path=q, qrels_path=r, doc_key="stem", conn=conn, embedder=emb)
    assert set(report["metrics"]) == {"keyword", "vector", "hybrid"}
    assert report["metrics"]["hybrid"]["recall@100"] == 1.0 and report["metrics"]["hybrid"]["ndcg@10"] > 0.6
    assert set(report["per_query"]["keyword"]) == {"q1", "q2"}
    assert emb.calls == 2          # each query embedded once for both vector modes


def test_identifiers_are_found_by_their_parts(conn):
    """Migration 009: camelCase, snake_case, dotted and path-like words are indexed by their parts too (and
    a query's identifiers are split the same way), so a bug report's plain words find the code."""
    from kb_assets.query.engine import identifier_words

    c = Corpus(conn)
    c.doc("src/transport.py", [("HTTPTransportAdapter", "class HTTPTransportAdapter:\n    def sendRequest(self):\n"
                                "        return self._pool.acquire_connection()")],
          source="code", kind="code", title="src/transport.py")
    c.doc("src/other.py", [("helpers", "def helper():\n    return 42")], source="code", kind="code",
          title="src/other.py")
    for i, topic in enumerate(FILLER_TOPICS):
        c.doc(f"misc/{i:02d}.md", [topic], source="notes", kind="doc", title=f"Note {i}")
    c.refresh()
    for q in ("transport adapter sends a request", "acquire connection from the pool", "HttpTransport"):
        r = recall(q, conn=conn, mode="keyword", tuning=NO_GATE)
        assert [x.id for x in r.code][:1] == ["kb:code/src/transport.py"], q
    # the query side splits exactly as the database does
    for text in ("HTTPTransportAdapter.sendRequest(x)", "click/core.py get_user_name", "plain words only",
                 "e.g. and/or XMLHttpRequest2Go"):
        db = conn.execute("SELECT kb_identifier_words(%s)", (text,)).fetchone()[0]
        assert db == identifier_words(text), text
    assert identifier_words("getUserName httpx/_client.py") == "get User Name httpx client py"


def test_code_files_fuse_with_their_own_channel_weights():
    """Tuning.code_keyword_factor / code_document_factor: a code file's keyword rank counts more and its
    document-vector rank less than a prose document's; prose documents fuse as before."""
    from kb_assets.config import QuerySettings
    from kb_assets.query.engine import _DocHit, _fuse

    def hits(kind):
        # document-vector ranks 1, 3, 2 (1: the small file); keyword ranks 2, 1, 3 (2: the large module)
        out = {}
        for i, (d_sim, kw) in enumerate([(0.9, 2.0), (0.5, 3.0), (0.7, 1.0)], 1):
            h = _DocHit(i, kind)
            h.d_sim, h.kw = d_sim, [(kw, 10 * i)]
            out[i] = h
        return out

    s, chans = QuerySettings(document_weight=1.0, keyword_weight=1.0), ["document", "keyword"]
    plain = Tuning(code_keyword_factor=1.0, code_document_factor=1.0)
    assert [h.doc_id for h in _fuse(hits("code"), chans, s, plain)][0] == 1
    assert [h.doc_id for h in _fuse(hits("code"), chans, s, Tuning())][0] == 2      # keywords win for code
    prose, prose_plain = _fuse(hits("doc"), chans, s, Tuning()), _fuse(hits("doc"), chans, s, plain)
    assert [(h.doc_id, round(h.score, 9)) for h in prose] == [(h.doc_id, round(h.score, 9)) for h in prose_plain]
    assert prose[0].doc_id == 1
    # first in every channel scores 1.0 for code too (the gate reads the fused score's scale)
    solo = {1: _DocHit(1, "code")}
    solo[1].d_sim, solo[1].kw = 0.9, [(1.0, 10)]
    assert _fuse(solo, chans, s, Tuning())[0].score == pytest.approx(1.0)
    # one channel alone (keyword mode): the factors cancel out
    assert [h.doc_id for h in _fuse(hits("code"), ["keyword"], s, Tuning())] == [2, 1, 3]


def test_imputed_ranks_for_documents_below_a_truncated_channel():
    """Tuning.impute_rank: a document absent from a truncated channel fuses as if at the cut + 1 (off: it adds
    nothing there); a keyword channel below its window is complete (no imputation: no query term matched)."""
    from kb_assets.config import QuerySettings
    from kb_assets.query.engine import _DocHit, _fuse

    s = QuerySettings(candidate_window=10, document_window=5, rrf_k=60)
    chans = ["vector", "document", "keyword"]

    def hits():
        out = {}
        # 1: keyword only, first there; 2..6: vector + document at ranks 1..5, keyword absent
        a = out[1] = _DocHit(1, "doc")
        a.kw = [(9.0, 100)]
        for i in range(2, 7):
            h = out[i] = _DocHit(i, "doc")
            h.vec, h.d_sim = [(1.0 - i / 10, 10 * i)], 1.0 - i / 10
        return out

    off = _fuse(hits(), chans, s, Tuning(impute_rank="off"))
    assert [h.doc_id for h in off][-1] == 1                       # one channel of three: below every two-channel one
    win = _fuse(hits(), chans, s, Tuning(impute_rank="window"), truncated={"keyword": True})
    one = next(h for h in win if h.doc_id == 1)
    assert one.score == pytest.approx((1 / 61 + 1 / 71 + 1 / 66) * 61 / 3)   # vector 10 + 1, document 5 + 1
    assert one.v_rank is None and one.d_rank is None              # the gate's ranks stay as they were
    assert [h.doc_id for h in win][0] == 1
    listed = _fuse(hits(), chans, s, Tuning(impute_rank="listed"), truncated={"keyword": True})
    assert next(h for h in listed if h.doc_id == 1).score == pytest.approx((1 / 61 + 1 / 66 + 1 / 66) * 61 / 3)
    two = next(h for h in listed if h.doc_id == 2)              # keyword: one document listed -> rank 2
    assert two.score == pytest.approx((1 / 61 + 1 / 61 + 1 / 62) * 61 / 3)
    # the keyword channel returned less than its window: a document absent there gets nothing
    full = _fuse(hits(), chans, s, Tuning(impute_rank="listed"), truncated={"keyword": False})
    assert next(h for h in full if h.doc_id == 2).score == pytest.approx((1 / 61 + 1 / 61) * 61 / 3)
    # only the channels named
    dense = _fuse(hits(), chans, s, Tuning(impute_rank="window", impute_channels=("vector", "document")),
                  truncated={"keyword": True})
    assert next(h for h in dense if h.doc_id == 2).score == pytest.approx((1 / 61 + 1 / 61) * 61 / 3)
    with pytest.raises(ValueError):
        _fuse(hits(), chans, s, Tuning(impute_rank="sometimes"))


def test_bm25_term_frequency_modes(conn):
    """Tuning.bm25_tf: "chunks" counts the chunks holding a term, "occurrences" its occurrences in the whole
    document (ts_rank_cd of the one-lexeme query, every position weighted 1)."""
    c = Corpus(conn)
    # a: "widget" in two chunks once each; b: in one chunk, four times; same length in bytes
    c.doc("src/a.py", [("one", "widget alpha beta gamma delta epsilon zeta"),
                       ("two", "widget theta iota kappa lambda mu nu xi")], source="code", kind="code",
          title="src/a.py")
    c.doc("src/b.py", [("one", "widget widget widget widget omicron pi rho"),
                       ("two", "sigma tau upsilon phi chi psi omega omega")], source="code", kind="code",
          title="src/b.py")
    for i, topic in enumerate(FILLER_TOPICS):
        c.doc(f"misc/{i:02d}.md", [topic], source="notes", kind="doc", title=f"Note {i}")
    c.refresh()

    def order(tf):
        r = recall("widget", conn=conn, mode="keyword", tuning=Tuning(gate=False, bm25_tf=tf, title_weight=0.0))
        return [x.id for x in r.code]

    assert order("chunks") == ["kb:code/src/a.py", "kb:code/src/b.py"]
    assert order("occurrences") == ["kb:code/src/b.py", "kb:code/src/a.py"]
    assert order("code_occurrences") == ["kb:code/src/b.py", "kb:code/src/a.py"]
    with pytest.raises(ValueError, match="bm25_tf"):
        order("words")


def test_keyword_channel_reads_document_terms_with_the_same_results(conn):
    """Migration 014: the keyword channel's BM25 reads its postings from document_terms (kept by the statistics
    refresh) instead of the chunks' GIN index — the same documents, scores, best chunks and coverage, with and
    without filters; before the first refresh that keeps it (or after a TRUNCATE of chunks) it reads the chunks."""
    from kb_assets.config import QuerySettings
    from kb_assets.query.engine import _Filters, _Searcher

    c = Corpus(conn)
    c.doc("adr/0001-celery.md", [("Context", "Celery workers leak memory; the celery queue grows overnight."),
                                 ("Decision", "Restart celery workers nightly with a warm shutdown.")],
          source="decisions", kind="adr", title="Restart celery workers nightly")
    c.doc("adr/0002-kafka.md", [("Decision", "Stream bids through kafka; celery stays for invoices.")],
          source="decisions", kind="adr", title="Stream bids through kafka")
    c.doc("notes/runbook.md", ["Runbook: restart celery, drain the queue, watch the worker logs.",
                               "Redis memory grows when celery results are never expired."],
          source="notes", kind="doc", title="Celery runbook")
    c.doc("src/tasks.py", [("send_invoice", "def send_invoice(invoice_id):\n    retry celery task on failure")],
          source="code", kind="code", title="src/tasks.py")
    for i, topic in enumerate(FILLER_TOPICS):
        c.doc(f"misc/{i:02d}.md", [topic], source="notes", kind="doc", title=f"Note {i}")
    queries = ["restart celery workers", "celery memory queue worker logs redis", "kafka bids invoices",
               "runbook celery", "send invoice retry task", "tomato bread choir"]

    def keyword(q: str, filters: _Filters, terms: bool) -> tuple[bool, list]:
        s = _Searcher(conn, QuerySettings(), Tuning(keyword_document_terms=terms), filters)
        s.prepare(False)
        rows = s.search([(q, None)], ["keyword"])[0]["keyword"]
        return "document_terms" in s.keyword_sql(), [(r[0], r[1], r[2], round(r[3], 9), round(r[4], 9)) for r in rows]

    c.refresh()
    for filters in (_Filters(), _Filters(sources=["decisions", "code"]), _Filters(kinds=["doc"])):
        for q in queries:
            used, got = keyword(q, filters, True)
            assert used, q
            assert got == keyword(q, filters, False)[1], (q, filters)
    assert keyword("restart celery workers", _Filters(), True)[1]          # not vacuously equal
    # the postings are as fresh as the last refresh (like the document vectors): a new document is found by the
    # keyword channel once the refresh that ends every `kb index` has run
    c.doc("adr/0003-zeppelin.md", ["Zeppelin notebooks replace the reporting cron."], source="decisions",
          kind="adr", title="Zeppelin notebooks")
    assert keyword("zeppelin notebooks", _Filters(), True)[1] == []
    c.refresh()
    assert [r[1] for r in keyword("zeppelin notebooks", _Filters(), True)[1]] == [
        r[1] for r in keyword("zeppelin notebooks", _Filters(), False)[1]] != []
    # a TRUNCATE of chunks forgets them: the chunks are read until the next refresh rebuilds them
    conn.execute("TRUNCATE chunks")
    assert keyword("restart celery workers", _Filters(), True) == (False, [])
    assert conn.execute("SELECT document_terms FROM query_stats").fetchone()[0] is False


def test_vector_channels_run_beside_the_keyword_channel_on_a_second_connection(corpus, conn):
    """Tuning.parallel_channels: in hybrid mode the vector channels run on a second connection while the keyword
    channel runs on the caller's. The answers are the same as on one connection; the second connection reads the
    caller's schema (its exact search_path); a lost second connection costs nothing but the overlap (the query is
    answered on the first, and a new one is opened next time); inside a caller's open transaction, whose rows a
    second connection could not see, none is used."""
    from kb_assets.query import engine

    emb = ToyEmbedder()
    queries = ["restart celery workers", "kafka bid pipeline", "postgres backups nightly", "tomato bread choir",
               ["celery restart", "send invoice retry"]]

    def answer(q, parallel: bool = True):
        r = recall(q, conn=conn, embedder=emb, tuning=Tuning(parallel_channels=parallel), ranked_ids=True)
        return r.ranked, ids(r.documents), ids(r.code), [rec.score for rec in r.documents + r.code]

    engine._drop_sibling(conn)
    for q in queries:
        assert answer(q) == answer(q, parallel=False), q
    assert answer(queries[0])[1][:1] == ["kb:decisions/adr/0001-celery-restart.md"]     # not vacuously equal
    path, sib, _ = engine._siblings[conn]
    assert path == conn.execute("SHOW search_path").fetchone()[0] == sib.execute("SHOW search_path").fetchone()[0]
    assert sib.info.backend_pid != conn.info.backend_pid
    # lost: an administrator's terminate (or a server restart) between two queries
    lost = sib.info.backend_pid
    conn.execute("SELECT pg_terminate_backend(%s)", (lost,))
    assert answer(queries[0]) == answer(queries[0], parallel=False)
    assert conn not in engine._siblings and sib.closed       # dropped and closed, not left open
    answer(queries[1])
    assert engine._siblings[conn][1].info.backend_pid not in (lost, conn.info.backend_pid)
    # inside the caller's transaction: one connection only
    engine._drop_sibling(conn)
    with conn.transaction():
        inside = answer(queries[0])
    assert conn not in engine._siblings
    assert inside == answer(queries[0], parallel=False)
