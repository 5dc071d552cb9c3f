"""refresh_query_stats: keyword statistics and document vectors, incremental and idempotent."""
from __future__ import annotations

from kb_assets.pipeline.query_stats import refresh_query_stats
from kb_assets.store.spaces import doc_vector_table
from kb_assets_tests.test_query_support import Corpus


def test_refresh_builds_statistics_and_document_vectors(conn):
    c = Corpus(conn)
    a = c.doc("a.md", ["celery workers restart", "celery beat schedule"])
    c.doc("b.md", ["kafka bid pipeline"])
    c.doc("c.md", ["licence footer shared"], source="other")
    out = refresh_query_stats(conn)
    assert out["chunks"] == 4 and out["document_vectors"] == {"added": 3, "removed": 0}
    df = dict(conn.execute("SELECT lexeme, ndoc FROM lexeme_stats").fetchall())
    assert df["celeri"] == 2 and df["kafka"] == 1
    assert conn.execute("SELECT n_chunks FROM query_stats").fetchone()[0] == 4
    table = doc_vector_table(c.table)
    assert conn.execute(f"SELECT n_chunks FROM {table} WHERE document_id = %s", (a,)).fetchone()[0] == 2
    # nothing changed: nothing recomputed
    assert refresh_query_stats(conn)["document_vectors"] == {"added": 0, "removed": 0}
    # a changed document is recomputed; a deleted one's vector is removed (by the refresh: no foreign key)
    conn.execute("UPDATE documents SET content_hash = 'new' WHERE id = %s", (a,))
    conn.execute("DELETE FROM documents WHERE path = 'b.md'")
    assert refresh_query_stats(conn)["document_vectors"] == {"added": 1, "removed": 2}
    assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 2
    df = dict(conn.execute("SELECT lexeme, ndoc FROM lexeme_stats").fetchall())
    assert "kafka" not in df
    # vectors that arrive after a refresh (a document embedded later) are picked up by the next one
    conn.execute("DELETE FROM " + c.table + " WHERE chunk_hash IN (SELECT chunk_hash FROM chunks WHERE document_id = %s"
                 " AND ordinal = 1)", (a,))
    assert refresh_query_stats(conn)["document_vectors"] == {"added": 1, "removed": 1}
    assert conn.execute(f"SELECT n_chunks FROM {table} WHERE document_id = %s", (a,)).fetchone()[0] == 1


# ---- incremental == from scratch ------------------------------------------------------------------------------

def _expected(conn, space_table: str) -> dict:
    """What a refresh from scratch must give, computed independently (the pre-incremental SQL)."""
    from kb_assets.pipeline.query_stats import BOILERPLATE_DOCS

    vectors = conn.execute(
        "WITH common AS (SELECT md5(text) AS t FROM chunks GROUP BY 1 HAVING count(DISTINCT document_id) > %s)"
        " SELECT d.id, d.content_hash, count(*),"
        " coalesce(avg(e.embedding) FILTER (WHERE md5(c.text) NOT IN (SELECT t FROM common)), avg(e.embedding))"
        f" FROM documents d JOIN chunks c ON c.document_id = d.id JOIN {space_table} e ON e.chunk_hash = c.chunk_hash"
        " WHERE d.status = 'active' GROUP BY d.id, d.content_hash", (BOILERPLATE_DOCS,)).fetchall()
    lexemes = dict(conn.execute("SELECT word, ndoc FROM ts_stat('SELECT tsv FROM chunks')").fetchall())
    return {"lexemes": lexemes, "n_chunks": conn.execute("SELECT count(*) FROM chunks").fetchone()[0],
            "vectors": {r[0]: (r[1], r[2], r[3]) for r in vectors}}


