"""The ASGI app of `kb serve`: HTTP API, auth, access log, error shapes, optional MCP and webhook mounts.

Every API response is JSON; errors are `{"error": "<one line naming the parameter>"}` with 400 / 401 / 404 /
429 (+ Retry-After) / 500, never a stack trace. Every route but /healthz needs a bearer token (the /knowledge
page takes it from its login cookie; the webhook routes carry their own HMAC auth).
"""
from __future__ import annotations

import importlib

import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import date
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Security
from fastapi import Path as FastApiPath
from fastapi.security import HTTPBearer
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException  # the router's own 404 / 405 too, not only FastAPI's subclass
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from kb_assets.models import DOCUMENT_KINDS

log = logging.getLogger("kb.serve")
access_log = logging.getLogger("kb.serve.access")

API_VERSION = "1"
MAX_QUERY_CHARS = 2000
MAX_QUERIES = 10
COOKIE_NAME = "kb_token"
KNOWN_FILTERS = ("source", "kind", "tag", "path_prefix", "date_range")
Kind = Literal[DOCUMENT_KINDS]  # type: ignore[valid-type]
# The schema says what the handlers accept, so generated clients (and schemathesis) know it too.
# something besides whitespace as str.strip() sees it (spelt out: a generator's \S may not count \x1c or \x85 as
# space); no NUL (PostgreSQL refuses it)
_SPACE = r"\s\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
QUERY_PATTERN = rf"^[^\x00]*[^\x00{_SPACE}][^\x00]*$"
_DAY = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
DATE_RANGE_PATTERN = rf"^({_DAY})?:({_DAY})?$"
NO_NUL_PATTERN = r"^[^\x00]*$"
TIER_PATTERN = r"^[013]$"
TIER_TYPE_PATTERN = r"^[A-Za-z0-9_-]{1,60}$"
SafeText = Annotated[str, StringConstraints(max_length=MAX_QUERY_CHARS, pattern=NO_NUL_PATTERN)]
_PATTERN_HINTS = {NO_NUL_PATTERN: "contains a NUL character", QUERY_PATTERN: "empty, blank, or contains a NUL character",
                  DATE_RANGE_PATTERN: "is not FROM:TO (YYYY-MM-DD:YYYY-MM-DD; either side may be empty)",
                  TIER_PATTERN: "use 0 (the index), 1 (per type) or 3 (relations); tier 2 is one document: "
                                "GET /api/v1/documents/{kb id}",
                  TIER_TYPE_PATTERN: "not a type name (adr, doc, ..., code): GET /api/v1/tier/1 lists them"}


class ApiError(Exception):
    """Bad input: becomes {"error": message} with `status` (400 unless said otherwise)."""

    def __init__(self, message: str, status: int = 400, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}


# ------------------------------------------------------------------------------------------ server state
class QueryEmbedder:
    """The server's query encoder: one embedding at a time (a forward pass already keeps a core busy;
    concurrent passes only thrash), behind a bounded LRU of recent query vectors (agents repeat questions:
    a hit costs no forward pass). Searches and record fetches still run in parallel."""

    def __init__(self, inner, cache_size: int = 2048):
        from collections import OrderedDict

        self._inner, self._lock = inner, threading.Lock()
        self.model, self.dimension = inner.model, inner.dimension
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Any] = OrderedDict()     # text -> float32 vector
        self._cache_lock = threading.Lock()
        self.hits = self.misses = 0

    @property
    def runtime(self) -> str:
        """What embeds the queries: onnx | numpy (the torch-free encoders), torch, or the embedder's class."""
        enc = getattr(self._inner, "query_encoder", None)
        if enc is None:
            return type(self._inner).__name__
        if enc() != "numpy":
            return enc()
        from kb_assets.embedding import numpy_bert

        return numpy_bert.runtime()

    def embed_query(self, text: str) -> list[float]:
        import numpy as np

        if self.cache_size:
            with self._cache_lock:
                kept = self._cache.get(text)
                if kept is not None:
                    self._cache.move_to_end(text)
                    self.hits += 1
                    return kept.tolist()
        with self._lock:
            vec = list(self._inner.embed_query(text))
        if self.cache_size:
            # kept as an array (.tolist() gives back the same numbers): float32 when that is exact (the local
            # encoders' own precision, ~1.6 KB a vector), else float64; a list of Python floats takes ~12 KB
            exact = np.asarray(vec, dtype=np.float64)
            kept = exact.astype(np.float32)
            if not np.array_equal(kept, exact):
                kept = exact
            with self._cache_lock:
                self.misses += 1
                self._cache[text] = kept
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return vec


