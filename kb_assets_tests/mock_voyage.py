"""A local stand-in for the Voyage embeddings API, for tests that drive the real `voyageai` SDK.

    with MockVoyage() as mock:
        client = voyageai.Client(api_key="k", base_url=mock.base_url)   # http://127.0.0.1:<port>/v1
        ...
        mock.requests        # every request: RecordedRequest(path, headers, body, status, time, response)
        mock.inputs()        # every text sent, in order

Behaves like the real API where our code can tell: POST /v1/embeddings, JSON in and out, base64 float32
vectors when the SDK asks for `encoding_format: "base64"` (it always does), `usage.total_tokens`,
400 `{"detail": ...}` for > 1,000 texts, for too many tokens in a batch, for empty strings and for
unsupported dimensions; 401 when `api_key` is set and the bearer token differs.

Scripted failures, consumed one per request (before validation), then normal service:

    mock.script((429, {"Retry-After": "1"}), (500,), (401,), ("sleep", 2.0), (400, {}, {"detail": "..."}))

`("sleep", s)` stalls s seconds and then answers normally (a client with a shorter timeout gives up).
Vectors are deterministic: `MockVoyage.vector_for(text, dimension)`.
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import numpy as np

FIXED_DIMS = {"voyage-3": 1024, "voyage-3-lite": 512, "voyage-2": 1024, "voyage-code-2": 1536}
FLEXIBLE_DIMS = (256, 512, 1024, 2048)
DEFAULT_DIM = 1024

_STATUS_DETAIL = {
    400: "Bad request.",
    401: "Provided API key is invalid.",
    403: "Forbidden.",
    429: "You have exceeded your rate limit. Please wait and retry.",
}


def default_token_count(text: str) -> int:
    """The mock's idea of Voyage tokens: one per 4 UTF-8 bytes, at least one (roughly real for English)."""
    return max(1, math.ceil(len(text.encode("utf-8")) / 4))


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: Any               # parsed JSON (or the raw text if it was not JSON)
    status: int             # what the mock answered
    time: float             # time.monotonic() at arrival
    response: Any = None    # the JSON it answered with


class MockVoyage:
    def __init__(self, *, api_key: str | None = None, max_texts: int = 1000,
                 max_tokens_per_request: int = 320_000,
                 token_count: Callable[[str], int] = default_token_count):
        self.api_key = api_key
        self.max_texts = max_texts
        self.max_tokens_per_request = max_tokens_per_request
        self.token_count = token_count
        self.requests: list[RecordedRequest] = []
        self._script: deque[tuple] = deque()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "MockVoyage":
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 10

            def log_message(self, *args):   # keep test output clean
                pass

            def do_POST(self):
                mock._handle(self)

            def do_GET(self):
                mock._send(self, 405, {"detail": "Method Not Allowed"})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="mock-voyage", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "MockVoyage":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "MockVoyage is not running"
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------------ scripting and inspection

    def script(self, *responses: tuple) -> None:
        """Queue scripted answers: (status,), (status, headers), (status, headers, body), ("sleep", seconds)."""
        with self._lock:
            self._script.extend(responses)

    @property
    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]

    def embedding_requests(self, status: int | None = 200) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/v1/embeddings" and (status is None or r.status == status)]

    def inputs(self, status: int | None = 200) -> list[str]:
        """Every text sent in (by default: successfully answered) embedding requests, in arrival order."""
        out: list[str] = []
        for r in self.embedding_requests(status):
            inp = r.body.get("input") if isinstance(r.body, dict) else None
            out.extend([inp] if isinstance(inp, str) else inp or [])
        return out

    @staticmethod
    def vector_for(text: str, dimension: int = DEFAULT_DIM) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(dimension).astype(np.float32)
        return v / np.linalg.norm(v)

    # ------------------------------------------------------------------ HTTP

    def _send(self, h: BaseHTTPRequestHandler, status: int, payload: Any,
              headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):   # the client gave up (timeout test)
            pass

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        arrived = time.monotonic()
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw or b"null")
        except ValueError:
            body = raw.decode("utf-8", "replace")
        record = RecordedRequest(h.path, dict(h.headers.items()), body, 0, arrived)
        with self._lock:
            self.requests.append(record)
            scripted = self._script.popleft() if self._script else None

        status, payload, headers = self._answer(h, body, scripted)
        record.status, record.response = status, payload
        self._send(h, status, payload, headers)

    def _answer(self, h: BaseHTTPRequestHandler, body: Any, scripted: tuple | None):
        if scripted is not None:
            if scripted[0] == "sleep":
                time.sleep(float(scripted[1]))
            else:
                status = int(scripted[0])
                headers = dict(scripted[1]) if len(scripted) > 1 and scripted[1] else {}
                payload = scripted[2] if len(scripted) > 2 else {"detail": _STATUS_DETAIL.get(
                    status, "The server failed to process the request.")}
                return status, payload, headers
        if h.path != "/v1/embeddings":
            return 404, {"detail": "Not Found"}, {}
        if self.api_key is not None and h.headers.get("Authorization") != f"Bearer {self.api_key}":
            return 401, {"detail": _STATUS_DETAIL[401]}, {}
        return self._embed(body)

    def _embed(self, body: Any):
        def bad(detail: str):
            return 400, {"detail": detail}, {}

        if not isinstance(body, dict):
            return bad("Request body must be a JSON object.")
        inp, model = body.get("input"), body.get("model")
        if not isinstance(model, str) or not model:
            return bad("'model' is required.")
        texts = [inp] if isinstance(inp, str) else inp
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return bad("'input' must be a string or a non-empty list of strings.")
        if any(t == "" for t in texts):
            return bad("Input cannot contain empty strings.")
        if len(texts) > self.max_texts:
            return bad(f"The batch size limit is {self.max_texts}. Your batch size is {len(texts)}.")
        if body.get("input_type") not in (None, "query", "document"):
            return bad("'input_type' must be null, 'query' or 'document'.")
        counts = [self.token_count(t) for t in texts]
        total = sum(counts)
        if total > self.max_tokens_per_request:
            return bad(f"Request to model '{model}' failed. The max allowed tokens per submitted batch is "
                       f"{self.max_tokens_per_request}. Your batch has {total} tokens after truncation. "
                       "Please lower the number of tokens in the batch.")
        dim = body.get("output_dimension")
        if model in FIXED_DIMS:
            if dim is not None:
                return bad(f"Model {model} does not support 'output_dimension'.")
            dim = FIXED_DIMS[model]
        elif dim is None:
            dim = DEFAULT_DIM
        elif dim not in FLEXIBLE_DIMS:
            return bad(f"'output_dimension' must be one of {list(FLEXIBLE_DIMS)}.")
        fmt = body.get("encoding_format")
        if fmt not in (None, "base64"):
            return bad("'encoding_format' must be null or 'base64'.")
        data = []
        for i, t in enumerate(texts):
            v = self.vector_for(t, dim)
            emb: Any = base64.b64encode(v.astype("<f4").tobytes()).decode() if fmt == "base64" else v.tolist()
            data.append({"object": "embedding", "embedding": emb, "index": i})
        return 200, {"object": "list", "data": data, "model": model, "usage": {"total_tokens": total}}, {}
