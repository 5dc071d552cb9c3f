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

    def embedder(self):
        from kb_assets.embedding import make_embedder

        return make_embedder(self.config)

    def signposter(self):
        from kb_assets.signposts import make_signposter

        return make_signposter(self.config)
