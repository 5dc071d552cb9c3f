"""What-if (bench only, not the product): one source's `kb_index` run executed by Dagster's multiprocess executor
(steps in parallel where the graph allows: kb_signposts beside kb_chunks/kb_embeddings) instead of `kb index`'s
execute_in_process, which always runs steps one after another (JobDefinition.execute_in_process ignores the job's
executor_def). Run it in the environment of peerbench's kb adapter (bench/peerbench_profile.sh sets it up) on a
fresh database, and compare its wall time with a `kb index` full pass on another fresh database:

    KB_CONFIG=<run>/kb.yaml DAGSTER_HOME=<run>/dagster_home python bench/executor_whatif.py corpus 2 forkserver

Prints the run's wall seconds and each step's start/end (seconds from the run's start).
"""
from __future__ import annotations

import os
import sys
import time

os.environ["KB_DAGSTER_EXECUTOR"] = "multiprocess"   # the location's executor for this run (children inherit it)

import dagster as dg  # noqa: E402


def kb_index_job():
    from kb_assets.definitions import defs

    d = defs() if callable(defs) else defs
    return d.resolve_job_def("kb_index")


def main() -> None:
    key, max_concurrent, start = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    from kb_assets.config import load_config
    from kb_assets.store.db import open_database

    open_database(load_config())
    method = {"spawn": {}} if start == "spawn" else {"forkserver": {"preload_modules": ["kb_assets.definitions"]}}
    run_config = {"execution": {"config": {"max_concurrent": max_concurrent, "start_method": method}},
                  "loggers": {"console": {"config": {"log_level": "ERROR"}}}}
    t0 = time.perf_counter()
    with dg.DagsterInstance.get() as instance:
        result = dg.execute_job(dg.reconstructable(kb_index_job), instance=instance, run_config=run_config,
                                tags={"dagster/partition": key}, raise_on_error=False)
        wall = time.perf_counter() - t0
        steps: dict[str, list] = {}
        for rec in instance.all_logs(result.run_id):
            ev = rec.dagster_event
            if ev is not None and ev.event_type_value in ("STEP_WORKER_STARTING", "STEP_START", "STEP_SUCCESS",
                                                           "STEP_FAILURE"):
                steps.setdefault(ev.step_key, []).append((ev.event_type_value, rec.timestamp))
        first = min(ts for evs in steps.values() for _, ts in evs)
        for step, evs in sorted(steps.items(), key=lambda kv: kv[1][0][1]):
            print(f"{step:45s} " + "  ".join(f"{t.lower()} {ts - first:6.1f}" for t, ts in evs))
        print(f"success={result.success} wall={wall:.1f}s load={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
