"""Two Dagster in-process runs in two threads of one process: where does the process's stdout go afterwards?

    python bench/two_inprocess_runs_probe.py /tmp/some_empty_dagster_home

The route to run kb_signposts beside kb_embeddings inside `kb index` (docs/BENCHMARKS.md, "Full pass: where
the time goes") would be two execute_in_process runs at once. Each run captures compute logs by redirecting
fds 1 and 2 (LocalComputeLogManager, os.dup2); here run A starts first and ends first, so the captures unwind
out of order. Prints where fd 1 points after both runs (a compute-log file means the CLI's output is lost).
"""
import os
import sys
import threading
import time

os.environ["DAGSTER_HOME"] = sys.argv[1]
import dagster as dg  # noqa: E402


@dg.asset
def a_short():
    time.sleep(0.5)


@dg.asset
def b_long():
    time.sleep(2.0)


defs = dg.Definitions(assets=[a_short, b_long], jobs=[dg.define_asset_job("ja", selection=[a_short]),
                                                       dg.define_asset_job("jb", selection=[b_long])])
instance = dg.DagsterInstance.get()
before = os.readlink("/proc/self/fd/1")
thread = threading.Thread(target=lambda: defs.resolve_job_def("ja").execute_in_process(instance=instance))
thread.start()
time.sleep(0.2)
defs.resolve_job_def("jb").execute_in_process(instance=instance)
thread.join()
after = os.readlink("/proc/self/fd/1")
with open(os.path.join(sys.argv[1], "fd1_after.txt"), "w") as f:     # fd 1 itself may be a log file now
    f.write(f"compute logs: {type(instance.compute_log_manager).__name__}\nfd 1 before: {before}\nfd 1 after: {after}\n")
