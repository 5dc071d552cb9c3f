"""A small change indexed without a Dagster run: every stage of the `kb_index` job, then its checks, in this
process, with the same stage bodies (pipeline/stages.py) and check evaluations (store/checks.py). After the
documents and chunks stages, two lines run side by side: the embedding and search-index stages, then the checks
(the signpost ones once the signposts stage has finished); and the signposts, then the projections, which read
only documents, signposts and relations. The projections' figures are recorded last, as the job records them.

Why: a Dagster run costs ~3-4 s of a `kb index` process whatever it does (importing Dagster, its instance,
a dozen steps' events), while the work of a few changed, renamed or deleted files takes about one second
(docs/BENCHMARKS.md, "Small passes without a Dagster run"). So `kb index` takes this path when a source was
indexed completely before, with the same settings and kb code, and only a few of its files changed
(`why_not_direct`); everything else (a first run, a changed setting or model, a failed or stopped previous
run, many changes, `--force`, `--dagster`) runs the Dagster job as before.

What Dagster learns: each direct run is stored in `direct_runs` with what its assets and checks would have
reported; the `kb_direct_runs` sensor reports them to the Dagster instance as asset materializations and
check evaluations (defs/automation.py), so the UI's partitions and checks show them.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from typing import TYPE_CHECKING

from kb_assets.pipeline import guard, stages
from kb_assets.pipeline.progress import Progress, null_progress

if TYPE_CHECKING:
    import psycopg

    from kb_assets.config import KbConfig, SourceConfig
    from kb_assets.pipeline.source_state import SourceState
    from kb_assets.store.checks import CheckOutcome

# A change this small is indexed directly: at most this many files changed, new or deleted...
DIRECT_MAX_FILES = 100
# ...or at most this share of the source's files, whichever is larger.
DIRECT_MAX_SHARE = 0.05
KEEP_DAYS = 30          # direct_runs rows older than this are pruned (the sensor reported them long ago)


@dataclass
class DirectRun:
    source: str
    started_at: datetime
    assets: dict[str, dict] = field(default_factory=dict)     # asset name -> metadata (plain values)
    checks: list[CheckOutcome] = field(default_factory=list)
    # the checks' health.chunk_coverage, taken after the last stage that writes chunks or vectors: what the
    # caller's own counts of this source would read again (source_state.pending_work, store.status)
    coverage: dict | None = None


def why_not_direct(conn: psycopg.Connection, cfg: KbConfig, source: SourceConfig,
                   state: SourceState) -> str | None:
    """None when the source's pending change may be indexed without a Dagster run; else why not."""
    if state.fingerprint is None:
        return state.why or "no fingerprint"
    if not state.projections_present:
        return "the tier files are missing"
    row = conn.execute("SELECT details FROM source_state WHERE source_key = %s", (source.key,)).fetchone()
    if row is None:
        return "no complete run recorded"
    before, now = row[0] or {}, state.details
    for part in ("state_version", "code", "settings", "mode"):
        if before.get(part) != now.get(part):
            return f"{part} changed since the last complete run"
    changed, total = _changed_files(conn, cfg, source, state, before)
    if changed is None:
        return "the change cannot be sized"
    limit = max(DIRECT_MAX_FILES, int(DIRECT_MAX_SHARE * total))
    if changed > limit:
        return f"{changed} files changed (more than {limit})"
    return None


def _changed_files(conn, cfg, source, state, before) -> tuple[int | None, int]:
    """(files changed, new or deleted since the indexed state; files in the source now)."""
    if state.details.get("mode") == "git-commit":
        from kb_assets.sources.gitutil import GitError, run_git

        old, new = before.get("commit"), state.details.get("commit")
        if not old or not new:
            return None, 0
        try:
            root = cfg.source_root(source)
            diff = run_git(root, "diff", "--name-only", "--no-renames", "-z", old, new, check=False, timeout=60)
            files = run_git(root, "ls-tree", "-r", "--name-only", "-z", new, check=False, timeout=60)
        except GitError:
            return None, 0
        if diff.returncode != 0 or files.returncode != 0:
            return None, 0
        return diff.stdout.count(b"\0"), files.stdout.count(b"\0")
    listing = state.listing
    if listing is None:
        return None, 0
    from kb_assets.pipeline.documents import _file_of

    stored: dict[str, str | None] = {}
    for path, sig in conn.execute(
            "SELECT path, file_sig FROM documents WHERE source_key = %s AND status <> 'deleted'", (source.key,)):
        stored.setdefault(_file_of(path), sig)
    listed = {e.path: e.sig for e in listing.files}
    changed = sum(1 for p, sig in listed.items() if stored.get(p) != sig)
    skips = {s.path for s in listing.skips}
    changed += sum(1 for p in stored if p not in listed and p not in skips)
    return changed, len(listed)


