"""VoyageEmbedder through the real voyageai SDK against the local mock server (never the internet)."""
from __future__ import annotations

import socket
import time
from email.utils import formatdate

import numpy as np
import pytest

from kb_assets.config import VoyageSettings
from kb_assets.embedding import EmbeddingAuthError, EmbeddingError, VoyageEmbedder, estimate_tokens
from kb_assets.embedding.voyage import parse_retry_after

try:
    from kb_assets_tests.mock_voyage import MockVoyage
except ImportError:  # kb_assets_tests is not a package: pytest puts this folder on sys.path
    from mock_voyage import MockVoyage

KEY = "test-voyage-key-DO-NOT-LEAK-1234"


class Sleeps:
    """Injected sleep: records the waits instead of sleeping."""

    def __init__(self):
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
def mock():
    with MockVoyage(api_key=KEY) as m:
        yield m


def make(mock, sleep=None, **settings) -> VoyageEmbedder:
    s = VoyageSettings(base_url=mock.base_url, **settings)
    return VoyageEmbedder(s, api_key=KEY, sleep=sleep or Sleeps())


def texts(n: int, prefix: str = "text") -> list[str]:
    return [f"{prefix} number {i}: a short sentence about vectors." for i in range(n)]


def test_2500_texts_go_in_three_requests_of_at_most_1000(mock):
    emb = make(mock)
    inputs = texts(2500)
    res = emb.embed_documents(inputs)
    sizes = [len(b["input"]) for b in mock.bodies]
    assert sizes == [1000, 1000, 500]
    assert res.vectors.shape == (2500, 1024) and res.vectors.dtype == np.float32
    # order preserved across batches: each vector is the mock's vector for that very text
    for i in (0, 999, 1000, 1999, 2000, 2499):
        np.testing.assert_allclose(res.vectors[i], MockVoyage.vector_for(inputs[i], 1024), rtol=1e-6)
    assert res.tokens == sum(mock.token_count(t) for t in inputs)    # usage.total_tokens, summed
    assert mock.inputs() == inputs


