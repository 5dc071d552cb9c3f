"""On a first load the embedding stage embeds chunks while the chunk stage still cuts and commits them (one Dagster
step, kb_chunks_embeddings_and_signposts; pipeline/stages.py ChunkingBeside, embeddings.embed_source
`chunking_done`): model calls start before the chunk stage ends, and what is written equals what the stages write
one after the other. Into a space that already has its HNSW index, or on a re-run, the embedding stage waits for
the chunk stage instead. Whole `kb index` processes, the real Dagster job, real embedded PostgreSQL, the
fixed-cost stand-in embedder."""
from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from kb_assets_tests.test_signposts_beside_embeddings import _config, _kb_index, _materialized, _reload_definitions
from kb_assets_tests.test_signposts_beside_embeddings import _corpus as _adrs
from kb_assets_tests.test_signposts_beside_embeddings import _spans, _state

N_DOCS = 130            # a first load: at least chunks.WARM_UP_MIN_DOCUMENTS never chunked


def _corpus(root: Path, n: int = N_DOCS) -> Path:
    return _adrs(root, n)


# in the child: each model call's start time, appended to a file
_CALL_TIMES = """
import os, time
import kb_assets.embedding.fixed as fx
_embed = fx.FixedCostEmbedder.embed_documents
def _timed(self, texts, token_counts=None):
    with open(os.environ["CALL_TIMES"], "a") as f:
        f.write(f"{time.time():.3f} {len(texts)}\\n")
    return _embed(self, texts, token_counts)
fx.FixedCostEmbedder.embed_documents = _timed
# a chunk stage that lasts (three batches here, each stored 0.7 s late), as on a large first load
import kb_assets.pipeline.chunks as ch
_store = ch._store
def _slow_store(*a, **kw):
    time.sleep(0.7)
    return _store(*a, **kw)
ch._store = _slow_store
# the signposts of this many documents are generated in a process of their own (PROCESS_MIN_JOBS: 200)
import kb_assets.pipeline.signposts as sp
sp.PROCESS_MIN_JOBS = 50
_pool = sp._generation_pool
import contextlib
@contextlib.contextmanager
def _noted(*a, **kw):
    with _pool(*a, **kw) as (pool, width):
        with open(os.environ["CALL_TIMES"] + ".pool", "a") as f:
            f.write(type(pool).__name__ + chr(10))
        yield pool, width
sp._generation_pool = _noted
"""


