"""The governed tag vocabulary (`tags:` in kb.yaml): canonical tags and their aliases.

With a vocabulary, a document tag is mapped to its canonical tag (case, spacing, "-"/"_" and aliases
ignored); a tag outside it gets no by-tag file and is reported (asset check `tags_in_vocabulary`), never
silently added. Without one, every document tag is used as written (lowercased, normalised).
"""
from __future__ import annotations

import re
from typing import Any, Iterable

_SEP = re.compile(r"[\s_]+")
_UNSAFE = re.compile(r"[^a-z0-9.+-]+")


def normalise_tag(tag: Any) -> str:
    """'Jet Stream' -> 'jet-stream'; ' KV ' -> 'kv'."""
    s = _SEP.sub("-", str(tag or "").strip().lower()).strip("-")
    return re.sub(r"-{2,}", "-", s)


def tag_file_name(tag: str) -> str:
    """A tag as a safe file name (by-tag/<name>.dsl): no path separators, no dot files."""
    name = _UNSAFE.sub("-", normalise_tag(tag)).strip("-.")
    return name or "_"


class TagVocabulary:
    def __init__(self, spec: Iterable[Any] = ()):
        self.canonical: dict[str, str] = {}       # normalised spelling -> canonical tag
        self.tags: list[str] = []
        for item in spec or []:
            if isinstance(item, str):
                tag, aliases = item, []
            elif isinstance(item, dict):
                tag, aliases = item.get("tag", ""), item.get("aliases") or []
            else:                                 # config.TagSpec
                tag, aliases = item.tag, list(item.aliases)
            canon = normalise_tag(tag)
            if not canon:
                continue
            if canon not in self.tags:
                self.tags.append(canon)
            for spelling in [tag, *aliases]:
                self.canonical.setdefault(normalise_tag(spelling), canon)

    @property
    def governed(self) -> bool:
        return bool(self.tags)

    def map(self, tag: Any) -> str | None:
        """The canonical tag for a document's tag; None when a vocabulary exists and the tag is outside it."""
        n = normalise_tag(tag)
        if not n:
            return None
        if not self.governed:
            return n
        return self.canonical.get(n)