def _assert_exact(conn, space_table: str) -> None:
    want = _expected(conn, space_table)
    got_lex = dict(conn.execute("SELECT lexeme, ndoc FROM lexeme_stats").fetchall())
    assert got_lex == want["lexemes"]
    # the keyword channel's document postings: every (lexeme, document) of the chunks, with exactly its chunks
    assert _terms(conn, "SELECT lexeme, document_id, chunk_ids FROM document_terms") == _terms(
        conn, "SELECT l, c.document_id, array_agg(c.id) FROM chunks c, unnest(tsvector_to_array(c.tsv)) l GROUP BY 1, 2")
    assert conn.execute("SELECT document_terms FROM query_stats").fetchone()[0] is True
    assert conn.execute("SELECT n_chunks, n_lexemes FROM query_stats").fetchone() == (
        want["n_chunks"], len(want["lexemes"]))
    got = {r[0]: (r[1], r[2], r[3]) for r in conn.execute(
        f"SELECT document_id, content_hash, n_chunks, embedding FROM {doc_vector_table(space_table)}")}
    assert got.keys() == want["vectors"].keys()
    for doc_id, (h, n, v) in want["vectors"].items():
        gh, gn, gv = got[doc_id]
        assert (gh, gn) == (h, n), doc_id
        # same rows averaged, perhaps in another order: equal up to float rounding
        assert max(abs(a - b) for a, b in zip(_floats(gv), _floats(v))) < 1e-6, doc_id
    # documents with a chunk that has no vector yet: rechecked by the next refresh
    pending = dict(conn.execute(
        f"SELECT d.id, count(e.chunk_hash) FROM documents d JOIN chunks c ON c.document_id = d.id"
        f" LEFT JOIN {space_table} e ON e.chunk_hash = c.chunk_hash WHERE d.status = 'active' GROUP BY d.id"
        f" HAVING count(e.chunk_hash) < count(*)").fetchall())
    assert dict(conn.execute("SELECT document_id, n_embedded FROM doc_vector_pending").fetchall()) == pending


def _terms(conn, query: str) -> dict[tuple[str, int], list[int]]:
    rows = conn.execute(query).fetchall()
    out = {(lexeme, doc): sorted(ids) for lexeme, doc, ids in rows}
    assert len(out) == len(rows)   # one row per (lexeme, document)
    return out


def _floats(v) -> list[float]:
    return [float(x) for x in (v.to_list() if hasattr(v, "to_list") else v)]


def _swap(conn, c, doc_id: int, texts: list[str], *, vectors: bool = True, content_hash: str | None = None):
    """What the chunk stage does: a document's chunks replaced in one transaction (new content hash)."""
    from kb_assets_tests.test_query_support import chunk_hash

    with conn.transaction():
        conn.execute("UPDATE documents SET content_hash = %s WHERE id = %s",
                     (content_hash or chunk_hash("", "\n".join(texts)), doc_id))
        conn.execute("DELETE FROM chunks WHERE document_id = %s", (doc_id,))
        for n, t in enumerate(texts):
            h = chunk_hash("", t)
            conn.execute("INSERT INTO chunks (document_id, ordinal, heading, start_line, end_line, token_count,"
                         " chunk_hash, text) VALUES (%s, %s, '', 1, 1, 1, %s, %s)", (doc_id, n, h, t))
            if vectors:
                conn.execute(f"INSERT INTO {c.table} (chunk_hash, embedding) VALUES (%s, %s::vector)"
                             " ON CONFLICT DO NOTHING", (h, str(c.emb.vec(t))))


FOOTER = "licensed under the apache licence version two see the notice file"


