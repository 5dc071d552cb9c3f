"""The deployment's run coordinator (kb_assets/defs/run_coordinator.py): Dagster's run queue, except that a run
submitted while nothing waits and the run limit leaves room is launched at once. A real Dagster instance (sqlite
storage in a temp DAGSTER_HOME) configured from the repo's dagster.yaml; runs in real run storage. The launch
itself (the webserver's and the daemon's) is exercised by test_topology (sensor runs, never enqueued) and
bench/ui_partition_bench.py (the UI's launch)."""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import dagster as dg
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _instance(tmp_path: Path, **queue_config):
    home = tmp_path / f"home-{uuid.uuid4().hex[:6]}"
    home.mkdir()
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    conf = yaml.safe_load((home / "dagster.yaml").read_text())
    conf["concurrency"]["runs"].update(queue_config)     # the run limits live there (Dagster's config)
    (home / "dagster.yaml").write_text(yaml.safe_dump(conf))
    return dg.DagsterInstance.from_config(str(home))


def _add_run(instance, status: dg.DagsterRunStatus, tags: dict | None = None) -> dg.DagsterRun:
    """A run of kb_index from the compose code server, as the webserver records it before submitting."""
    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin

    origin = RemoteJobOrigin(repository_origin=RemoteRepositoryOrigin(
        code_location_origin=GrpcServerCodeLocationOrigin(host="code", port=4000, location_name="kb_assets"),
        repository_name="__repository__"), job_name="kb_index")
    return instance.add_run(dg.DagsterRun(job_name="kb_index", run_id=uuid.uuid4().hex, status=status,
                                          tags=tags or {}, remote_job_origin=origin))


def test_both_instance_files_name_the_prompt_coordinator():
    for path in (ROOT / "dagster.yaml", ROOT / "docker" / "dagster.yaml"):
        conf = yaml.safe_load(path.read_text())
        assert conf["run_coordinator"]["module"] == "kb_assets.defs.run_coordinator", path
        assert conf["run_coordinator"]["class"] == "PromptRunCoordinator", path
        assert "run_queue" not in conf, path      # Dagster refuses both
        assert conf["run_coordinator"]["config"]["dequeue_interval_seconds"] == 1
        assert conf["concurrency"]["runs"]["max_concurrent_runs"] >= 1


def test_room_now_only_when_the_queue_is_empty_and_under_the_limit(tmp_path):
    from kb_assets.defs.run_coordinator import PromptRunCoordinator

    instance = _instance(tmp_path, max_concurrent_runs=2)
    coordinator = instance.run_coordinator
    # a QueuedRunCoordinator for everything else: the daemon's queue still runs it
    assert isinstance(coordinator, PromptRunCoordinator) and isinstance(coordinator, dg.QueuedRunCoordinator)
    assert coordinator.room_to_launch_now()
    _add_run(instance, dg.DagsterRunStatus.STARTED)
    _add_run(instance, dg.DagsterRunStatus.SUCCESS)          # finished runs take no room
    assert coordinator.room_to_launch_now()
    _add_run(instance, dg.DagsterRunStatus.STARTING)
    assert not coordinator.room_to_launch_now()              # 2 in progress: the limit
    instance.dispose()

    instance = _instance(tmp_path, max_concurrent_runs=5)
    assert instance.run_coordinator.room_to_launch_now()
    _add_run(instance, dg.DagsterRunStatus.QUEUED)           # one waits: a new run goes behind it
    assert not instance.run_coordinator.room_to_launch_now()
    instance.dispose()

    instance = _instance(tmp_path, max_concurrent_runs=0)    # Dagster's "launch nothing"
    assert not instance.run_coordinator.room_to_launch_now()
    instance.dispose()

    # limits only the daemon's dequeue applies: never launched past it
    instance = _instance(tmp_path, tag_concurrency_limits=[{"key": "kb/source", "limit": 1}])
    assert not instance.run_coordinator.room_to_launch_now()
    instance.dispose()


def test_a_run_that_must_wait_is_queued_as_before(tmp_path):
    from dagster._core.run_coordinator import SubmitRunContext

    instance = _instance(tmp_path, max_concurrent_runs=1)
    _add_run(instance, dg.DagsterRunStatus.STARTED)
    waiting = _add_run(instance, dg.DagsterRunStatus.NOT_STARTED)
    run = instance.run_coordinator.submit_run(SubmitRunContext(waiting, workspace=None))
    assert run.status == dg.DagsterRunStatus.QUEUED
    events = instance.all_logs(waiting.run_id)
    assert [e.dagster_event.event_type_value for e in events if e.dagster_event] == ["PIPELINE_ENQUEUED"]
    instance.dispose()


def test_when_the_check_fails_the_queue_decides(tmp_path, monkeypatch):
    instance = _instance(tmp_path)

    def refuse(*a, **k):
        raise RuntimeError("run storage unavailable")

    monkeypatch.setattr(instance, "get_runs_count", refuse)
    assert not instance.run_coordinator.room_to_launch_now()
    instance.dispose()
