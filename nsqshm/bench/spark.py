"""Rows/s into Spark (issue 9): the "nsqshm" data source's batch read through
shared memory and through TCP, and a Python data source yielding the same
rows from memory (the ceiling of Spark's Python data source path), in one
run on local[2].  100 B messages; each read forces every body through
(sum of lengths).  Target: at least 2 M rows/s through shared memory.

Each read gets N messages published before it (over TCP, not timed) to a
fresh topic of one broker.  Skipped until nsqshm.spark and pyspark import.
"""

import argparse
import os
import sys
import time
import urllib.request
import uuid

from . import loadgen
from .common import median, not_built
from .server import server

TITLE, ISSUE = "Spark (issue 9)", "9"
HELP = "rows/s into Spark via shared memory, TCP, in-memory ceiling (issue 9)"
TARGET_ROWS = 2_000_000


def add_arguments(ap):
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=2, help="numPartitions of the source")


class _MemorySource:
    """Built on first use: pyspark is imported only when the suite runs."""

    cls = None

    @classmethod
    def get(cls):
        if cls.cls is None:
            cls.cls = _memory_source()
        return cls.cls


def _memory_source():
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from nsqshm.spark.schema import SCHEMA

    class MemoryReader(DataSourceReader):
        def __init__(self, options):
            self.rows = int(options["rows"])
            self.size = int(options["size"])
            self.parts = int(options["partitions"])

        def partitions(self):
            return [InputPartition(i) for i in range(self.parts)]

        def read(self, partition):
            import pyarrow as pa

            n = 65536
            batch = pa.RecordBatch.from_arrays(
                [pa.array([b"m" * self.size] * n, pa.binary()),
                 pa.array([f"{i:016x}" for i in range(n)]),
                 pa.array([time.time_ns() // 1000] * n, pa.timestamp("us", tz="UTC")),
                 pa.array([1] * n, pa.int32()), pa.array(["t"] * n), pa.array(["c"] * n)],
                schema=pa.schema([("body", pa.binary()), ("id", pa.string()),
                                  ("timestamp", pa.timestamp("us", tz="UTC")),
                                  ("attempts", pa.int32()), ("topic", pa.string()),
                                  ("channel", pa.string())]))
            left = self.rows // self.parts
            while left > 0:
                yield batch if left >= n else batch.slice(0, left)
                left -= n

    class MemorySource(DataSource):
        @classmethod
        def name(cls):
            return "nsqshm_bench_memory"

        def schema(self):
            return SCHEMA

        def reader(self, schema):
            return MemoryReader(self.options)

    return MemorySource


def _session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from nsqshm.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("nsqshm-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(_MemorySource.get())
    return spark


def _timed_read(reader):
    t0 = time.perf_counter()
    row = reader.load().selectExpr("count(*) AS n", "sum(length(body)) AS bytes").collect()[0]
    return row["n"], time.perf_counter() - t0


def _publish(target, topic, messages, size):
    # the channel first, so the messages are queued in it when the read starts
    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel=spark"):
        req = urllib.request.Request("http://{}:{}".format(*target.http) + path, method="POST")
        urllib.request.urlopen(req, timeout=10).close()
    spec = argparse.Namespace(messages=messages, size=size, batch=1000, window=4, rdy=2500,
                              publishers=2, consumers=0, rate=0, runfor=0)
    loadgen.publish(target, topic, spec)


def run(ctx):
    missing = not_built("nsqshm.spark", ISSUE) or not_built("pyspark", ISSUE)
    if missing:
        return missing
    a = ctx.args
    if a.nsqd_tcp_address:
        return {"skipped": "starts nsqshm itself (the shared-memory read needs a local broker)"}
    if ctx.quick:
        a.messages = min(a.messages, 200_000)
    spark = _session()
    rows = []
    try:
        # not timed: Spark starts its Python workers and loads the sources on first use
        with server(a, backlog=(20_000, a.size)) as target:
            _publish(target, "warmup", 10_000, a.size)
            _timed_read(spark.read.format("nsqshm").options(topic="warmup",
                                                             shmPrefix=target.prefix))
        _timed_read(spark.read.format("nsqshm_bench_memory").options(
            rows=100_000, size=a.size, partitions=a.partitions))
        with ctx.progress.task("spark", 3 * ctx.runs()) as advance:
            for i in range(ctx.runs()):
                row = {}
                ctx.settle()
                with server(a, backlog=(2 * a.messages, a.size)) as target:
                    for way in ("shm", "tcp"):
                        topic = f"spark{uuid.uuid4().hex[:8]}"
                        _publish(target, topic, a.messages, a.size)
                        opts = {"topic": topic, "transport": way, "maxMessages": a.messages,
                                "numPartitions": a.partitions}
                        if way == "shm":
                            opts.update(shmPrefix=target.prefix)
                        else:
                            opts.update(nsqdTcpAddress="{}:{}".format(*target.tcp),
                                        nsqdHttpAddress="{}:{}".format(*target.http))
                        n, secs = _timed_read(spark.read.format("nsqshm").options(**opts))
                        row[way] = {"rows": n, "seconds": secs, "rows_per_s": n / secs}
                        advance()
                mem = spark.read.format("nsqshm_bench_memory").options(
                    rows=a.messages, size=a.size, partitions=a.partitions)
                n, secs = _timed_read(mem)
                row["memory"] = {"rows": n, "seconds": secs, "rows_per_s": n / secs}
                advance()
                rows.append(row)
                ctx.say(f"run {i + 1}: " + ", ".join(
                    f"{k} {v['rows_per_s'] / 1e6:.2f} M rows/s ({v['rows']:,} rows)"
                    for k, v in row.items()))
    finally:
        spark.stop()
    summary = {k: median([r[k]["rows_per_s"] for r in rows]) for k in ("shm", "tcp", "memory")}
    summary["shm_of_memory"] = summary["shm"] / summary["memory"]
    summary["shm_over_tcp"] = summary["shm"] / summary["tcp"]
    return {"params": {"messages": a.messages, "size": a.size, "partitions": a.partitions},
            "runs": rows, "median": summary}


def render(res):
    p, m, last = res["params"], res["median"], res["runs"][-1]
    return [f"Batch read of {p['messages']:,} messages of {p['size']} B into a local[2] "
            f"SparkSession ({p['partitions']} partitions), count and sum of body lengths; "
            f"medians of {len(res['runs'])} runs (the session is started once, not timed).", "",
            "| source | rows read (last run) | rows/s | of the in-memory source |",
            "|---|---:|---:|---:|",
            f"| nsqshm, shared memory | {last['shm']['rows']:,} | {m['shm'] / 1e6:.2f} M | "
            f"{m['shm_of_memory']:.2f} |",
            f"| nsqshm, TCP | {last['tcp']['rows']:,} | {m['tcp'] / 1e6:.2f} M | "
            f"{m['tcp'] / m['memory']:.2f} |",
            f"| Python data source over memory (the ceiling) | {last['memory']['rows']:,} | "
            f"{m['memory'] / 1e6:.2f} M | 1.00 |"]


def targets(res):
    v = res["median"]["shm"]
    return [("9", "rows/s into Spark through shared memory, local[2]", ">= 2 M",
             f"{v / 1e6:.2f} M", v >= TARGET_ROWS)]
