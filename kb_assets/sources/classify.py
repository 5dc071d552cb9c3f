"""What a path is, decided from its name alone (cheap, no read): vendored, generated, lock file, binary by
extension, programming language, document kind (auto_kind). Content checks live in `content.py`.

Languages come from Pygments' own filename table (maintained upstream, ~600 lexers) rather than a table
of ours: `language_for_path("src/app.tsx") -> ("tsx", "TSX")`. The id is the lexer's first alias
(lowercase: python, typescript, tsx, javascript, go, rust, csharp, cpp, c, bash, yaml, toml, hcl/terraform,
...), the name its display name. A handful of ambiguous extensions are pinned (.pl is Perl here, not Prolog).
"""
from __future__ import annotations

import fnmatch
import posixpath
import re
from functools import lru_cache

from kb_assets.models import Skip

# Folders of third-party or installed code: never indexed unless an include pattern names them.
VENDORED_DIRS = frozenset({
    "vendor", "vendors", "node_modules", "third_party", "third-party", "thirdparty", ".venv", "venv",
    "site-packages", "dist-packages", "dist", "build", "bower_components", "jspm_packages", "Pods",
    "Carthage", ".bundle", ".yarn", ".pnpm-store", "__vendor__", "external_libs",
})
# Caches and tool state: generated, never worth reading.
CACHE_DIRS = frozenset({
    ".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox", ".nox",
    ".cache", ".gradle", ".next", ".nuxt", ".parcel-cache", ".terraform", ".eggs", ".ipynb_checkpoints",
    ".kb", ".dagster", ".hypothesis", "coverage", "htmlcov", ".turbo", ".angular",
})

LOCK_FILES = frozenset({
    "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml", "bun.lockb", "bun.lock",
    "poetry.lock", "Pipfile.lock", "pdm.lock", "uv.lock", "Cargo.lock", "Gemfile.lock", "composer.lock",
    "go.sum", "mix.lock", "Podfile.lock", "pubspec.lock", "flake.lock", "packages.lock.json",
    "gradle.lockfile", "Package.resolved", ".terraform.lock.hcl", "conda-lock.yml", "deno.lock",
})
# Generated-by-name (a content check catches "Code generated ... DO NOT EDIT" and friends).
GENERATED_NAME_PATTERNS = (
    "*_pb2.py", "*_pb2_grpc.py", "*_pb2.pyi", "*.pb.go", "*.pb.cc", "*.pb.h", "*.pb.swift", "*_grpc.pb.go",
    "*.min.js", "*.min.css", "*.min.mjs", "*-min.js", "*.bundle.js", "*.chunk.js", "*.js.map", "*.css.map",
    "*.map", "*.generated.*", "*_generated.go", "*.g.dart", "*.freezed.dart", "*.designer.cs", "*.Designer.cs",
    "*_generated.rs", "*.pyc", "*.pyo",
)
_GENERATED_NAME_RE = re.compile("|".join(fnmatch.translate(p) for p in GENERATED_NAME_PATTERNS))

# Extensions that are never text we want (skipped as "binary" without opening them).
BINARY_EXTENSIONS = frozenset("""
png jpg jpeg gif bmp tif tiff ico icns webp avif heic psd ai eps svgz raw cr2 nef
mp3 mp4 m4a m4v mov avi mkv webm wav flac ogg oga opus aac wma wmv flv mpg mpeg 3gp
zip gz tgz bz2 xz lz lzma zst 7z rar tar jar war ear whl egg apk ipa dmg iso img deb rpm msi cab
exe dll so dylib a lib o obj ko bin elf class dex wasm pyc pyo pyd beam
pdf doc docx xls xlsx ppt pptx odt ods odp key numbers pages rtf epub mobi
ttf otf woff woff2 eot svg
sqlite sqlite3 db mdb accdb parquet feather arrow avro orc npy npz pkl pickle joblib h5 hdf5 nc mat
onnx pt pth ckpt safetensors tflite pb gguf ggml
""".split())
# Text data, not code (kind "code" skips these as not-code).
DATA_EXTENSIONS = frozenset("""
json jsonl ndjson geojson csv tsv psv txt text log dat out err tmp bak swp sav ipynb
lock sum
""".split())
# Pygments lexers that are not programming languages for our purposes.
NON_CODE_LEXERS = frozenset({"Text only", "JSON", "JSONLD", "Raw token data", "Text output", "Data",
                             "JSON5", "Output"})
