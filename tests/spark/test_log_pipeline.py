"""spark/log_pipeline.py: a log topic to Parquet exactly once, with its
driver SIGKILLed in the middle of a micro-batch and the query restarted
from its checkpoint: the table it leaves is the table of an uninterrupted
run over the same log, row for row."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.local.conftest import started
from tests.spark.conftest import wait_for

SPARK_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "spark")
sys.path.insert(0, SPARK_DIR)
import log_pipeline  # noqa: E402


def batches(checkpoint, kind):
    path = os.path.join(checkpoint, kind)
    if not os.path.isdir(path):
        return set()
    return {int(n) for n in os.listdir(path) if n.isdigit()}


@pytest.mark.soak  # two Spark drivers, one killed: about a minute on a loaded machine
def test_killed_and_restarted_exactly_once(spark, nsqd_factory, tmp_path):
    broker = started(nsqd_factory())
    n = 8000
    argv = ["--shm-prefix", broker.prefix, "--out", str(tmp_path / "out"), "--partitions", "4",
            "--max-per-trigger", "1000", "--channel", "pipeline"]
    args = log_pipeline.parse_args(argv)
    counts = log_pipeline.generate(args, n)
    table, checkpoint = log_pipeline.paths(args)

    # the job in its own process group (the driver and its JVM), batches back to back
    started_at = time.monotonic()
    job = subprocess.Popen([sys.executable, os.path.join(SPARK_DIR, "log_pipeline.py"), *argv,
                            "--trigger", "0"], start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    try:
        # killed while a batch is planned (in the offset log) and not committed
        assert wait_for(lambda: len(batches(checkpoint, "commits")) >= 3 and
                        max(batches(checkpoint, "offsets")) > max(batches(checkpoint, "commits")),
                        timeout=120, interval=0.005)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
        print(f"killed after {time.monotonic() - started_at:.1f} s")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    planned, committed = batches(checkpoint, "offsets"), batches(checkpoint, "commits")
    assert max(planned) > max(committed) and len(committed) < n // 1000

    # what the dead driver planned runs again as logged; the rest in large batches
    args.trigger, args.max_per_trigger = "availableNow", n
    t = time.monotonic()
    log_pipeline.run(spark, args)
    print(f"restart ran {time.monotonic() - t:.1f} s")
    summary = log_pipeline.summarize(spark, table)
    assert summary == {"rows": n, "distinct_offsets": n, "per_action": counts}

    # the same log read by a query nobody killed, into a table of its own
    whole = log_pipeline.parse_args([*argv[:argv.index("--out")], "--out", str(tmp_path / "whole"),
                                     *argv[argv.index("--out") + 2:]])
    whole.channel = None  # (the killed run's channel cursor is not this run's business)
    whole.trigger, whole.max_per_trigger = "availableNow", 1000
    log_pipeline.run(spark, whole)
    killed = spark.read.parquet(table)
    uninterrupted = spark.read.parquet(log_pipeline.paths(whole)[0])
    assert killed.count() == uninterrupted.count() == n
    assert killed.exceptAll(uninterrupted).count() == 0   # every row, duplicates counted
    assert uninterrupted.exceptAll(killed).count() == 0
