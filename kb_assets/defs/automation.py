"""What keeps the index fresh: a nightly schedule over every source and a sensor that sees new commits."""

import json

import dagster as dg

from kb_assets.defs.assets import kb_job
from kb_assets.defs.partitions import source_keys
from kb_assets.config import load_config
from kb_assets.store.status import git_head


@dg.schedule(job=kb_job, cron_schedule="0 3 * * *", execution_timezone="UTC",
             default_status=dg.DefaultScheduleStatus.STOPPED,
             description="Re-index every source nightly (cheap: unchanged documents cost nothing).")
def nightly_index(context: dg.ScheduleEvaluationContext):
    day = context.scheduled_execution_time.strftime("%Y-%m-%d")
    # One run per source partition (build_schedule_from_partitioned_job misbehaves with static partitions).
    return [dg.RunRequest(partition_key=key, run_key=f"{key}@{day}") for key in source_keys()]


@dg.sensor(job=kb_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED,
           description="Index a source when its git HEAD moves. Cursor: {source key: last commit seen}.")
def git_commit_sensor(context: dg.SensorEvaluationContext):
    seen = json.loads(context.cursor) if context.cursor else {}
    requests = []
    cfg = load_config()
    for source in cfg.sources:
        if not source.enabled:
            continue
        head = git_head(cfg.source_root(source))
        if head is None or seen.get(source.key) == head:
            continue
        requests.append(dg.RunRequest(partition_key=source.key, run_key=f"{source.key}@{head}"))
        seen[source.key] = head
    if not requests:
        return dg.SkipReason("no source has a new commit")
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(seen, sort_keys=True))