def test_incremental_refresh_equals_recompute_from_scratch(conn, monkeypatch):
    from kb_assets.pipeline import query_stats as stats

    c = Corpus(conn)
    words = ["celery", "kafka", "redis", "postgres", "vector", "lexeme", "ranking", "budget", "signpost",
             "transcript", "decision", "rationale", "migration", "trigger", "watermark", "boilerplate"]
    ids = []
    for i in range(12):
        body = [f"{words[i % 16]} {words[(i * 3) % 16]} notes number {i}", f"{words[(i + 5) % 16]} details {i}"]
        if i < 8:
            body.append(FOOTER)          # in 8 documents: not boilerplate yet (more than 8 makes it one)
        ids.append(c.doc(f"d{i}.md", body))

    def check(expect_mode: str = "incremental", full_too: bool = True):
        out = refresh_query_stats(conn)
        assert out["mode"] == expect_mode, out
        _assert_exact(conn, c.table)
        if full_too:   # the repair path gives the same, and a refresh right after it changes nothing
            assert refresh_query_stats(conn, full=True)["mode"] == "full"
            _assert_exact(conn, c.table)
            again = refresh_query_stats(conn)
            assert again["document_vectors"] == {"added": 0, "removed": 0} and again["changed_documents"] == 0
        return out

    check("full")                                                    # the first refresh builds from scratch
    # new documents (one more with the footer: it becomes boilerplate, every footer document is recomputed)
    ids.append(c.doc("d12.md", ["fresh celery text", FOOTER]))
    out = check()
    assert out["document_vectors"]["added"] == 9 and out["changed_documents"] == 1
    # modified: chunks swapped, some unchanged, one new; the footer dropped from one (no longer boilerplate)
    _swap(conn, c, ids[0], ["celery celery notes number 0", "brand new paragraph about watermarks"])
    _swap(conn, c, ids[3], ["postgres details 3 rewritten", FOOTER, FOOTER])   # twice in one document
    check()
    # renamed: the pipeline deletes the old row and inserts a new one with the same chunks
    row = conn.execute("SELECT path, text FROM documents WHERE id = %s", (ids[5],)).fetchone()
    texts = [r[0] for r in conn.execute("SELECT text FROM chunks WHERE document_id = %s ORDER BY ordinal", (ids[5],))]
    conn.execute("DELETE FROM documents WHERE id = %s", (ids[5],))
    ids[5] = c.doc("renamed/" + row[0], texts)
    conn.execute("UPDATE documents SET path = 'moved.md' WHERE id = %s", (ids[6],))   # in place: nothing to do
    check()
    # deleted documents (chunks cascade), one made unreadable (skipped: chunks deleted, same transaction)
    conn.execute("DELETE FROM documents WHERE id = ANY(%s)", ([ids[1], ids[2]],))
    with conn.transaction():
        conn.execute("UPDATE documents SET status = 'skipped', content_hash = NULL WHERE id = %s", (ids[4],))
        conn.execute("DELETE FROM chunks WHERE document_id = %s", (ids[4],))
    check()
    # content hash changed, chunks not cut yet (the documents stage ran, the chunk stage not)
    conn.execute("UPDATE documents SET content_hash = 'next' WHERE id = %s", (ids[7],))
    # chunks updated in place (no stage does it; the trigger keeps the statistics exact anyway)
    conn.execute("UPDATE chunks SET text = text || ' amended' WHERE document_id = %s AND ordinal = 0", (ids[8],))
    conn.execute("UPDATE chunks SET document_id = %s, ordinal = 100 WHERE document_id = %s AND ordinal = 1",
                 (ids[9], ids[8]))
    check()
    # vectors: chunks cut but not embedded yet, embedded later; a vector deleted and put back
    _swap(conn, c, ids[10], ["kafka waiting for its vector", "another unembedded chunk"], vectors=False)
    check()
    for t in ["kafka waiting for its vector", "another unembedded chunk"]:
        conn.execute(f"INSERT INTO {c.table} (chunk_hash, embedding) VALUES (%s, %s::vector)",
                     (chunk_hash_of(t), str(c.emb.vec(t))))
    assert check()["document_vectors"] == {"added": 1, "removed": 0}
    h = chunk_hash_of("fresh celery text")
    saved = conn.execute(f"SELECT embedding FROM {c.table} WHERE chunk_hash = %s", (h,)).fetchone()[0]
    conn.execute(f"DELETE FROM {c.table} WHERE chunk_hash = %s", (h,))
    assert check()["document_vectors"] == {"added": 1, "removed": 1}
    conn.execute(f"INSERT INTO {c.table} (chunk_hash, embedding) VALUES (%s, %s)", (h, saved))
    check()
    # many changes at once: recomputed from scratch (cheaper), same result
    monkeypatch.setattr(stats, "FULL_MIN_CHUNKS", 0)
    monkeypatch.setattr(stats, "FULL_FRACTION", 0.0)
    _swap(conn, c, ids[11], ["everything rewritten", FOOTER])
    check("full")
    monkeypatch.undo()
    # many documents' vectors at once: one pass over every chunk instead of lookups per document
    monkeypatch.setattr(stats, "BULK_DOCUMENTS", 0)
    _swap(conn, c, ids[11], ["rewritten again", "and again"])
    check()
    monkeypatch.undo()
    # inside a caller's transaction, two refreshes
    conn.autocommit = False
    _swap(conn, c, ids[11], ["third version", FOOTER])
    refresh_query_stats(conn)
    _swap(conn, c, ids[10], ["kafka once more"])
    conn.execute("DELETE FROM documents WHERE id = %s", (ids[11],))
    check()
    conn.commit()
    conn.autocommit = True
    # TRUNCATE fires no delete trigger: the next refresh starts from scratch
    conn.execute("TRUNCATE chunks")
    check("full")
    for i in range(3):
        c.doc(f"after-truncate-{i}.md", [f"new life {i}", FOOTER])
    check()


def chunk_hash_of(text: str) -> str:
    from kb_assets_tests.test_query_support import chunk_hash
    return chunk_hash("", text)


