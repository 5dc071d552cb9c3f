"""Stage: run a signposter over one source's documents, incrementally and safely.

- Only documents whose (content_hash, generator, model, prompt_version) differs from the signpost they show are
  done; a second run over unchanged sources makes no LLM call.
- Content-addressed: a signpost that already exists for (content_hash, generator, model, prompt_version) is reused
  with no call (renames, copies, identical documents in other sources). Identical documents in one run share
  one call.
- No transaction is open during generation; each result is written in one short transaction.
- A failure keeps the previous signpost (marked stale) and records reason, attempts and time; after
  `max_failures` failures on the same version the document is parked until its content (or the generator,
  model or prompt version) changes.
- 401/403 (SignpostAuthError) or an exhausted quota (SignpostQuotaError) stops the run: documents not yet
  done are left untouched, results already paid for are kept, and the error is raised.
- Concurrency: a thread pool whose width halves on a 429 and grows by one after a round of successes (AIMD).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
# BrokenExecutor, not concurrent.futures.process's BrokenProcessPool (its subclass): that module brings
# multiprocessing (~5 ms of every pass), and a broken pool of either kind fails the stage alike
from concurrent.futures import FIRST_COMPLETED, BrokenExecutor, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import psycopg
from pydantic import ValidationError

from kb_assets.pipeline import cancel
from kb_assets.signposts.base import (
    SignpostAuthError,
    SignpostError,
    SignpostInput,
    SignpostQuotaError,
    SignpostResult,
)
from kb_assets.signposts.gemini import estimate_signpost_tokens as _estimate
from kb_assets.signposts.gemini import estimate_tokens_for_length
from kb_assets.signposts.schema import SCHEMA_VERSION, validate_payload
from kb_assets.sources.safe_names import clean_json_value

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 1000
# What storing one document's signpost can raise (a value PostgreSQL refuses, e.g. a lone surrogate in a
# model's answer); the connection lost still stops the run.
_STORE_ERRORS = (psycopg.DataError, UnicodeError, ValueError)
MAX_ERRORS_IN_STATS = 20
READ_BATCH = 64      # documents read back per query
WRITE_BATCH = 64     # free (extractive) results written per transaction


def estimate_signpost_tokens(text: str, kind: str, *, max_input_tokens: int = 200_000) -> tuple[int, int]:
    """(input, output) token estimate for one LLM signpost of this text (for `kb plan`)."""
    return _estimate(text, kind, max_input_tokens=max_input_tokens)


@dataclass
class SignpostRunStats:
    considered: int = 0          # active documents of the source
    up_to_date: int = 0          # already showing a current signpost: nothing to do
    reused: int = 0              # content-addressed hit in `signposts`: no call
    generated: int = 0           # documents given a freshly generated signpost
    failed: int = 0              # documents whose generation failed in this run
    parked: int = 0              # documents parked after this run (including ones skipped because parked)
    skipped_parked: int = 0      # parked documents not retried in this run
    stale: int = 0               # documents showing a stale signpost after this run
    llm_calls: int = 0           # API calls made (every attempt counts)
    input_tokens: int = 0
    output_tokens: int = 0
    estimated_cost_usd: float = 0.0
    seconds: float = 0.0
    rate_limited: int = 0        # 429 answers seen
    min_concurrency: int = 0     # narrowest the adaptive pool got
    generator: str = ""
    model: str = ""
    prompt_version: str = ""
    stopped: str = ""            # why the run stopped early (auth / quota), else ""
    errors: list[str] = field(default_factory=list)   # first failures, "path: reason"

    def as_metadata(self) -> dict[str, Any]:
        d = asdict(self)
        d["estimated_cost_usd"] = round(self.estimated_cost_usd, 6)
        d["seconds"] = round(self.seconds, 3)
        return d


class AdaptiveLimit:
    """AIMD width for the worker pool: halve on a rate limit, +1 after `width` successes in a row, within
    [1, maximum]. Thread-safe (rate limits are reported from worker threads)."""

    def __init__(self, maximum: int):
        self.maximum = max(1, int(maximum))
        self.width = self.maximum
        self.min_width = self.maximum
        self._successes = 0
        self._lock = threading.Lock()
        self.history: list[int] = [self.width]

    def on_rate_limit(self) -> None:
        with self._lock:
            new = max(1, self.width // 2)
            self._successes = 0
            if new != self.width:
                self.width = new
                self.min_width = min(self.min_width, new)
                self.history.append(new)

    def on_success(self) -> None:
        with self._lock:
            self._successes += 1
            if self.width < self.maximum and self._successes >= self.width:
                self.width += 1
                self._successes = 0
                self.history.append(self.width)


@dataclass
class _Job:
    content_hash: str
    document_ids: list[int]
    paths: list[str]


def _version(signposter) -> str:
    return f"{signposter.generator}/{signposter.model}/{signposter.prompt_version}"


def _readable(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if not isinstance(exc, SignpostError):
        text = f"{type(exc).__name__}: {text}"
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _load_input(conn, document_id: int) -> SignpostInput | None:
    row = conn.execute("SELECT kind, title, path, text, meta, blocks FROM documents"
                       " WHERE id = %s AND status = 'active'", (document_id,)).fetchone()
    if row is None:
        return None
    kind, title, path, text, meta, blocks = row
    if isinstance(meta, str):
        meta = json.loads(meta or "{}")
    return SignpostInput(title=title or "", kind=kind, path=path, text=text or "", meta=meta or {},
                         blocks=blocks if isinstance(blocks, dict) else None)


def _load_inputs(conn, document_ids: list[int]) -> dict[int, SignpostInput]:
    """_load_input for many documents in one query: {document_id: input} for the active ones."""
    rows = conn.execute("SELECT id, kind, title, path, text, meta FROM documents WHERE id = ANY(%s) AND status = 'active'",
                        (list(document_ids),)).fetchall()
    out: dict[int, SignpostInput] = {}
    for doc_id, kind, title, path, text, meta in rows:
        if isinstance(meta, str):
            meta = json.loads(meta or "{}")
        out[doc_id] = SignpostInput(title=title or "", kind=kind, path=path, text=text or "", meta=meta or {})
    return out


_INSERT_SIGNPOST = """INSERT INTO signposts (content_hash, generator, model, prompt_version, schema_version, payload,
                                          input_tokens, output_tokens, seconds, kind, model_used, segments)
                   VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s)
                   ON CONFLICT (content_hash, generator, model, prompt_version) DO NOTHING"""
_POINT_STATE = """INSERT INTO signpost_state (document_id, content_hash, generator, model, prompt_version, stale,
                                       failures, parked, last_error, last_attempt_at, failed_hash, failed_version,
                                       last_attempts, updated_at)
           SELECT id, %s, %s, %s, %s, false, 0, false, NULL, now(), NULL, NULL, 0, now()
             FROM documents WHERE id = ANY(%s)
           ON CONFLICT (document_id) DO UPDATE SET
             content_hash = EXCLUDED.content_hash, generator = EXCLUDED.generator, model = EXCLUDED.model,
             prompt_version = EXCLUDED.prompt_version, stale = false, failures = 0, parked = false,
             last_error = NULL, last_attempt_at = now(), failed_hash = NULL, failed_version = NULL,
             last_attempts = 0, updated_at = now()"""


def _write_success(conn, signposter, job: _Job, kind: str, result: SignpostResult, payload: dict) -> None:
    with conn.transaction():
        conn.execute(
            _INSERT_SIGNPOST,
            (job.content_hash, signposter.generator, signposter.model, signposter.prompt_version, SCHEMA_VERSION,
             json.dumps(clean_json_value(payload)), result.input_tokens, result.output_tokens, float(result.seconds), kind,
             result.model_used or signposter.model, max(1, result.segments)))
        _point_state(conn, signposter, job.content_hash, job.document_ids)


def _write_successes(conn, signposter, items: list[tuple[_Job, str, SignpostResult, dict]]) -> None:
    """_write_success for many results in one transaction (statements pipelined by executemany)."""
    rows = [(job.content_hash, signposter.generator, signposter.model, signposter.prompt_version, SCHEMA_VERSION,
             json.dumps(clean_json_value(payload)), result.input_tokens, result.output_tokens, float(result.seconds),
             kind, result.model_used or signposter.model, max(1, result.segments))
            for job, kind, result, payload in items]
    with conn.transaction(), conn.cursor() as cur:
        cur.executemany(_INSERT_SIGNPOST, rows)
        cur.executemany(_POINT_STATE, [(job.content_hash, signposter.generator, signposter.model,
                                        signposter.prompt_version, job.document_ids) for job, _, _, _ in items])


def _point_state(conn, signposter, content_hash: str, document_ids: list[int]) -> None:
    """Make documents show the signpost (content_hash, generator, model, prompt_version); clear failures."""
    conn.execute(
        _POINT_STATE,
        (content_hash, signposter.generator, signposter.model, signposter.prompt_version, document_ids))


def _write_failure(conn, signposter, job: _Job, error: str, attempts: int, max_failures: int) -> int:
    """Record a failure for the job's documents; returns how many are parked now."""
    with conn.transaction():
        rows = conn.execute(
            """INSERT INTO signpost_state AS st (document_id, stale, failures, parked, last_error, last_attempt_at,
                                                 failed_hash, failed_version, last_attempts, updated_at)
               SELECT id, false, 1, 1 >= %(max)s, %(err)s, now(), %(hash)s, %(ver)s, %(att)s, now()
                 FROM documents WHERE id = ANY(%(ids)s)
               ON CONFLICT (document_id) DO UPDATE SET
                 stale = st.content_hash IS NOT NULL,
                 failures = CASE WHEN st.failed_hash IS NOT DISTINCT FROM EXCLUDED.failed_hash
                                  AND st.failed_version IS NOT DISTINCT FROM EXCLUDED.failed_version
                                 THEN st.failures + 1 ELSE 1 END,
                 parked = (CASE WHEN st.failed_hash IS NOT DISTINCT FROM EXCLUDED.failed_hash
                                 AND st.failed_version IS NOT DISTINCT FROM EXCLUDED.failed_version
                                THEN st.failures + 1 ELSE 1 END) >= %(max)s,
                 last_error = EXCLUDED.last_error, last_attempt_at = now(), failed_hash = EXCLUDED.failed_hash,
                 failed_version = EXCLUDED.failed_version, last_attempts = EXCLUDED.last_attempts,
                 updated_at = now()
               RETURNING parked""",
            {"max": max_failures, "err": error, "hash": job.content_hash, "ver": _version(signposter),
             "att": attempts, "ids": job.document_ids}).fetchall()
    return sum(1 for (p,) in rows if p)


