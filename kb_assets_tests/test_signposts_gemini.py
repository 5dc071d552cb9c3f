"""GeminiSignposter: the real google-genai SDK against a local mock Gemini server (never the internet)."""
from __future__ import annotations

import time

import pytest

from kb_assets.config import GeminiSettings, KbConfig
from kb_assets.signposts import make_signposter
from kb_assets.signposts.base import SignpostAuthError, SignpostError, SignpostInput, SignpostQuotaError
from kb_assets.signposts.extractive import ExtractiveSignposter
from kb_assets.signposts.gemini import (
    GeminiSignposter,
    estimate_signpost_tokens,
    merge_payloads,
    retry_delay_seconds,
    split_segments,
)
from kb_assets.signposts.schema import PROMPT_VERSION
from kb_assets_tests.mock_gemini import MockGemini, Reply

GOOD = {"summary": "Adopts S3 for Terraform state.", "work_types": ["decision", "infrastructure"],
        "key_decisions": [{"decision": "Use S3 as the Terraform backend", "rationale": "It costs 99% less."}],
        "artifacts": ["infra/backend.tf"], "components": ["Terraform", "S3"], "tags": ["terraform"],
        "status": "Accepted"}
DOC = SignpostInput(title="Replace Terraform Cloud", kind="adr", path="docs/adr/0014.md",
                    text="## Context\n\nWe pay too much.\n\n## Decision\n\nUse S3.\n", meta={"status": "Accepted"})


@pytest.fixture
def mock():
    with MockGemini() as m:
        yield m


class Sleeps(list):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def _settings(mock: MockGemini, **kw) -> GeminiSettings:
    base = {"base_url": mock.base_url, "timeout_seconds": 5, "max_attempts": 4}
    base.update(kw)
    return GeminiSettings(**base)


def _signposter(mock: MockGemini, sleeps: Sleeps | None = None, **kw) -> GeminiSignposter:
    return GeminiSignposter(_settings(mock, **kw), "test-key", sleep=sleeps if sleeps is not None else Sleeps())


def test_success_json_mode_request_and_usage(mock):
    mock.push(Reply.ok(GOOD, prompt_tokens=321, output_tokens=45, thoughts_tokens=5))
    sp = _signposter(mock)
    assert sp._client is None                       # lazy: nothing created before the first call
    res = sp.generate(DOC)
    assert res.payload["key_decisions"] == GOOD["key_decisions"]
    assert res.payload["status"] == "Accepted"
    assert (res.input_tokens, res.output_tokens, res.calls) == (321, 50, 1)    # thinking tokens are billed
    assert res.model_used == "gemini-flash-latest" and res.segments == 1
    req = mock.requests[0]
    assert req.model == "gemini-flash-latest"
    assert req.path.endswith("/models/gemini-flash-latest:generateContent")
    assert req.headers.get("x-goog-api-key") == "test-key"
    cfg = req.generation_config
    assert cfg["responseMimeType"] == "application/json"
    assert cfg["temperature"] == pytest.approx(0.1)
    assert cfg["maxOutputTokens"] == 2048
    assert set(cfg["responseSchema"]["properties"]) >= {"summary", "key_decisions", "artifacts", "tags"}
    assert "signposts" in req.system_text and "Never invent" in req.system_text
    assert "Path: docs/adr/0014.md" in req.prompt_text and "<document>" in req.prompt_text
    assert '"status": "Accepted"' in req.prompt_text
    assert "thinkingConfig" not in cfg               # an alias model: leave thinking to the server default
    assert sp.generator == "gemini" and sp.model == "gemini-flash-latest" and sp.prompt_version == PROMPT_VERSION


def test_code_documents_use_the_code_schema(mock):
    mock.push(Reply.ok({"purpose": "Serves users.", "key_functions": [{"name": "get_user", "does": "Reads one."}],
                        "tables": ["users"], "endpoints": ["GET /users/{id}"]}))
    res = _signposter(mock).generate(SignpostInput("users.py", "code", "app/users.py", "def get_user(): ..."))
    assert res.payload["tables"] == ["users"]
    props = mock.requests[0].generation_config["responseSchema"]["properties"]
    assert "purpose" in props and "summary" not in props
    assert "<code>" in mock.requests[0].prompt_text


def test_max_tokens_retries_once_on_the_fallback_with_a_higher_limit(mock):
    mock.push(Reply.max_tokens(GOOD), Reply.ok(GOOD))
    res = _signposter(mock).generate(DOC)
    assert [r.model for r in mock.requests] == ["gemini-flash-latest", "gemini-flash-lite-latest"]
    assert mock.requests[1].generation_config["maxOutputTokens"] == 8192
    assert res.model_used == "gemini-flash-lite-latest" and res.calls == 2
    assert res.payload["summary"] == GOOD["summary"]
    assert res.output_tokens == 2048 + 60              # the truncated answer was paid for too


