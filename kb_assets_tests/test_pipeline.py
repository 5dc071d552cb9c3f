"""The documents → chunks → embeddings stages on a real embedded PostgreSQL: incremental, pay-once,
crash-safe, deletes propagated."""
from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest

from kb_assets.config import parse_config
from kb_assets.embedding import FixedCostEmbedder
from kb_assets.pipeline import build_search_index, chunk_source, index_sources, run_embeddings_stage, sync_documents
from kb_assets.store import spaces


class CountingEmbedder(FixedCostEmbedder):
    """The benchmark stand-in with no cost, recording every text it is asked to embed."""

    def __init__(self, model: str = "counting", dimension: int = 384):
        super().__init__(cost_per_text=0.0, dimension=dimension)
        self.model = model
        self.texts: list[str] = []
        self.token_counts: list[int | None] = []
        self.calls = 0

    def embed_documents(self, texts, token_counts=None):
        self.calls += 1
        self.texts.extend(texts)
        self.token_counts.extend(token_counts if token_counts is not None else [None] * len(texts))
        return super().embed_documents(texts, token_counts)


PARA = ("The ingestion service keeps a queue of work in PostgreSQL and takes batches with skip locked so that "
        "two workers never embed the same chunk twice; the retry delay grows after each failure. ")


def _write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    for i in range(6):
        body = "\n\n".join(f"## Part {j}\n\n{PARA * 2} Topic {i}-{j}." for j in range(4))
        _write(root, f"docs/note-{i}.md", f"# Note {i}\n\n{body}\n")
    _write(root, "docs/tiny.md", "# tiny\n")
    _write(root, "docs/blob.md", "PK\x03\x04\x00\x00binary\x00data" * 20)
    _git(root, "init", "-q")
    _git(root, "-c", "user.email=t@e", "-c", "user.name=t", "add", ".")
    _git(root, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "init")
    return root


def _cfg(root: Path, db_url: str, **source):
    data = {"database_url": db_url, "sources": [{"key": "docs", "kind": "doc", "root": str(root),
                                                  "include": ["docs/**/*.md"], **source}]}
    return parse_config(data, path=str(root / "kb.yaml"), base_dir=str(root))


def _index(cfg, conn, embedder):
    return index_sources(cfg, conn, embedder=embedder)["docs"]


