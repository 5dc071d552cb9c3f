"""A deterministic synthetic corpus: markdown documents and Python / TypeScript / Go files, made a git repository.

    /work/venv/bin/python bench/synth_corpus.py OUT_DIR [--docs 3000] [--seed 7] [--no-git]

~70% markdown (title, sections, paragraphs, bullet and numbered lists, code fences, sub-headings) and ~30%
code (Python ~15%, TypeScript ~10%, Go ~5%), from a built-in vocabulary (common technical English plus seeded
pseudo-words and identifiers, drawn with a Zipf-like weighting): no external data. Document i depends only on
(seed, i), so the first 300 documents of a 3,000-document corpus are the 300-document corpus. Sizes are tuned
so 3,000 documents give ≈ 40,000 chunks with the local model's 256-token window (see docs/BENCHMARKS.md).

The mutation helpers (`modify_paragraphs`, `rename_files`, `delete_files`, `git_commit`) are what
bench/pipeline_bench.py uses for the 1% scenarios.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

# --- vocabulary ------------------------------------------------------------------------------------------

_COMMON = """
the of and to a in is that for it as with be on by this are or from at an not which have but we can will
one all when if each more new then so also only into than other its use was has there been should must may
after before while every some any most both between without because where these those what how over under
""".split()
_TECH = """
service request response queue worker batch retry timeout failure error cache index query database table
column row schema migration transaction lock commit branch merge release deploy build test fixture config
setting option default value parameter argument function method class module package library interface
handler client server endpoint route token session user account permission role policy audit log metric
trace span event stream message topic partition offset consumer producer scheduler job task pipeline stage
asset snapshot backup restore replica primary shard cluster node pod container image volume network latency
throughput bandwidth memory disk storage file folder path buffer chunk vector embedding model prompt signal
sensor threshold budget limit quota rate window backoff jitter deadline heartbeat lease election consensus
state machine workflow step input output payload header body field record document version history change
diff patch review approval rollout rollback canary feature flag experiment dashboard alert incident runbook
owner team contract invariant guarantee ordering idempotent duplicate conflict resolution validation parser
serializer encoder decoder compression encryption certificate secret credential key rotation expiry renewal
upstream downstream dependency graph cycle order priority weight score rank filter sort group count sum
average median percentile histogram sample probe health readiness liveness startup shutdown graceful drain
""".split()
_VERBS = """
keeps takes returns writes reads sends receives stores loads checks validates rejects accepts retries drops
skips records reports computes builds runs starts stops waits blocks releases acquires holds moves copies
splits merges sorts filters maps reduces caches evicts expires refreshes rotates signs verifies encodes
decodes parses renders emits consumes publishes subscribes schedules cancels resumes replays truncates
""".split()
_ADJ = """
fast slow small large stale fresh empty full partial complete pending active idle broken healthy degraded
safe unsafe strict lenient local remote shared private public internal external primary secondary optional
required cheap expensive bounded unbounded ordered unordered atomic durable transient explicit implicit
""".split()

_SYLL = ["ka", "lo", "mi", "ne", "ru", "ta", "vo", "zen", "bar", "qui", "dex", "plo", "sta", "tri", "vel",
         "gor", "han", "jun", "kor", "lum", "mar", "nix", "ost", "pra", "sol", "tur", "umb", "vin", "wes", "yal"]


@dataclass
class Vocab:
    words: list[str]
    cum: list[float]
    idents: list[str]
    verbs: list[str]
    adjs: list[str]


def build_vocab(seed: int) -> Vocab:
    rng = random.Random(f"vocab:{seed}")
    pseudo = set()
    while len(pseudo) < 3000:
        pseudo.add("".join(rng.choice(_SYLL) for _ in range(rng.choice((2, 2, 3, 3, 4)))))
    real = list(dict.fromkeys(_COMMON + _TECH + _VERBS + _ADJ))
    words = real + sorted(pseudo)
    # Zipf-like: rank r weighs 1/(r+2)^1.05; real words take the head, pseudo-words the long tail.
    weights = [1.0 / (r + 2) ** 1.05 for r in range(len(words))]
    cum = list(itertools.accumulate(weights))
    idents = sorted({f"{rng.choice(_TECH)}_{rng.choice(_TECH + sorted(pseudo)[:500])}" for _ in range(2500)})
    return Vocab(words, cum, idents, _VERBS, _ADJ)


class Writer:
    """Text generation for one document (its own Random)."""

    def __init__(self, vocab: Vocab, rng: random.Random):
        self.v = vocab
        self.rng = rng

    def words(self, n: int) -> list[str]:
        return self.rng.choices(self.v.words, cum_weights=self.v.cum, k=n)

    def sentence(self, lo: int = 8, hi: int = 22) -> str:
        r = self.rng
        ws = self.words(r.randint(lo, hi))
        # Sprinkle structure real prose has: a verb, an identifier in backticks, a number.
        ws[r.randrange(len(ws))] = r.choice(self.v.verbs)
        if r.random() < 0.3:
            ws[r.randrange(len(ws))] = f"`{r.choice(self.v.idents)}`"
        if r.random() < 0.15:
            ws[r.randrange(len(ws))] = str(r.choice((2, 3, 5, 8, 10, 30, 60, 100, 250, 500, 1000)))
        s = " ".join(ws)
        if r.random() < 0.2:
            i = s.find(" ", len(s) // 2)
            if i > 0:
                s = s[:i] + "," + s[i:]
        return s[0].upper() + s[1:] + "."

    def paragraph(self, lo: int = 3, hi: int = 7) -> str:
        text = " ".join(self.sentence() for _ in range(self.rng.randint(lo, hi)))
        return "\n".join(textwrap.wrap(text, 100))

    def title(self, lo: int = 3, hi: int = 6) -> str:
        ws = self.words(self.rng.randint(lo, hi))
        return " ".join(w.capitalize() for w in ws)

    def ident(self) -> str:
        return self.rng.choice(self.v.idents)

    def camel(self) -> str:
        parts = self.ident().split("_")
        return parts[0] + "".join(p.capitalize() for p in parts[1:])

    def pascal(self) -> str:
        return "".join(p.capitalize() for p in self.ident().split("_"))

    def comment(self, lo: int = 6, hi: int = 14) -> str:
        return self.sentence(lo, hi)


# --- markdown ------------------------------------------------------------------------------------------------

def markdown_doc(w: Writer, size: float) -> str:
    r = w.rng
    out = [f"# {w.title()}", "", w.paragraph(2, 5), ""]
    for _ in range(max(1, round(r.randint(4, 10) * size))):
        out += [f"## {w.title(2, 5)}", ""]
        for _ in range(r.randint(1, 4)):
            x = r.random()
            if x < 0.58:
                out += [w.paragraph(), ""]
            elif x < 0.73:
                out += [f"- {w.sentence(5, 14)}" for _ in range(r.randint(3, 7))] + [""]
            elif x < 0.80:
                out += [f"{k}. {w.sentence(5, 14)}" for k in range(1, r.randint(3, 6) + 1)] + [""]
            elif x < 0.94:
                lang = r.choice(("python", "bash", "yaml", "sql"))
                out += [f"```{lang}", *_fence_body(w, lang), "```", ""]
            else:
                out += [f"### {w.title(2, 4)}", "", w.paragraph(2, 5), ""]
    return "\n".join(out).rstrip() + "\n"


def _fence_body(w: Writer, lang: str) -> list[str]:
    r = w.rng
    n = r.randint(3, 10)
    if lang == "python":
        return [f"{w.ident()} = {w.ident()}({w.ident()}, {r.randint(1, 500)})" for _ in range(n)]
    if lang == "bash":
        return [f"kb {r.choice(('index', 'status', 'recall'))} --{w.ident().replace('_', '-')} {w.ident()}"
                for _ in range(n)]
    if lang == "yaml":
        return [f"{w.ident()}: {r.choice((str(r.randint(1, 900)), 'true', 'false', w.ident()))}" for _ in range(n)]
    return [f"SELECT {w.ident()}, {w.ident()} FROM {w.ident()} WHERE {w.ident()} > {r.randint(1, 99)};"
            for _ in range(n)]


# --- code ----------------------------------------------------------------------------------------------------

def python_file(w: Writer, size: float) -> str:
    r = w.rng
    out = ['"""' + w.sentence(), "", w.paragraph(1, 3), '"""', "from __future__ import annotations", "",
           "import logging", f"from {w.ident()} import {w.ident()}, {w.ident()}", "",
           "log = logging.getLogger(__name__)", ""]
    for _ in range(max(1, round(r.randint(3, 8) * size))):
        if r.random() < 0.35:
            cls = w.pascal()
            out += ["", f"class {cls}:", f'    """{w.sentence()}"""', ""]
            out += ["    def __init__(self, " + ", ".join(w.ident() for _ in range(r.randint(1, 3))) + "):"]
            out += [f"        self.{w.ident()} = {w.ident()}" for _ in range(r.randint(2, 5))]
            for _ in range(r.randint(2, 5)):
                out += [""] + _py_func(w, "    ", method=True)
        else:
            out += [""] + _py_func(w, "", method=False)
    return "\n".join(out).rstrip() + "\n"


def _py_func(w: Writer, ind: str, method: bool) -> list[str]:
    r = w.rng
    args = ", ".join((["self"] if method else []) + [w.ident() for _ in range(r.randint(0, 3))])
    name = w.ident()
    lines = [f"{ind}def {name}({args}):", f'{ind}    """{w.sentence()}']
    if r.random() < 0.5:
        lines += ["", *(f"{ind}    {ln}" for ln in textwrap.wrap(" ".join(w.sentence() for _ in range(2)), 90))]
    lines += [f'{ind}    """']
    for _ in range(r.randint(3, 14)):
        x = r.random()
        if x < 0.2:
            lines.append(f"{ind}    # {w.comment()}")
        elif x < 0.4:
            lines += [f"{ind}    if {w.ident()} > {r.randint(0, 100)}:", f"{ind}        {w.ident()} += 1"]
        elif x < 0.55:
            lines += [f"{ind}    for {w.ident()} in {w.ident()}:", f"{ind}        {w.ident()}.append({w.ident()})"]
        elif x < 0.65:
            lines.append(f'{ind}    log.info("{w.sentence(4, 9)[:-1]} %s", {w.ident()})')
        else:
            lines.append(f"{ind}    {w.ident()} = {w.ident()}({w.ident()}, {w.ident()}={r.randint(1, 999)})")
    lines.append(f"{ind}    return {w.ident()}")
    return lines