# A CPU-bound generator (extractive: ~10 ms of Python a document) generates in a process of its own once a run has
# PROCESS_MIN_JOBS documents: in this interpreter it ran beside the embedding stage on a first load and slowed the
# model calls' own Python through the interpreter lock (docs/BENCHMARKS.md, "Embeddings beside chunking").
# PROCESS_IN_FLIGHT documents wait in its queue, so the round trips hide. "spawn": no fork of a threaded process.
PROCESS_MIN_JOBS = 200
PROCESS_IN_FLIGHT = 16


@contextmanager
def _generation_pool(signposter, jobs: int, limiter: "AdaptiveLimit"):
    """(executor, how many documents may be in flight now)."""
    if getattr(signposter, "cpu_bound", False) and jobs >= PROCESS_MIN_JOBS:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            yield pool, (lambda: PROCESS_IN_FLIGHT)
    else:
        with ThreadPoolExecutor(max_workers=limiter.maximum, thread_name_prefix="signpost") as pool:
            yield pool, (lambda: limiter.width)


def run_signposts(conn, source_key: str, signposter, *, max_failures: int = 3, concurrency: int = 1,
                  on_progress: Callable[[int, int], None] | None = None) -> SignpostRunStats:
    """Signpost the active documents of one source that need it (see the module docstring).

    `concurrency` is the widest the worker pool gets; `max_failures` failures on one document version park it;
    `on_progress(done, total)` is called after each generated (or failed) document. Returns SignpostRunStats.
    On SignpostAuthError / SignpostQuotaError the run stops and the error is raised with `.stats` attached.
    """
    t0 = time.perf_counter()
    gen, model, pv = signposter.generator, signposter.model, signposter.prompt_version
    version = _version(signposter)
    stats = SignpostRunStats(generator=gen, model=model, prompt_version=pv)

    rows = conn.execute(
        """SELECT d.id, d.path, d.content_hash, st.content_hash, st.generator, st.model, st.prompt_version,
                  COALESCE(st.parked, false), st.failed_hash, st.failed_version,
                  COALESCE(st.stale OR st.failures > 0, false)
             FROM documents d LEFT JOIN signpost_state st ON st.document_id = d.id
            WHERE d.source_key = %s AND d.status = 'active' AND d.content_hash IS NOT NULL
            ORDER BY d.path""", (source_key,)).fetchall()
    stats.considered = len(rows)
    groups: "OrderedDict[str, _Job]" = OrderedDict()
    settled: list[int] = []      # current again (e.g. content reverted after a failed try): clear the flags
    for doc_id, path, chash, s_hash, s_gen, s_model, s_pv, parked, f_hash, f_ver, flagged in rows:
        if (s_hash, s_gen, s_model, s_pv) == (chash, gen, model, pv):
            stats.up_to_date += 1
            if flagged:
                settled.append(doc_id)
            continue
        if parked and f_hash == chash and f_ver == version:
            stats.skipped_parked += 1
            continue
        job = groups.setdefault(chash, _Job(chash, [], []))
        job.document_ids.append(doc_id)
        job.paths.append(path)

    if settled:
        with conn.transaction():
            conn.execute("""UPDATE signpost_state SET stale = false, failures = 0, parked = false, last_error = NULL,
                                   failed_hash = NULL, failed_version = NULL, last_attempts = 0, updated_at = now()
                             WHERE document_id = ANY(%s)""", (settled,))

    # Content-addressed reuse: one query, one short transaction.
    if groups:
        hits = {r[0] for r in conn.execute(
            """SELECT content_hash FROM signposts WHERE content_hash = ANY(%s) AND generator = %s AND model = %s
                 AND prompt_version = %s""", (list(groups), gen, model, pv)).fetchall()}
        if hits:
            with conn.transaction():
                for h in hits:
                    _point_state(conn, signposter, h, groups[h].document_ids)
                    stats.reused += len(groups[h].document_ids)
            for h in hits:
                del groups[h]

    jobs = list(groups.values())
    total = len(jobs)
    done = 0
    # A generator that calls no paid API (extractive) commits without waiting for the WAL flush: a server crash
    # can lose its newest signposts, which the next run regenerates for free, never half of one. 35% of the
    # stage's wall time on 300 documents (5.4-7.4 s against 8.6-11.5 s); paid generators keep durable commits.
    relaxed = bool(jobs) and gen == "extractive"
    if relaxed:
        conn.execute("SET synchronous_commit = off")
    limiter = AdaptiveLimit(max(1, concurrency))
    has_listener = hasattr(signposter, "rate_limit_listener")
    previous_listener = getattr(signposter, "rate_limit_listener", None)
    if has_listener:
        signposter.rate_limit_listener = limiter.on_rate_limit
    cost_fn = getattr(signposter, "cost_usd", None)
    stop_exc: SignpostError | None = None

    def account(calls: int, rate_limited: int, tin: int, tout: int) -> None:
        stats.llm_calls += calls
        stats.rate_limited += rate_limited
        stats.input_tokens += tin
        stats.output_tokens += tout
        if not has_listener and rate_limited:
            limiter.on_rate_limit()

    def store(items: list[tuple[_Job, str, SignpostResult, dict]]) -> None:
        for job, kind, result, payload in items:
            try:
                _write_success(conn, signposter, job, kind, result, payload)
            except _STORE_ERRORS as exc:  # a payload the database refuses: this document fails
                error = _readable(exc)
                stats.failed += len(job.document_ids)
                if len(stats.errors) < MAX_ERRORS_IN_STATS:
                    stats.errors.append(f"{job.paths[0]}: {error}")
                log.warning("signpost for %s cannot be stored: %s", job.paths[0], error)
                _write_failure(conn, signposter, job, error, 1, max_failures)
            else:
                stats.generated += len(job.document_ids)
                if not result.rate_limited:
                    limiter.on_success()

    # Free results (extractive) are written WRITE_BATCH at a time in one transaction; if the database refuses
    # one of them, the batch is written again one by one so that only that document fails.
    unwritten: list[tuple[_Job, str, SignpostResult, dict]] = []

    def flush() -> None:
        items = unwritten[:]
        unwritten.clear()
        if not items:
            return
        try:
            _write_successes(conn, signposter, items)
        except _STORE_ERRORS:
            store(items)
            return
        for job, _, result, _ in items:
            stats.generated += len(job.document_ids)
            if not result.rate_limited:
                limiter.on_success()

    prefetched: dict[int, SignpostInput] = {}
    try:
        with _generation_pool(signposter, len(jobs), limiter) as (pool, width):
            pending: dict[Future, tuple[_Job, str]] = {}
            queue = list(reversed(jobs))
            while queue or pending:
                # a stop request (SIGINT/SIGTERM): start nothing new, finish what is in flight
                while queue and stop_exc is None and not cancel.stop_requested() and len(pending) < width():
                    job = queue.pop()
                    if job.document_ids[0] not in prefetched:
                        # the texts of the next jobs in one query, not one round trip per document
                        prefetched = _load_inputs(conn, [j.document_ids[0] for j in queue[-(READ_BATCH - 1):]]
                                                  + [job.document_ids[0]])
                    inp = prefetched.pop(job.document_ids[0], None)
                    for doc_id in job.document_ids[1:] if inp is None else ():
                        inp = _load_input(conn, doc_id)
                        if inp is not None:
                            break
                    if inp is None:      # deleted meanwhile
                        done += 1
                        continue
                    pending[pool.submit(signposter.generate, inp)] = (job, inp.kind)
                if not pending:
                    break
                finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for fut in finished:
                    job, kind = pending.pop(fut)
                    done += 1
                    try:
                        result = fut.result()
                        payload = validate_payload(kind, result.payload)
                    except BrokenExecutor:
                        raise       # the generating process died: the stage fails, no document is to blame
                    except (SignpostAuthError, SignpostQuotaError) as exc:
                        account(exc.calls, exc.rate_limited, exc.input_tokens, exc.output_tokens)
                        if stop_exc is None:
                            stop_exc = exc
                            log.error("signposts for %s stopped: %s", source_key, exc)
                        continue
                    except (SignpostError, ValidationError, Exception) as exc:  # noqa: BLE001 - recorded per doc
                        if isinstance(exc, SignpostError):
                            account(exc.calls, exc.rate_limited, exc.input_tokens, exc.output_tokens)
                            attempts = exc.attempts
                        else:
                            attempts = 1
                        error = _readable(exc)
                        stats.failed += len(job.document_ids)
                        if len(stats.errors) < MAX_ERRORS_IN_STATS:
                            stats.errors.append(f"{job.paths[0]}: {error}")
                        log.warning("signpost failed for %s: %s", job.paths[0], error)
                        _write_failure(conn, signposter, job, error, attempts, max_failures)
                    else:
                        account(result.calls, result.rate_limited, result.input_tokens, result.output_tokens)
                        if relaxed:
                            unwritten.append((job, kind, result, payload))
                            if len(unwritten) >= WRITE_BATCH:
                                flush()
                        else:
                            store([(job, kind, result, payload)])
                    if on_progress is not None:
                        try:
                            on_progress(done, total)
                        except Exception:  # a progress callback must not break the run
                            log.debug("on_progress failed", exc_info=True)
        flush()
    finally:
        if has_listener:
            signposter.rate_limit_listener = previous_listener
        if relaxed and not conn.closed and not conn.broken:
            conn.execute("SET synchronous_commit = on")
    cancel.check()

    row = conn.execute(
        """SELECT count(*) FILTER (WHERE st.parked),
                  count(*) FILTER (WHERE st.content_hash IS NOT NULL
                                   AND (st.stale OR st.content_hash IS DISTINCT FROM d.content_hash))
             FROM documents d JOIN signpost_state st ON st.document_id = d.id
            WHERE d.source_key = %s AND d.status = 'active'""", (source_key,)).fetchone()
    stats.parked, stats.stale = int(row[0]), int(row[1])
    stats.min_concurrency = limiter.min_width
    if callable(cost_fn):
        stats.estimated_cost_usd = float(cost_fn(stats.input_tokens, stats.output_tokens))
    stats.seconds = time.perf_counter() - t0
    if stop_exc is not None:
        stats.stopped = _readable(stop_exc)
        stop_exc.stats = stats            # the caller can still report what was done
        raise stop_exc
    return stats


