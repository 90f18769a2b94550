"""spark/pipeline.py end to end: JSON events published through shared
memory, windowed counts in Parquet and in the results topic."""

import json
import os
import sys

import pyarrow.compute as pc
import pyarrow.parquet as pq

from nsqshm.local import Consumer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "spark"))
import pipeline  # noqa: E402


def test_pipeline_end_to_end(spark, broker, tmp_path):
    n = 20000
    args = pipeline.parse_args(["--shm-prefix", broker.prefix, "--out", str(tmp_path / "out"),
                                "--minutes", "5", "--window", "1 minute"])
    broker.post(f"/topic/create?topic={args.results_topic}")
    broker.post(f"/channel/create?topic={args.results_topic}&channel=check")
    assert pipeline.generate(args, n) == n + 1  # and the watermark marker
    summary = pipeline.run(spark, args)
    assert summary["input_rows"] == n + 1
    windows = pq.read_table(summary["parquet"])
    assert pc.sum(windows.column("events")).as_py() == n
    assert set(windows.column("action").to_pylist()) == set(pipeline.ACTIONS)
    assert windows.num_rows == 5 * len(pipeline.ACTIONS)  # 5 one-minute windows per action
    results = []
    with Consumer(args.results_topic, "check", shm_prefix=broker.prefix) as c:
        while len(results) < windows.num_rows:
            batch = c.fetch(1000, timeout=10)
            assert batch, f"only {len(results)} results published"
            results += [json.loads(bytes(b)) for b in batch.bodies()]
            batch.finish()
    assert sum(r["events"] for r in results) == n
    assert set(results[0]) == {"window_start", "window_end", "action", "events", "users",
                               "value_sum"}

    # a second run with the same checkpoint finds nothing new and repeats nothing
    again = pipeline.run(spark, args)
    assert again["input_rows"] == 0
    assert pq.read_table(summary["parquet"]).num_rows == windows.num_rows
