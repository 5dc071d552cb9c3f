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
def _timed(self, texts):
    with open(os.environ["CALL_TIMES"], "a") as f:
        f.write(f"{time.time():.3f} {len(texts)}\\n")
    return _embed(self, texts)
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
    # the source's signposts in a process; the regression check's 21 documents after, in threads
    assert Path(str(calls) + ".pool").read_text().split() == ["ProcessPoolExecutor", "ThreadPoolExecutor"]
    overlapped = _state(db_url, "kb")

    # the reference, one stage after the other in the real job (the UI's "Materialize selected", one at a time;
    # signposts generated in threads of this process)
    defs = _reload_definitions(_config(tmp_path, db_url, corpus, "kb_serial"), monkeypatch)
    job = defs.resolve_job_def("kb_index")
    instance = dg.DagsterInstance.ephemeral()
    for asset in ("kb_documents", "kb_chunks", "kb_embeddings", "kb_signposts"):
        result = job.execute_in_process(partition_key="adrs", instance=instance,
                                        asset_selection=[dg.AssetKey(asset)])
        assert result.success and set(_materialized(result)) == {asset}
    serial = _state(db_url, "kb_serial")

    assert overlapped["documents"] == serial["documents"] == N_DOCS
    assert set(overlapped["vectors"]) == overlapped["chunks"] and len(overlapped["chunks"]) > N_DOCS
    assert overlapped["chunks"] == serial["chunks"]
    assert overlapped["vectors"] == serial["vectors"]
    assert overlapped["signposts"] == serial["signposts"] and len(overlapped["signposts"]) == N_DOCS


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