def test_full_then_unchanged_run_makes_no_embedding_call(repo, db_url, conn):
    cfg = _cfg(repo, db_url)
    emb = CountingEmbedder()
    run = _index(cfg, conn, emb)
    assert run.documents.new == 6
    assert run.chunks.chunks_written > 6
    assert run.embeddings.chunks_embedded == len(set(emb.texts)) == len(emb.texts)
    # each text comes with the chunk table's count of it (the local model orders its batches by them)
    assert emb.token_counts == emb.count_tokens(emb.texts)
    assert run.embeddings.missing_after == 0 and run.search_index.activated and run.search_index.vector_index_built
    reasons = run.documents.skip_reasons
    assert reasons.get("too-small") == 1 and reasons.get("binary") == 1, reasons
    table = spaces.active_space(conn)[2]
    idx = [r[0] for r in conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", (table,))]
    assert any("hnsw" in d and "vector_cosine_ops" in d for d in idx), idx

    emb2 = CountingEmbedder()
    again = _index(cfg, conn, emb2)
    assert emb2.calls == 0
    assert again.documents.new == again.documents.changed == again.documents.deleted == 0
    assert again.chunks.documents_chunked == 0
    commit = _git(repo, "rev-parse", "HEAD").strip()
    assert conn.execute("SELECT indexed_commit FROM sources WHERE key='docs'").fetchone()[0] == commit


def test_change_rename_delete_pay_only_for_changed_chunks(repo, db_url, conn):
    cfg = _cfg(repo, db_url)
    _index(cfg, conn, CountingEmbedder())
    before_hashes = {r[0] for r in conn.execute("SELECT chunk_hash FROM chunks")}

    # 1 change (one section), 1 rename, 1 delete
    p = repo / "docs/note-0.md"
    p.write_text(p.read_text().replace("Topic 0-2.", "Topic 0-2, now rewritten entirely."), encoding="utf-8")
    (repo / "docs/note-1.md").rename(repo / "docs/renamed-1.md")
    (repo / "docs/note-2.md").unlink()

    emb = CountingEmbedder()
    run = _index(cfg, conn, emb)
    assert run.documents.changed == 1 and run.documents.new == 1 and run.documents.deleted == 2
    after_hashes = {r[0] for r in conn.execute("SELECT chunk_hash FROM chunks")}
    new_hashes = after_hashes - before_hashes
    assert 1 <= len(new_hashes) <= 2                    # only the edited section's chunk(s)
    assert run.embeddings.chunks_embedded == len(new_hashes) == len(emb.texts)
    paths = {r[0] for r in conn.execute("SELECT path FROM documents WHERE status='active'")}
    assert "docs/renamed-1.md" in paths and "docs/note-1.md" not in paths and "docs/note-2.md" not in paths
    # deletes propagate to chunks, keyword rows and vectors
    table = spaces.active_space(conn)[2]
    orphans = conn.execute(f'SELECT count(*) FROM "{table}" e WHERE NOT EXISTS '
                           f'(SELECT 1 FROM chunks c WHERE c.chunk_hash = e.chunk_hash)').fetchone()[0]
    assert orphans == 0
    assert conn.execute("SELECT count(*) FROM chunks c LEFT JOIN documents d ON d.id=c.document_id "
                        "WHERE d.id IS NULL").fetchone()[0] == 0
    hits = conn.execute("SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.document_id "
                        "WHERE d.path = 'docs/note-2.md'").fetchone()[0]
    assert hits == 0


def test_identical_chunks_in_two_documents_are_embedded_once(repo, db_url, conn):
    _write(repo, "docs/copy.md", (repo / "docs/note-3.md").read_text())
    cfg = _cfg(repo, db_url)
    emb = CountingEmbedder()
    _index(cfg, conn, emb)
    counts = Counter(emb.texts)
    assert max(counts.values()) == 1
    n_chunks, n_hashes = conn.execute("SELECT count(*), count(DISTINCT chunk_hash) FROM chunks").fetchone()
    assert n_chunks > n_hashes


def test_kill_between_batches_then_rerun_embeds_every_chunk_exactly_once(repo, db_url, conn):
    cfg = _cfg(repo, db_url)
    src = cfg.sources[0]
    sync_documents(conn, cfg, src)
    emb = CountingEmbedder()
    chunk_source(conn, "docs", max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
    total = conn.execute("SELECT count(DISTINCT chunk_hash) FROM chunks").fetchone()[0]
    assert total > 6
    # "killed" after two committed model calls of 5 (half a batch each: the write of one overlaps the next)
    first = run_embeddings_stage(conn, emb, "docs", batch_rows=10, max_batches=2)
    assert first.chunks_embedded == 10 and first.missing_after == total - 10
    # an incomplete space is never queried, and gets no HNSW index yet (the rest of its load stays fast)
    early = build_search_index(conn, emb.model, emb.dimension)
    assert not early.activated and not early.vector_index_built and spaces.active_space(conn) is None
    second = run_embeddings_stage(conn, emb, "docs", batch_rows=5)
    assert second.chunks_embedded == total - 10 and second.missing_after == 0
    done = build_search_index(conn, emb.model, emb.dimension)
    assert done.activated and done.vector_index_built and done.query_stats_refreshed
    assert len(emb.texts) == total and max(Counter(emb.texts).values()) == 1


def test_crash_inside_a_batch_keeps_committed_batches(repo, db_url, conn):
    cfg = _cfg(repo, db_url)
    sync_documents(conn, cfg, cfg.sources[0])
    good = CountingEmbedder()
    chunk_source(conn, "docs", max_tokens=good.max_tokens, count_tokens=good.count_tokens)

    class Dies(CountingEmbedder):
        def embed_documents(self, texts, token_counts=None):
            if self.calls == 1:
                raise ConnectionError("killed")
            return super().embed_documents(texts, token_counts)

    with pytest.raises(ConnectionError):
        run_embeddings_stage(conn, Dies(), "docs", batch_rows=8)     # calls of 4
    table = spaces.space_table(conn, "counting", 384)
    assert conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0] == 4
    rerun = run_embeddings_stage(conn, good, "docs", batch_rows=8)
    assert rerun.missing_after == 0
    assert len(good.texts) == conn.execute("SELECT count(DISTINCT chunk_hash) FROM chunks").fetchone()[0] - 4


def test_embedding_writes_overlap_the_next_model_call(repo, db_url, conn, monkeypatch):
    """The write of one part (half a batch) runs while the model works on the next, so the model never waits for
    the database (a write was ~0.1 s per 500 rows on a first load's critical path); a kill -9 still loses at most
    one batch of model work (test_run_safety: the part being written and the call in flight)."""
    import threading
    import time

    from kb_assets.pipeline import embeddings as emb_mod

    cfg = _cfg(repo, db_url)
    sync_documents(conn, cfg, cfg.sources[0])
    in_flight = threading.Event()

    class Slow(CountingEmbedder):
        def embed_documents(self, texts, token_counts=None):
            in_flight.set()
            try:
                time.sleep(0.15)
                return super().embed_documents(texts, token_counts)
            finally:
                in_flight.clear()

    emb = Slow()
    chunk_source(conn, "docs", max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
    writes_during_call = []
    real_write = emb_mod._write_batch

    def watched(*args, **kwargs):
        # the loop starts the next call just before this write: give its thread time to show it
        writes_during_call.append(in_flight.wait(timeout=0.3))
        return real_write(*args, **kwargs)

    monkeypatch.setattr(emb_mod, "_write_batch", watched)
    stats = run_embeddings_stage(conn, emb, "docs", batch_rows=6)
    assert stats.batches == len(writes_during_call) >= 4 and stats.missing_after == 0
    # every write but the last one's (no call follows it) ran while a call was in flight
    assert all(writes_during_call[:-1]) and not writes_during_call[-1], writes_during_call
    assert max(Counter(emb.texts).values()) == 1


def test_large_load_into_an_indexed_space_rebuilds_its_index_once(repo, db_url, conn, monkeypatch):
    """Inserting many vectors into an HNSW index row by row is far slower than rebuilding it: a large load
    drops the index and the search-index stage builds it again; a small one keeps it."""
    from kb_assets.pipeline import embeddings as emb_mod

    cfg = _cfg(repo, db_url)
    emb = CountingEmbedder()
    first = _index(cfg, conn, emb)
    assert first.search_index.vector_index_built
    table = spaces.active_space(conn)[2]
    n = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0]
    monkeypatch.setattr(emb_mod, "LARGE_LOAD_MIN", 2)
    # small change (1 new chunk against n vectors): the index stays and is maintained
    p = repo / "docs/note-0.md"
    p.write_text(p.read_text().replace("Topic 0-2.", "Topic 0-2, edited."), encoding="utf-8")
    small = _index(cfg, conn, emb)
    assert small.embeddings.chunks_embedded >= 1 and not small.embeddings.vector_index_dropped
    assert not small.search_index.vector_index_built and spaces.has_vector_index(conn, table)
    # a load of more than a quarter of the table: dropped, then rebuilt by the search-index stage
    for i in range(3):
        _write(repo, f"docs/extra-{i}.md", f"# Extra {i}\n\n" + "\n\n".join(
            f"## Part {j}\n\n{PARA} Extra topic {i}-{j}." for j in range(max(2, n // 6))))
    big = _index(cfg, conn, emb)
    assert big.embeddings.chunks_embedded >= n // 4
    assert big.embeddings.vector_index_dropped and big.search_index.vector_index_built
    assert spaces.has_vector_index(conn, table) and spaces.active_space(conn)[2] == table


def test_incomplete_listing_prunes_nothing(repo, db_url, conn, monkeypatch):
    cfg = _cfg(repo, db_url)
    _index(cfg, conn, CountingEmbedder())
    n = conn.execute("SELECT count(*) FROM documents WHERE status='active'").fetchone()[0]
    from kb_assets.sources import discovery

    real = discovery.list_source

    def partial(root, source):
        listing = real(root, source)
        listing.files = listing.files[:1]
        listing.complete = False
        return listing

    monkeypatch.setattr(discovery, "list_source", partial)
    stats = sync_documents(conn, cfg, cfg.sources[0])
    assert stats.deleted == 0 and not stats.complete
    assert conn.execute("SELECT count(*) FROM documents WHERE status='active'").fetchone()[0] == n


def test_model_change_builds_a_new_space_and_swaps_when_complete(repo, db_url, conn):
    cfg = _cfg(repo, db_url)
    _index(cfg, conn, CountingEmbedder("model-a", 384))
    assert spaces.active_space(conn)[0] == "model-a"
    new = CountingEmbedder("model-b", 256)
    run_embeddings_stage(conn, new, "docs", batch_rows=3, max_batches=1)
    partial = build_search_index(conn, new.model, new.dimension)
    assert not partial.activated and spaces.active_space(conn)[0] == "model-a"   # old space still answers
    run_embeddings_stage(conn, new, "docs", batch_rows=500)
    done = build_search_index(conn, new.model, new.dimension)
    assert done.activated and done.vector_index_built and spaces.active_space(conn)[:2] == ("model-b", 256)
    tables = {r[0] for r in conn.execute("SELECT table_name FROM embedding_spaces")}
    assert len(tables) == 2


def test_chunks_swap_in_one_transaction(repo, db_url, conn):
    """A changed document's old chunks stay until its new chunks replace them."""
    cfg = _cfg(repo, db_url)
    _index(cfg, conn, CountingEmbedder())
    doc_id = conn.execute("SELECT id FROM documents WHERE path='docs/note-4.md'").fetchone()[0]
    old = conn.execute("SELECT count(*) FROM chunks WHERE document_id=%s", (doc_id,)).fetchone()[0]
    p = repo / "docs/note-4.md"
    p.write_text(p.read_text() + "\n## Added\n\nA new closing section about rollback.\n", encoding="utf-8")
    sync_documents(conn, cfg, cfg.sources[0])
    # documents updated, chunks not yet cut: the old chunks are still there and searchable
    assert conn.execute("SELECT count(*) FROM chunks WHERE document_id=%s", (doc_id,)).fetchone()[0] == old
    emb = CountingEmbedder()
    chunk_source(conn, "docs", max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
    texts = " ".join(r[0] for r in conn.execute("SELECT text FROM chunks WHERE document_id=%s", (doc_id,)))
    assert "rollback" in texts


def test_a_re_cut_document_keeps_its_unchanged_chunks(repo, db_url, conn):
    """A paragraph appended to a document rewrites its last chunk only: the other rows stay as they were (same
    ids), and what is stored equals a cut from scratch. An edit that moves lines rewrites the chunks whose
    lines moved. The keyword statistics and postings, refreshed incrementally, equal a refresh from scratch."""
    from kb_assets.chunking import chunk_document
    from kb_assets.models import SourceDocument
    from kb_assets.pipeline.query_stats import refresh_query_stats

    cfg = _cfg(repo, db_url)
    emb = CountingEmbedder()
    _index(cfg, conn, emb)
    doc_id = conn.execute("SELECT id FROM documents WHERE path='docs/note-2.md'").fetchone()[0]

    def rows() -> dict[int, tuple]:
        return {r[0]: r[1:] for r in conn.execute(
            "SELECT id, ordinal, chunk_hash, start_line, end_line, token_count, heading, text FROM chunks"
            " WHERE document_id = %s", (doc_id,))}

    def from_scratch() -> list[tuple]:
        text = conn.execute("SELECT text FROM documents WHERE id = %s", (doc_id,)).fetchone()[0]
        doc = SourceDocument(path="docs/note-2.md", kind="doc", title="Note 2", text=text)
        return sorted((c.ordinal, c.chunk_hash, c.start_line, c.end_line, c.token_count, c.heading, c.text)
                      for c in chunk_document(doc, max_tokens=emb.max_tokens, count_tokens=emb.count_tokens))

    def keywords() -> tuple:
        return (conn.execute("SELECT lexeme, ndoc FROM lexeme_stats ORDER BY 1").fetchall(),
                conn.execute("SELECT n_chunks, n_lexemes FROM query_stats").fetchall(),
                conn.execute("SELECT document_id, lexeme, (SELECT array_agg(x ORDER BY x) FROM unnest(chunk_ids) x)"
                             " FROM document_terms ORDER BY 1, 2").fetchall())

    before = rows()
    assert len(before) >= 4
    p = repo / "docs/note-2.md"
    p.write_text(p.read_text() + "\nA closing line about rollback windows.\n", encoding="utf-8")
    sync_documents(conn, cfg, cfg.sources[0])
    stats = chunk_source(conn, "docs", max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
    after = rows()
    assert sorted(after.values()) == from_scratch()
    assert (stats.documents_chunked, stats.chunks_written, stats.chunks_removed) == (1, 1, 1)
    assert stats.chunks_kept == len(before) - 1
    assert {i: r for i, r in after.items() if i in before} == {i: r for i, r in before.items() if i in after}
    assert len(set(after) & set(before)) == len(before) - 1          # the same rows, not copies of them
    assert "rollback" in max(after.values())[-1]

    refresh_query_stats(conn)
    incremental = keywords()
    refresh_query_stats(conn, full=True)
    assert keywords() == incremental

    # a line inserted near the top moves every chunk's lines: each is rewritten (its row says where it is)
    text = p.read_text()
    p.write_text(text.replace("\n\n", "\n\nAn added opening line.\n\n", 1), encoding="utf-8")
    sync_documents(conn, cfg, cfg.sources[0])
    stats = chunk_source(conn, "docs", max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
    assert sorted(rows().values()) == from_scratch()
    assert stats.chunks_written == stats.chunks_removed == len(after) and stats.chunks_kept == 0
    refresh_query_stats(conn)
    incremental = keywords()
    refresh_query_stats(conn, full=True)
    assert keywords() == incremental


def _commit(root: Path, msg: str) -> None:
    _git(root, "-c", "user.email=t@e", "-c", "user.name=t", "add", "-A")
    _git(root, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", msg)


def test_head_mode_follows_git_diff_and_ignores_uncommitted_edits(repo, db_url, conn):
    cfg = _cfg(repo, db_url, content="HEAD")
    first = _index(cfg, conn, CountingEmbedder())
    assert first.documents.listing_mode == "full" and first.documents.new == 6

    # an uncommitted edit is invisible to HEAD mode
    (repo / "docs/note-5.md").write_text("# Uncommitted\n\n" + PARA * 3, encoding="utf-8")
    quiet = _index(cfg, conn, CountingEmbedder())
    assert quiet.documents.listing_mode == "git-diff" and quiet.documents.changed == 0
    _git(repo, "checkout", "--", "docs/note-5.md")

    p = repo / "docs/note-0.md"
    p.write_text(p.read_text() + "\n## Later\n\nA committed addition about retries.\n", encoding="utf-8")
    _git(repo, "mv", "docs/note-1.md", "docs/moved-1.md")
    _git(repo, "rm", "-q", "docs/note-2.md")
    _commit(repo, "change, move, delete")
    emb = CountingEmbedder()
    run = _index(cfg, conn, emb)
    d = run.documents
    assert d.listing_mode == "git-diff"
    assert (d.changed, d.new, d.deleted) == (1, 1, 2)
    assert d.unchanged == 3
    assert 1 <= run.embeddings.chunks_embedded <= 2                    # the moved file re-embeds nothing
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert conn.execute("SELECT indexed_commit FROM sources WHERE key='docs'").fetchone()[0] == head
    paths = {r[0] for r in conn.execute("SELECT path FROM documents WHERE status='active'")}
    assert paths == {"docs/note-0.md", "docs/moved-1.md", "docs/note-3.md", "docs/note-4.md", "docs/note-5.md"}


def test_unreachable_previous_commit_falls_back_to_a_full_listing(repo, db_url, conn):
    cfg = _cfg(repo, db_url, content="HEAD")
    _index(cfg, conn, CountingEmbedder())
    # rewrite history (a force-push), then garbage-collect the old commit away
    _git(repo, "checkout", "-q", "--orphan", "rewritten")
    (repo / "docs/note-3.md").unlink()
    _commit(repo, "rewritten history")
    _git(repo, "branch", "-D", "master" if "master" in _git(repo, "branch") else "main")
    _git(repo, "reflog", "expire", "--expire=now", "--all")
    _git(repo, "gc", "-q", "--prune=now")
    run = _index(cfg, conn, CountingEmbedder())
    assert run.documents.listing_mode == "full"
    assert run.documents.deleted == 1 and run.embeddings.chunks_embedded == 0


def test_changed_settings_force_a_full_listing(repo, db_url, conn):
    _index(_cfg(repo, db_url, content="HEAD"), conn, CountingEmbedder())
    _write(repo, "notes/extra.md", "# Extra\n\n" + PARA * 2)
    _commit(repo, "extra")
    wider = parse_config({"database_url": db_url, "sources": [{
        "key": "docs", "kind": "doc", "root": str(repo), "content": "HEAD",
        "include": ["docs/**/*.md", "notes/*.md"]}]}, path="kb.yaml", base_dir=str(repo))
    run = _index(wider, conn, CountingEmbedder())
    assert run.documents.listing_mode == "full" and run.documents.new == 1


def test_recall_without_the_vector_index_is_exact_and_says_so(repo, db_url, conn):
    """Between a large load (index dropped) and the search-index stage, recall still answers, by exact scan."""
    from kb_assets.query import recall

    cfg = _cfg(repo, db_url)
    emb = CountingEmbedder()
    _index(cfg, conn, emb)
    with_index = recall("retry delay after each failure", conn=conn, embedder=emb, mode="vector")
    assert with_index.documents and not any("vector index" in w for w in with_index.warnings)
    table = spaces.active_space(conn)[2]
    assert spaces.drop_vector_index(conn, table)
    without = recall("retry delay after each failure", conn=conn, embedder=emb, mode="vector")
    assert any("vector index" in w for w in without.warnings), without.warnings
    assert [d.id for d in without.documents] == [d.id for d in with_index.documents]
    again = build_search_index(conn, emb.model, emb.dimension, index_changed=False)
    assert again.vector_index_built and spaces.has_vector_index(conn, table)


def test_a_branch_switched_away_and_back_embeds_nothing_again(repo, db_url, conn):
    """Pay once per (chunk hash, model), also across deletes: the vectors of a branch's files, checked out away
    and back (or a deleted file restored by a revert), come back from recycled_vectors instead of the model;
    the space itself keeps no orphans meanwhile (what the checks and the HNSW index see), and what was recycled
    longer ago than RECYCLE_DAYS is dropped."""
    from kb_assets.pipeline.embeddings import RECYCLE_DAYS

    cfg = _cfg(repo, db_url, content="HEAD")
    first = _index(cfg, conn, CountingEmbedder())
    table = spaces.active_space(conn)[2]
    vectors = {h: v for h, v in conn.execute(f'SELECT chunk_hash, embedding::text FROM "{table}"')}
    main = _git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip()

    _git(repo, "checkout", "-q", "-b", "trim")
    (repo / "docs/note-4.md").unlink()
    (repo / "docs/note-5.md").unlink()
    _commit(repo, "trim two notes")
    away = _index(cfg, conn, CountingEmbedder())
    assert away.documents.deleted == 2 and away.embeddings.chunks_embedded == 0
    gone = conn.execute("SELECT count(*) FROM recycled_vectors WHERE space_table = %s", (table,)).fetchone()[0]
    assert gone == away.embeddings.orphans_removed > 0
    orphans = conn.execute(f'SELECT count(*) FROM "{table}" e WHERE NOT EXISTS '
                           f'(SELECT 1 FROM chunks c WHERE c.chunk_hash = e.chunk_hash)').fetchone()[0]
    assert orphans == 0

    _git(repo, "checkout", "-q", main)
    emb = CountingEmbedder()
    back = _index(cfg, conn, emb)
    assert back.documents.new == 2
    assert emb.calls == 0 and back.embeddings.chunks_embedded == 0 and back.embeddings.restored == gone
    assert back.embeddings.missing_after == 0
    assert conn.execute("SELECT count(*) FROM recycled_vectors").fetchone()[0] == 0
    assert {h: v for h, v in conn.execute(f'SELECT chunk_hash, embedding::text FROM "{table}"')} == vectors
    assert first.embeddings.chunks_embedded == len(vectors)

    # recycled longer ago than the retention: dropped at the next removal, and embedded again if it comes back
    _git(repo, "checkout", "-q", "trim")
    _index(cfg, conn, CountingEmbedder())
    conn.execute("UPDATE recycled_vectors SET removed_at = now() - make_interval(days => %s)", (RECYCLE_DAYS + 1,))
    conn.commit()
    (repo / "docs/note-0.md").unlink()
    _commit(repo, "trim one more")
    _index(cfg, conn, CountingEmbedder())
    left = {h for (h,) in conn.execute("SELECT chunk_hash FROM recycled_vectors")}    # note-0's only
    assert left and left <= set(vectors)
    _git(repo, "checkout", "-q", main)
    emb = CountingEmbedder()
    back = _index(cfg, conn, emb)
    assert back.embeddings.restored == len(left) and back.embeddings.chunks_embedded == gone
