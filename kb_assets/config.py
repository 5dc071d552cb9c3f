"""The kb.yaml schema, its defaults, and validation that fails with one clear line.

Lookup order: --config, else $KB_CONFIG, else ./kb.yaml, else a default config that indexes the current
git repository's docs and code.
"""
from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kb_assets.models import DOCUMENT_KINDS

CONFIG_ENV = "KB_CONFIG"
DATABASE_URL_ENV = "KB_DATABASE_URL"
VOYAGE_KEY_ENV = "VOYAGE_API_KEY"
GEMINI_KEY_ENVS = ("GEMINI_API_KEY", "GOOGLE_API_KEY")

DEFAULT_DOC_GLOBS = ["**/*.md", "**/*.rst", "**/*.txt", "**/*.ipynb"]
SOURCE_KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


class ConfigError(Exception):
    """A configuration mistake: str() is one line naming the file, the key and the fix."""

    def __init__(self, file: str, key: str, problem: str, fix: str):
        self.file, self.key, self.problem, self.fix = file, key, problem, fix
        super().__init__(f"{file}: {key}: {problem} — {fix}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LocalEmbedderSettings(_Strict):
    model: str = "all-MiniLM-L6-v2"
    # texts per model call: 16 in word-piece order was 7-9% faster than 32 on CPU (less padding per batch;
    # docs/BENCHMARKS.md, "Batches in word-piece order")
    batch_size: int = Field(16, ge=1, le=1024)
    max_tokens: int = Field(256, ge=16)       # the model's window; chunks are cut to fit it


class VoyageSettings(_Strict):
    model: str = "voyage-3.5"
    dimension: int = 1024
    base_url: str | None = None              # for a proxy or a local mock server
    max_texts_per_request: int = Field(1000, ge=1, le=1000)
    max_tokens_per_request: int = Field(320_000, ge=1000)
    max_tokens: int = Field(1024, ge=16)      # chunk window we cut to (the model accepts 32K per text)
    max_attempts: int = Field(6, ge=1)
    timeout_seconds: float = Field(60.0, gt=0)
    price_per_million_tokens: float = 0.06


class GeminiSettings(_Strict):
    model: str = "gemini-flash-latest"
    fallback_model: str = "gemini-flash-lite-latest"
    base_url: str | None = None
    temperature: float = 0.1
    max_output_tokens: int = 2048
    fallback_max_output_tokens: int = 8192
    max_input_tokens: int = 200_000           # longer documents are split into segments and merged
    max_attempts: int = Field(5, ge=1)
    concurrency: int = Field(4, ge=1, le=64)
    timeout_seconds: float = Field(120.0, gt=0)
    max_failures_before_parking: int = Field(3, ge=1)
    price_input_per_million_tokens: float = 0.30
    price_output_per_million_tokens: float = 2.50


class QuerySettings(_Strict):
    documents_limit: int = Field(20, ge=1, le=200)
    code_limit: int = Field(10, ge=0, le=200)
    record_chars: int = Field(1000, ge=200)
    vector_weight: float = Field(1.0, ge=0)
    keyword_weight: float = Field(1.0, ge=0)
    rrf_k: int = Field(60, ge=1)
    candidate_window: int = Field(200, ge=10, le=2000)
    per_document_chunks: int = Field(3, ge=1)
    min_score: float = Field(0.0, ge=0)       # relevance threshold on the fused score (0: keep all)
    # Added for recall() (kb_assets/query, docs/QUALITY.md):
    document_window: int = Field(100, ge=0, le=2000)   # nearest document vectors taken as candidates (0: off)
    document_weight: float = Field(1.0, ge=0)          # that channel's weight in the fusion
    # Relevance gate (drops weak results instead of filling the list): a result's best passage must be at
    # least min_similarity similar to the query (null: the value calibrated for the embedder's model, 0 for
    # an uncalibrated one) and within similarity_margin of the best result's (min_similarity + 0.15 always
    # suffices) — or its keyword matches must cover min_keyword_coverage of the query's informative words.
    min_similarity: float | None = Field(None, ge=-1, le=1)
    similarity_margin: float = Field(0.15, ge=0, le=2)
    min_keyword_coverage: float = Field(0.6, ge=0, le=1)
    answer_tokens: int = Field(6000, ge=500)            # budget of the whole compact answer (chars / 4)


class ServeSettings(_Strict):
    """`kb serve` and the CLI's client mode (kb_assets/serving). Tokens are never settings: KB_TOKEN."""
    url: str | None = None                  # a running kb serve that `kb recall` uses (KB_SERVER overrides)
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=1, le=65535)
    default_rate: str = "60/min"            # `kb token create` without --rate
    pool_size: int = Field(8, ge=2, le=64)  # server connections (a recall() in use opens a second one beside)
    # intra-op threads of one query embedding (local model, onnxruntime; capped at the cores). 2: with
    # onnxruntime's spinning off, a second thread costs ~5% more CPU and cuts a paragraph's wall time by
    # ~1/3 even on a busy machine (docs/BENCHMARKS.md "kb serve", bench/serve_embed_threads.py)
    embed_threads: int = Field(2, ge=1, le=64)
    query_cache: int = Field(2048, ge=0, le=1_000_000)  # recent query vectors kept by kb serve (0: none)