# ================================================================================================ reading

_CURRENT_SQL = """
SELECT st.document_id, s.payload, st.generator, st.model, s.model_used, st.prompt_version, s.schema_version,
       (st.stale OR st.content_hash IS DISTINCT FROM d.content_hash) AS stale, st.failures, st.parked,
       st.last_error, st.content_hash, s.created_at, d.kind, s.segments
  FROM signpost_state st
  JOIN documents d ON d.id = st.document_id
  JOIN signposts s ON s.content_hash = st.content_hash AND s.generator = st.generator AND s.model = st.model
                  AND s.prompt_version = st.prompt_version
"""


def _row_to_dict(r) -> dict:
    payload = r[1] if isinstance(r[1], dict) else json.loads(r[1])
    return {"document_id": r[0], "payload": payload, "generator": r[2], "model": r[3], "model_used": r[4],
            "prompt_version": r[5], "schema_version": r[6], "stale": bool(r[7]), "failures": r[8],
            "parked": bool(r[9]), "last_error": r[10], "content_hash": r[11], "created_at": r[12], "kind": r[13],
            "segments": r[14], "extractive": r[2] == "extractive"}


def current_signpost(conn, document_id: int) -> dict | None:
    """The signpost a document shows: {"payload": {...}, "generator", "model", "model_used", "prompt_version",
    "schema_version", "stale", "failures", "parked", "last_error", "content_hash", "created_at", "kind",
    "extractive"}; stale is true when the document changed since (or its regeneration failed). None if none."""
    r = conn.execute(_CURRENT_SQL + " WHERE st.document_id = %s", (document_id,)).fetchone()
    return _row_to_dict(r) if r else None