def test_unparseable_output_retries_on_the_fallback(mock):
    mock.push(Reply.garbage(), Reply.ok(GOOD))
    res = _signposter(mock).generate(DOC)
    assert res.model_used == "gemini-flash-lite-latest"
    assert mock.calls_for("gemini-flash-lite-latest") == 1


def test_wrong_shape_json_counts_as_unparseable(mock):
    mock.push(Reply.ok({"no_summary": True}), Reply.ok({"summary": "ok"}))
    assert _signposter(mock).generate(DOC).payload["summary"] == "ok"
    assert mock.calls == 2


def test_both_models_unusable_is_a_readable_error(mock):
    mock.push(Reply.max_tokens(), Reply.garbage("not json at all"))
    with pytest.raises(SignpostError) as info:
        _signposter(mock).generate(DOC)
    msg = str(info.value)
    assert "MAX_TOKENS" in msg and "gemini-flash-lite-latest" in msg and "unparseable" in msg
    assert info.value.calls == 2 and mock.calls == 2


def test_primary_model_gone_404_uses_the_fallback(mock):
    mock.push(Reply.not_found("gemini-flash-latest"), Reply.ok(GOOD))
    res = _signposter(mock).generate(DOC)
    assert res.model_used == "gemini-flash-lite-latest" and mock.calls == 2


def test_429_honours_the_server_retry_delay(mock):
    sleeps = Sleeps()
    mock.push(Reply.rate_limited("7s"), Reply.ok(GOOD))
    seen = []
    sp = _signposter(mock, sleeps)
    sp.rate_limit_listener = lambda: seen.append(1)
    res = sp.generate(DOC)
    assert len(sleeps) == 1 and 7.0 <= sleeps[0] <= 8.0
    assert res.rate_limited == 1 and res.calls == 2 and seen == [1]


def test_429_real_one_second_wait(mock):
    mock.push(Reply.rate_limited("1s"), Reply.ok(GOOD))
    sp = GeminiSignposter(_settings(mock), "k")            # the real time.sleep
    t0 = time.monotonic()
    sp.generate(DOC)
    assert time.monotonic() - t0 >= 1.0
    assert mock.requests[1].started - mock.requests[0].started >= 1.0


def test_429_without_retry_info_backs_off_and_gives_up(mock):
    sleeps = Sleeps()
    mock.push(*[Reply.rate_limited(None)] * 4)
    with pytest.raises(SignpostError) as info:
        _signposter(mock, sleeps, max_attempts=4).generate(DOC)
    assert "429" in str(info.value) and info.value.rate_limited == 4
    assert mock.calls == 4 and len(sleeps) == 3
    assert sleeps[0] < sleeps[2]                             # exponential (with jitter 0.5x-1.5x)


def test_429_with_a_day_long_delay_stops_instead_of_sleeping(mock):
    sleeps = Sleeps()
    mock.push(Reply.rate_limited("86400s"))
    with pytest.raises(SignpostQuotaError):
        _signposter(mock, sleeps).generate(DOC)
    assert sleeps == []


def test_500_is_retried_with_backoff(mock):
    sleeps = Sleeps()
    mock.push(Reply.server_error(500), Reply.server_error(503), Reply.ok(GOOD))
    res = _signposter(mock, sleeps).generate(DOC)
    assert res.calls == 3 and len(sleeps) == 2 and all(0.4 <= s <= 3.1 for s in sleeps)


def test_500_until_attempts_exhausted(mock):
    mock.push(*[Reply.server_error(500)] * 10)
    with pytest.raises(SignpostError) as info:
        _signposter(mock, max_attempts=3).generate(DOC)
    assert mock.calls == 3
    assert "500" in str(info.value) and "3 attempts" in str(info.value)
    assert not isinstance(info.value, SignpostAuthError)


def test_timeouts_are_retried(mock):
    mock.push(Reply.ok(GOOD, delay=1.5), Reply.ok(GOOD))
    sleeps = Sleeps()
    res = _signposter(mock, sleeps, timeout_seconds=0.4).generate(DOC)
    assert res.calls == 2 and len(sleeps) == 1


@pytest.mark.parametrize("reply", [Reply.unauthenticated(401), Reply.unauthenticated(403), Reply.api_key_invalid()])
def test_bad_key_stops_at_once_with_a_clear_error(mock, reply):
    mock.push(reply)
    sleeps = Sleeps()
    with pytest.raises(SignpostAuthError) as info:
        _signposter(mock, sleeps).generate(DOC)
    assert "Gemini rejected the API key" in str(info.value) and "check GEMINI_API_KEY" in str(info.value)
    assert mock.calls == 1 and sleeps == []


def test_missing_key_fails_before_any_call(mock):
    with pytest.raises(SignpostAuthError, match="GEMINI_API_KEY is not set"):
        GeminiSignposter(_settings(mock), "").generate(DOC)
    assert mock.calls == 0