@dataclass
class ServeState:
    cfg: Any                       # KbConfig
    pool: Any                      # psycopg_pool.ConnectionPool (autocommit connections)
    embedder: Any                  # .embed_query / .model / .dimension
    no_auth: bool = False
    log_query_text: bool = False
    secure_cookie: bool = False    # set the cookie's Secure flag (behind TLS)
    secret: bytes = b""
    extras: dict[str, Any] = field(default_factory=dict)

    def connection(self):
        return self.pool.connection()


def open_state(cfg, *, embedder=None, database_url: str | None = None, no_auth: bool = False,
               log_query_text: bool = False, pool_size: int = 8, secure_cookie: bool = False) -> ServeState:
    """Start (or reach) the database, migrate it, open the pool, load the model: everything paid once."""
    from psycopg_pool import ConnectionPool

    from kb_assets.serving.tokens import server_secret
    from kb_assets.store.db import connect, open_database, open_schema

    # a URL carrying kb's search_path (migrated once): the pool's connections find kb's tables
    url = open_schema(database_url, cfg.effective_schema()) if database_url else open_database(cfg)
    # The server writes only the token buckets (one UPDATE per request): without waiting for the WAL flush
    # a crash can forget the last few spent requests, never an index row, and no request waits on fsync.
    # `options` given here would replace the URL's own (which carries kb's search_path): extend them
    from psycopg.conninfo import conninfo_to_dict

    options = " ".join(o for o in (conninfo_to_dict(url).get("options"), "-c synchronous_commit=off") if o)
    pool = ConnectionPool(url, min_size=2, max_size=pool_size, open=True, name="kb-serve",
                          kwargs={"autocommit": True, "options": options})
    if embedder is None:
        from kb_assets.embedding import make_embedder

        embedder = make_embedder(cfg)
    # The local model's queries run on the torch-free encoder (the vectors sentence-transformers gives):
    # onnxruntime when installed, else numpy. torch is never imported by the server (half the RSS).
    from kb_assets.embedding import numpy_bert

    numpy_bert.prefer_onnxruntime(threads=cfg.serve.embed_threads)
    with connect(url, register=False) as conn:
        secret = server_secret(conn)
        active = conn.execute("SELECT model, dimension FROM embedding_spaces WHERE activated_at IS NOT NULL"
                              " ORDER BY activated_at DESC LIMIT 1").fetchone()
    query_embedder = QueryEmbedder(embedder, cache_size=cfg.serve.query_cache)
    if active is not None and (embedder.model, int(embedder.dimension)) == (active[0], int(active[1])):
        embedder.embed_query("warm up")          # load the model now, not on the first request
        log.info("query encoder: %s (%s threads), %s cached query vectors at most", query_embedder.runtime,
                 cfg.serve.embed_threads, cfg.serve.query_cache)
    return ServeState(cfg=cfg, pool=pool, embedder=query_embedder, no_auth=no_auth,
                      log_query_text=log_query_text, secret=secret, secure_cookie=secure_cookie,
                      extras={"database_url": url})


