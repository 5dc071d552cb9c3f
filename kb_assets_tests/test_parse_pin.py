"""The parse of each document (reader metadata, chunks, extractive signposts) over the shared corpora matches the
committed pin (kb_assets_tests/fixtures/parse_pin.json, see parse_pin.py). An intended change regenerates the
fixture (`python -m kb_assets_tests.parse_pin`) and says why in its commit."""
from __future__ import annotations

import json

import pytest

from kb_assets_tests import parse_pin


def test_parse_matches_the_pin(tmp_path):
    if not parse_pin.SHARED.is_dir():
        pytest.skip(f"shared corpora not found at {parse_pin.SHARED}")
    want = json.loads(parse_pin.FIXTURE.read_text())
    got = json.loads(json.dumps(parse_pin.compute(tmp_path), sort_keys=True, ensure_ascii=False, default=str))
    assert len(want["documents"]) > 250
    diffs = []
    for section in ("documents", "signposts"):
        for key in sorted(set(want[section]) | set(got[section])):
            a, b = want[section].get(key), got[section].get(key)
            if a != b:
                fields = sorted(k for k in set(a or {}) | set(b or {}) if (a or {}).get(k) != (b or {}).get(k))
                diffs.append(f"{section} {key}: {fields}")
    assert not diffs, f"{len(diffs)} differ from the pin:\n" + "\n".join(diffs[:40])