def test_a_first_load_embeds_chunks_while_the_chunk_stage_runs_and_writes_what_the_serial_stages_write(
        tmp_path, db_url, monkeypatch):
    corpus = _corpus(tmp_path / "corpus")
    trace, calls = tmp_path / "trace.log", tmp_path / "calls.log"
    monkeypatch.setenv("CALL_TIMES", str(calls))
    proc = _kb_index(_config(tmp_path, db_url, corpus, "kb"), trace, plant=_CALL_TIMES)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads(proc.stdout)["sources"][0]["this_run"]
    assert run["embeddings"]["missing_after"] == 0 and run["chunks"]["documents_chunked"] == N_DOCS
    spans = _spans(trace)
    chunks_end = spans["kb_chunks"][1]
    times = [(float(t), int(n)) for t, n in (line.split() for line in calls.read_text().splitlines())]
    before = [n for t, n in times if t < chunks_end]
    assert before, f"no model call before the chunk stage ended at {chunks_end}: {times[:3]}"
    stage = [n for t, n in times if t <= spans["kb_embeddings"][1]]   # later: the regression check's corpus
    assert max(stage) <= 20                                 # half of embed_batch_rows (40) per call
    assert sum(stage) == run["embeddings"]["chunks_embedded"]   # every text once
    s0, s1 = spans["kb_signposts"]
    assert s0 >= chunks_end - 0.01                          # the signposts after the cut ...
    assert s0 < spans["kb_embeddings"][1]                   # ... beside the embedding stage
    # the keyword statistics once the chunks are in, beside the embedding stage (then again, incrementally,
    # by the search-index stage after it)
    k0 = spans["kb_search_index"][0]
    assert chunks_end - 0.01 <= k0 < spans["kb_embeddings"][1], (k0, chunks_end, spans["kb_embeddings"])
    # the source's signposts in a process; the regression check's 21 documents after, in threads
    assert Path(str(calls) + ".pool").read_text().split() == ["ProcessPoolExecutor", "ThreadPoolExecutor"]
    overlapped = _state(db_url, "kb")

    # the reference, one stage after the other in the real job (the UI's "Materialize selected", one at a time;
    # signposts generated in threads of this process)
    defs = _reload_definitions(_config(tmp_path, db_url, corpus, "kb_serial"), monkeypatch)
    job = defs.resolve_job_def("kb_index")
    instance = dg.DagsterInstance.ephemeral()
    for asset in ("kb_documents", "kb_chunks", "kb_embeddings", "kb_signposts", "kb_search_index"):
        result = job.execute_in_process(partition_key="adrs", instance=instance,
                                        asset_selection=[dg.AssetKey(asset)])
        assert result.success and set(_materialized(result)) == {asset}
    serial = _state(db_url, "kb_serial")
    # what recall() reads beyond the vectors: the same as one refresh from scratch after the embedding stage
    assert _search_state(db_url, "kb") == _search_state(db_url, "kb_serial")
    assert _search_state(db_url, "kb")["lexemes"] and _search_state(db_url, "kb")["document_vectors"]

    assert overlapped["documents"] == serial["documents"] == N_DOCS
    assert set(overlapped["vectors"]) == overlapped["chunks"] and len(overlapped["chunks"]) > N_DOCS
    assert overlapped["chunks"] == serial["chunks"]
    assert overlapped["vectors"] == serial["vectors"]
    assert overlapped["signposts"] == serial["signposts"] and len(overlapped["signposts"]) == N_DOCS