def current_signposts(conn, document_ids: list[int]) -> dict[int, dict]:
    """Batch form of current_signpost for the query layer: {document_id: signpost dict}."""
    if not document_ids:
        return {}
    rows = conn.execute(_CURRENT_SQL + " WHERE st.document_id = ANY(%s)", (list(document_ids),)).fetchall()
    return {r[0]: _row_to_dict(r) for r in rows}


def signpost_failures(conn, source_key: str) -> list[dict]:
    """Documents of a source whose last signpost attempt failed (for `kb status`): parked first."""
    rows = conn.execute(
        """SELECT d.id, d.path, d.kind, st.failures, st.parked, st.last_error, st.last_attempt_at,
                  st.last_attempts, st.failed_version, st.content_hash IS NOT NULL AS has_signpost,
                  (st.content_hash IS NOT NULL AND (st.stale OR st.content_hash IS DISTINCT FROM d.content_hash))
             FROM signpost_state st JOIN documents d ON d.id = st.document_id
            WHERE d.source_key = %s AND d.status = 'active' AND st.failures > 0
            ORDER BY st.parked DESC, d.path""", (source_key,)).fetchall()
    return [{"document_id": r[0], "path": r[1], "kind": r[2], "failures": r[3], "parked": bool(r[4]),
             "last_error": r[5], "last_attempt_at": r[6], "attempts": r[7], "version": r[8],
             "has_signpost": bool(r[9]), "stale": bool(r[10])} for r in rows]