# ------------------------------------------------------------------------------------------ auth
def bearer_token(request: Request) -> str | None:
    h = request.headers.get("authorization", "")
    scheme, _, value = h.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def authenticate(request: Request, token: str | None) -> str:
    """Spend one request of the token's rate; raise ApiError 401 / 429. Returns the token's name."""
    st: ServeState = request.app.state.kb
    if st.no_auth:
        request.state.token_name = "(no-auth)"
        return "(no-auth)"
    from kb_assets.serving.tokens import check_token

    with st.connection() as conn:
        verdict = check_token(conn, st.secret, token)
    if verdict.status == 401:
        raise ApiError("missing, unknown, revoked or expired bearer token: send 'Authorization: Bearer <token>'"
                       " (kb token create NAME)", 401, {"WWW-Authenticate": 'Bearer realm="kb"'})
    request.state.token_name = verdict.name
    if verdict.status == 429:
        raise ApiError(f"rate limit of token {verdict.name!r} exceeded: retry after {verdict.retry_after} s",
                       429, {"Retry-After": str(verdict.retry_after)})
    return verdict.name or ""


_bearer_scheme = HTTPBearer(auto_error=False, description="a token from `kb token create NAME`")


def require_token(request: Request, _doc=Security(_bearer_scheme)) -> str:
    # _doc only declares the scheme in the OpenAPI spec; the header is read (and judged) here
    return authenticate(request, bearer_token(request))


# ------------------------------------------------------------------------------------------ parameters
def _param_error(name: str, problem: str) -> ApiError:
    return ApiError(f"{name}: {problem}")


def check_filters(request: Request, allowed: tuple[str, ...]) -> None:
    """Unknown filters and misspelt parameters are errors, not silently ignored (`topk=5` would otherwise
    quietly return the default 10)."""
    for key in request.query_params.keys():
        if key.startswith("filter"):
            inner = key[7:-1] if key.startswith("filter[") and key.endswith("]") else None
            if inner not in KNOWN_FILTERS:
                raise _param_error(key, "unknown filter: use " + ", ".join(f"filter[{f}]" for f in KNOWN_FILTERS))
        elif key not in allowed:
            raise _param_error(key, "unknown parameter: use " + ", ".join(allowed) + " or filter[…]")


def _split(values: list[str] | None) -> list[str] | None:
    """Several values: repeat the parameter (filter[kind]=adr&filter[kind]=doc)."""
    out = [v.strip() for v in values or [] if v.strip()]
    return out or None


def _clean_text(name: str, value: str) -> str:
    if "\x00" in value:
        raise _param_error(name, "contains a NUL character")
    if len(value) > MAX_QUERY_CHARS:
        raise _param_error(name, f"longer than {MAX_QUERY_CHARS} characters")
    return value


def parse_queries(q: list[str] | None) -> list[str]:
    qs = [_clean_text("q", v).strip() for v in (q or [])]
    if not qs or any(not v for v in qs):
        raise _param_error("q", "empty query: give ?q=<question> (repeat q for several queries)")
    if len(qs) > MAX_QUERIES:
        raise _param_error("q", f"at most {MAX_QUERIES} queries per request")
    return qs


def parse_date_range(value: str | None) -> tuple[date | None, date | None]:
    if value is None or value == "":
        return None, None
    name = "filter[date_range]"
    if value.count(":") != 1:
        raise _param_error(name, f"{value!r} is not FROM:TO (YYYY-MM-DD:YYYY-MM-DD; either side may be empty)")
    a, b = (s.strip() for s in value.split(":"))
    try:
        since = date.fromisoformat(a) if a else None
        until = date.fromisoformat(b) if b else None
    except ValueError:
        raise _param_error(name, f"{value!r}: dates must be YYYY-MM-DD") from None
    if since and until and since > until:
        raise _param_error(name, f"FROM {since} is after TO {until}")
    return since, until


@dataclass
class Filters:
    source: list[str] | None = None
    kind: list[str] | None = None
    tag: list[str] | None = None
    path_prefix: str | None = None
    since: date | None = None
    until: date | None = None

    def as_recall_kwargs(self) -> dict[str, Any]:
        return {"source": self.source, "kind": self.kind, "tag": self.tag, "path_prefix": self.path_prefix,
                "since": self.since, "until": self.until}


