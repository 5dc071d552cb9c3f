"""run_signposts on a real embedded PostgreSQL: incremental, content-addressed, stale-on-failure, parking,
auth stop, adaptive concurrency. Gemini cases drive the real google-genai SDK against the local mock server."""
from __future__ import annotations

import json

import psycopg
import pytest

from kb_assets.config import GeminiSettings
from kb_assets.models import SourceDocument
from kb_assets.signposts.base import SignpostAuthError, SignpostResult
from kb_assets.signposts.extractive import ExtractiveSignposter
from kb_assets.signposts.gemini import GeminiSignposter
from kb_assets.pipeline.signposts import (
    AdaptiveLimit,
    current_signpost,
    current_signposts,
    estimate_signpost_run,
    estimate_signpost_tokens,
    run_signposts,
    signpost_counts,
    signpost_failures,
    unpark,
)
from kb_assets_tests.mock_gemini import MockGemini, Reply

SRC = "decisions"


def _add_source(conn, key: str = SRC) -> None:
    conn.execute("INSERT INTO sources (key, kind, root) VALUES (%s, 'adr', '/tmp/x') ON CONFLICT DO NOTHING", (key,))


def _add_doc(conn, path: str, text: str, *, kind: str = "adr", title: str = "", meta: dict | None = None,
             source: str = SRC) -> int:
    _add_source(conn, source)
    h = SourceDocument(path=path, kind=kind, title=title, text=text).content_hash
    return conn.execute(
        """INSERT INTO documents (source_key, path, kind, title, status, content_hash, meta, text)
           VALUES (%s, %s, %s, %s, 'active', %s, %s::jsonb, %s) RETURNING id""",
        (source, path, kind, title or path, h, json.dumps(meta or {}), text)).fetchone()[0]


def _change_doc(conn, doc_id: int, text: str, kind: str = "adr") -> None:
    h = SourceDocument(path="", kind=kind, title="", text=text).content_hash
    conn.execute("UPDATE documents SET text = %s, content_hash = %s, updated_at = now() WHERE id = %s",
                 (text, h, doc_id))


def _adr(n: int) -> str:
    return (f"# {n}. Use tool {n}\n\n## Status\n\nAccepted\n\n## Context\n\nWe need a way to handle case {n} "
            f"reliably across services.\n\n## Decision\n\nWe will use tool {n} because it is simple.\n")


@pytest.fixture
def mock():
    with MockGemini() as m:
        yield m


def _gemini(mock, *, sleep=lambda s: None, **kw) -> GeminiSignposter:
    settings = {"base_url": mock.base_url, "timeout_seconds": 5, "max_attempts": 3}
    settings.update(kw)
    return GeminiSignposter(GeminiSettings(**settings), "test-key", sleep=sleep)


# ------------------------------------------------------------------------------------------------- extractive

def test_extractive_run_then_nothing_to_do(conn):
    ids = [_add_doc(conn, f"docs/{i:04d}.md", _adr(i)) for i in range(5)]
    _add_doc(conn, "skipped.bin", "", kind="doc")
    conn.execute("UPDATE documents SET status = 'skipped', skip_reason = 'binary' WHERE path = 'skipped.bin'")
    first = run_signposts(conn, SRC, ExtractiveSignposter())
    assert (first.considered, first.generated, first.reused, first.failed, first.llm_calls) == (5, 5, 0, 0, 0)
    assert first.estimated_cost_usd == 0
    sp = current_signpost(conn, ids[2])
    assert sp["generator"] == "extractive" and sp["extractive"] and sp["model"] == "" and not sp["stale"]
    assert sp["payload"]["key_decisions"][0]["decision"] == "We will use tool 2."
    assert sp["payload"]["key_decisions"][0]["rationale"] == "It is simple."
    assert sp["payload"]["status"] == "Accepted"
    second = run_signposts(conn, SRC, ExtractiveSignposter())
    assert (second.up_to_date, second.generated, second.reused) == (5, 0, 0)
    meta = second.as_metadata()
    assert meta["generator"] == "extractive" and json.dumps(meta)
    assert signpost_counts(conn, SRC, ExtractiveSignposter()) == {
        "documents": 5, "signposted": 5, "current": 5, "stale": 0, "failing": 0, "parked": 0, "missing": 0}


