"""What keeps the index fresh: a nightly schedule over every source, a sensor that sees merged commits (and
pushes recorded by the webhook), and one that sees listing changes of sources that are not git."""

import json
import os

import dagster as dg

from kb_assets.defs.assets import kb_job
from kb_assets.defs.partitions import source_keys
from kb_assets.config import load_config


@dg.schedule(job=kb_job, cron_schedule="0 3 * * *", execution_timezone="UTC",
             default_status=dg.DefaultScheduleStatus.STOPPED,
             description="Re-index every source nightly (cheap: unchanged documents cost nothing).")
def nightly_index(context: dg.ScheduleEvaluationContext):
    day = context.scheduled_execution_time.strftime("%Y-%m-%d")
    # One run per source partition (build_schedule_from_partitioned_job misbehaves with static partitions).
    return [dg.RunRequest(partition_key=key, run_key=f"{key}@{day}") for key in source_keys()]


def _push_state(cfg, after_id: int, log) -> tuple[list, int]:
    """Pushes the webhook recorded since the cursor (only read when some source has a remote to match)."""
    from kb_assets.sources.watch import pending_pushes, prune_pushes
    from kb_assets.store.db import connect, open_database

    try:
        with connect(open_database(cfg), register=False) as conn:
            pushes = pending_pushes(conn, after_id)
            prune_pushes(conn)
    except Exception as exc:   # the database is down: keep polling git, read the pushes next tick
        log.warning(f"cannot read recorded pushes: {str(exc).splitlines()[0] if str(exc) else exc!r}")
        return [], after_id
    return pushes, max([after_id, *(p.id for p in pushes)])


# Seconds between ticks of git_commit_sensor (a deployment setting: lower it when the webhook records
# pushes, so a push is indexed within seconds; each tick fetches every source that sets `remote:`).
GIT_SENSOR_INTERVAL = int(os.environ.get("KB_GIT_SENSOR_INTERVAL_SECONDS") or 60)


@dg.sensor(job=kb_job, minimum_interval_seconds=GIT_SENSOR_INTERVAL,
           default_status=dg.DefaultSensorStatus.STOPPED,
           description=("Index a git source when the commit of its branch moves: the checkout's branch "
                        "(or `branch:`), after `git fetch <remote>` when the source sets `remote:`, and at "
                        "once for pushes recorded by POST /hooks/git. One run per source and commit "
                        "(run_key source@sha); a force-push or history rewrite runs a full listing. "
                        "Cursor: {commits: {source: sha}, push_id}."))
def git_commit_sensor(context: dg.SensorEvaluationContext):
    from kb_assets.sources.watch import git_tip, history_rewritten, is_git_source, push_matches

    raw = json.loads(context.cursor) if context.cursor else {}
    # the first cursor format was a flat {source: sha}
    state = raw if "commits" in raw else {"commits": raw, "push_id": 0}
    seen: dict[str, str] = dict(state.get("commits") or {})
    push_id = int(state.get("push_id") or 0)
    cfg = load_config()
    sources = [s for s in cfg.sources if s.enabled and is_git_source(cfg, s)]
    pushes: list = []
    if any(s.remote for s in sources):
        pushes, push_id = _push_state(cfg, push_id, context.log)
    requests = []
    for source in sources:
        pushed = [p for p in pushes if push_matches(p, cfg, source)]
        tip = git_tip(cfg, source, do_fetch=True)
        if tip.error:
            context.log.warning(f"{source.key}: fetch failed, using the last fetched state: {tip.error}")
        if tip.commit is None or seen.get(source.key) == tip.commit:
            continue
        previous = seen.get(source.key)
        rewritten = history_rewritten(cfg, source, previous, tip.commit) or any(p.forced for p in pushed)
        tags = {
            "kb/source": source.key, "kb/ref": tip.ref, "kb/commit": tip.commit,
            "kb/previous_commit": previous or "",
            "kb/trigger": "push" if pushed else "poll",
            "kb/listing": ("full: history rewritten (force-push)" if rewritten
                           else "first run" if previous is None else "incremental (git diff)"),
        }
        if pushed:
            tags["kb/push_delivery"] = pushed[-1].delivery_id[:60]
        requests.append(dg.RunRequest(partition_key=source.key, run_key=f"{source.key}@{tip.commit}", tags=tags))
        seen[source.key] = tip.commit
    cursor = json.dumps({"commits": seen, "push_id": push_id}, sort_keys=True)
    if not requests:
        return dg.SensorResult(skip_reason=dg.SkipReason("no source has a new commit"), cursor=cursor)
    return dg.SensorResult(run_requests=requests, cursor=cursor)