def test_other_4xx_is_not_retried(mock):
    mock.push(Reply.error(400, "INVALID_ARGUMENT", "Request contains an invalid argument."))
    with pytest.raises(SignpostError, match="invalid argument"):
        _signposter(mock).generate(DOC)
    assert mock.calls == 1


def test_long_documents_are_split_signposted_and_merged(mock):
    paras = [f"Paragraph {i}. " + ("word " * 300) for i in range(3)]
    text = "\n\n".join(paras)                   # ~4.6K chars; budget 2K chars per segment (min)
    replies = []
    for i in range(3):
        replies.append(Reply.ok({"summary": f"Part {i} summary. More detail {i}.",
                                 "key_decisions": [{"decision": "Shared decision", "rationale": "r"},
                                                   {"decision": f"Decision {i}", "rationale": f"r{i}"}],
                                 "artifacts": ["a.py", f"f{i}.py"], "tags": ["t"]}))
    mock.push(*replies)
    res = _signposter(mock, max_input_tokens=1000).generate(
        SignpostInput("Long transcript", "transcript", "s.jsonl", text))
    assert res.segments == 3 and res.calls == 3 and mock.calls == 3
    assert "part 2 of 3" in mock.requests[1].prompt_text
    p = res.payload
    assert p["summary"].startswith("Part 0 summary. More detail 0. Part 1 summary. Part 2 summary.")
    assert [d["decision"] for d in p["key_decisions"]] == ["Shared decision", "Decision 0", "Decision 1",
                                                            "Decision 2"]
    assert p["artifacts"] == ["a.py", "f0.py", "f1.py", "f2.py"] and p["tags"] == ["t"]


def test_split_segments_keeps_boundaries_and_text():
    text = "\n\n".join(f"turn {i}: " + "x" * 700 for i in range(10)) + "\n\n" + "y" * 5000
    segs = split_segments(text, 2000)
    assert "".join(segs) == text
    assert all(len(s) <= 2000 for s in segs)
    assert all(s.startswith(("turn", "y")) for s in segs)
    assert split_segments("short", 2000) == ["short"]


def test_merge_code_payloads_dedupes():
    merged = merge_payloads("code", [
        {"purpose": "P", "key_functions": [{"name": "a", "does": "x"}], "tables": ["t"], "endpoints": ["GET /"]},
        {"purpose": "Q", "key_functions": [{"name": "a", "does": "y"}, {"name": "b"}], "tables": ["t", "u"],
         "endpoints": []}])
    assert merged == {"purpose": "P", "key_functions": [{"name": "a", "does": "x"}, {"name": "b"}],
                      "tables": ["t", "u"], "endpoints": ["GET /"]}


def test_thinking_config_per_model_family(mock):
    mock.push(Reply.ok(GOOD), Reply.ok(GOOD))
    _signposter(mock, model="gemini-2.5-flash-lite").generate(DOC)
    _signposter(mock, model="gemini-3-flash-preview").generate(DOC)
    def norm(d):   # the SDK sends proto field names; the API accepts snake_case and lowerCamel alike
        return {k.replace("_", "").lower(): v for k, v in d.items()}

    assert norm(mock.requests[0].generation_config["thinkingConfig"]) == {"thinkingbudget": 0}
    assert norm(mock.requests[1].generation_config["thinkingConfig"]) == {"thinkinglevel": "LOW"}


def test_defaults_do_not_depend_on_a_retiring_model():
    s = GeminiSettings()
    assert "2.5" not in s.model and "2.5" not in s.fallback_model
    assert s.model != s.fallback_model and s.temperature <= 0.3


def test_retry_delay_parsing():
    class E:
        def __init__(self, details):
            self.details = details
            self.response = None

    assert retry_delay_seconds(E({"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                                          "retryDelay": "7s"}]}})) == 7.0
    assert retry_delay_seconds(E({"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                                          "retryDelay": "0.5s"}]}})) == 0.5
    assert retry_delay_seconds(E({"error": {"details": []}})) is None


def test_make_signposter_is_lazy_and_configured(monkeypatch, mock):
    monkeypatch.setenv("GEMINI_API_KEY", "from-env")
    cfg = KbConfig(signposter="gemini", gemini=_settings(mock))
    sp = make_signposter(cfg)
    assert isinstance(sp, GeminiSignposter) and sp._client is None and mock.calls == 0
    sp.generate(DOC)
    assert mock.requests[0].headers["x-goog-api-key"] == "from-env"
    assert isinstance(make_signposter(KbConfig()), ExtractiveSignposter)


def test_estimates_and_cost():
    tin, tout = estimate_signpost_tokens("x" * 4000, "adr")
    assert tin == 1000 + 700 and tout == 450
    tin2, tout2 = estimate_signpost_tokens("x" * 4000, "code", max_input_tokens=1000)   # 2K-char segments
    assert tout2 == 2 * 350 and tin2 == 1000 + 2 * 700
    sp = GeminiSignposter(GeminiSettings(), "k")
    assert sp.cost_usd(1_000_000, 1_000_000) == pytest.approx(0.30 + 2.50)