def parse_filters(request: Request, allowed: tuple[str, ...], source, kind, tag, path_prefix,
                  date_range) -> Filters:
    check_filters(request, allowed)
    kinds = _split(kind)
    for k in kinds or []:
        if k not in DOCUMENT_KINDS:
            raise _param_error("filter[kind]", f"unknown kind {k!r}: use one of {', '.join(DOCUMENT_KINDS)}")
    sources = _split(source)
    tags = _split(tag)
    for name, vals in (("filter[source]", sources), ("filter[tag]", tags)):
        for v in vals or []:
            _clean_text(name, v)
    if path_prefix is not None:
        _clean_text("filter[path_prefix]", path_prefix)
    since, until = parse_date_range(date_range)
    return Filters(sources, kinds, tags, path_prefix or None, since, until)


# Shared query parameter declarations (documented in the OpenAPI spec under their bracketed names).
def _filter_params(source: list[SafeText] | None = Query(None, alias="filter[source]", description="source key(s)"),
                   kind: list[Kind] | None = Query(None, alias="filter[kind]", description="document kind(s)"),
                   tag: list[SafeText] | None = Query(None, alias="filter[tag]", description="tag(s)"),
                   path_prefix: SafeText | None = Query(None, alias="filter[path_prefix]",
                                                   description="only paths starting with this"),
                   date_range: str | None = Query(None, alias="filter[date_range]", pattern=DATE_RANGE_PATTERN,
                                                  description="FROM:TO, YYYY-MM-DD, either side may be empty"),
                   ) -> tuple:
    return source, kind, tag, path_prefix, date_range


# ------------------------------------------------------------------------------------------ response models
class ErrorBody(BaseModel):
    error: str


class SearchResult(BaseModel):
    score: float
    source_url: str | None = Field(description="the file at the indexed commit (web link for a source with a "
                                               "remote), else a file: URL")
    citation: str = Field(description="kb:<id>, cite it; GET /api/v1/documents/{id} opens it")
    snippet: str = Field(description="the best matching passage (or the summary)")
    id: str
    title: str
    kind: str
    source: str
    path: str
    stale: bool


class SourceIndex(BaseModel):
    key: str
    kind: str
    documents: int
    indexed_commit: str | None
    last_indexed_at: str | None


class IndexInfo(BaseModel):
    last_indexed_at: str | None
    sources: list[SourceIndex]


class SearchResponse(BaseModel):
    query: str
    results: list[SearchResult]
    index: IndexInfo


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class RecallResponse(_Open):
    query: str
    queries: list[str]
    mode: str
    documents: list[dict[str, Any]]
    code: list[dict[str, Any]]
    truncated: bool
    timings: dict[str, float]
    token_estimate: int


class RecallTextResponse(BaseModel):
    text: str


class DocumentResponse(_Open):
    id: str
    source: str
    path: str
    kind: str
    title: str
    text: str
    signpost: dict[str, Any]
    stale: bool
    chunks: list[dict[str, Any]]


class StatusResponse(_Open):
    sources: list[dict[str, Any]]
    never_indexed: list[str]


class Health(BaseModel):
    status: str


class TierResponse(_Open):
    tier: int = Field(description="0 the index, 1 per type (no type: the list of types), 3 the relations graph")
    type: str | None
    chars: int = Field(description="length of the whole projection text")
    truncated: bool
    text: str = Field(description="the projection as `kb tier` prints it (cut at whole lines when truncated)")


class TagsResponse(_Open):
    governed: bool
    vocabulary: list[Any]
    tags: dict[str, Any]
    unused: list[str]
    outside: dict[str, int]


class RelatedEdge(_Open):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    from_: str = Field(alias="from")
    kind: str
    to: str
    resolved: bool
    depth: int


class RelatedResponse(_Open):
    id: str
    found: bool
    edges: list[RelatedEdge]


