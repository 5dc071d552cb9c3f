"""A local stand-in for the Gemini API (generativelanguage v1beta), for tests that drive the real google-genai SDK.

    with MockGemini() as mock:
        mock.push(Reply.max_tokens(), Reply.ok({...}))       # scripted, in order, for the next calls
        client = genai.Client(api_key="k", http_options=HttpOptions(base_url=mock.base_url))
        ...
        mock.calls, mock.requests[0].model, mock.requests[0].generation_config

It answers POST /{v1|v1beta}/models/{model}:generateContent (the path the SDK builds from base_url + api_version +
"models/{model}:generateContent"; google-genai 3.x defaults to v1), in the JSON shape the SDK parses: candidates[0].content.parts[0].text,
candidates[0].finishReason, usageMetadata {promptTokenCount, candidatesTokenCount, totalTokenCount}.
When the script is empty the `default` responder answers (by default: a valid signpost for the schema asked for).
Stdlib only: ThreadingHTTPServer on 127.0.0.1, port 0.
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

PATH_RE = re.compile(r"^/(?P<version>v1[a-z0-9]*)/models/(?P<model>[^/:]+):generateContent$")


@dataclass
class Reply:
    """One scripted answer. status 200 with `body`, or an error status with a google.rpc-style error body."""

    status: int = 200
    body: Any = None
    delay: float = 0.0            # seconds to wait before answering (simulates a slow server / timeout)
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None      # send these bytes instead of JSON

    # -- successes ---------------------------------------------------------------------------------------
    @classmethod
    def text(cls, text: str, *, finish_reason: str = "STOP", prompt_tokens: int = 120, output_tokens: int = 60,
             thoughts_tokens: int = 0, model: str = "", delay: float = 0.0) -> "Reply":
        usage = {"promptTokenCount": prompt_tokens, "candidatesTokenCount": output_tokens,
                 "totalTokenCount": prompt_tokens + output_tokens + thoughts_tokens}
        if thoughts_tokens:
            usage["thoughtsTokenCount"] = thoughts_tokens
        body = {
            "candidates": [{
                "content": {"parts": [{"text": text}], "role": "model"},
                "finishReason": finish_reason,
                "index": 0,
            }],
            "usageMetadata": usage,
        }
        if model:
            body["modelVersion"] = model
        return cls(200, body, delay=delay)

    @classmethod
    def ok(cls, payload: dict, **kw) -> "Reply":
        return cls.text(json.dumps(payload), **kw)

    @classmethod
    def max_tokens(cls, payload: dict | None = None, **kw) -> "Reply":
        """Output cut off by the output-token limit: finishReason MAX_TOKENS and truncated JSON."""
        full = json.dumps(payload or {"summary": "A long summary that was cut " * 20, "key_decisions": []})
        kw.setdefault("output_tokens", 2048)
        return cls.text(full[: max(10, len(full) // 2)], finish_reason="MAX_TOKENS", **kw)

    @classmethod
    def garbage(cls, text: str = "Sure! Here is the summary you asked for: it is about things.", **kw) -> "Reply":
        return cls.text(text, **kw)

    # -- errors ------------------------------------------------------------------------------------------
    @classmethod
    def error(cls, code: int, status: str, message: str, details: list | None = None, **kw) -> "Reply":
        err: dict[str, Any] = {"code": code, "message": message, "status": status}
        if details is not None:
            err["details"] = details
        return cls(code, {"error": err}, **kw)

    @classmethod
    def rate_limited(cls, retry_delay: str | None = "1s", **kw) -> "Reply":
        details = [{"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_requests",
                                    "quotaId": "GenerateRequestsPerMinutePerProjectPerModel"}]}]
        if retry_delay is not None:
            details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay})
        return cls.error(429, "RESOURCE_EXHAUSTED",
                         "You exceeded your current quota, please check your plan and billing details.",
                         details, **kw)

    @classmethod
    def server_error(cls, code: int = 500, **kw) -> "Reply":
        status = {500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}.get(code, "INTERNAL")
        return cls.error(code, status, "An internal error has occurred. Please retry or report it.", **kw)

    @classmethod
    def unauthenticated(cls, code: int = 401, **kw) -> "Reply":
        if code == 403:
            return cls.error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers.", **kw)
        return cls.error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.", **kw)

    @classmethod
    def api_key_invalid(cls, **kw) -> "Reply":
        """What the real API answers to a wrong key: 400 with an ErrorInfo reason API_KEY_INVALID."""
        return cls.error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.",
                         [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                           "domain": "googleapis.com"}], **kw)

    @classmethod
    def not_found(cls, model: str = "gemini-x", **kw) -> "Reply":
        return cls.error(404, "NOT_FOUND", f"models/{model} is not found for API version v1beta, or is not "
                                           "supported for generateContent.", **kw)


@dataclass
class RecordedRequest:
    model: str
    path: str
    body: dict
    headers: dict[str, str]
    started: float
    status: int = 0

    @property
    def generation_config(self) -> dict:
        return self.body.get("generationConfig", {}) or {}

    @property
    def prompt_text(self) -> str:
        out = []
        for content in self.body.get("contents", []) or []:
            for part in content.get("parts", []) or []:
                if "text" in part:
                    out.append(part["text"])
        return "\n".join(out)

    @property
    def system_text(self) -> str:
        si = self.body.get("systemInstruction") or {}
        return "\n".join(p.get("text", "") for p in si.get("parts", []) or [])


def default_signpost(req: RecordedRequest) -> Reply:
    """A valid answer for whichever schema was asked for (document or code signpost)."""
    schema = req.generation_config.get("responseSchema") or req.generation_config.get("responseJsonSchema") or {}
    props = schema.get("properties", {}) or {}
    if "purpose" in props:
        payload: dict[str, Any] = {"purpose": "Mock purpose of the module.",
                                   "key_functions": [{"name": "main", "does": "Runs it."}],
                                   "tables": [], "endpoints": []}
    else:
        payload = {"summary": "Mock summary of the document.", "work_types": ["decision"],
                   "key_decisions": [{"decision": "Use the mock", "rationale": "because tests run offline"}],
                   "artifacts": ["src/app.py"], "components": ["Mock"], "tags": ["test"], "status": "Accepted"}
    return Reply.ok(payload, model=req.model)


class MockGemini:
    def __init__(self, default: Callable[[RecordedRequest], Reply] | None = None):
        self.default = default or default_signpost
        self.requests: list[RecordedRequest] = []
        self._script: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._in_flight = 0
        self.max_in_flight = 0
        self.in_flight_log: list[tuple[float, int]] = []    # (time, in-flight count) at each request start
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- scripting ---------------------------------------------------------------------------------------
    def push(self, *replies: Reply) -> "MockGemini":
        with self._lock:
            self._script.extend(replies)
        return self

    def clear(self) -> None:
        with self._lock:
            self._script.clear()

    @property
    def calls(self) -> int:
        with self._lock:
            return len(self.requests)

    def calls_for(self, model: str) -> int:
        with self._lock:
            return sum(1 for r in self.requests if r.model == model)

    def reset_counts(self) -> None:
        with self._lock:
            self.requests.clear()
            self.max_in_flight = 0
            self.in_flight_log.clear()

    # -- lifecycle ---------------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        assert self._server is not None, "start() the mock first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> "MockGemini":
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output quiet
                pass

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_unparseable": raw.decode("utf-8", "replace")}
                m = PATH_RE.match(self.path.split("?", 1)[0])
                if not m:
                    self._send(Reply.error(404, "NOT_FOUND", f"mock: unknown path {self.path}"))
                    return
                rec = RecordedRequest(model=m.group("model"), path=self.path, body=body,
                                      headers={k.lower(): v for k, v in self.headers.items()}, started=time.time())
                with mock._lock:
                    mock.requests.append(rec)
                    mock._in_flight += 1
                    mock.max_in_flight = max(mock.max_in_flight, mock._in_flight)
                    mock.in_flight_log.append((rec.started, mock._in_flight))
                    reply = mock._script.popleft() if mock._script else None
                try:
                    if reply is None:
                        reply = mock.default(rec)
                    if reply.delay:
                        time.sleep(reply.delay)
                    rec.status = reply.status
                    self._send(reply)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout)
                finally:
                    with mock._lock:
                        mock._in_flight -= 1

            def _send(self, reply: Reply) -> None:
                data = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="mock-gemini", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "MockGemini":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
