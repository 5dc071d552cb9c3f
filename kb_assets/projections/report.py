"""Read-side reports over the projections' inputs: the tags in use against the vocabulary (`kb tags`, the
asset check `tags_in_vocabulary`)."""
from __future__ import annotations

from typing import Any

from kb_assets.projections.load import load_entries
from kb_assets.projections.render import tag_index
from kb_assets.projections.vocabulary import TagVocabulary, tag_file_name


def tags_report(conn, cfg) -> dict[str, Any]:
    vocab = TagVocabulary(cfg.tags)
    tagged, outside = tag_index(load_entries(conn), vocab)
    return {
        "governed": vocab.governed,
        "vocabulary": list(vocab.tags),
        "tags": {t: {"documents": len(es), "file": f"by-tag/{tag_file_name(t)}.dsl"} for t, es in sorted(tagged.items())},
        "unused": [t for t in vocab.tags if t not in tagged],
        "outside": {t: len(ids) for t, ids in sorted(outside.items(), key=lambda kv: (-len(kv[1]), kv[0]))},
    }