def run_source(cfg: KbConfig, key: str, *, progress: Progress = null_progress) -> DirectRun:
    """Every stage of the source, then the job's checks; raises what a stage raises (committed work stays)."""
    from kb_assets.embedding import make_embedder
    from kb_assets.pipeline.side_by_side import prompt_gil_handoffs, run_side_by_side, yield_cpu
    from kb_assets.signposts import make_signposter
    from kb_assets.store import checks

    run_stage = partial(guard.run_stage, cfg)
    out = DirectRun(key, datetime.now(timezone.utc))
    embedder, signposter = make_embedder(cfg), make_signposter(cfg)

    docs, skipped = stages.documents(cfg, key, run_stage, progress)
    out.assets["kb_documents"] = {**docs.as_metadata(), "skipped_files": [
        {"path": p, "reason": r, "detail": (d or "")[:120]} for p, r, d in skipped]}
    # content changed (not only renamed or deleted): chunks to embed are likely, so the small-job encoder
    # loads while the chunk stage cuts them
    if (docs.changed or docs.new > docs.deleted) and hasattr(embedder, "warm_up_small_job"):
        embedder.warm_up_small_job()
    # and the new chunks' texts go to it as soon as they are cut (the embedding stage takes their vectors)
    out.assets["kb_chunks"] = stages.chunks(key, embedder, run_stage, progress, encode_ahead=True).as_metadata()
    source = [cfg.source(key)]

    def scans() -> list[CheckOutcome]:        # the checks that scan every chunk: one scan for the three
        def read(conn) -> list[CheckOutcome]:
            from kb_assets.store import health, spaces

            cover = out.coverage = health.chunk_coverage(conn, spaces.space_table(conn, embedder.model,
                                                                                  embedder.dimension))
            return [checks.every_chunk_embedded(conn, embedder.model, embedder.dimension, coverage=cover),
                    checks.vector_keyword_parity(conn, source, coverage=cover),
                    checks.no_orphans(conn, coverage=cover)]
        return run_stage(None, read, lock=False)

    signposts_over = threading.Event()

    def the_rest() -> list[CheckOutcome]:
        signposts_over.wait()      # the signpost and tag checks read what the signposts stage wrote
        def read(conn) -> list[CheckOutcome]:
            return [checks.signpost_failure_rate(conn), checks.indexed_commit_matches_tip(conn, cfg, source),
                    checks.tags_in_vocabulary(conn, cfg)]
        found = run_stage(None, read, lock=False)
        return found + [run_stage(":regression-check", lambda conn: checks.recall_regression_set(cfg, embedder))]

    def vectors_then_checks():
        """The stages that write and read chunks and vectors, then the checks (two threads of their own: mostly
        server work, each on its own connection) — where the Dagster job's check steps follow their assets'
        steps one by one."""
        emb = stages.embeddings(cfg, key, embedder, run_stage, progress)
        search = stages.search_index(key, embedder, run_stage, progress)
        first, rest, failed = run_side_by_side(scans, the_rest, thread_name=f"kb_checks[{key}]")
        if failed is not None:
            raise failed
        return emb, search, first.value + rest.value

    def signposts_then_projections():
        """The signposts need only the documents, the tier files only documents, signposts and relations:
        both run beside the vector stages (a small pass's projections no longer wait for the search index)."""
        yield_cpu()      # the vector line is the longer one: the model's calls go first (side_by_side.yield_cpu)
        try:
            sig = stages.signposts(cfg, key, signposter, run_stage)
        finally:
            signposts_over.set()
        return sig, stages.projections(cfg, key, run_stage, record=False)

    with prompt_gil_handoffs():
        vec, sp, error = run_side_by_side(vectors_then_checks, signposts_then_projections,
                                          thread_name=f"kb_signposts[{key}]")
    if error is not None:
        raise error
    emb, search, found = vec.value
    sig, proj = sp.value
    stages.record_projections(key, proj, run_stage)     # last, as the job's last step records it
    out.assets["kb_embeddings"] = emb.as_metadata()
    out.assets["kb_signposts"] = {**{k: v for k, v in sig.items() if isinstance(v, (int, float, str, bool))},
                                  "generator": signposter.generator, "model": signposter.model}
    out.assets["kb_search_index"] = {k: v for k, v in search.as_metadata().items() if k != "query_stats"}
    out.assets["kb_projections"] = {k: v for k, v in proj.as_metadata().items() if k not in ("written", "removed")}
    out.checks = found
    return out


def record(conn: psycopg.Connection, run: DirectRun) -> None:
    """Store the run for the `kb_direct_runs` sensor (and prune what it reported long ago)."""
    from psycopg.types.json import Json

    with conn.transaction():
        conn.execute("INSERT INTO direct_runs (source_key, started_at, assets, checks) VALUES (%s, %s, %s, %s)",
                     (run.source, run.started_at, Json(run.assets, dumps=_dumps),
                      Json([c.as_json() for c in run.checks], dumps=_dumps)))
        conn.execute("DELETE FROM direct_runs WHERE finished_at < now() - make_interval(days => %s)", (KEEP_DAYS,))


def unreported(conn: psycopg.Connection, after: int, limit: int = 50) -> list[tuple]:
    """(id, source_key, finished_at, assets, checks) of the runs after id `after`, oldest first."""
    return conn.execute("SELECT id, source_key, finished_at, assets, checks FROM direct_runs WHERE id > %s"
                        " ORDER BY id LIMIT %s", (after, limit)).fetchall()


def _dumps(obj) -> str:
    import json

    return json.dumps(obj, default=str)
