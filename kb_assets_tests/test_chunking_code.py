"""Chunking source code: Python by `ast`, TypeScript / Go / others by tree-sitter, the rest by line windows."""
from __future__ import annotations

import textwrap

import pytest
from tokenizers import Tokenizer

from kb_assets.chunking import chunk_document, default_tokenizer_path, language_for, make_token_counter
from kb_assets.chunking.code import LINE_WINDOW, code_sections, get_parser
from kb_assets.chunking.core import Lines
from kb_assets.models import Chunk, SourceDocument

MAX = 254


@pytest.fixture(scope="module")
def counter():
    return make_token_counter()


@pytest.fixture(scope="module")
def raw() -> Tokenizer:
    tok = Tokenizer.from_file(str(default_tokenizer_path()))
    tok.no_truncation()
    tok.no_padding()
    return tok


def check(doc: SourceDocument, chunks: list[Chunk], raw: Tokenizer, max_tokens: int = MAX) -> None:
    lines = doc.text.split("\n")
    real = [len(e.ids) for e in raw.encode_batch([c.embedding_text() for c in chunks], add_special_tokens=False)]
    for c, n in zip(chunks, real):
        assert c.text in "\n".join(lines[c.start_line - 1:c.end_line])
        assert c.token_count == n <= max_tokens
    covered = {i for c in chunks for i in range(c.start_line, c.end_line + 1)}
    missing = [i + 1 for i, line in enumerate(lines) if line.strip() and i + 1 not in covered]
    assert not missing, missing                       # code keeps every non-blank line


def run(path: str, text: str, counter, max_tokens: int = MAX):
    doc = SourceDocument(path=path, kind="code", title="", text=text)
    return doc, chunk_document(doc, max_tokens=max_tokens, count_tokens=counter)


def method(i: int, indent: str = "    ") -> str:
    body = f'''
def method_{i}(self, value: int) -> int:
    """Method {i}: scale the value by the factor and clamp it into the configured window."""
    scaled = value * {i} + self.offset
    if scaled > self.upper:
        return self.upper
    return max(scaled, self.lower)
'''
    return textwrap.indent(body.strip("\n"), indent)


PY = '''"""Module docstring: helpers for the budget."""
import os
from typing import Any

LIMIT = 10


# comment that belongs to the decorated function below
@functools.lru_cache(maxsize=None)
def cached(key: str) -> str:
    """Docstring kept with its def."""
    return key.upper()


class Small:
    """A small class stays whole."""

    def a(self):
        return 1


class Big:
    """A big class is split by its methods."""

    offset = 1
    upper = 100
    lower = 0

''' + "\n\n".join(method(i) for i in range(24)) + '''


async def tail_function(x):
    return await x
'''


def test_python_definitions_classes_and_methods(counter, raw):
    doc, chunks = run("pkg/budget.py", PY, counter)
    check(doc, chunks, raw)
    headings = [c.heading for c in chunks]
    assert headings[0] == "cached"                       # tiny module statements lead into the first def
    assert chunks[0].text.startswith('"""Module docstring')
    cached = chunks[0].text
    assert "# comment that belongs" in cached and "@functools.lru_cache" in cached and '"""Docstring kept' in cached
    assert "Small" in headings
    small = chunks[headings.index("Small")]
    assert "def a(self)" in small.text                    # a class under budget is one chunk
    methods = [h for h in headings if h.startswith("Big.method_")]
    assert methods == [f"Big.method_{i}" for i in range(24)]
    assert "tail_function" in headings
    first = chunks[headings.index("Big.method_0")]
    assert '"""A big class is split' in first.text or "Big" in headings     # class header kept, not lost


def test_python_large_function_is_split_by_lines_within_budget(counter, raw):
    body = "\n".join(f"    total += compute_step_{i}(value, factor={i})  # step {i}" for i in range(300))
    text = f"def huge(value):\n    total = 0\n{body}\n    return total\n"
    doc, chunks = run("huge.py", text, counter, max_tokens=128)
    check(doc, chunks, raw, 128)
    assert len(chunks) >= 10 and all(c.heading == "huge" for c in chunks)
    assert all(c.text.split("\n")[0].lstrip().startswith(("total", "def", "return")) for c in chunks)  # line starts
    assert any(chunks[i].end_line >= chunks[i + 1].start_line for i in range(len(chunks) - 1))       # overlap


def test_python_syntax_error_falls_back_to_line_windows(counter, raw):
    text = PY.replace("async def tail_function(x):", "async def tail_function(x:")
    _, how = code_sections(text, "bad.py", Lines(text))
    assert how == "lines"
    doc, chunks = run("bad.py", text, counter)
    check(doc, chunks, raw)
    assert all(c.heading == "" for c in chunks)
    assert all(c.end_line - c.start_line + 1 <= LINE_WINDOW + 5 for c in chunks)
    assert any(chunks[i].end_line >= chunks[i + 1].start_line for i in range(len(chunks) - 1))


