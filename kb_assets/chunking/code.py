"""Source code: one section per top-level definition.

Python is parsed with `ast`: functions and classes (decorators and the comment lines right above them
included; docstrings are inside) are sections headed by their name; the module-level statements between
them are grouped. A class over the budget is split by members: "Class" (its header, docstring and
attributes) and "Class.method" sections, recursively for nested classes.

Other languages are parsed with tree-sitter grammars from `tree-sitter-language-pack` (`get_parser(name)`),
top-level definition nodes by node type, containers (classes, impl blocks, namespaces, modules, ...)
split by members when over budget. Single wrappers (a C header guard, a YAML document, an HCL body) are
looked through.

No grammar, a parse failure or a syntax error: line windows of up to LINE_WINDOW lines, token-bounded,
with a few lines of overlap.
"""
from __future__ import annotations

import ast
import re
import threading
from typing import Callable

from kb_assets.chunking.core import Lines, Section
from kb_assets.sources.python_ast import parse_python

LINE_WINDOW = 60

EXTENSION_LANGUAGES = {
    ".py": "python", ".pyi": "python", ".pyw": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust", ".java": "java",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".c++": "cpp", ".hpp": "cpp",
    ".hh": "cpp", ".hxx": "cpp", ".ipp": "cpp", ".cu": "cuda",
    ".rb": "ruby", ".rake": "ruby", ".gemspec": "ruby", ".php": "php", ".cs": "csharp",
    ".kt": "kotlin", ".kts": "kotlin", ".swift": "swift", ".scala": "scala", ".sc": "scala",
    ".sh": "bash", ".bash": "bash", ".zsh": "bash", ".ksh": "bash", ".fish": "fish",
    ".sql": "sql", ".tf": "terraform", ".tfvars": "terraform", ".hcl": "hcl",
    ".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json",
    ".lua": "lua", ".ex": "elixir", ".exs": "elixir", ".erl": "erlang", ".hrl": "erlang",
    ".hs": "haskell", ".ml": "ocaml", ".mli": "ocaml_interface", ".dart": "dart", ".r": "r",
    ".jl": "julia", ".clj": "clojure", ".cljs": "clojure", ".cljc": "clojure", ".el": "elisp",
    ".pl": "perl", ".pm": "perl", ".ps1": "powershell", ".psm1": "powershell",
    ".groovy": "groovy", ".gradle": "groovy", ".zig": "zig", ".nim": "nim", ".proto": "proto",
    ".graphql": "graphql", ".gql": "graphql", ".css": "css", ".scss": "scss", ".html": "html",
    ".htm": "html", ".vue": "vue", ".svelte": "svelte", ".xml": "xml", ".m": "objc", ".mm": "objc",
    ".nix": "nix", ".cmake": "cmake", ".mk": "make", ".sol": "solidity", ".v": "verilog",
    ".vhd": "vhdl", ".vhdl": "vhdl", ".f90": "fortran", ".f": "fortran", ".jsonnet": "jsonnet",
    ".tex": "latex", ".gleam": "gleam", ".odin": "odin", ".purs": "purescript", ".bzl": "starlark",
}
FILENAME_LANGUAGES = {
    "dockerfile": "dockerfile", "containerfile": "dockerfile", "makefile": "make", "gnumakefile": "make",
    "cmakelists.txt": "cmake", "jenkinsfile": "groovy", "rakefile": "ruby", "gemfile": "ruby",
    "vagrantfile": "ruby", "build": "starlark", "build.bazel": "starlark", "workspace": "starlark",
}

# Configuration and data: a key is not a definition worth a chunk of its own when it is tiny.
DATA_LANGUAGES = frozenset({"yaml", "toml", "json", "json5", "hcl", "terraform", "ini", "properties", "xml", "html",
                            "css", "scss"})

