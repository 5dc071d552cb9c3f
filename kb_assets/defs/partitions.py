"""Partitions are sources (tens), never documents (invariant 9)."""
from __future__ import annotations

import dagster as dg

from kb_assets.config import load_config


def source_keys() -> list[str]:
    return [s.key for s in load_config().sources if s.enabled]


sources_partitions = dg.StaticPartitionsDefinition(source_keys())