def typescript_file(w: Writer, size: float) -> str:
    r = w.rng
    out = [f"// {w.sentence()}", f"import {{ {w.pascal()}, {w.camel()} }} from './{w.ident()}';", ""]
    for _ in range(max(1, round(r.randint(3, 8) * size))):
        x = r.random()
        if x < 0.3:
            out += [f"/** {w.sentence()} */", f"export interface {w.pascal()} {{"]
            out += [f"  {w.camel()}: {r.choice(('string', 'number', 'boolean', 'string[]', w.pascal()))};"
                    for _ in range(r.randint(2, 7))]
            out += ["}", ""]
        elif x < 0.55:
            out += [f"/** {w.sentence()} */", f"export class {w.pascal()} {{"]
            for _ in range(r.randint(2, 4)):
                out += [f"  {w.camel()}({w.camel()}: string): number {{"] + _ts_body(w, "    ") + ["  }", ""]
            out += ["}", ""]
        else:
            out += [f"/**", f" * {w.sentence()}", f" */",
                    f"export function {w.camel()}({w.camel()}: {w.pascal()}, {w.camel()} = {r.randint(1, 99)}) {{"]
            out += _ts_body(w, "  ") + ["}", ""]
    return "\n".join(out).rstrip() + "\n"


def _ts_body(w: Writer, ind: str) -> list[str]:
    r = w.rng
    lines = []
    for _ in range(r.randint(3, 12)):
        x = r.random()
        if x < 0.2:
            lines.append(f"{ind}// {w.comment()}")
        elif x < 0.45:
            lines += [f"{ind}if ({w.camel()} > {r.randint(0, 100)}) {{", f"{ind}  {w.camel()} += 1;", f"{ind}}}"]
        else:
            lines.append(f"{ind}const {w.camel()} = await {w.camel()}.{w.camel()}({w.camel()}, '{w.ident()}');")
    lines.append(f"{ind}return {w.camel()};")
    return lines