_HASH_COMMENTS = ("#",)
_C_COMMENTS = ("//", "/*", "*")
_COMMENTS = {
    "python": _HASH_COMMENTS, "ruby": _HASH_COMMENTS, "bash": _HASH_COMMENTS, "fish": _HASH_COMMENTS,
    "yaml": _HASH_COMMENTS, "toml": _HASH_COMMENTS, "perl": _HASH_COMMENTS, "r": _HASH_COMMENTS,
    "elixir": _HASH_COMMENTS, "make": _HASH_COMMENTS, "dockerfile": _HASH_COMMENTS, "nix": _HASH_COMMENTS,
    "terraform": ("#", "//", "/*", "*"), "hcl": ("#", "//", "/*", "*"), "starlark": _HASH_COMMENTS,
    "sql": ("--", "/*", "*"), "lua": ("--",), "haskell": ("--", "{-"), "elisp": (";",), "clojure": (";",),
    "erlang": ("%",), "latex": ("%",), "powershell": ("#", "<#"),
}

_DEF_TYPES = re.compile(
    r"function|method|class|interface|struct|enum|trait|impl_item|module|namespace|type_alias|"
    r"type_declaration|type_definition|type_item|object_declaration|object_definition|record|protocol|"
    r"extension|union|macro_definition|macro_rules|mod_item|template_declaration|const_item|static_item|"
    r"subroutine|procedure|contract|^block$|^table$|table_array_element|rule_set|block_mapping_pair|"
    r"^pair$|^statement$|^instruction$|^rule$|^element$")
_CONTAINER_TYPES = re.compile(
    r"class|interface|impl_item|trait|module|namespace|object_declaration|object_definition|struct_item|"
    r"protocol|extension|contract|^block$|export_statement|template_declaration|block_mapping_pair|^pair$|"
    r"^element$|^table$")
_BODY_TYPES = {"class_body", "declaration_list", "field_declaration_list", "block", "body_statement",
               "template_body", "enum_body", "interface_body", "object_body", "body", "enum_class_body",
               "protocol_body", "block_node", "block_mapping", "object", "enum_variant_list",
               "namespace_body", "compound_statement"}
_FUNCTION_VALUES = re.compile(r"function|arrow|class|lambda")

_local = threading.local()


def language_for(path: str) -> str | None:
    name = path.rsplit("/", 1)[-1].lower()
    if name in FILENAME_LANGUAGES:
        return FILENAME_LANGUAGES[name]
    dot = name.rfind(".")
    if dot <= 0:
        return None
    return EXTENSION_LANGUAGES.get(name[dot:])


def get_parser(lang: str):
    """A tree-sitter parser for `lang` from tree-sitter-language-pack, or None (cached per thread)."""
    cache = getattr(_local, "parsers", None)
    if cache is None:
        cache = _local.parsers = {}
    if lang not in cache:
        try:
            from tree_sitter_language_pack import get_parser as _get

            cache[lang] = _get(lang)
        except Exception:   # grammar missing from the pack, a pack that downloads grammars while offline, ...
            cache[lang] = None
    return cache[lang]


def _is_comment(line: str, prefixes: tuple[str, ...]) -> bool:
    s = line.lstrip()
    return bool(s) and s.startswith(prefixes)


def code_sections_from_defs(lines: Lines, defs: list[tuple[int, int, str, Callable | None]], *,
                            region: tuple[int, int], group_heading: str,
                            comments: tuple[str, ...], merge_defs: bool = False) -> list[Section]:
    """Sections for definitions (0-based line ranges [start, end)) and the groups of lines between them.

    A definition takes the comment lines directly above it. `alt(start, end)` gives finer sections.
    Every non-blank line of `region` ends up in exactly one section.
    """
    a0, b0 = region
    out: list[Section] = []
    cursor = a0
    for start, end, heading, alt in sorted(defs, key=lambda d: d[0]):
        start = max(start, cursor)
        end = min(end, b0)
        if end <= start:
            continue
        while start - 1 >= cursor and _is_comment(lines.line(start - 1), comments):
            start -= 1
        if cursor < start:
            r = lines.char_range(cursor, start)
            if r:
                out.append(Section(group_heading, [r], mode="code"))
        r = lines.char_range(start, end)
        if r:
            alternative = (lambda f=alt, s=start, e=end: f(s, e)) if alt is not None else None
            # definitions are never merged into a neighbour (their name heads the chunk); the statements
            # between them are, when tiny
            out.append(Section(heading, [r], mode="code", alternative=alternative, mergeable=merge_defs))
        cursor = end
    if cursor < b0:
        r = lines.char_range(cursor, b0)
        if r:
            out.append(Section(group_heading, [r], mode="code"))
    return out