def signpost_counts(conn, source_key: str, signposter=None) -> dict[str, int]:
    """Per-source counts for `kb status`: documents, signposted, current (with the given signposter's
    generator/model/prompt version), stale, failing, parked, missing."""
    gen = getattr(signposter, "generator", None)
    model = getattr(signposter, "model", None)
    pv = getattr(signposter, "prompt_version", None)
    r = conn.execute(
        """SELECT count(*),
                  count(st.content_hash),
                  count(*) FILTER (WHERE st.content_hash = d.content_hash AND st.generator = %s AND st.model = %s
                                   AND st.prompt_version = %s),
                  count(*) FILTER (WHERE st.content_hash IS NOT NULL
                                   AND (st.stale OR st.content_hash IS DISTINCT FROM d.content_hash)),
                  count(*) FILTER (WHERE st.failures > 0),
                  count(*) FILTER (WHERE st.parked),
                  count(*) FILTER (WHERE st.content_hash IS NULL)
             FROM documents d LEFT JOIN signpost_state st ON st.document_id = d.id
            WHERE d.source_key = %s AND d.status = 'active'""", (gen, model, pv, source_key)).fetchone()
    keys = ("documents", "signposted", "current", "stale", "failing", "parked", "missing")
    out = dict(zip(keys, (int(x) for x in r)))
    if signposter is None:
        out.pop("current")
    return out