def go_file(w: Writer, size: float) -> str:
    r = w.rng
    pkg = w.ident().split("_")[0]
    out = [f"// Package {pkg} {w.sentence()[0].lower()}{w.sentence()[1:]}", f"package {pkg}", "",
           "import (", '\t"context"', '\t"fmt"', ")", ""]
    for _ in range(max(1, round(r.randint(3, 8) * size))):
        if r.random() < 0.3:
            name = w.pascal()
            out += [f"// {name} {w.sentence()[0].lower()}{w.sentence()[1:]}", f"type {name} struct {{"]
            out += [f"\t{w.pascal()} {r.choice(('string', 'int', 'bool', '[]string', 'time.Duration'))}"
                    for _ in range(r.randint(2, 6))]
            out += ["}", ""]
        else:
            name = w.pascal()
            out += [f"// {name} {w.sentence()[0].lower()}{w.sentence()[1:]}",
                    f"func {name}(ctx context.Context, {w.camel()} string) (int, error) {{"]
            for _ in range(r.randint(3, 12)):
                x = r.random()
                if x < 0.2:
                    out.append(f"\t// {w.comment()}")
                elif x < 0.45:
                    out += [f"\tif {w.camel()} == nil {{",
                            f'\t\treturn 0, fmt.Errorf("{w.sentence(3, 7)[:-1].lower()}: %w", err)', "\t}"]
                else:
                    out.append(f"\t{w.camel()} := {w.camel()}.{w.pascal()}(ctx, {w.camel()})")
            out += [f"\treturn {r.randint(0, 9)}, nil", "}", ""]
    return "\n".join(out).rstrip() + "\n"