class TagSpec(_Strict):
    """One tag of the governed vocabulary (`tags:` in kb.yaml), with the spellings that mean it."""

    tag: str = Field(min_length=1, max_length=60)
    aliases: list[str] = Field(default_factory=list)


class SourceConfig(_Strict):
    key: str
    kind: Literal["adr", "doc", "session", "transcript", "readme", "agents_md", "memory", "work_item", "code"]
    root: str
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    # committed content at HEAD (CI, sensors) or the working tree (local use)
    content: Literal["worktree", "HEAD"] = "worktree"
    max_file_bytes: int = Field(2_000_000, ge=1)
    max_line_chars: int = Field(20_000, ge=80)
    min_chars: int = Field(100, ge=0)
    enabled: bool = True       # memory folders are opt-in: they must be enabled explicitly
    # With kind "doc"/"code" mixed trees (the default source), files are classified per path.
    auto_kind: bool = False
    # Too-broad roots (/, the home folder, system folders) and listings past max_files are refused unless
    # allow_broad_root (sources/roots.py); /proc, /sys and /dev are never read.
    allow_broad_root: bool = False
    max_files: int = Field(100_000, ge=1)
    # Git merges (content: HEAD): the branch whose commits are indexed (default: the checkout's current
    # branch) and an optional remote fetched on each sensor tick (then <remote>/<branch> is indexed).
    branch: str | None = None
    remote: str | None = None
    # false: the folder is listed by walking it even inside a git work tree (untracked and ignored files
    # included, no commit recorded, no git process started); for folders whose files are not what git tracks
    use_git: bool = True

    @field_validator("key")
    @classmethod
    def _key_ok(cls, v: str) -> str:
        if not SOURCE_KEY_RE.match(v):
            raise ValueError("must be 1-64 letters, digits, '_', '-' or '.' (it becomes a Dagster partition key)")
        return v

    @field_validator("branch", "remote")
    @classmethod
    def _ref_ok(cls, v: str | None) -> str | None:
        # a name git accepts as one ref component path, never an option ("-x") or a range ("a..b")
        if v is not None and (not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,199}$", v) or ".." in v
                              or v.endswith((".", "/", ".lock"))):
            raise ValueError(f"{v!r} is not a valid git branch or remote name")
        return v

    @model_validator(mode="after")
    def _remote_needs_head(self) -> "SourceConfig":
        if (self.remote or self.branch) and self.content != "HEAD":
            raise ValueError("branch/remote need content: HEAD (fetching never changes the working tree)")
        if not self.use_git and self.content == "HEAD":
            raise ValueError("use_git: false lists the working tree: it needs content: worktree")
        return self

    @field_validator("include", "exclude")
    @classmethod
    def _globs_ok(cls, v: list[str]) -> list[str]:
        for pattern in v:
            if not pattern or pattern.count("[") != pattern.count("]") or "\0" in pattern:
                raise ValueError(f"bad glob {pattern!r}")
            try:
                re.compile(fnmatch.translate(pattern))
            except re.error as exc:
                raise ValueError(f"bad glob {pattern!r}: {exc}") from exc
        return v


