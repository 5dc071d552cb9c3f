"""The deployment's run coordinator: Dagster's queue, minus the wait for the daemon's next look when there is
room. Named in dagster.yaml (`run_coordinator: {module: kb_assets.defs.run_coordinator, class:
PromptRunCoordinator}`), loaded by the webserver and the daemon, not by the code location.

Why: with the QueuedRunCoordinator a run launched from the UI waits for the daemon's next dequeue, polled at
most every second (`dequeue_interval_seconds` is a whole number): ~0.9-1.0 s of the ~5.8 s an unchanged
partition took from the click to SUCCESS (BENCHMARKS.md). The DefaultRunCoordinator launches at once but
drops the run limit, and a nightly schedule that requests one run per source would start them all together
on one node.
"""
from __future__ import annotations

import dagster as dg


class PromptRunCoordinator(dg.QueuedRunCoordinator):
    """The QueuedRunCoordinator (same config, same daemon, same limits), except that a run submitted while
    nothing waits in the queue and the run limit leaves room is launched at once by the process that
    submitted it (the webserver for the UI's "Materialize", the daemon for sensors and schedules) instead
    of at the daemon's next dequeue. Anything else is queued as usual: runs already waiting (their order is
    kept), the limit reached, tag concurrency limits or pools at run granularity (those only the daemon's
    dequeue enforces). Two submissions racing from two processes can pass the limit by one run; pools at op
    granularity (this deployment's) are claimed by the steps in any case."""

    def submit_run(self, context):
        run = context.dagster_run
        if run.status == dg.DagsterRunStatus.NOT_STARTED and self.room_to_launch_now():
            self._instance.launch_run(run.run_id, context.workspace)
            launched = self._instance.get_run_by_id(run.run_id)
            if launched is None:
                raise dg.DagsterInvariantViolationError(f"run {run.run_id} vanished while launching")
            return launched
        return super().submit_run(context)

    def room_to_launch_now(self) -> bool:
        """True when the daemon's dequeue would launch this run at its next look without waiting."""
        instance = self._instance
        try:
            concurrency = instance.get_concurrency_config()
            queue = concurrency.run_queue_config or self.get_run_queue_config()
            if queue.tag_concurrency_limits:
                return False
            granularity = concurrency.pool_config.pool_granularity
            if granularity is not None and granularity.value == "run":
                return False
            limit = queue.max_concurrent_runs
            if limit == 0:
                return False
            if instance.get_runs_count(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED])):
                return False
            if limit < 0:
                return True
            in_progress = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
                           dg.DagsterRunStatus.CANCELING]
            return instance.get_runs_count(dg.RunsFilter(statuses=in_progress)) < limit
        except Exception:   # noqa: BLE001 - when in doubt, the queue decides (as Dagster would)
            self._logger.exception("kb_assets PromptRunCoordinator: could not check for room; queueing the run")
            return False