def test_token_cap_forces_more_splits(mock):
    emb = make(mock, max_tokens_per_request=1000)
    inputs = [("word " * 60 + f"#{i}") for i in range(40)]      # ~75 estimated tokens each
    est = emb.count_tokens(inputs)
    assert all(50 < e < 200 for e in est)
    res = emb.embed_documents(inputs)
    bodies = mock.bodies
    assert len(bodies) >= -(-sum(est) // 1000) and len(bodies) > 1
    for b in bodies:                                         # every request within the estimated cap
        assert sum(estimate_tokens(t) for t in b["input"]) <= 1000
        assert len(b["input"]) > 1                           # packed, never one text at a time
    assert mock.inputs() == inputs and res.vectors.shape == (40, 1024)


def test_batch_rejected_by_server_for_tokens_is_halved_not_lost():
    # The server counts more tokens than our estimate allowed for: 400 "max allowed tokens per batch".
    with MockVoyage(api_key=KEY, max_tokens_per_request=2000, token_count=lambda t: len(t)) as mock:
        emb = make(mock)
        inputs = [f"{i:03d} " + "x" * 96 for i in range(50)]   # 100 "tokens" each for the mock: 5,000 total
        res = emb.embed_documents(inputs)
        rejected = [r for r in mock.requests if r.status == 400]
        assert rejected and all("max allowed tokens per submitted batch" in r.response["detail"] for r in rejected)
        assert all(sum(len(t) for t in r.body["input"]) <= 2000 for r in mock.embedding_requests())
        assert mock.inputs() == inputs                       # every text embedded once, in order
        assert emb.split_batches == len(rejected)
        for i in (0, 24, 25, 49):
            np.testing.assert_allclose(res.vectors[i], MockVoyage.vector_for(inputs[i], 1024), rtol=1e-6)


def test_429_then_success_with_backoff_when_no_retry_after(mock):
    sleeps = Sleeps()
    emb = make(mock, sleep=sleeps)
    mock.script((429,))
    res = emb.embed_documents(texts(3))
    assert len(mock.requests) == 2 and [r.status for r in mock.requests] == [429, 200]
    assert res.vectors.shape == (3, 1024)
    assert len(sleeps.calls) == 1 and 0.0 <= sleeps.calls[0] <= emb.backoff_base
    assert emb.retries[0].reason == "HTTP 429" and emb.retries[0].retry_after is None


def test_retry_after_seconds_and_http_date_are_honoured(mock):
    sleeps = Sleeps()
    emb = make(mock, sleep=sleeps)
    future = formatdate(time.time() + 7, usegmt=True)
    mock.script((429, {"Retry-After": "3"}), (503, {"Retry-After": future}))
    emb.embed_documents(texts(2))
    assert len(mock.requests) == 3
    assert sleeps.calls[0] == 3.0
    assert 5.0 <= sleeps.calls[1] <= 7.5          # HTTP date, second resolution


def test_retry_after_really_waits(mock):
    emb = make(mock, sleep=time.sleep)
    mock.script((429, {"Retry-After": "1"}))
    t0 = time.monotonic()
    emb.embed_documents(texts(2))
    elapsed = time.monotonic() - t0
    assert elapsed >= 1.0
    first, second = mock.requests
    assert (first.status, second.status) == (429, 200)
    assert second.time - first.time >= 1.0


def test_5xx_retried_then_gives_up_after_max_attempts(mock):
    sleeps = Sleeps()
    emb = make(mock, sleep=sleeps, max_attempts=3)
    mock.script((500,), (502,))
    emb.embed_documents(texts(2))
    assert [r.status for r in mock.requests] == [500, 502, 200]
    assert len(sleeps.calls) == 2
    assert 0 <= sleeps.calls[0] <= 1.0 and 0 <= sleeps.calls[1] <= 2.0    # full jitter, exponential cap

    mock.script((500,), (500,), (500,))
    with pytest.raises(EmbeddingError, match=r"after 3 attempts \(last: HTTP 500\)"):
        emb.embed_documents(texts(2))
    assert len(mock.requests) == 6


def test_401_fails_fast_with_a_clear_message():
    with MockVoyage(api_key="the-right-key") as mock:
        sleeps = Sleeps()
        emb = VoyageEmbedder(VoyageSettings(base_url=mock.base_url), api_key=KEY, sleep=sleeps)
        with pytest.raises(EmbeddingAuthError) as info:
            emb.embed_documents(texts(5))
        assert str(info.value) == "Voyage rejected the API key (401): check VOYAGE_API_KEY"
        assert KEY not in str(info.value) and KEY not in repr(emb)
        assert len(mock.requests) == 1 and sleeps.calls == []
        # the key travelled only in the Authorization header, never in a body
        assert mock.requests[0].headers.get("Authorization") == f"Bearer {KEY}"
        assert KEY not in str(mock.requests[0].body)


def test_missing_key_is_an_auth_error_before_any_request(mock, monkeypatch):
    monkeypatch.delenv("VOYAGE_API_KEY", raising=False)
    monkeypatch.delenv("VOYAGE_API_KEY_PATH", raising=False)
    emb = VoyageEmbedder(VoyageSettings(base_url=mock.base_url))
    with pytest.raises(EmbeddingAuthError, match="VOYAGE_API_KEY is not set"):
        emb.embed_query("hello")
    assert mock.requests == []


def test_key_from_environment(mock, monkeypatch):
    monkeypatch.setenv("VOYAGE_API_KEY", KEY)
    emb = VoyageEmbedder(VoyageSettings(base_url=mock.base_url), sleep=Sleeps())
    assert len(emb.embed_query("hello")) == 1024


def test_input_type_document_vs_query(mock):
    emb = make(mock)
    emb.embed_documents(["alpha doc", "beta doc"])
    q = emb.embed_query("what is alpha?")
    d, qb = mock.bodies
    assert d["input_type"] == "document" and d["input"] == ["alpha doc", "beta doc"]
    assert qb["input_type"] == "query" and qb["input"] == ["what is alpha?"]
    assert d["model"] == "voyage-3.5" and d["truncation"] is True
    np.testing.assert_allclose(q, MockVoyage.vector_for("what is alpha?", 1024), rtol=1e-6)


def test_dimension_passed_through(mock):
    emb = make(mock, dimension=256)
    res = emb.embed_documents(["one", "two"])
    assert mock.bodies[0]["output_dimension"] == 256
    assert res.vectors.shape == (2, 256) and emb.dimension == 256
    assert len(emb.embed_query("q")) == 256


def test_fixed_dimension_model_sends_no_output_dimension(mock):
    emb = make(mock, model="voyage-3-lite", dimension=512)
    res = emb.embed_documents(["one"])
    assert mock.bodies[0]["output_dimension"] is None
    assert res.vectors.shape == (1, 512)
    with pytest.raises(EmbeddingError, match="set voyage.dimension: 512"):
        make(mock, model="voyage-3-lite", dimension=1024)
    with pytest.raises(EmbeddingError, match="256, 512, 1024, 2048"):
        make(mock, model="voyage-3.5", dimension=384)


def test_timeout_is_retried(mock):
    sleeps = Sleeps()
    emb = make(mock, sleep=sleeps, timeout_seconds=0.3)
    mock.script(("sleep", 1.5))
    res = emb.embed_documents(texts(2))
    assert res.vectors.shape == (2, 1024)
    assert len(mock.requests) == 2 and emb.retries[0].reason == "timeout"


def test_connection_error_is_retried_then_reported():
    with socket.socket() as s:                     # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    emb = VoyageEmbedder(VoyageSettings(base_url=f"http://127.0.0.1:{port}/v1", max_attempts=2),
                         api_key=KEY, sleep=sleeps)
    with pytest.raises(EmbeddingError, match=r"after 2 attempts \(last: connection error\)"):
        emb.embed_documents(["x"])
    assert len(sleeps.calls) == 1