def unpark(conn, source_key: str, paths: list[str] | None = None) -> int:
    """Clear parking (and the failure count) so parked documents are retried on the next run."""
    sql = """UPDATE signpost_state st SET parked = false, failures = 0, updated_at = now()
               FROM documents d WHERE d.id = st.document_id AND d.source_key = %s AND st.parked"""
    params: list[Any] = [source_key]
    if paths:
        sql += " AND d.path = ANY(%s)"
        params.append(list(paths))
    with conn.transaction():
        return conn.execute(sql, params).rowcount


def estimate_signpost_run(conn, source_key: str, signposter, *, max_input_tokens: int = 200_000) -> dict[str, Any]:
    """What a run would cost now (for `kb plan` on an indexed source): documents to generate (after reuse),
    estimated input/output tokens and dollars. Extractive signposters cost 0 tokens."""
    gen, model, pv = signposter.generator, signposter.model, signposter.prompt_version
    rows = conn.execute(
        """SELECT DISTINCT ON (d.content_hash) d.kind, length(d.text)
             FROM documents d LEFT JOIN signpost_state st ON st.document_id = d.id
            WHERE d.source_key = %s AND d.status = 'active' AND d.content_hash IS NOT NULL
              AND (st.document_id IS NULL OR (st.content_hash, st.generator, st.model, st.prompt_version)
                   IS DISTINCT FROM (d.content_hash, %s, %s, %s))
              AND NOT (COALESCE(st.parked, false) AND st.failed_hash = d.content_hash AND st.failed_version = %s)
              AND NOT EXISTS (SELECT 1 FROM signposts s WHERE s.content_hash = d.content_hash AND s.generator = %s
                                AND s.model = %s AND s.prompt_version = %s)""",
        (source_key, gen, model, pv, _version(signposter), gen, model, pv)).fetchall()
    tin = tout = 0
    if gen != "extractive":
        for kind, n in rows:
            i, o = estimate_tokens_for_length(n or 0, kind, max_input_tokens=max_input_tokens)
            tin += i
            tout += o
    cost_fn = getattr(signposter, "cost_usd", None)
    return {"documents": len(rows), "input_tokens": tin, "output_tokens": tout,
            "estimated_cost_usd": float(cost_fn(tin, tout)) if callable(cost_fn) else 0.0}