class KbConfig(_Strict):
    data_dir: str = ".kb"
    database_url: str | None = None
    embedder: Literal["local", "voyage"] = "local"
    signposter: Literal["extractive", "gemini"] = "extractive"
    local: LocalEmbedderSettings = Field(default_factory=LocalEmbedderSettings)
    voyage: VoyageSettings = Field(default_factory=VoyageSettings)
    gemini: GeminiSettings = Field(default_factory=GeminiSettings)
    query: QuerySettings = Field(default_factory=QuerySettings)
    embed_batch_rows: int = Field(500, ge=1, le=500)   # rows written and committed per batch
    # a database that is down or restarting is retried this long (s), then `kb` exits 4 (store/retry.py)
    database_retry_seconds: float = Field(30.0, ge=0, le=3600)
    sources: list[SourceConfig] = Field(default_factory=list)
    serve: ServeSettings = Field(default_factory=ServeSettings)
    # Projections (kb_assets/projections): where the tier files go (default data_dir/machine; relative to this
    # file), and the governed tag vocabulary — a tag or {tag, aliases}; empty: every document tag is used.
    projections_dir: str | None = None
    tags: list[TagSpec] = Field(default_factory=list)

    @field_validator("tags", mode="before")
    @classmethod
    def _tag_strings(cls, v: Any) -> Any:
        # `- ops` is short for `- {tag: ops}`
        return [{"tag": t} if isinstance(t, str) else t for t in v] if isinstance(v, list) else v
    # kb's PostgreSQL schema (its tables never mix with Dagster's or anyone's); KB_SCHEMA overrides
    db_schema: str = Field("kb", alias="schema")

    # Filled in by load_config, not read from YAML.
    config_path: str = Field("<default>", exclude=True)
    base_dir: str = Field(".", exclude=True)

    def data_path(self) -> Path:
        p = Path(self.data_dir)
        return p if p.is_absolute() else Path(self.base_dir) / p

    def projections_path(self) -> Path:
        if self.projections_dir is None:
            return self.data_path() / "machine"
        p = Path(os.path.expanduser(self.projections_dir))
        return p if p.is_absolute() else Path(self.base_dir) / p

    def source_root(self, source: SourceConfig) -> Path:
        p = Path(os.path.expanduser(source.root))
        return p if p.is_absolute() else (Path(self.base_dir) / p).resolve()

    def source(self, key: str) -> SourceConfig:
        for s in self.sources:
            if s.key == key:
                return s
        raise ConfigError(self.config_path, "sources", f"no source with key {key!r}",
                          f"use one of: {', '.join(s.key for s in self.sources) or '(none configured)'}")

    def effective_database_url(self) -> str | None:
        return os.environ.get(DATABASE_URL_ENV) or self.database_url

    @field_validator("db_schema")
    @classmethod
    def _schema_name(cls, v: str) -> str:
        from kb_assets.store.schema import schema_problem

        problem = schema_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    def effective_schema(self) -> str:
        """KB_SCHEMA, else `schema` (default `kb`); a bad KB_SCHEMA is a ConfigError naming it."""
        from kb_assets.store.schema import SCHEMA_ENV, env_schema, schema_problem

        env = env_schema()
        if env:
            problem = schema_problem(env)
            if problem:
                raise ConfigError(self.config_path, SCHEMA_ENV, problem, "use a name such as 'kb' or 'kb_team'")
            return env
        return self.db_schema

    @property
    def embedder_max_tokens(self) -> int:
        return self.local.max_tokens if self.embedder == "local" else self.voyage.max_tokens


def _loc_to_key(loc: tuple[Any, ...], data: dict[str, Any]) -> str:
    parts: list[str] = []
    node: Any = data
    for item in loc:
        if isinstance(item, int):
            key = None
            if isinstance(node, list) and 0 <= item < len(node) and isinstance(node[item], dict):
                key = node[item].get("key")
            parts.append(f"[{item}]" if key is None else f"[{key}]")
            node = node[item] if isinstance(node, list) and 0 <= item < len(node) else None
        else:
            parts.append(("." if parts else "") + str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts)