def test_other_4xx_is_not_retried(mock):
    emb = make(mock)
    mock.script((422, {}, {"detail": "Input is malformed."}))
    with pytest.raises(EmbeddingError, match=r"HTTP 422: Input is malformed.*not retried"):
        emb.embed_documents(["x", "y"])
    assert len(mock.requests) == 1


def test_unexpected_response_is_a_clear_error(mock):
    emb = make(mock)
    mock.script((520, {}, {"detail": "origin error"}))       # the SDK reads unlisted 5xx JSON as success
    with pytest.raises(EmbeddingError, match="unexpected response"):
        emb.embed_documents(["x"])
    mock.script((200, {}, {"object": "list", "data": [], "model": "voyage-3.5", "usage": {"total_tokens": 1}}))
    with pytest.raises(EmbeddingError, match=r"shape \(0,\), expected \(1, 1024\)"):
        emb.embed_documents(["x"])


def test_empty_texts_rejected_before_sending(mock):
    emb = make(mock)
    with pytest.raises(EmbeddingError, match="input #1"):
        emb.embed_documents(["ok", "  ", "fine"])
    assert mock.requests == []
    assert emb.embed_documents([]).vectors.shape == (0, 1024)


def test_construction_is_lazy(mock):
    emb = make(mock)
    assert emb._client is None and mock.requests == []
    emb.count_tokens(["a b c"])
    assert emb._client is None and mock.requests == []


def test_parse_retry_after():
    now = 1_700_000_000.0
    assert parse_retry_after("2", now) == 2.0
    assert parse_retry_after("0.5", now) == 0.5
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now) == pytest.approx(30, abs=1)
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now) == 0.0
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None
    assert parse_retry_after("-4", now) == 0.0
