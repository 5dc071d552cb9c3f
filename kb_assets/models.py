"""Plain data shapes that flow between the core stages (no Dagster, no database).

sources  -> SourceDocument   (one per file / transcript / work item, text already redacted)
chunking -> Chunk            (placement of a piece of a document)
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

# documents.blocks (migration 008; written by chunking/markdown.document_blocks): the block scan the documents
# stage stores for a markdown-shaped document (and, from version 2, the header and section titles of a reST one:
# chunking/rst.rst_structure), read back by the chunker and the extractive signposter instead of parsing the text
# again. A row of another version is re-parsed from its stored text by the next documents run
# (pipeline/documents.refill_blocks). Kept here, not in chunking: every documents run compares it, and importing
# the chunking package for it alone cost ~6 ms.
BLOCKS_VERSION = 2

DOCUMENT_KINDS = (
    "adr", "doc", "session", "transcript", "readme", "agents_md", "memory", "work_item", "code",
)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class SourceDocument:
    """A readable document produced by a source reader.

    `path` is POSIX and relative to the source root (a work item export may yield several documents
    from one file: their paths are `<file>#<item id>`). `text` is what gets chunked and embedded; it
    has been redacted. `meta` carries kind-specific fields: status, dates, tags, author, references,
    redactions (count per secret type), language, session id, ...
    """

    path: str
    kind: str
    title: str
    text: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def content_hash(self) -> str:
        return sha256_hex(self.kind + "\0" + self.text)


@dataclass
class Chunk:
    ordinal: int
    text: str
    heading: str = ""           # heading path ("A > B") or code symbol ("Class.method") or turn label
    start_line: int = 1         # 1-based, inclusive, in the document text
    end_line: int = 1
    token_count: int = 0

    @property
    def chunk_hash(self) -> str:
        # The heading is embedded with the text, so it is part of the identity.
        return sha256_hex(self.heading + "\0" + self.text)

    def embedding_text(self) -> str:
        return f"{self.heading}\n{self.text}" if self.heading else self.text


@dataclass
class Skip:
    """A file that was seen but not indexed, with a reason a person can read."""

    path: str
    reason: str            # short code: binary, not-utf8, too-large, too-small, generated, vendored, symlink-outside, ...
    detail: str = ""
