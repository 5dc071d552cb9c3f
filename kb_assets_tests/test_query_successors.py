"""recall(): a superseded document names its successor (`superseded_by: kb:…`) and the successor, when found
too, is placed right above it."""
from __future__ import annotations

from kb_assets.pipeline.relations import replace_document_edges, resolve_relations
from kb_assets.query import Tuning, recall
from kb_assets_tests.test_query_support import Corpus, ToyEmbedder

NO_GATE = Tuning(gate=False)


def _corpus(conn) -> Corpus:
    c = Corpus(conn)
    old_meta = {"status": "Superseded", "superseded_by": ["adr/0007-queue-kafka.md"]}
    c.doc("adr/0003-queue-rabbitmq.md", [
        "Queue: we use rabbitmq for the job queue; rabbitmq queue workers take jobs from the queue.",
        "The rabbitmq queue keeps jobs durable across restarts of the queue workers.",
    ], source="decisions", kind="adr", title="Use rabbitmq for the job queue", meta=old_meta)
    c.doc("adr/0007-queue-kafka.md", [
        "We move the job queue to kafka: partitions replace the old broker.",
    ], source="decisions", kind="adr", title="Move the job queue to kafka",
        meta={"status": "Accepted", "supersedes": ["adr/0003-queue-rabbitmq.md"]})
    c.doc("adr/0005-rejected-queue.md", [
        "Rejected: a redis list as the job queue was rejected; see the kafka queue decision instead.",
    ], source="decisions", kind="adr", title="Redis list as the job queue",
        meta={"status": "Rejected", "superseded_by": ["ADR-99"]})        # its successor is not indexed
    for i, topic in enumerate(["tomato seedlings in spring", "sourdough rises overnight", "choir harmonies"]):
        c.doc(f"misc/{i}.md", [topic], source="notes", kind="doc", title=f"Note {i}")
    c.refresh()
    replace_document_edges(conn, "decisions", [
        ("adr/0003-queue-rabbitmq.md", "adr", old_meta, None),
        ("adr/0005-rejected-queue.md", "adr", {"superseded_by": ["ADR-99"]}, None),
        ("adr/0007-queue-kafka.md", "adr", {"supersedes": ["adr/0003-queue-rabbitmq.md"]}, None)])
    resolve_relations(conn)
    return c


def test_successor_ranked_above_and_named(conn):
    _corpus(conn)
    emb = ToyEmbedder()
    r = recall("rabbitmq job queue workers", conn=conn, embedder=emb, tuning=NO_GATE, limit=10)
    ids = [d.id for d in r.documents]
    old, new = "kb:decisions/adr/0003-queue-rabbitmq.md", "kb:decisions/adr/0007-queue-kafka.md"
    assert old in ids and new in ids
    assert ids.index(new) == ids.index(old) - 1          # lifted to just above the document it supersedes
    rec = r.documents[ids.index(old)]
    assert rec.superseded_by == new and rec.to_dict()["superseded_by"] == new
    assert f"→ superseded by {new}" in r.render_text()
    assert "superseded_by" not in r.documents[ids.index(new)].to_dict()
    # an unresolved successor is not shown as if it were an id
    rejected = [d for d in r.documents if d.id.endswith("0005-rejected-queue.md")]
    assert rejected and rejected[0].superseded_by is None


def test_order_untouched_without_relations(conn):
    _corpus(conn)
    conn.execute("DELETE FROM relations")
    emb = ToyEmbedder()
    r = recall("rabbitmq job queue workers", conn=conn, embedder=emb, tuning=NO_GATE, limit=10)
    ids = [d.id for d in r.documents]
    # the rabbitmq ADR matches better: without the edge it ranks first, and names no successor
    assert ids.index("kb:decisions/adr/0003-queue-rabbitmq.md") < ids.index("kb:decisions/adr/0007-queue-kafka.md")
    assert all(d.superseded_by is None for d in r.documents)
