"""The fault-injection harness (bench/faults.py), short: a few trials against the real `kb index` process on
a small corpus. Each fault is followed by a re-run whose end state must equal a clean index of the same
corpus (documents, chunks, vectors, document vectors, keyword statistics), with no duplicate, no orphan, and
at most one batch of texts embedded again after a kill -9, a stop or a database restart (the next model call
starts only once the previous batch has committed: pipeline/embeddings.py WRITE_BEFORE_NEXT_CALL)."""
from __future__ import annotations

import importlib.util
import signal
import sys
import tempfile
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "faults.py"


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("kb_bench_faults", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod      # dataclasses look their module up there
    spec.loader.exec_module(mod)
    h = mod.Harness(Path(tempfile.mkdtemp(prefix="kbft-", dir="/tmp")), n_docs=16, cost=0.02, batch_rows=20,
                    seed=5)
    clean = h.reference()
    assert clean["vectors"] == clean["chunks"] > 100
    return h


def _assert_recovered(trial, max_batches: float = 1):
    assert trial.rerun_rc == 0, trial
    assert trial.diffs == [], trial
    assert trial.redone_batches <= max_batches, trial
    assert trial.server_left == 0, trial          # the embedded server stopped when the last holder left


@pytest.mark.timeout(900)
def test_kill_9_during_embedding_then_rerun_equals_a_clean_index(harness):
    trial = harness.kill9("kb_embeddings")
    # (where it lands depends on the machine's load: the stage's length comes from the clean run)
    assert trial.fault_rc == -signal.SIGKILL
    _assert_recovered(trial, max_batches=1)     # the batch being written or the call in flight, never both


@pytest.mark.timeout(900)
def test_sigterm_stops_within_10_s_with_exit_143_and_one_line(harness):
    trial = harness.sigterm("kb_embeddings")
    assert trial.fault_rc == 143 and trial.stop_seconds is not None
    assert "kb index: stopped by SIGTERM" in trial.notes and "re-run `kb index` to finish" in trial.notes
    _assert_recovered(trial, max_batches=1)     # a stop finishes the batch being written: only the call in flight


@pytest.mark.timeout(900)
def test_two_runs_at_once_do_the_work_once_and_no_wait_exits_3(harness):
    trial = harness.concurrent()
    assert trial.diffs == [], trial.notes
    assert "rc 0/0, --no-wait rc 3" in trial.notes and "waited: True" in trial.notes
    _assert_recovered(trial, max_batches=0)


@pytest.mark.timeout(900)
def test_database_restarted_mid_run_the_run_finishes(harness):
    trial = harness.database_restart(2, retry_seconds=20)
    assert trial.fault_rc == 0, trial.notes
    # vectors computed before the connection dropped are carried to the stage's re-run (pipeline/embeddings.py):
    # at most one batch is redone (was two: the batch being written and the call in flight)
    _assert_recovered(trial, max_batches=1)
