"""The one resource every asset uses: the kb.yaml config, the database and the model clients."""
from __future__ import annotations

from functools import cached_property

import dagster as dg

from kb_assets.config import KbConfig, load_config


class KbResource(dg.ConfigurableResource):
    """kb_assets configuration. `config_path` empty: $KB_CONFIG, else ./kb.yaml, else the default config."""

    config_path: str = ""

    @cached_property
    def config(self) -> KbConfig:
        return load_config(self.config_path or None)

    def database_url(self) -> str:
        from kb_assets.store.db import open_database

        return open_database(self.config)

    def connect(self):
        from kb_assets.store.db import connect

        return connect(self.database_url())

    def run_stage(self, source_key: str | None, fn, *, lock: bool = True):
        """fn(conn) under the source's run lock, re-run on a fresh connection after a transient database
        error (pipeline/guard.py). A stop request or a database that stayed away fails the step without
        Dagster's retries: the first is what the operator asked for, the second was retried already."""
        from kb_assets.pipeline import guard
        from kb_assets.pipeline.cancel import Cancelled
        from kb_assets.store.retry import DatabaseUnreachable

        try:
            return guard.run_stage(self.config, source_key, fn, lock=lock)
        except Cancelled as exc:
            raise dg.Failure(description=f"stopped: {exc}", allow_retries=False) from None
        except DatabaseUnreachable as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None

    def embedder(self):
        from kb_assets.embedding import make_embedder

        return make_embedder(self.config)

    def signposter(self):
        from kb_assets.signposts import make_signposter

        return make_signposter(self.config)