@dg.sensor(job=kb_job, minimum_interval_seconds=120, default_status=dg.DefaultSensorStatus.STOPPED,
           description=("Index a source that is not git (memory folders, exports) when its listing changes: "
                        "paths, sizes and modification times. Cursor: {source: listing signature}."))
def source_listing_sensor(context: dg.SensorEvaluationContext):
    from kb_assets.sources.watch import is_git_source, listing_signature

    seen = json.loads(context.cursor) if context.cursor else {}
    cfg = load_config()
    requests = []
    for source in cfg.sources:
        if not source.enabled or is_git_source(cfg, source) or not cfg.source_root(source).is_dir():
            continue
        sig = listing_signature(cfg, source)
        if seen.get(source.key) == sig:
            continue
        requests.append(dg.RunRequest(partition_key=source.key, run_key=f"{source.key}@listing-{sig[:16]}",
                                      tags={"kb/source": source.key, "kb/trigger": "listing",
                                            "kb/listing_signature": sig[:16]}))
        seen[source.key] = sig
    cursor = json.dumps(seen, sort_keys=True)
    if not requests:
        return dg.SensorResult(skip_reason=dg.SkipReason("no listing changed"), cursor=cursor)
    return dg.SensorResult(run_requests=requests, cursor=cursor)


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description=("Report `kb index`'s direct runs (a small change indexed without a Dagster run, "
                        "pipeline/direct_run.py) to Dagster: each as its assets' materializations and its checks' "
                        "evaluations, on the source's partition. Launches nothing. Cursor: the last run's id."))
def kb_direct_runs(context: dg.SensorEvaluationContext):
    from kb_assets.pipeline.direct_run import unreported
    from kb_assets.store.db import connect, open_database

    after = int(context.cursor or 0)
    cfg = load_config()
    try:
        with connect(open_database(cfg), register=False) as conn:
            rows = unreported(conn, after)
    except Exception as exc:   # the database is down: the runs stay stored, reported at a later tick
        return dg.SensorResult(skip_reason=dg.SkipReason(f"cannot read direct runs: {str(exc).splitlines()[0]}"),
                               cursor=context.cursor)
    if not rows:
        return dg.SensorResult(skip_reason=dg.SkipReason("no direct run to report"), cursor=context.cursor)
    return dg.SensorResult(asset_events=direct_run_events(rows, set(source_keys())), cursor=str(rows[-1][0]))


def direct_run_events(rows, partitions: set[str]) -> list:
    """The asset materializations and check evaluations of stored direct runs (sources that are no longer
    partitions are left out: Dagster would refuse their partition)."""
    from kb_assets.defs.checks import check_metadata, json_metadata
    from kb_assets.store.checks import CheckOutcome

    events = []
    for run_id, source, finished_at, assets, checks in rows:
        if source not in partitions:
            continue
        tags = {"kb/runner": "direct", "kb/direct_run": str(run_id)}
        for asset, meta in assets.items():
            events.append(dg.AssetMaterialization(
                asset_key=asset, partition=source, tags=tags,
                description=f"kb index without a Dagster run (direct run {run_id}, finished {finished_at:%Y-%m-%d %H:%M:%S %Z})",
                metadata=json_metadata({k: v for k, v in meta.items() if v is not None})))
        for c in map(CheckOutcome.from_json, checks):
            events.append(dg.AssetCheckEvaluation(
                asset_key=dg.AssetKey(c.asset), check_name=c.name, passed=c.passed, partition=source,
                description=c.description, metadata=check_metadata(c),
                severity=dg.AssetCheckSeverity.WARN if c.severity == "warn" else dg.AssetCheckSeverity.ERROR))
    return events