# ----------------------------------------------------------------------------- Python
def python_sections(text: str, lines: Lines) -> list[Section] | None:
    try:
        tree = parse_python(text)
    except Exception:    # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
        return None
    defs = _py_defs(lines, tree.body, "", 0)
    return code_sections_from_defs(lines, defs, region=(0, lines.count), group_heading="", comments=_HASH_COMMENTS)


def _py_defs(lines: Lines, body, prefix: str, depth: int):
    defs = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            name = prefix + node.name
            alt = None
            if isinstance(node, ast.ClassDef) and depth < 3:
                alt = (lambda s, e, node=node, name=name:
                       code_sections_from_defs(lines, _py_defs(lines, node.body, name + ".", depth + 1),
                                               region=(s, e), group_heading=name, comments=_HASH_COMMENTS))
            defs.append((start, node.end_lineno, name, alt))
    return defs


# ----------------------------------------------------------------------------- tree-sitter
class _TS:
    def __init__(self, src: bytes, lang: str, lines: Lines):
        self.src = src
        self.lang = lang
        self.lines = lines
        self.comments = _COMMENTS.get(lang, ("//", "/*", "*", "#", "--"))

    def text(self, node) -> str:
        return self.src[node.start_byte:node.end_byte].decode("utf-8", "replace")

    @staticmethod
    def rows(node) -> tuple[int, int]:
        a = node.start_point[0]
        b = node.end_point[0] + (1 if node.end_point[1] > 0 else 0)
        return a, max(a + 1, b)

    def is_def(self, node) -> bool:
        t = node.type
        if "comment" in t:
            return False
        if t == "export_statement":
            d = node.child_by_field_name("declaration") or node.child_by_field_name("value")
            return d is not None and (self.is_def(d) or bool(_FUNCTION_VALUES.search(d.type)))
        if t in ("lexical_declaration", "variable_declaration"):
            for c in node.named_children:
                v = c.child_by_field_name("value")
                if v is not None and _FUNCTION_VALUES.search(v.type):
                    return True
            return False
        return bool(_DEF_TYPES.search(t))

    def name(self, node) -> str:
        t = node.type
        if t == "export_statement":
            d = node.child_by_field_name("declaration") or node.child_by_field_name("value")
            return self.name(d) if d is not None else "export"
        if t in ("lexical_declaration", "variable_declaration"):
            names = [self.text(n) for c in node.named_children if (n := c.child_by_field_name("name")) is not None]
            if names:
                return ", ".join(names)
        if t == "impl_item":
            ty, tr = node.child_by_field_name("type"), node.child_by_field_name("trait")
            if ty is not None:
                return f"impl {self.text(tr)} for {self.text(ty)}" if tr is not None else f"impl {self.text(ty)}"
        if t == "method_declaration" and self.lang == "go":
            recv = node.child_by_field_name("receiver")
            n = node.child_by_field_name("name")
            if recv is not None and n is not None:
                typ = self.text(recv).strip("()").split()[-1].lstrip("*") if self.text(recv).strip("()") else ""
                return f"{typ}.{self.text(n)}" if typ else self.text(n)
        if t == "type_declaration":
            for c in node.named_children:
                n = c.child_by_field_name("name")
                if n is not None:
                    return self.text(n)
        n = node.child_by_field_name("name") or node.child_by_field_name("key")
        if n is not None:
            return self.text(n)
        d = node.child_by_field_name("declarator")
        for _ in range(8):
            if d is None:
                break
            inner = d.child_by_field_name("declarator")
            if inner is None:
                return self.text(d)
            d = inner
        if t == "block":      # HCL: resource "aws_s3_bucket" "logs" { ... }
            parts = []
            for c in node.children:
                if c.type in ("{", "block_start", "body"):
                    break
                parts.append(self.text(c))
            if parts:
                return " ".join(parts)
        first = self.text(node).lstrip().split("\n", 1)[0].strip()
        return first.rstrip("{:(").strip()[:60]

    def body_of(self, node):
        if node.type == "export_statement":
            d = node.child_by_field_name("declaration")
            return self.body_of(d) if d is not None else None
        b = node.child_by_field_name("body") or node.child_by_field_name("value")
        if b is not None and b.named_child_count:
            return b
        for c in node.named_children:
            if c.type in _BODY_TYPES or c.type.endswith("_body"):
                return c
        return None

    def top_nodes(self, root) -> list:
        nodes = list(root.named_children)
        for _ in range(6):
            sig = [n for n in nodes if "comment" not in n.type]
            if len(sig) != 1 or self.is_def(sig[0]) or sig[0].named_child_count == 0:
                break
            nodes = list(sig[0].named_children)
        return nodes

    def defs(self, nodes, prefix: str, depth: int):
        out = []
        for n in nodes:
            if not self.is_def(n):
                continue
            a, b = self.rows(n)
            name = prefix + (self.name(n) or n.type)
            alt = None
            if depth < 3 and _CONTAINER_TYPES.search(n.type):
                body = self.body_of(n)
                if body is not None:
                    alt = (lambda s, e, body=body, name=name:
                           code_sections_from_defs(self.lines, self.defs(self._members(body), name + ".", depth + 1),
                                                   region=(s, e), group_heading=name, comments=self.comments,
                                                   merge_defs=self.lang in DATA_LANGUAGES))
            out.append((a, b, name, alt))
        return out

    def _members(self, body) -> list:
        nodes = list(body.named_children)
        for _ in range(4):      # YAML block_node → block_mapping → pairs
            sig = [n for n in nodes if "comment" not in n.type]
            if len(sig) != 1 or self.is_def(sig[0]) or sig[0].named_child_count == 0:
                break
            nodes = list(sig[0].named_children)
        return nodes


