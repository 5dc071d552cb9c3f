"""What the parse of a document decides, as digests: pins the documents stage, the chunker and the extractive
signposter over the shared corpora so a refactoring of the parsers provably changes nothing it does not mean to.

    .venv/bin/python -m kb_assets_tests.parse_pin        # rewrite kb_assets_tests/fixtures/parse_pin.json

Corpora: every ADR of the four shared ADR corpora, every 10th PEP and every 10th Rust RFC, and this
repository's docs at a fixed commit (PIN_COMMIT, read from git so later edits of the docs do not move the pin).
Per document: kind, title, the metadata the reader keeps (redaction counts left out), the content hash, and
one digest over its chunks (ordinal, heading, lines, token count, chunk hash) as the local model's tokenizer
counts them. Chunks and signposts are computed as the pipeline does: from the documents stage's stored block
scan (documents.blocks, through JSON), not a scan of their own. For every 4th document, the extractive signpost's payload itself (readable in a diff).
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "corpora"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "parse_pin.json"
PIN_COMMIT = "a3f4ea0"         # this repository's docs as they were when the pin was taken
EVERY = 10
SIGNPOST_EVERY = 4


def _unpack(archive: Path, dest: Path, want) -> list[str]:
    out = []
    with tarfile.open(archive) as tar:
        for member in tar:
            if member.isfile() and want(member.name):
                tar.extract(member, dest, filter="data")
                out.append(member.name)
    return sorted(out)


def _repo_docs(dest: Path) -> list[str] | None:
    try:
        names = subprocess.run(["git", "ls-tree", "-r", "--name-only", PIN_COMMIT, "--", "docs", "README.md"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None
    out = []
    for name in names:
        if not name.endswith(".md"):
            continue
        data = subprocess.run(["git", "show", f"{PIN_COMMIT}:{name}"], cwd=ROOT, capture_output=True,
                              check=True).stdout
        f = dest / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        out.append(name)
    return sorted(out)


def corpora(dest: Path) -> list[tuple[str, str, bool, Path, list[str]]]:
    """(set name, kind, auto_kind, root, paths) for each pinned set."""
    sets = []
    for archive in sorted(SHARED.glob("adr-*.tar.gz")):
        name = archive.name.split("-", 1)[1].rsplit("-", 1)[0]
        root = dest / name
        sets.append((name, "adr", False, root, _unpack(archive, root, lambda n: n.endswith(".md"))))
    for glob, rx, label in (("python-peps-*.tar.gz", r"/pep-\d+\.rst$", "peps"),
                            ("rust-rfcs-*.tar.gz", r"/text/\d+-[^/]+\.md$", "rfcs")):
        archive = sorted(SHARED.glob(glob))[0]
        root = dest / label
        paths = _unpack(archive, root, lambda n, rx=rx: bool(re.search(rx, n)))
        sets.append((label, "doc", True, root, paths[::EVERY]))
    docs = _repo_docs(dest / "repo")
    if docs is not None:
        sets.append(("repo-docs", "doc", True, dest / "repo", docs))
    return sets


def _meta_view(meta: dict) -> dict:
    return {k: v for k, v in sorted(meta.items()) if k != "redactions"}


def compute(dest: Path) -> dict:
    from kb_assets.chunking import chunk_document, document_blocks, make_token_counter
    from kb_assets.config import SourceConfig
    from kb_assets.models import Skip
    from kb_assets.signposts.base import SignpostInput
    from kb_assets.signposts.extractive import ExtractiveSignposter
    from kb_assets.sources.discovery import FileEntry
    from kb_assets.sources.readers import read_entry

    count = make_token_counter()
    signposter = ExtractiveSignposter()
    out: dict = {"documents": {}, "signposts": {}}
    n = 0
    for name, kind, auto, root, paths in corpora(dest):
        source = SourceConfig(key="pin", kind=kind, root=str(root), include=["**/*"], auto_kind=auto)
        for path in paths:
            key = f"{name}/{path}"
            result = read_entry(root, FileEntry(path, "0:0"), source)
            if isinstance(result, Skip):
                out["documents"][key] = {"skip": result.reason}
                continue
            for doc in result:
                stored = document_blocks(doc)
                blocks = json.loads(json.dumps(stored)) if stored is not None else None   # as documents.blocks
                chunks = chunk_document(doc, max_tokens=254, count_tokens=count, blocks=blocks)
                h = hashlib.sha256()
                for c in chunks:
                    h.update(f"{c.ordinal}\t{c.heading}\t{c.start_line}\t{c.end_line}\t{c.token_count}\t"
                             f"{c.chunk_hash}\n".encode())
                out["documents"][key] = {
                    "kind": doc.kind, "title": doc.title, "content_hash": doc.content_hash[:16],
                    "chunks": len(chunks), "chunk_digest": h.hexdigest()[:16], "meta": _meta_view(doc.meta)}
                if n % SIGNPOST_EVERY == 0:
                    res = signposter.generate(SignpostInput(title=doc.title, kind=doc.kind, path=doc.path,
                                                            text=doc.text, meta=doc.meta, blocks=blocks))
                    out["signposts"][key] = res.payload
                n += 1
    return out


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        data = compute(Path(tmp))
    FIXTURE.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False, default=str) + "\n")
    print(f"{FIXTURE}: {len(data['documents'])} documents, {len(data['signposts'])} signposts")


if __name__ == "__main__":
    main()