def _err(*codes: int) -> dict[int | str, dict[str, Any]]:
    desc = {400: "bad parameter (the message names it)", 401: "missing, unknown, revoked or expired token",
            404: "no such document", 429: "rate limit exceeded: see Retry-After", 500: "internal error"}
    return {c: {"model": ErrorBody, "description": desc[c]} for c in codes}


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """The CLI's JSON (json.dumps with default=str), so server and CLI print the same values."""
    return Response(json.dumps(data, default=str, ensure_ascii=False), status_code=status,
                    media_type="application/json", headers=headers)


# ------------------------------------------------------------------------------------------ the API
api = APIRouter(prefix="/api/v1", dependencies=[Depends(require_token)])


@api.get("/knowledge/search", response_model=SearchResponse, responses=_err(400, 401, 429),
         summary="Ranked passages with citations and links")
def knowledge_search(request: Request, q: str = Query(..., description="the question", min_length=1,
                                                      max_length=MAX_QUERY_CHARS, pattern=QUERY_PATTERN),
                     top_k: int = Query(10, ge=1, le=100), filters: tuple = Depends(_filter_params)):
    from kb_assets.serving import views

    qs = parse_queries([q])
    f = parse_filters(request, ("q", "top_k"), *filters)
    st: ServeState = request.app.state.kb
    with st.connection() as conn:
        body = views.knowledge_search(conn, st, qs[0], top_k, f)
    return json_response(body)


@api.get("/recall", response_model=RecallResponse,
         responses={**_err(400, 401, 429), 200: {"content": {"application/json": {"schema": {"anyOf": [
             {"$ref": "#/components/schemas/RecallResponse"}, {"$ref": "#/components/schemas/RecallTextResponse"}]}}},
             "description": "exactly `kb recall --json` (format=text: {\"text\": the `kb recall` text})"}},
         summary="Signposts for one or several queries: the JSON of `kb recall --json`")
def recall_route(request: Request, q: list[Annotated[str, StringConstraints(
                     min_length=1, max_length=MAX_QUERY_CHARS, pattern=QUERY_PATTERN)]] = Query(
                     ..., description="query; repeat for several", min_length=1, max_length=MAX_QUERIES),
                 limit: int | None = Query(None, ge=0, le=200), code_limit: int | None = Query(None, ge=0, le=200),
                 passage: bool = Query(False, description="add each record's best passage"),
                 format: str = Query("json", pattern="^(json|text)$"),
                 filters: tuple = Depends(_filter_params)):
    from kb_assets.serving import views

    qs = parse_queries(q)
    f = parse_filters(request, ("q", "limit", "code_limit", "passage", "format"), *filters)
    st: ServeState = request.app.state.kb
    with st.connection() as conn:
        result = views.run_recall(conn, st, qs, limit=limit, code_limit=code_limit, passage=passage, filters=f)
    if format == "text":
        return json_response({"text": result.render_text()})
    return json_response(result.to_dict())


@api.get("/documents/{doc_id:path}", response_model=DocumentResponse, responses=_err(400, 401, 404, 429),
         summary="The whole document behind a kb:<id>: the JSON of `kb show --json`")
def document_route(request: Request, doc_id: str):
    from kb_assets.query import QueryError, parse_id, show

    # A malformed id names no document either: 404, like an unknown one (the message says what ids look like).
    if "\x00" in doc_id or len(doc_id) > 4096:
        raise ApiError("doc_id: not a kb id", 404)
    try:
        parse_id(doc_id)
    except QueryError as exc:
        raise ApiError(f"doc_id: {exc}", 404) from None
    st: ServeState = request.app.state.kb
    with st.connection() as conn:
        try:
            doc = show(doc_id, conn=conn)
        except QueryError as exc:
            raise ApiError(str(exc), 404) from None
    return json_response(doc)


@api.get("/status", response_model=StatusResponse, responses=_err(401, 429),
         summary="Per-source counts, skips, freshness: the JSON of `kb status --json`")
def status_route(request: Request):
    from kb_assets.store.status import status_report

    st: ServeState = request.app.state.kb
    with st.connection() as conn:
        return json_response(status_report(conn, [s.key for s in st.cfg.sources], config=st.cfg))