# Document-like extensions (auto_kind: never "code").
DOC_EXTENSIONS = frozenset({"md", "markdown", "mdx", "rst", "txt", "adoc", "asciidoc", "org", "mdc", "textile",
                            "ipynb"})   # notebooks: read as markdown with code blocks (sources.notebooks)

_PINNED_EXT = {  # extensions Pygments resolves ambiguously without content
    ".pl": "perl", ".pm": "perl", ".t": "perl", ".sql": "sql", ".h": "c", ".inc": "php", ".v": "verilog",
    ".fs": "fsharp", ".cl": "common-lisp", ".m": "objective-c", ".ts": "typescript", ".mts": "typescript",
    ".cts": "typescript", ".hcl": "terraform",
}
_SHEBANG_LANG = {
    "python": "python", "python3": "python", "python2": "python", "bash": "bash", "sh": "bash", "zsh": "bash",
    "dash": "bash", "ksh": "bash", "node": "javascript", "nodejs": "javascript", "deno": "typescript",
    "bun": "javascript", "ruby": "ruby", "perl": "perl", "php": "php", "lua": "lua", "Rscript": "r",
    "fish": "fish", "tclsh": "tcl", "pwsh": "powershell", "osascript": "applescript", "awk": "awk",
}


def basename(path: str) -> str:
    return posixpath.basename(path)


def extension(path: str) -> str:
    b = basename(path)
    i = b.rfind(".")
    return b[i + 1:].lower() if i > 0 else ""


def vendored_dir(path: str) -> str | None:
    """The first vendored folder on the path (as a root-relative folder path), or None."""
    parts = path.split("/")[:-1]
    for i, seg in enumerate(parts):
        if seg in VENDORED_DIRS or (seg.endswith(".egg-info")):
            return "/".join(parts[: i + 1])
    return None


def cache_dir(path: str) -> str | None:
    parts = path.split("/")[:-1]
    for i, seg in enumerate(parts):
        if seg in CACHE_DIRS:
            return "/".join(parts[: i + 1])
    return None


def name_skip(path: str, *, kind: str, include_mentions: frozenset[str] = frozenset()) -> Skip | None:
    """Skip decided from the path alone, or None. `include_mentions`: folder names an include pattern names.

    Cache and tool-state folders (.git, __pycache__, .mypy_cache, ...) are not skips but silent drops:
    callers check `cache_dir()` first.
    """
    d = vendored_dir(path)
    if d is not None and d.rsplit("/", 1)[-1] not in include_mentions:
        return Skip(d, "vendored", f"third-party or build folder {d}/ is not indexed")
    b = basename(path)
    if b in LOCK_FILES:
        return Skip(path, "generated", f"{b} is a dependency lock file")
    if _GENERATED_NAME_RE.match(b):
        return Skip(path, "generated", f"{b}: generated file (by its name)")
    ext = extension(path)
    if ext in BINARY_EXTENSIONS:
        return Skip(path, "binary", f".{ext} files are images or binary data (by extension)")
    if kind == "code":
        special_re, _ = _pygments_tables()
        if ext in DATA_EXTENSIONS and not special_re.match(b):
            return Skip(path, "not-code", f".{ext} is data or plain text, not source code")
        # Files without an extension may be scripts with a shebang: the reader decides.
        if ext and language_for_path(path, None) is None:
            return Skip(path, "not-code", f"no programming language is known for {b!r}")
    return None


# --- languages -------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _pygments_tables() -> tuple[re.Pattern[str], dict[str, tuple[str, str]]]:
    from pygments.lexers._mapping import LEXERS

    special: list[str] = []
    simple_re = re.compile(r"^\*\.[^*?\[./]+$")
    by_alias: dict[str, tuple[str, str]] = {}
    for _module, name, aliases, filenames, _mimes in LEXERS.values():
        if aliases:
            by_alias.setdefault(aliases[0], (aliases[0], name))
        for pat in filenames:
            if not simple_re.match(pat):
                special.append(fnmatch.translate(pat))
    return re.compile("|".join(special) or r"(?!)"), by_alias