def treesitter_sections(text: str, lang: str, lines: Lines) -> list[Section] | None:
    parser = get_parser(lang)
    if parser is None:
        return None
    src = text.encode("utf-8", "replace")
    try:
        tree = parser.parse(src)
    except Exception:
        return None
    ts = _TS(src, lang, lines)
    root = tree.root_node
    if root.has_error and _mostly_errors(root):
        return None
    defs = ts.defs(ts.top_nodes(root), "", 0)
    return code_sections_from_defs(lines, defs, region=(0, lines.count), group_heading="", comments=ts.comments,
                                   merge_defs=lang in DATA_LANGUAGES)


def _mostly_errors(root) -> bool:
    bad = sum(c.end_byte - c.start_byte for c in root.children if c.type == "ERROR" or c.is_missing)
    return bad > (root.end_byte - root.start_byte) // 2


# ----------------------------------------------------------------------------- fallback
def line_window_sections(text: str, lines: Lines) -> list[Section]:
    blocks = []
    for i in range(lines.count):
        r = lines.char_range(i, i + 1)
        if r:
            blocks.append(r)
    return [Section("", blocks, mode="code", max_lines=LINE_WINDOW)] if blocks else []


def code_sections(text: str, path: str, lines: Lines) -> tuple[list[Section], str]:
    """Sections for a source file and how they were found: "ast", "tree-sitter:<lang>" or "lines"."""
    lang = language_for(path)
    secs = None
    how = "lines"
    if lang == "python":
        secs = python_sections(text, lines)
        how = "ast"
    elif lang:
        secs = treesitter_sections(text, lang, lines)
        how = f"tree-sitter:{lang}"
    if secs is None:
        return line_window_sections(text, lines), "lines"
    return secs, how
