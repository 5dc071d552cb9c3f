"""The projections' T0 figure (tokens per entry) counts each line once across runs: a small change re-renders
every line but changes few, so the lines an earlier run counted come from data_dir/cache, and the figure is the
tokenizer's own, exactly."""
from __future__ import annotations

import json

from kb_assets.chunking import make_token_counter
from kb_assets.pipeline import projections
from kb_assets.pipeline.projections import t0_tokens_per_entry

LINES = [f"docs/adr/{i:04d}-use-thing-{i}.md | adr | Use thing {i} for the job queue | = | Accepted" for i in range(40)]


def exact(lines):
    counts = make_token_counter().count_once(lines)
    return round(sum(counts) / len(lines), 2)


def counted(monkeypatch):
    """Record the lines the tokenizer is asked to count."""
    seen: list[list[str]] = []
    real = make_token_counter

    def counter(*a, **k):
        c = real(*a, **k)
        once = c.count_once

        def count_once(texts):
            seen.append(list(texts))
            return once(texts)
        c.count_once = count_once
        return c
    monkeypatch.setattr("kb_assets.chunking.tokens.make_token_counter", counter)
    return seen


def test_lines_counted_by_an_earlier_run_are_not_counted_again(tmp_path, monkeypatch):
    cache = tmp_path / "cache" / projections.T0_COUNTS_FILE
    seen = counted(monkeypatch)
    assert t0_tokens_per_entry(LINES, cache) == exact(LINES)
    assert seen == [LINES] and cache.exists()

    changed = LINES[:10] + ["docs/new.md | doc | A new operator guide with — unicode → and [SEP] | = | -"] + LINES[12:]
    seen.clear()
    assert t0_tokens_per_entry(changed, cache) == exact(changed)
    assert seen == [[changed[10]]]                      # only the new line went to the tokenizer
    stored = json.loads(cache.read_text())["counts"]
    assert len(stored) == len(set(changed))              # this run's lines only: the removed ones are gone

    seen.clear()
    before = cache.stat().st_mtime_ns
    assert t0_tokens_per_entry(changed, cache) == exact(changed) and seen == []   # nothing new: no count
    assert cache.stat().st_mtime_ns == before                                      # ... and no write


def test_a_damaged_or_foreign_cache_is_counted_again(tmp_path, monkeypatch):
    cache = tmp_path / projections.T0_COUNTS_FILE
    seen = counted(monkeypatch)
    for text in ("{not json", json.dumps({"tokenizer": "another:1:2", "counts": {}}), json.dumps([1, 2])):
        cache.write_text(text)
        seen.clear()
        assert t0_tokens_per_entry(LINES, cache) == exact(LINES) and seen == [LINES]
    # the last run rewrote the file with the tokenizer's own counts
    data = json.loads(cache.read_text())
    assert set(data["counts"].values()) == set(make_token_counter().count_once(LINES))


def test_an_unwritable_cache_folder_only_loses_the_saving(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the folder would go")
    assert t0_tokens_per_entry(LINES, blocker / projections.T0_COUNTS_FILE) == exact(LINES)
    assert t0_tokens_per_entry(LINES, None) == exact(LINES)
