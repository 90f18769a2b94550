"""Rows/s into Spark (issue 9), local[2], 100 B messages, in one run:

  log      the "nsqshm" source on a log topic (issue 19): offset ranges read
           from the partition logs' mmap'd segments (nothing consumed, so the
           same N messages are read every run)
  shm      the "nsqshm" source reading a channel through shared memory
  tcp      the same source over TCP (transport=tcp, nsqd's max_rdy_count window)
  ceiling  a Python data source yielding ready-made Arrow batches of the same
           schema and sizes from an in-memory list: what Spark's Python data
           source path itself costs, the most any such source can reach

Each figure is a batch read of N messages ending in count(): every row and
every column crosses from the Python worker into the JVM.  The messages are
published (through shared memory) and pumped into the channel before the
clock starts.  One warm-up run, then --runs runs; the order of the sources
rotates each run; medians.  Target: at least 2 M rows/s through shared memory.
(The method of issue 9's bench/spark.py, which now runs this suite.)
"""

import os
import random
import sys
import time

from .common import median
from .server import server, wait_local

TITLE, ISSUE = "Spark (issue 9)", "9"
HELP = "rows/s into Spark via shared memory, TCP, in-memory ceiling (issue 9)"
SIZE = 100
TARGET_ROWS = 2_000_000


def add_arguments(ap):
    ap.add_argument("--messages", type=int, default=4_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--batch-size", "--batch", dest="batch", type=int, default=65536,
                    help="rows per Arrow batch")