def _tool_call(fn, *args, **kwargs):
    """serving/tools.py answers (the MCP tools' own): a missing projection or document is 404, bad input 400."""
    from kb_assets.serving import tools

    try:
        return fn(*args, **kwargs)
    except tools.ProjectionsNotFound as exc:
        raise ApiError(str(exc), 404) from None
    except tools.ToolInputError as exc:
        raise ApiError(str(exc)) from None


@api.get("/tier/{tier}", response_model=TierResponse, responses=_err(400, 401, 404, 429),
         summary="A projection tier (`kb tier`): read T0 first, T1 per type, T2 = /documents/{id}, T3 relations")
def tier_route(request: Request, tier: str = FastApiPath(..., pattern=TIER_PATTERN,
                                                        description="0, 1 or 3 (tier 2: /documents/{id})"),
               type: str | None = Query(None, pattern=TIER_TYPE_PATTERN,
                                        description="tier 1: a document type (adr, doc, ...) or code"),
               max_chars: int | None = Query(None, ge=1000, le=1_000_000, description="cap on text (default 60000)")):
    from kb_assets.serving import tools

    check_filters(request, ("type", "max_chars"))
    st: ServeState = request.app.state.kb
    return json_response(_tool_call(tools.tier_json, st.cfg, int(tier), type, max_chars=max_chars))


@api.get("/tags", response_model=TagsResponse, responses=_err(400, 401, 429),
         summary="Tags in use, their by-tag files, and tags outside the vocabulary: `kb tags --json`")
def tags_route(request: Request):
    from kb_assets.serving import tools

    check_filters(request, ())
    st: ServeState = request.app.state.kb
    with st.connection() as conn:
        return json_response(_tool_call(tools.tags_json, st.cfg, conn=conn))


@api.get("/related/{doc_id:path}", response_model=RelatedResponse, responses=_err(400, 401, 404, 429),
         summary="Relations of one document (T3), both directions, up to depth hops: `kb related --json`")
def related_route(request: Request, doc_id: str,
                  depth: int = Query(1, ge=1, le=3, description="hops (1-3)")):
    from kb_assets.serving import tools

    check_filters(request, ("depth",))
    if "\x00" in doc_id or len(doc_id) > 4096:
        raise ApiError("doc_id: not a kb id", 404)
    st: ServeState = request.app.state.kb
    with st.connection() as conn:
        try:
            return json_response(tools.related_json(st.cfg, doc_id, depth=depth, conn=conn))
        except tools.ToolInputError as exc:          # malformed or unknown id: names no document
            raise ApiError(str(exc), 404) from None


# ------------------------------------------------------------------------------------------ app
def build_app(state: ServeState) -> FastAPI:
    from kb_assets.serving import page

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        async with contextlib.AsyncExitStack() as stack:
            for enter in app.state.lifespans:       # the mounted MCP app's session manager, if any
                await stack.enter_async_context(enter())
            yield
        with contextlib.suppress(Exception):
            state.pool.close()
        log.info("stopped: requests in flight finished, database connections closed")

    app = FastAPI(title="kb", version=API_VERSION, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None,
                  description="kb_assets knowledge API. Every route but /healthz needs "
                              "`Authorization: Bearer <token>` (`kb token create NAME`).")
    app.state.kb = state
    app.state.kb_database_url = state.extras.get("database_url")   # the git push webhook records pushes there
    app.state.lifespans = []

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return json_response({"error": str(exc)}, exc.status, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {"loc": ("?",), "msg": "invalid"}
        loc = [str(x) for x in err.get("loc", ()) if x not in ("query", "path", "body") and not isinstance(x, int)]
        msg = err.get("msg", "invalid")
        if err.get("type") == "string_pattern_mismatch":
            msg = _PATTERN_HINTS.get((err.get("ctx") or {}).get("pattern"), msg)
        return json_response({"error": f"{'.'.join(loc) or 'request'}: {msg}"}, 400)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        return json_response({"error": str(exc.detail)}, exc.status_code, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return json_response({"error": "internal error (details are in the server log)"}, 500)

    @app.middleware("http")
    async def _access_log(request: Request, call_next):
        t0 = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            if request.url.path.startswith("/knowledge"):
                for k, v in page.SECURITY_HEADERS.items():
                    response.headers.setdefault(k, v)
            return response
        finally:
            entry = {"ts": round(time.time(), 3), "method": request.method, "path": request.url.path,
                     "status": status, "ms": round((time.perf_counter() - t0) * 1000, 1),
                     "token": getattr(request.state, "token_name", None),
                     "client": request.client.host if request.client else None}
            if state.log_query_text and request.url.query:
                entry["query"] = request.url.query
            access_log.info(json.dumps(entry))

    @app.get("/healthz", response_model=Health, tags=["health"], summary="Liveness: no token needed")
    def healthz():
        return json_response({"status": "ok"})

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(require_token)])
    def openapi():
        return json_response(app.openapi())

    app.include_router(api)
    page.add_routes(app)
    mount_webhooks(app)
    mount_mcp(app)
    return app