def test_refresh_waits_for_a_chunk_writer_in_flight(db_url):
    """A refresh never sees a writer half-way: it waits for the writer's commit, then counts its changes."""
    import threading

    from kb_assets.store.db import connect

    with connect(db_url) as conn, connect(db_url) as writer:
        c = Corpus(conn)
        a = c.doc("a.md", ["celery workers restart", "celery beat schedule"])
        c.doc("b.md", ["kafka bid pipeline"])
        refresh_query_stats(conn)
        writer.autocommit = False
        writer.execute("DELETE FROM chunks WHERE document_id = %s AND ordinal = 1", (a,))
        writer.execute("INSERT INTO chunks (document_id, ordinal, heading, start_line, end_line, token_count,"
                       " chunk_hash, text) VALUES (%s, 5, '', 1, 1, 1, 'h5', 'zookeeper quorum')", (a,))
        done = threading.Event()
        result = {}

        def run():
            with connect(db_url) as other:
                result["out"] = refresh_query_stats(other)
            done.set()

        th = threading.Thread(target=run)
        th.start()
        assert not done.wait(1.0)          # blocked behind the writer's transaction
        writer.commit()
        th.join(10)
        assert done.is_set() and result["out"]["changed_documents"] == 1
        df = dict(conn.execute("SELECT lexeme, ndoc FROM lexeme_stats").fetchall())
        assert df.get("zookeep") == 1 and "beat" not in df and df["celeri"] == 1
        _assert_exact(conn, c.table)


def test_document_vector_table_from_before_migration_004_loses_its_foreign_key(conn):
    """A table made by the previous code (foreign key to documents, ON DELETE CASCADE): its key is dropped (a
    refresh must never wait for a document row lock while chunk writers wait for it) and it is rebuilt."""
    c = Corpus(conn)
    a = c.doc("a.md", ["celery workers restart", "celery beat schedule"])
    c.doc("b.md", ["kafka bid pipeline"])
    table = doc_vector_table(c.table)
    conn.execute(f"CREATE TABLE {table} (document_id bigint PRIMARY KEY REFERENCES documents(id) ON DELETE CASCADE,"
                 " content_hash text, n_chunks int NOT NULL, embedding vector(64) NOT NULL)")
    conn.execute(f"INSERT INTO {table} SELECT %s, 'stale', 7, embedding FROM {c.table} LIMIT 1", (a,))
    out = refresh_query_stats(conn)
    assert out["mode"] == "full" and out["document_vectors"] == {"added": 2, "removed": 1}
    assert conn.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f'",
                        (table,)).fetchone()[0] == 0
    _assert_exact(conn, c.table)
    conn.execute("DELETE FROM documents WHERE id = %s", (a,))
    assert refresh_query_stats(conn)["document_vectors"] == {"added": 0, "removed": 1}
    _assert_exact(conn, c.table)


def test_concurrent_writers_and_refreshes_stay_exact(db_url):
    """Two writers swapping and deleting documents of their own sources while refreshes run: no deadlock, no
    error, and the statistics are exact once they are done."""
    import random
    import threading
    import time

    from kb_assets.store.db import connect

    with connect(db_url) as conn:
        c = Corpus(conn)
        docs = {src: [c.doc(f"{src}/{i}.md", [f"{src} topic {i}", FOOTER], source=src) for i in range(12)]
                for src in ("one", "two")}
        refresh_query_stats(conn)
    errors: list[BaseException] = []
    stop = time.monotonic() + 3.0

    def writer(src: str, seed: int) -> None:
        rng = random.Random(seed)
        try:
            with connect(db_url) as w:
                cw = Corpus(w)
                n = 0
                while time.monotonic() < stop:
                    n += 1
                    live = docs[src]
                    if rng.random() < 0.2 and len(live) > 4:
                        w.execute("DELETE FROM documents WHERE id = %s", (live.pop(rng.randrange(len(live))),))
                    elif rng.random() < 0.3:
                        live.append(cw.doc(f"{src}/new-{n}.md", [f"{src} fresh {n}", FOOTER], source=src))
                    else:
                        texts = [f"{src} rewrite {n} {k}" for k in range(rng.randint(1, 3))]
                        _swap(w, cw, rng.choice(live), texts + ([FOOTER] if rng.random() < 0.5 else []))
        except BaseException as exc:   # noqa: BLE001 - reported by the test
            errors.append(exc)

    def refresher() -> None:
        try:
            with connect(db_url) as r:
                while time.monotonic() < stop:
                    refresh_query_stats(r)
        except BaseException as exc:   # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=("one", 1)), threading.Thread(target=writer, args=("two", 2)),
               threading.Thread(target=refresher), threading.Thread(target=refresher)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors, errors
    with connect(db_url) as conn:
        assert refresh_query_stats(conn)["mode"] == "incremental"
        _assert_exact(conn, Corpus(conn).table)