def publish(target, topic, n):
    """n messages of SIZE bytes through shared memory, pumped into channel "spark"."""
    import numpy as np

    from nsqshm.local import Producer
    from nsqshm.local.broker import Broker

    local = Broker(shm_prefix=target.prefix)
    local.create_channel(topic, "spark")
    ring = local.attach(local.channel_ring_name(topic, "spark"))
    base = ring.depth
    body = (os.urandom(SIZE // 2).hex().encode() * 2)[:SIZE]
    chunk = 250_000
    data = body * chunk
    offsets = np.arange(chunk + 1, dtype=np.int64) * SIZE
    with Producer(topic, broker=local) as p:
        done = 0
        while done < n:
            k = min(chunk, n - done)
            p.publish_buffer(data, offsets[:k + 1])
            done += k
    deadline = time.monotonic() + 120
    while ring.depth < base + n and time.monotonic() < deadline:
        time.sleep(0.01)
    depth = ring.depth
    ring.close()
    if depth < base + n:
        raise RuntimeError(f"only {depth - base} of {n} messages reached the channel ring")


def publish_log(target, topic, n, partitions):
    """n messages of SIZE bytes into a new log topic, spread evenly over its
    partitions (MPUB T p over TCP, the setup of the read benchmark: how the
    messages got there is not what it measures)."""
    import urllib.request

    import numpy as np

    from nsqshm.spark.tcp import Publisher

    host, port = target.http
    req = urllib.request.Request(f"http://{host}:{port}/topic/create?topic={topic}"
                                 f"&partition_num={partitions}", data=b"", method="POST")
    urllib.request.urlopen(req, timeout=10).close()
    body = (os.urandom(SIZE // 2).hex().encode() * 2)[:SIZE]
    chunk = 100_000
    data = body * chunk
    offsets = np.arange(chunk + 1, dtype=np.int32) * SIZE
    pub = Publisher("{}:{}".format(*target.tcp))
    try:
        for p in range(partitions):
            left = n // partitions + (p < n % partitions)
            while left:
                k = min(chunk, left)
                pub.publish_spans(topic, data, offsets, 4, 0, k, partition=p)
                left -= k
    finally:
        pub.close()


def ceiling_source():
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from nsqshm.spark.schema import LOG_SCHEMA, SCHEMA

    class Reader(DataSourceReader):
        def __init__(self, n, parts, batch, log):
            self.n, self.parts, self.batch, self.log = n, parts, batch, log

        def partitions(self):
            return [InputPartition(i) for i in range(self.parts)]

        def read(self, partition):
            # the in-memory list: Arrow batches as the shared-memory source yields
            # them (with log: as the log source does, its partition and offset
            # columns too), built (by the same C code) before the first row is
            # handed over
            import numpy as np
            import pyarrow as pa

            from nsqshm._core.localbatch import Columns
            from nsqshm.local.arrow import record_batch

            per = self.n // self.parts + (partition.value < self.n % self.parts)
            k = min(self.batch, per)
            msg = (b"\x00" * 8) + b"\x00\x01" + b"0123456789abcdef" + b"x" * SIZE
            frames = (len(msg) + 4).to_bytes(4, "big") + (2).to_bytes(4, "big") + msg
            cols = Columns()
            cols.add_frames(frames * k)
            full = record_batch(cols.export(), "bench", "spark")
            if self.log:
                columns = full.columns
                columns[5] = pa.nulls(k, pa.string())  # a log read's channel: none
                full = pa.RecordBatch.from_arrays(
                    [*columns, pa.array(np.full(k, partition.value, dtype=np.int32)),
                     pa.array(np.arange(k, dtype=np.int64))],
                    names=[*full.schema.names, "partition", "offset"])
            batches = [full] * (per // k)
            if per % k:
                batches.append(full.slice(0, per % k))
            yield from batches

    class Ceiling(DataSource):
        @classmethod
        def name(cls):
            return "nsqshm_ceiling"

        def schema(self):
            return LOG_SCHEMA if self.options.get("log") == "true" else SCHEMA

        def reader(self, schema):
            return Reader(int(self.options["n"]), int(self.options.get("parts", 2)),
                          int(self.options.get("batch", 65536)),
                          self.options.get("log") == "true")

    return Ceiling


def _session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from nsqshm.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("nsqshm-bench-spark")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(ceiling_source())
    return spark


def run(ctx):
    try:
        import pyspark  # noqa: F401  (the spark extra)
    except ImportError as err:
        return {"skipped": f"pyspark is not installed (pip install nsqshm[spark]): {err}"}
    a = ctx.args
    if a.nsqd_tcp_address:
        return {"skipped": "starts nsqshm itself (the shared-memory read needs a local broker)"}
    if ctx.quick:
        a.messages = min(a.messages, 200_000)
    n, runs = a.messages, ctx.runs(default=5)
    results = {"log": [], "shm": [], "tcp": [], "ceiling": [], "ceiling_log": []}
    spark = _session()
    try:
        with server(a, backlog=(n + 100_000, SIZE)) as target, \
                ctx.progress.task("spark", len(results) * (runs + 1)) as advance:
            wait_local(target)
            publish_log(target, "benchlog", n, a.partitions)  # once: a log read consumes nothing
            common = {"numPartitions": a.partitions, "batchSize": a.batch}
            options = {
                "log": {"shmPrefix": target.prefix, "batchSize": a.batch},
                "shm": {"shmPrefix": target.prefix, **common},
                "tcp": {"nsqdTcpAddress": "{}:{}".format(*target.tcp), "transport": "tcp",
                        "nsqdHttpAddress": "{}:{}".format(*target.http), **common}}

            def read(name):
                if name in ("ceiling", "ceiling_log"):
                    df = spark.read.format("nsqshm_ceiling").options(
                        n=n, parts=a.partitions, batch=a.batch, log=str(name == "ceiling_log"
                                                                       ).lower())
                elif name == "log":
                    df = spark.read.format("nsqshm").option("topic", "benchlog").options(
                        **options[name])
                else:
                    publish(target, "bench", n)  # not timed
                    df = spark.read.format("nsqshm").option("topic", "bench").options(
                        **options[name])
                t0 = time.perf_counter()
                rows = df.load().count()
                return rows, time.perf_counter() - t0

            names = ["ceiling", "log", "shm", "tcp", "ceiling_log"]
            for i in range(runs + 1):  # run 0 warms the JVM and the Python workers up
                if i:
                    ctx.settle()
                # a seeded shuffle per run: no source keeps the same neighbours
                for name in random.Random(i).sample(names, len(names)):
                    rows, secs = read(name)
                    if rows != n:
                        raise RuntimeError(f"{name}: {rows} rows, expected {n}")
                    ctx.say(f"run {i} {name:8s} {rows} rows in {secs:6.2f} s: "
                            f"{rows / secs / 1e6:5.2f} M rows/s{'  (warm-up)' if not i else ''}")
                    if i:
                        results[name].append(rows / secs)
                    advance()
    finally:
        spark.stop()
    med = {k: median(v) for k, v in results.items()}
    return {"params": {"messages": n, "size": SIZE, "partitions": a.partitions,
                       "batch": a.batch, "master": "local[2]", "order": "shuffled"},
            "runs": results, "median": med,
            # the log source's rows have two more columns (partition, offset) than
            # the others': its ceiling yields them too
            "ratios": {"log_to_ceiling": med["log"] / med["ceiling_log"],
                       "log_to_plain_ceiling": med["log"] / med["ceiling"],
                       "log_to_shm": med["log"] / med["shm"],
                       "shm_to_ceiling": med["shm"] / med["ceiling"],
                       "tcp_to_ceiling": med["tcp"] / med["ceiling"],
                       "shm_to_tcp": med["shm"] / med["tcp"]}}


def render(res):
    p, m, r = res["params"], res["median"], res["ratios"]
    n = len(res["runs"]["shm"])
    out = [f"Rows/s into Spark on `local[2]`: a batch read of {p['messages']:,} messages of "
           f"{p['size']} B ending in `count()`, so every row and every column crosses from the "
           f"Python worker into the JVM; {p['partitions']} partitions, Arrow batches of "
           f"{p['batch']:,} rows. One warm-up run, then {n}; the order of the sources "
           + ("is shuffled each run (seeded). " if p.get("order") == "shuffled"
              else "rotates each run. ") +
           "The log source's ratio is to the ceiling with its columns.", "",
           "| source | median | runs | of ceiling |", "|---|---:|---|---:|"]
    for key, name, of in (
            ("log", "`nsqshm`, log topic (mmap'd segments)", "ceiling_log"),
            ("shm", "`nsqshm`, shared memory", "ceiling"), ("tcp", "`nsqshm`, TCP", "ceiling"),
            ("ceiling", "ceiling: Python data source over an in-memory list of Arrow batches",
             "ceiling"),
            ("ceiling_log", "ceiling with the log source's columns (partition, offset too)",
             "ceiling_log")):
        if key not in m:  # (results saved before the source read log topics)
            continue
        if of not in m:  # (results saved before the log's own ceiling)
            of = "ceiling"
        runs = ", ".join(f"{v / 1e6:.2f}" for v in res["runs"][key])
        out.append(f"| {name} | {m[key] / 1e6:.2f} M rows/s | {runs} | "
                   f"{m[key] / m[of]:.2f} |")
    out += ["", f"Shared memory / TCP: {r['shm_to_tcp']:.1f}x."
                + (f" Log topic / classic channel through shared memory: {r['log_to_shm']:.2f}x."
                   if "log_to_shm" in r else "")
                + (f" Log topic / the ceiling without its two columns: "
                   f"{m['log'] / m['ceiling']:.2f}." if "log" in m else "")]
    return out


def targets(res):
    v = res["median"]["shm"]
    rows = [("9", "rows/s into Spark through shared memory, local[2]", ">= 2 M",
             f"{v / 1e6:.2f} M", v >= TARGET_ROWS)]
    log = res["ratios"].get("log_to_ceiling")  # (absent from results saved before issue 19)
    if log is not None:
        rows.append(("19", "rows/s from a log topic, of the in-memory ceiling with the same "
                           "columns (partition, offset)", ">= 0.9",
                     f"{log:.2f}", log >= 0.9))
    return rows
