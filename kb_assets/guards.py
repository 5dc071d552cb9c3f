"""No silent success: command-line values that cannot match anything are errors that list the valid ones
(exit 2), and include globs that match no file are warnings wherever people look (kb index, kb status)."""
from __future__ import annotations

from kb_assets.config import ConfigError, KbConfig


def check_recall_filters(cfg: KbConfig, kinds: list[str] | None, sources: list[str] | None) -> None:
    """An unknown --kind or --source is a typo, not an empty answer."""
    from kb_assets.models import DOCUMENT_KINDS

    for k in kinds or []:
        if k not in DOCUMENT_KINDS:
            raise ConfigError("(command line)", "--kind", f"unknown kind {k!r}",
                              f"use one of: {', '.join(sorted(DOCUMENT_KINDS))}")
    known = [s.key for s in cfg.sources]
    for s in sources or []:
        if s not in known:
            raise ConfigError(cfg.config_path, "--source", f"no source with key {s!r}",
                              f"use one of: {', '.join(known) or '(none configured)'}")


def glob_warnings(conn, cfg: KbConfig, keys: list[str] | None = None) -> list[str]:
    """One line per configured (enabled) source whose include globs match no indexed or skipped file."""
    from kb_assets.store.health import glob_warning, unmatched_includes

    out = []
    for source in cfg.sources:
        if not source.enabled or (keys is not None and source.key not in keys):
            continue
        patterns = unmatched_includes(conn, source)
        if patterns:
            out.append(glob_warning(source.key, patterns))
    return out
