"""The code location: everything under kb_assets/defs/, plus the resource the assets share."""
from pathlib import Path

import dagster as dg

from kb_assets.defs.resources import KbResource


@dg.definitions
def defs() -> dg.Definitions:
    found = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
    return dg.Definitions.merge(found, dg.Definitions(resources={"kb": KbResource()}))
