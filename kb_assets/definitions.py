"""The code location: everything under kb_assets/defs/, plus the resource the assets share and the executor."""
import os

import dagster as dg

from kb_assets.defs.resources import KbResource

EXECUTOR_ENV = "KB_DAGSTER_EXECUTOR"
_EXECUTORS = {"in_process": dg.in_process_executor, "multiprocess": dg.multiprocess_executor}


def _executor() -> dg.ExecutorDefinition:
    """The default executor of every job in the location, the UI's asset-graph "Materialize" included.

    in_process (default): the steps of a run execute one after the other in its run worker. A partition's run
    is ~13 small steps whose own work is a few seconds; a process per step (Dagster's default) cost ~31 s of
    interpreter starts and imports on 2 cores. multiprocess: a process per step (isolation; steps in parallel)
    — set KB_DAGSTER_EXECUTOR=multiprocess, or give the job another executor (docs/DEPLOYMENT.md)."""
    choice = os.environ.get(EXECUTOR_ENV, "").strip() or "in_process"
    if choice not in _EXECUTORS:
        from kb_assets.config import ConfigError

        raise ConfigError("(environment)", EXECUTOR_ENV, f"unknown executor {choice!r}",
                          f"use one of: {', '.join(_EXECUTORS)}")
    return _EXECUTORS[choice]


@dg.definitions
def defs() -> dg.Definitions:
    """Every definition under kb_assets/defs/, named here (a test checks that they are all that
    dg.load_from_defs_folder finds there). Named instead of discovered: the folder loader cost ~0.2 s of every
    process that loads the location (each run worker, `kb index`): it reads the project's pyproject.toml
    (tomlkit), builds a component tree and attaches a JSON of every component type to the definitions."""
    from kb_assets.defs import assets, automation, checks

    return dg.Definitions(
        assets=dg.load_assets_from_modules([assets]),
        asset_checks=dg.load_asset_checks_from_modules([checks]),
        jobs=[assets.kb_job],
        schedules=[automation.nightly_index],
        sensors=[automation.git_commit_sensor, automation.source_listing_sensor, automation.kb_direct_runs],
        resources={"kb": KbResource()}, executor=_executor())