def _fix_for(err: dict[str, Any]) -> str:
    t = err.get("type", "")
    loc = err.get("loc", ())
    if t == "extra_forbidden":
        field = loc[-1] if loc else "?"
        return f"remove {field!r} or check its spelling against the kb.yaml reference in README.md"
    if t == "literal_error":
        return f"use one of {err.get('ctx', {}).get('expected', '')}"
    if t == "missing":
        return f"add {loc[-1]!r}"
    if tuple(loc) == ("schema",):
        return "use a lower-case SQL name such as 'kb' (or leave it out)"
    return "see the kb.yaml reference in README.md"


def parse_config(data: Any, *, path: str, base_dir: str) -> KbConfig:
    """Validate a kb.yaml mapping; raise ConfigError with one line."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(path, "(top level)", "is not a mapping", "write keys such as 'sources:' at the top level")
    try:
        cfg = KbConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = _loc_to_key(tuple(err["loc"]), data) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        raise ConfigError(path, key, msg, _fix_for(err)) from None
    cfg.config_path = path
    cfg.base_dir = base_dir
    seen: set[str] = set()
    for i, s in enumerate(cfg.sources):
        if s.key in seen:
            raise ConfigError(path, f"sources[{i}].key", f"duplicate key {s.key!r}", "give each source a unique key")
        seen.add(s.key)
    return cfg


def check_environment(cfg: KbConfig, *, need_sources: bool = True) -> None:
    """Checks that need the outside world: roots exist, keys are set."""
    if need_sources:
        for s in cfg.sources:
            if not s.enabled:
                continue
            root = cfg.source_root(s)
            if not root.exists():
                raise ConfigError(cfg.config_path, f"sources[{s.key}].root", f"{root} does not exist",
                                  "fix the path (relative paths are relative to the config file)")
            if not root.is_dir():
                raise ConfigError(cfg.config_path, f"sources[{s.key}].root", f"{root} is not a folder",
                                  "point root at a folder")
            from kb_assets.sources.roots import check_root

            check_root(root, s, cfg.config_path)
    if cfg.embedder == "voyage" and not os.environ.get(VOYAGE_KEY_ENV):
        raise ConfigError(cfg.config_path, "embedder", "is 'voyage' but VOYAGE_API_KEY is not set",
                          "export VOYAGE_API_KEY=... or set 'embedder: local'")
    if cfg.signposter == "gemini" and not any(os.environ.get(k) for k in GEMINI_KEY_ENVS):
        raise ConfigError(cfg.config_path, "signposter", "is 'gemini' but GEMINI_API_KEY is not set",
                          "export GEMINI_API_KEY=... or set 'signposter: extractive'")


def default_config(cwd: Path | None = None) -> KbConfig:
    """No kb.yaml: index the current git repository's docs and code (or the current folder)."""
    from kb_assets.sources.gitutil import work_tree_top

    cwd = (cwd or Path.cwd()).resolve()
    top = work_tree_top(cwd) or cwd
    data = {
        "data_dir": str(top / ".kb"),
        "sources": [
            {"key": "docs", "kind": "doc", "root": str(top), "include": list(DEFAULT_DOC_GLOBS), "auto_kind": True},
            {"key": "code", "kind": "code", "root": str(top), "exclude": list(DEFAULT_DOC_GLOBS)},
        ],
    }
    return parse_config(data, path="<default config>", base_dir=str(top))


def resolve_config_path(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    if explicit:
        return Path(explicit)
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    here = Path.cwd() / "kb.yaml"
    return here if here.exists() else None


def load_config(explicit: str | os.PathLike[str] | None = None) -> KbConfig:
    path = resolve_config_path(explicit)
    if path is None:
        return default_config()
    if not path.exists():
        raise ConfigError(str(path), "(file)", "does not exist", "create it or pass --config with the right path")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(file)"
        raise ConfigError(str(path), where, f"is not valid YAML ({getattr(exc, 'problem', exc)})",
                          "fix the YAML syntax") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "(file)", "is not UTF-8 text", "save it as UTF-8") from None
    return parse_config(data, path=str(path), base_dir=str(path.resolve().parent))