def _search_state(db_url: str, schema: str) -> dict:
    """The keyword statistics and document vectors, independent of ids: per lexeme, per (lexeme, path) the hashes
    of the chunks holding it, per path its mean vector."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path = {}, public").format(sql.Identifier(schema)))
        (space,) = conn.execute("SELECT table_name FROM embedding_spaces").fetchone()
        return {
            "totals": conn.execute("SELECT n_chunks, n_lexemes, vector_space FROM query_stats").fetchall(),
            "lexemes": dict(conn.execute("SELECT lexeme, ndoc FROM lexeme_stats").fetchall()),
            "postings": {(lex, path): hashes for lex, path, hashes in conn.execute(
                "SELECT t.lexeme, d.path, array_agg(c.chunk_hash ORDER BY c.chunk_hash) FROM document_terms t"
                " JOIN documents d ON d.id = t.document_id CROSS JOIN unnest(t.chunk_ids) AS u(chunk_id)"
                " JOIN chunks c ON c.id = u.chunk_id GROUP BY t.lexeme, d.path").fetchall()},
            "document_vectors": dict(conn.execute(sql.SQL(
                "SELECT d.path, v.embedding::text FROM {} v JOIN documents d ON d.id = v.document_id").format(
                sql.Identifier(space + "_docs"))).fetchall()),
        }


def test_the_embedding_stage_follows_only_a_first_load_into_a_space_without_its_index(tmp_path, db_url, conn):
    from kb_assets.config import parse_config
    from kb_assets.embedding.fixed import FixedCostEmbedder
    from kb_assets.pipeline import stages
    from kb_assets.pipeline.chunks import chunk_source
    from kb_assets.pipeline.documents import sync_documents
    from kb_assets.pipeline.embeddings import embed_source
    from kb_assets.pipeline.search_index import build_search_index

    small, big = _corpus(tmp_path / "small", 5), _corpus(tmp_path / "big", 120)
    cfg = parse_config({"database_url": db_url, "sources": [
        {"key": "small", "kind": "adr", "root": str(small), "include": ["*.md"]},
        {"key": "big", "kind": "adr", "root": str(big), "include": ["*.md"]}]},
        path=str(tmp_path / "kb.yaml"), base_dir=str(tmp_path))
    emb = FixedCostEmbedder(0.0)
    for source in cfg.sources:
        sync_documents(conn, cfg, source)
    assert stages.follows_chunking(conn, "big", emb)           # a first load, no space yet
    assert not stages.follows_chunking(conn, "small", emb)     # 5 documents: not worth a thread

    chunk_source(conn, "small", max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
    embed_source(conn, emb, source_key="small")
    assert stages.follows_chunking(conn, "big", emb)           # the space exists, still without its index
    built = build_search_index(conn, emb.model, emb.dimension)
    assert built.vector_index_built
    # each vector would go through the index row by row: wait for the chunk stage, load, rebuild once
    assert not stages.follows_chunking(conn, "big", emb)

    chunk_source(conn, "big", max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
    assert not stages.follows_chunking(conn, "big", emb)       # chunked: a re-run, not a first load


def test_a_new_source_loads_its_model_while_its_documents_are_read_and_only_then(tmp_path, db_url, conn,
                                                                                 monkeypatch):
    """`kb index`'s first load of a source with many files starts the model's load in the documents stage (before
    a document is written), not at the chunk stage; a known source, a small one, or a step in a process of its
    own (the Dagster UI's executor) loads nothing there. With a vector space in use, the keyword statistics are
    not refreshed ahead of the embedding stage (the document vectors would average half-embedded documents)."""
    from functools import partial

    from kb_assets.config import parse_config
    from kb_assets.embedding.fixed import FixedCostEmbedder
    from kb_assets.pipeline import guard, progress, source_state, stages
    from kb_assets.pipeline.chunks import chunk_source
    from kb_assets.pipeline.embeddings import embed_source
    from kb_assets.pipeline.search_index import build_search_index

    small, big = _corpus(tmp_path / "small", 5), _corpus(tmp_path / "big", 120)
    cfg = parse_config({"database_url": db_url, "sources": [
        {"key": "small", "kind": "adr", "root": str(small), "include": ["*.md"]},
        {"key": "big", "kind": "adr", "root": str(big), "include": ["*.md"]}]},
        path=str(tmp_path / "kb.yaml"), base_dir=str(tmp_path))
    run_stage = partial(guard.run_stage, cfg)
    warmed: list[tuple[str, int]] = []

    class Model(FixedCostEmbedder):
        def warm_up(self):
            # how many documents the source had when the load started
            warmed.append((self.source, conn.execute("SELECT count(*) FROM documents WHERE source_key = %s",
                                                     (self.source,)).fetchone()[0]))

    def index_documents(key: str, *, in_process: bool = True) -> None:
        def model():
            m = Model(0.0)
            m.source = key
            return m
        source_state.offer_listing(source_state.source_fingerprint(cfg, cfg.source(key)))   # as `kb index` does
        monkeypatch.setattr(progress, "_steps_in_process", in_process)
        try:
            stages.documents(cfg, key, run_stage, embedder_factory=model)
        finally:
            source_state.offer_listing(None)

    index_documents("big", in_process=False)      # a step of its own: its process never embeds
    index_documents("small")                      # 5 files: the chunk stage's own rule decides, later
    assert warmed == []
    conn.execute("DELETE FROM documents WHERE source_key = 'big'")
    index_documents("big")
    assert warmed == [("big", 0)]                 # before the first document was written
    index_documents("big")                        # known now: a re-run
    assert warmed == [("big", 0)]

    # a space in use (the small source indexed): no refresh ahead for the big one's first load
    emb = FixedCostEmbedder(0.0)
    chunk_source(conn, "small", max_tokens=emb.max_tokens, count_tokens=emb.count_tokens)
    embed_source(conn, emb, source_key="small")
    assert stages.keyword_statistics_ahead("small", run_stage) is not None   # no space in use yet: refreshed
    build_search_index(conn, emb.model, emb.dimension)
    assert stages.keyword_statistics_ahead("big", run_stage) is None