# Section / definition count multiplier: 0.8 gives ≈ 13.3 chunks per document (3,000 documents ≈ 40,000
# chunks with FixedCostEmbedder's / the local model's 254-token budget; measured, see docs/BENCHMARKS.md).
DEFAULT_SIZE = 0.8

_AREAS = ["guides", "design", "runbooks", "api", "howto", "operations", "architecture", "onboarding"]
_PKGS = ["ingest", "billing", "search", "auth", "storage", "scheduler", "gateway", "reports"]


def document(i: int, seed: int, vocab: Vocab, size: float) -> tuple[str, str]:
    """(relative path, text) of document i."""
    rng = random.Random(f"doc:{seed}:{i}")
    w = Writer(vocab, rng)
    x = rng.random()
    slug = "-".join(w.words(2)).replace("`", "")
    slug = re.sub(r"[^a-z0-9-]", "", slug.lower()) or "doc"
    if x < 0.70:
        return f"docs/{rng.choice(_AREAS)}/{slug}-{i:05d}.md", markdown_doc(w, size)
    pkg = rng.choice(_PKGS)
    name = slug.replace("-", "_")
    if x < 0.85:
        return f"src/{pkg}/{name}_{i:05d}.py", python_file(w, size)
    if x < 0.95:
        return f"web/src/{pkg}/{slug}-{i:05d}.ts", typescript_file(w, size)
    return f"services/{pkg}/{name}_{i:05d}.go", go_file(w, size)


# --- git and mutations ---------------------------------------------------------------------------------------

def git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True,
                          env=env).stdout