# ------------------------------------------------------------------------------------------ optional mounts
# The lead connects these at merge: kb_assets/serving/mcp.py (branch mcp) and kb_assets/serving/webhooks.py
# (branch ops). Each is mounted only when its module exists, so this app runs with or without them.
def mount_mcp(app: FastAPI) -> bool:
    """Serve MCP over streamable HTTP at /mcp behind the same bearer auth and rate limit, if
    kb_assets.serving.mcp exists.

    Looks for `build_mcp_asgi(cfg)` (an ASGI app that serves the path /mcp) or `build_mcp_server(cfg)` /
    `build_mcp_server()` (the SDK's FastMCP: its `streamable_http_app()` serves /mcp, and its
    `session_manager.run()` joins this app's lifespan). The request reaches it with its path unchanged (a
    Route, not a Mount), so POST /mcp is answered without a redirect to /mcp/."""
    try:
        mcp_mod = importlib.import_module("kb_assets.serving.mcp")   # sys.modules first (tests stand in)
    except ImportError:
        return False
    from starlette.routing import Route

    st: ServeState = app.state.kb
    asgi = None
    if hasattr(mcp_mod, "build_mcp_asgi"):
        asgi = mcp_mod.build_mcp_asgi(st.cfg)
    elif hasattr(mcp_mod, "build_mcp_server"):
        for args, kwargs in (((st.cfg,), {"embedder": st.embedder}),   # /api/v1's encoder and its cache
                             ((st.cfg,), {}), ((), {})):
            try:
                server = mcp_mod.build_mcp_server(*args, **kwargs)
                break
            except TypeError:
                continue
        asgi = server.streamable_http_app()            # creates the session manager: call it first
        manager = getattr(server, "session_manager", None)
        if manager is not None:
            app.state.lifespans.append(manager.run)
    if asgi is None:
        log.warning("kb_assets.serving.mcp has neither build_mcp_asgi nor build_mcp_server: /mcp not served")
        return False
    app.router.routes.append(Route("/mcp", BearerGate(asgi, app), methods=["GET", "POST", "DELETE"],
                                   include_in_schema=False))
    return True


def mount_webhooks(app: FastAPI) -> bool:
    """Add the git push webhook routes (`routes: list[Route]`, their own HMAC auth, no bearer token)."""
    try:
        webhooks = importlib.import_module("kb_assets.serving.webhooks")
    except ImportError:
        return False
    app.router.routes.extend(getattr(webhooks, "routes", []))
    return True


class BearerGate:
    """ASGI wrapper: the bearer check and rate limit in front of a mounted app (MCP)."""

    def __init__(self, inner, app: FastAPI):
        self.inner, self.app = inner, app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        from starlette.concurrency import run_in_threadpool

        request = Request(scope)
        request.scope.setdefault("app", self.app)
        try:
            await run_in_threadpool(authenticate, request, bearer_token(request))
        except ApiError as exc:
            response = json_response({"error": str(exc)}, exc.status, exc.headers)
            return await response(scope, receive, send)
        return await self.inner(scope, receive, send)