def test_unknown_extension_gives_token_bounded_line_windows(counter, raw):
    text = "\n".join(f"entry {i}: value={i * 7} flag=on" for i in range(500))
    assert language_for("data.weird") is None
    doc, chunks = run("data.weird", text, counter)
    check(doc, chunks, raw)
    assert len(chunks) >= 500 // LINE_WINDOW
    assert all(c.end_line - c.start_line + 1 <= LINE_WINDOW + 5 for c in chunks)


TS = '''import { Injectable } from "@angular/core";
import type { Dep } from "./dep";

/** Options for the service. */
export interface Options {
  retries: number;
  timeoutMs: number;
}

export type Mode = "fast" | "safe";

export function greet(name: string): string {
  // a comment inside
  return `hello ${name}`;
}

export const double = (n: number): number => n * 2;

@Injectable()
export class Service {
  private count = 0;

  constructor(private readonly dep: Dep) {}

''' + "\n\n".join(f'''  handle{i}(request: Request, options: Options): Promise<Response> {{
    // handler {i} validates the request, retries on failure and records the outcome
    this.count += {i};
    return this.dep.send(request, {{ retries: options.retries + {i}, timeoutMs: options.timeoutMs }});
  }}''' for i in range(20)) + '''
}
'''

GO = '''package budget

import (
	"errors"
	"fmt"
)

// ErrOver is returned when the budget is exceeded.
var ErrOver = errors.New("over budget")

// Budget tracks tokens.
type Budget struct {
	limit int
	used  int
}

// Take reserves n tokens or fails.
func (b *Budget) Take(n int) error {
	if b.used+n > b.limit {
		return fmt.Errorf("take %d: %w", n, ErrOver)
	}
	b.used += n
	return nil
}

// New makes a budget.
func New(limit int) *Budget {
	return &Budget{limit: limit}
}
'''


def test_tree_sitter_grammars_are_available_offline():
    for lang in ("typescript", "tsx", "javascript", "go", "rust", "java", "c", "cpp", "ruby", "php",
                 "csharp", "kotlin", "swift", "scala", "bash", "sql", "hcl", "terraform", "yaml", "toml"):
        assert get_parser(lang) is not None, lang


def test_typescript_via_tree_sitter(counter, raw):
    doc, chunks = run("web/src/service.ts", TS, counter)
    _, how = code_sections(TS, "web/src/service.ts", Lines(TS))
    assert how == "tree-sitter:typescript"
    check(doc, chunks, raw)
    headings = [c.heading for c in chunks]
    for name in ("Options", "greet", "double"):
        assert name in headings, headings
    handlers = [h for h in headings if h.startswith("Service.handle")]
    assert handlers == [f"Service.handle{i}" for i in range(20)]
    greet = chunks[headings.index("greet")]
    assert greet.text.startswith("export function greet") and greet.end_line - greet.start_line == 3


def test_go_via_tree_sitter(counter, raw):
    doc, chunks = run("services/budget/budget.go", GO, counter, max_tokens=64)
    _, how = code_sections(GO, "budget.go", Lines(GO))
    assert how == "tree-sitter:go"
    check(doc, chunks, raw, 64)
    headings = [c.heading for c in chunks]
    assert "Budget" in headings and "Budget.Take" in headings and "New" in headings
    take = chunks[headings.index("Budget.Take")]
    assert take.text.startswith("// Take reserves n tokens")         # doc comment kept with its func


@pytest.mark.parametrize("path,text,expect", [
    ("lib.rs", "use std::fmt;\n\npub struct Point { x: i32 }\n\nimpl Point {\n    pub fn norm(&self) -> i32 { self.x }\n}\n\n"
     "fn main() {\n    println!(\"hi\");\n}\n", {"Point", "impl Point", "main"}),
    ("App.java", "package a;\n\npublic class App {\n  public static void main(String[] args) {\n    System.out.println(1);\n"
     "  }\n}\n", {"App"}),
    ("main.tf", 'resource "aws_s3_bucket" "logs" {\n  bucket = "logs"\n}\n\nvariable "region" {\n  default = "eu"\n}\n',
     {'resource "aws_s3_bucket" "logs"', 'variable "region"'}),
    ("deploy.yaml", "name: api\nreplicas: 3\nspec:\n  containers:\n    - image: api:1\n", {"spec"}),  # tiny keys merge
    ("util.c", "#include <stdio.h>\n\nstatic int add(int a, int b) {\n  return a + b;\n}\n\nint main(void) {\n  return add(1, 2);\n}\n",
     {"add", "main"}),
])
def test_other_languages(counter, raw, path, text, expect):
    doc, chunks = run(path, text, counter, max_tokens=64)
    check(doc, chunks, raw, 64)
    assert expect <= {c.heading for c in chunks}, [c.heading for c in chunks]


def test_code_edit_changes_only_the_edited_definition(counter, raw):
    doc, before = run("pkg/budget.py", PY, counter)
    edited = PY.replace("scaled = value * 7 + self.offset", "scaled = value * 7 + self.offset + 1")
    assert edited != PY
    doc2, after = run("pkg/budget.py", edited, counter)
    check(doc2, after, raw)
    changed = [c.heading for c in after if c.chunk_hash not in {b.chunk_hash for b in before}]
    assert changed == ["Big.method_7"]