def git_commit(root: Path, message: str) -> str:
    git(root, "add", "-A")
    git(root, "commit", "-q", "--allow-empty", "-m", message)
    return git(root, "rev-parse", "HEAD").strip()


def generate(out: Path, n_docs: int, *, seed: int = 7, size: float = DEFAULT_SIZE, make_git: bool = True) -> dict:
    """Write n_docs documents under `out` (created; must be empty or absent) and commit them."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise SystemExit(f"{out} is not empty")
    vocab = build_vocab(seed)
    counts: dict[str, int] = {}
    total = 0
    for i in range(n_docs):
        rel, text = document(i, seed, vocab, size)
        p = out / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
        ext = rel.rsplit(".", 1)[-1]
        counts[ext] = counts.get(ext, 0) + 1
        total += len(text)
    commit = None
    if make_git:
        git(out, "init", "-q", "-b", "main")
        commit = git_commit(out, f"synthetic corpus: {n_docs} documents, seed {seed}")
    return {"root": str(out), "docs": n_docs, "seed": seed, "size": size, "by_extension": counts,
            "characters": total, "commit": commit}


_PROSE_SKIP = re.compile(r"^(#|- |\d+\. |```)")


def modify_paragraphs(root: Path, paths: list[str], seed: int) -> dict[str, int]:
    """Rewrite one prose paragraph (markdown) or one comment line (code) in each file; returns lines changed."""
    vocab = build_vocab(seed)
    changed: dict[str, int] = {}
    for rel in paths:
        rng = random.Random(f"modify:{seed}:{rel}")
        w = Writer(vocab, rng)
        p = root / rel
        lines = p.read_text(encoding="utf-8").split("\n")
        if rel.endswith(".md"):
            # paragraphs: runs of non-empty lines outside fences that are not headings or list items
            paras, start, fence = [], None, False
            for k, line in enumerate(lines + [""]):
                if line.startswith("```"):
                    fence = not fence
                is_prose = bool(line.strip()) and not fence and not _PROSE_SKIP.match(line)
                if is_prose and start is None:
                    start = k
                elif not is_prose and start is not None:
                    paras.append((start, k))
                    start = None
            a, b = rng.choice(paras[1:] or paras)
            n_words = len(" ".join(lines[a:b]).split())
            new = " ".join(w.sentence() for _ in range(max(1, n_words // 15)))
            lines[a:b] = textwrap.wrap(new, 100)
            changed[rel] = b - a
        else:
            marks = [k for k, line in enumerate(lines) if line.lstrip().startswith(("# ", "// "))]
            k = rng.choice(marks)
            lead = lines[k][: len(lines[k]) - len(lines[k].lstrip())]
            mark = "# " if lines[k].lstrip().startswith("# ") else "// "
            lines[k] = f"{lead}{mark}{w.comment()}"
            changed[rel] = 1
        p.write_text("\n".join(lines), encoding="utf-8")
    return changed


def rename_files(root: Path, paths: list[str]) -> dict[str, str]:
    """Move each file to a new name in another folder (content unchanged): old path -> new path."""
    moved = {}
    for rel in paths:
        head, _, base = rel.rpartition("/")
        new = f"{head}/moved/{base.replace('.', '-renamed.', 1) if base.count('.') == 1 else 'renamed-' + base}"
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        os.rename(root / rel, root / new)
        moved[rel] = new
    return moved


def delete_files(root: Path, paths: list[str]) -> None:
    for rel in paths:
        (root / rel).unlink()


def list_docs(root: Path) -> list[str]:
    """Tracked files of the corpus, sorted (what the mutations pick from)."""
    return sorted(p for p in git(root, "ls-files").splitlines() if p)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--size", type=float, default=DEFAULT_SIZE, help="section / definition count multiplier")
    ap.add_argument("--no-git", action="store_true")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    info = generate(args.out, args.docs, seed=args.seed, size=args.size, make_git=not args.no_git)
    info["seconds"] = round(time.perf_counter() - started, 2)
    json.dump(info, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