@lru_cache(maxsize=4096)
def _lexer_for_key(key: str) -> tuple[str, str] | None:
    from pygments.lexers import find_lexer_class_for_filename
    from pygments.util import ClassNotFound

    try:
        cls = find_lexer_class_for_filename(key)
    except ClassNotFound:  # pragma: no cover - returns None in practice
        return None
    if cls is None or cls.name in NON_CODE_LEXERS:
        return None
    alias = cls.aliases[0] if cls.aliases else cls.name.lower()
    return alias, cls.name


def language_for_path(path: str, first_line: str | None) -> tuple[str, str] | None:
    """(language id, display name) from the file name (Pygments' table), else from a shebang line."""
    b = basename(path)
    ext = "." + extension(path) if extension(path) else ""
    special_re, by_alias = _pygments_tables()
    if ext in _PINNED_EXT and not special_re.match(b):
        alias = _PINNED_EXT[ext]
        found = by_alias.get(alias)
        if found:
            return found
    key = b if (not ext or special_re.match(b)) else "x" + b[b.rfind("."):]
    hit = _lexer_for_key(key)
    if hit is not None:
        return hit
    if first_line and first_line.startswith("#!"):
        words = first_line[2:].strip().split()
        if words:
            prog = posixpath.basename(words[0])
            if prog == "env" and len(words) > 1:
                prog = next((w for w in words[1:] if not w.startswith("-")), "")
            prog = re.sub(r"[\d.]+$", "", prog) or prog
            lang = _SHEBANG_LANG.get(prog) or _SHEBANG_LANG.get(prog.rstrip("0123456789."))
            if lang:
                return by_alias.get(lang, (lang, lang.title()))
    return None


# --- kinds -----------------------------------------------------------------------------------------

AGENT_FILES = frozenset({
    "claude.md", "claude.local.md", "agents.md", "agent.md", "gemini.md", ".cursorrules", ".windsurfrules",
    "copilot-instructions.md", ".clinerules", "conventions.md",
})
ADR_DIRS = frozenset({"adr", "adrs", "decisions", "decision-records", "architecture-decisions",
                      "decision-log", "design-decisions"})
_ADR_NAME_RE = re.compile(r"^(?:adr[-_ ]?\d+|\d{3,4}-[^/]+\.(?:md|markdown|rst|txt))", re.IGNORECASE)
_DATED_NAME_RE = re.compile(r"^(?:19|20)\d{2}-?[01]\d-?[0-3]\d(?:[T_\-. ]|$)")
SESSION_DIRS = frozenset({"sessions", "session-notes", "session_notes", "journal", "devlog", "worklog"})


def auto_kind_for(path: str, default: str) -> str:
    """Kind of a file in a mixed tree (`auto_kind: true`), from its path only.

    README* -> readme; CLAUDE.md, AGENTS.md, GEMINI.md, .cursorrules, copilot-instructions.md,
    .cursor/rules/*.mdc -> agents_md; under an adr/decisions folder or named ADR-NNN / adr-012-* -> adr;
    dated file names (2026-01-31-topic.md, 20260131_x.md) or a sessions/ folder -> session; in a "code"
    source a file without a document extension stays code; everything else -> `default` (the source kind).
    A PEP-style header ("PEP: 8") read later also turns a doc into an adr (see readers).
    """
    b = basename(path)
    low = b.lower()
    parts = [p.lower() for p in path.split("/")[:-1]]
    ext = extension(path)
    if low.startswith("readme"):
        return "readme"
    if low in AGENT_FILES or (ext == "mdc" and ".cursor" in parts):
        return "agents_md"
    if default == "code" and ext not in DOC_EXTENSIONS:
        return "code"
    if ext in DOC_EXTENSIONS or default != "code":
        if _ADR_NAME_RE.match(b) and (low.startswith("adr") or any(p in ADR_DIRS for p in parts)):
            return "adr"
        if any(p in ADR_DIRS for p in parts):
            return "adr"
        if _DATED_NAME_RE.match(b) or any(p in SESSION_DIRS for p in parts):
            return "session"
        return "doc" if default == "code" else default
    return default


def kind_for(path: str, source_kind: str, auto_kind: bool) -> str:
    return auto_kind_for(path, source_kind) if auto_kind else source_kind
