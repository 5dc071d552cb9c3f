"""Signposts: per-document summaries, decisions with rationale and touched files.

No Dagster here. `make_signposter(cfg)` gives the configured generator (extractive offline, Gemini in production);
the signposts stage (`kb_assets.pipeline.signposts.run_signposts`) brings one source's signposts up to date.
"""
from kb_assets.signposts.base import (
    Signposter,
    SignpostAuthError,
    SignpostError,
    SignpostInput,
    SignpostQuotaError,
    SignpostResult,
    make_signposter,
)
from kb_assets.signposts.schema import (
    PROMPT_VERSION,
    SCHEMA_VERSION,
    CodeSignpost,
    Decision,
    DocumentSignpost,
    KeyFunction,
)

__all__ = [
    "CodeSignpost", "Decision", "DocumentSignpost", "KeyFunction", "PROMPT_VERSION", "SCHEMA_VERSION",
    "SignpostAuthError", "SignpostError", "SignpostInput", "SignpostQuotaError", "SignpostResult", "Signposter",
    "make_signposter",
]