def test_extractive_reads_and_writes_in_batches_and_a_refused_result_fails_alone(conn, monkeypatch):
    """Free results are read back and written many per query/transaction (issue 14); a value the database
    refuses in a batch (here an int column overflow) fails only its own document, the rest of the batch is kept."""
    from kb_assets.pipeline import signposts as runner

    n = runner.WRITE_BATCH * 2 + 5
    ids = [_add_doc(conn, f"docs/{i:04d}.md", _adr(i)) for i in range(n)]
    reads, batches = [], []
    real_inputs, real_writes = runner._load_inputs, runner._write_successes
    monkeypatch.setattr(runner, "_load_input", lambda *a: pytest.fail("one document read back alone"))
    monkeypatch.setattr(runner, "_load_inputs", lambda c, d: (reads.append(len(d)), real_inputs(c, d))[1])
    monkeypatch.setattr(runner, "_write_successes", lambda c, s, items: (batches.append(len(items)),
                                                                          real_writes(c, s, items))[1])

    class Overflow(ExtractiveSignposter):
        def generate(self, doc):
            result = super().generate(doc)
            if doc.path == "docs/0070.md":
                result.input_tokens = 2 ** 40          # no int column holds it: PostgreSQL refuses the row
            return result

    stats = run_signposts(conn, SRC, Overflow())
    assert (stats.generated, stats.failed) == (n - 1, 1)
    assert len(stats.errors) == 1 and stats.errors[0].startswith("docs/0070.md: ")
    assert sum(reads) == n and max(reads) == runner.READ_BATCH and len(reads) == -(-n // runner.READ_BATCH)
    assert batches == [runner.WRITE_BATCH, runner.WRITE_BATCH, 5]
    assert current_signpost(conn, ids[70]) is None
    assert all(current_signpost(conn, i) is not None for i in ids if i != ids[70])
    assert signpost_failures(conn, SRC)[0]["path"] == "docs/0070.md"
    again = run_signposts(conn, SRC, ExtractiveSignposter())     # retried, not parked, on the next run
    assert (again.generated, again.up_to_date) == (1, n - 1)


def test_no_transaction_is_open_while_generating(conn):
    _add_doc(conn, "a.md", _adr(1))
    seen = []

    class Probe(ExtractiveSignposter):
        def generate(self, doc):
            seen.append(conn.info.transaction_status)
            return super().generate(doc)

    run_signposts(conn, SRC, Probe())
    assert seen == [psycopg.pq.TransactionStatus.IDLE]


def test_extractive_writes_skip_the_wal_flush_and_paid_ones_do_not(conn, mock):
    """Extractive signposts (free to regenerate) commit asynchronously; the connection is durable again after the
    stage; a paid generator's writes are never asynchronous."""
    _add_doc(conn, "a.md", _adr(1))
    seen = []

    class Probe(ExtractiveSignposter):
        def generate(self, doc):
            seen.append(conn.execute("SHOW synchronous_commit").fetchone()[0])
            return super().generate(doc)

    assert run_signposts(conn, SRC, Probe()).generated == 1
    assert seen == ["off"] and conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"
    _add_doc(conn, "b.md", _adr(2))
    gem = _gemini(mock)
    real = gem.generate
    paid = []
    gem.generate = lambda doc: (paid.append(conn.execute("SHOW synchronous_commit").fetchone()[0]), real(doc))[1]
    run_signposts(conn, SRC, gem)
    assert paid and set(paid) == {"on"}


# ------------------------------------------------------------------------------------------------- gemini

def test_gemini_idempotent_second_run_makes_no_call(conn, mock):
    ids = [_add_doc(conn, f"adr/{i}.md", _adr(i)) for i in range(4)]
    sp = _gemini(mock)
    first = run_signposts(conn, SRC, sp, concurrency=2)
    assert first.generated == 4 and first.llm_calls == 4 == mock.calls
    assert first.input_tokens == 4 * 120 and first.output_tokens == 4 * 60
    assert first.estimated_cost_usd == pytest.approx((480 * 0.30 + 240 * 2.50) / 1e6)
    got = current_signpost(conn, ids[0])
    assert got["generator"] == "gemini" and got["model"] == "gemini-flash-latest"
    assert got["model_used"] == "gemini-flash-latest" and got["payload"]["summary"]
    row = conn.execute("SELECT input_tokens, output_tokens, schema_version, kind FROM signposts LIMIT 1").fetchone()
    assert row == (120, 60, 1, "adr")

    mock.reset_counts()
    second = run_signposts(conn, SRC, _gemini(mock), concurrency=2)
    assert mock.calls == 0 and second.llm_calls == 0
    assert (second.up_to_date, second.generated, second.reused) == (4, 0, 0)


def test_rename_and_identical_documents_reuse_without_calls(conn, mock):
    a = _add_doc(conn, "adr/old-name.md", _adr(1))
    run_signposts(conn, SRC, _gemini(mock))
    assert mock.calls == 1
    # rename: the old row goes, a new path with the same content arrives
    conn.execute("DELETE FROM documents WHERE id = %s", (a,))
    b = _add_doc(conn, "adr/new-name.md", _adr(1))
    # and a copy in another source
    c = _add_doc(conn, "copy.md", _adr(1), source="other")
    mock.reset_counts()
    st = run_signposts(conn, SRC, _gemini(mock))
    st2 = run_signposts(conn, "other", _gemini(mock))
    assert mock.calls == 0 and st.reused == 1 and st2.reused == 1 and st.generated == 0
    assert current_signpost(conn, b)["payload"] == current_signpost(conn, c)["payload"]
    # identical new documents in one run share one call
    _add_doc(conn, "x1.md", _adr(9))
    _add_doc(conn, "x2.md", _adr(9))
    st3 = run_signposts(conn, SRC, _gemini(mock), concurrency=3)
    assert mock.calls == 1 and st3.generated == 2


def test_prompt_version_or_model_change_regenerates(conn, mock):
    ids = [_add_doc(conn, f"adr/{i}.md", _adr(i)) for i in range(3)]
    run_signposts(conn, SRC, _gemini(mock))
    mock.reset_counts()
    sp = _gemini(mock)
    sp.prompt_version = "sp-test-2"
    st = run_signposts(conn, SRC, sp)
    assert st.generated == 3 and mock.calls == 3
    assert current_signpost(conn, ids[0])["prompt_version"] == "sp-test-2"
    mock.reset_counts()
    st = run_signposts(conn, SRC, _gemini(mock, model="gemini-3-flash-preview"))
    assert st.generated == 3 and {r.model for r in mock.requests} == {"gemini-3-flash-preview"}
    # back to the first version: its signposts still exist, so no call at all
    mock.reset_counts()
    st = run_signposts(conn, SRC, _gemini(mock))
    assert st.reused == 3 and mock.calls == 0


def test_stale_on_failure_then_parked_then_retried_when_content_changes(conn, mock):
    doc = _add_doc(conn, "adr/1.md", _adr(1))
    other = _add_doc(conn, "adr/2.md", _adr(2))
    mock.push(Reply.ok({"summary": "Good old summary.", "key_decisions": [{"decision": "Old", "rationale": "r"}]}))
    run_signposts(conn, SRC, _gemini(mock))                 # concurrency 1: path order, adr/1.md first
    old = current_signpost(conn, doc)
    assert old["payload"]["summary"] == "Good old summary." and not old["stale"]

    _change_doc(conn, doc, _adr(1) + "\nA new paragraph.\n")
    assert current_signpost(conn, doc)["stale"]              # changed but not yet regenerated
    mock.default = lambda req: Reply.server_error(500)
    for attempt in (1, 2, 3):
        mock.reset_counts()
        st = run_signposts(conn, SRC, _gemini(mock, max_attempts=2), max_failures=3)
        assert st.failed == 1 and st.generated == 0 and mock.calls == 2 and st.llm_calls == 2
        assert st.up_to_date == 1                            # the other document is untouched
        now = current_signpost(conn, doc)
        assert now["payload"]["summary"] == "Good old summary."       # the previous good signpost is kept
        assert now["stale"] and now["failures"] == attempt
        assert "500" in now["last_error"] and "gave up after 2 attempts" in now["last_error"]
    assert st.parked == 1 and st.stale == 1
    assert "adr/1.md: Gemini server error 500" in st.errors[0]
    fails = signpost_failures(conn, SRC)
    assert len(fails) == 1 and fails[0]["path"] == "adr/1.md" and fails[0]["parked"]
    assert fails[0]["failures"] == 3 and fails[0]["attempts"] == 2 and fails[0]["has_signpost"]
    assert fails[0]["version"] == "gemini/gemini-flash-latest/" + _gemini(mock).prompt_version

    mock.reset_counts()
    st = run_signposts(conn, SRC, _gemini(mock, max_attempts=2), max_failures=3)
    assert mock.calls == 0 and st.skipped_parked == 1 and st.parked == 1      # parked: not retried
    assert current_signpost(conn, other)["failures"] == 0

    _change_doc(conn, doc, _adr(1) + "\nYet another version.\n")            # content changes: retried
    mock.default = lambda req: Reply.ok({"summary": "Fresh summary."})
    st = run_signposts(conn, SRC, _gemini(mock, max_attempts=2), max_failures=3)
    assert st.generated == 1 and st.parked == 0 and st.stale == 0
    fresh = current_signpost(conn, doc)
    assert fresh["payload"]["summary"] == "Fresh summary." and not fresh["stale"] and fresh["failures"] == 0
    assert signpost_failures(conn, SRC) == []


def test_failure_without_previous_signpost_and_unpark(conn, mock):
    doc = _add_doc(conn, "adr/1.md", _adr(1))
    mock.default = lambda req: Reply.garbage()
    st = run_signposts(conn, SRC, _gemini(mock), max_failures=1)
    assert st.failed == 1 and st.parked == 1 and st.stale == 0 and mock.calls == 2     # primary + fallback
    assert current_signpost(conn, doc) is None
    f = signpost_failures(conn, SRC)[0]
    assert f["parked"] and not f["has_signpost"] and "unparseable" in f["last_error"]
    assert signpost_counts(conn, SRC)["missing"] == 1
    assert unpark(conn, SRC) == 1
    mock.default = lambda req: Reply.ok({"summary": "Now it works."})
    assert run_signposts(conn, SRC, _gemini(mock)).generated == 1


def test_401_stops_the_run_with_a_clear_error_and_marks_nothing(conn, mock):
    for i in range(5):
        _add_doc(conn, f"adr/{i}.md", _adr(i))
    mock.default = lambda req: Reply.unauthenticated(401)
    with pytest.raises(SignpostAuthError) as info:
        run_signposts(conn, SRC, _gemini(mock), concurrency=1)
    assert "Gemini rejected the API key (401" in str(info.value) and "GEMINI_API_KEY" in str(info.value)
    assert mock.calls == 1                                   # no retries, no further documents
    assert info.value.stats.stopped and info.value.stats.failed == 0
    assert conn.execute("SELECT count(*) FROM signpost_state").fetchone()[0] == 0


def test_a_broken_signposter_is_recorded_per_document(conn):
    _add_doc(conn, "a.md", _adr(1))
    _add_doc(conn, "b.md", _adr(2))

    class Flaky(ExtractiveSignposter):
        def generate(self, doc):
            if doc.path == "a.md":
                raise ValueError("boom")
            return super().generate(doc)

    st = run_signposts(conn, SRC, Flaky())
    assert st.failed == 1 and st.generated == 1
    assert signpost_failures(conn, SRC)[0]["last_error"] == "ValueError: boom"


def test_invalid_payload_from_a_signposter_is_a_failure(conn):
    _add_doc(conn, "c.md", _adr(3))

    class Bad(ExtractiveSignposter):
        def generate(self, doc):
            return SignpostResult(payload={"key_decisions": "nope"})

    st = run_signposts(conn, SRC, Bad())
    assert st.failed == 1 and "validation error" in signpost_failures(conn, SRC)[0]["last_error"]


def test_pool_shrinks_on_429_and_grows_back(conn, mock):
    for i in range(16):
        _add_doc(conn, f"adr/{i:02d}.md", _adr(i))
    mock.push(*[Reply.rate_limited("0s")] * 4)
    mock.default = lambda req: Reply.ok({"summary": "ok"}, delay=0.1)
    widths = []
    st = run_signposts(conn, SRC, _gemini(mock, max_attempts=5), concurrency=4,
                       on_progress=lambda done, total: widths.append((done, total)))
    assert st.generated == 16 and st.failed == 0
    assert st.rate_limited == 4 and st.llm_calls == 20
    assert st.min_concurrency <= 2                          # halved (possibly repeatedly) on 429s
    assert widths[-1] == (16, 16)
    assert mock.max_in_flight <= 4
    # after the 429 burst the in-flight count stays at the shrunken width for a while, then grows back
    late = [n for t, n in mock.in_flight_log[-6:]]
    assert max(late) >= 2


def test_adaptive_limit_aimd():
    lim = AdaptiveLimit(8)
    lim.on_rate_limit()
    lim.on_rate_limit()
    assert lim.width == 2 and lim.min_width == 2
    for _ in range(2):
        lim.on_success()
    assert lim.width == 3
    for _ in range(3 + 4 + 5 + 6 + 7 + 8):
        lim.on_success()
    assert lim.width == 8
    for _ in range(10):
        lim.on_rate_limit()
    assert lim.width == 1


def test_estimates_for_plan(conn):
    _add_doc(conn, "a.md", "x" * 4000)
    _add_doc(conn, "b.md", "x" * 4000)                          # same content: one generation
    _add_doc(conn, "c.py", "y" * 400, kind="code")
    gem = GeminiSignposter(GeminiSettings(), "k")
    est = estimate_signpost_run(conn, SRC, gem)
    assert est["documents"] == 2
    assert est["input_tokens"] == estimate_signpost_tokens("x" * 4000, "adr")[0] + \
        estimate_signpost_tokens("y" * 400, "code")[0]
    assert est["output_tokens"] == 450 + 350 and est["estimated_cost_usd"] > 0
    assert estimate_signpost_run(conn, SRC, ExtractiveSignposter())["input_tokens"] == 0
    run_signposts(conn, SRC, ExtractiveSignposter())
    assert estimate_signpost_run(conn, SRC, ExtractiveSignposter())["documents"] == 0


def test_current_signposts_batch(conn):
    ids = [_add_doc(conn, f"{i}.md", _adr(i)) for i in range(3)]
    run_signposts(conn, SRC, ExtractiveSignposter())
    got = current_signposts(conn, ids + [999999])
    assert set(got) == set(ids) and all(not v["stale"] for v in got.values())
    assert current_signposts(conn, []) == {}


def test_content_reverted_after_a_failure_clears_the_stale_flag(conn, mock):
    doc = _add_doc(conn, "adr/1.md", _adr(1))
    run_signposts(conn, SRC, _gemini(mock))
    _change_doc(conn, doc, _adr(1) + "\nedit\n")
    mock.default = lambda req: Reply.server_error(503)
    run_signposts(conn, SRC, _gemini(mock, max_attempts=1))
    assert current_signpost(conn, doc)["stale"] and signpost_failures(conn, SRC)
    _change_doc(conn, doc, _adr(1))                            # the edit is reverted
    mock.reset_counts()
    st = run_signposts(conn, SRC, _gemini(mock))
    assert mock.calls == 0 and st.up_to_date == 1 and st.stale == 0
    assert not current_signpost(conn, doc)["stale"] and signpost_failures(conn, SRC) == []


def test_a_model_answer_with_nul_or_lone_surrogate_is_stored_clean(conn, mock):
    """An answer PostgreSQL's jsonb would refuse (a "\u0000" escape) neither fails the run nor the document:
    it is stored with the NUL dropped (issue 12 §1). (The SDK itself refuses lone surrogates: a retry.)"""
    ids = [_add_doc(conn, f"adr/{i}.md", _adr(i)) for i in range(3)]
    mock.push(Reply.ok({"summary": "Uses tool\u0000 one for case one.", "work_types": ["decision"],
                        "key_decisions": []}))
    st = run_signposts(conn, SRC, _gemini(mock))
    assert st.generated == 3 and st.failed == 0, st.errors
    summaries = {current_signpost(conn, i)["payload"]["summary"] for i in ids}
    assert "Uses tool one for case one." in summaries
