"""Rows/s into Spark (issue 9), local[2], 100 B messages, in one run:

  shm      the "nsqshm" source reading a channel through shared memory
  tcp      the same source over TCP (transport=tcp, nsqd's max_rdy_count window)
  ceiling  a Python data source yielding ready-made Arrow batches of the same
           schema from an in-memory list: what Spark's Python data source path
           itself costs, the most any such source can reach

Each figure is a batch read of N messages ending in count(): every row and
every column crosses from the Python worker into the JVM.  The messages are
published and pumped into the channel before the clock starts.  Runs are
repeated (the first is a warm-up) and the median is reported.

    .venv/bin/python -m bench.spark [--messages 4000000] [--runs 5] [--json bench/results/spark.json]
"""

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

SIZE = 100
TARGET = 2_000_000
LISTEN = re.compile(r"(TCP|HTTP): listening on \S+:(\d+)")


class Broker:
    """`nsqshm start` in a temp dir on ephemeral ports."""

    def __init__(self, *flags):
        self.dir = tempfile.mkdtemp(prefix="nsqshm-bench-spark-")
        self.prefix = f"nsqshm-bench-{uuid.uuid4().hex[:8]}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nsqshm.cli", "start", "--tcp-address=127.0.0.1:0",
             "--http-address=127.0.0.1:0", f"--data-path={self.dir}",
             f"--shm-prefix={self.prefix}", *flags],
            stderr=subprocess.PIPE, text=True)
        self.ports = {}
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                m = LISTEN.search(line)
                if m:
                    self.ports[m.group(1)] = int(m.group(2))
                    if len(self.ports) == 2:
                        ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        instance = f"/dev/shm/{self.prefix}.instance"
        ready.wait(30)
        deadline = time.monotonic() + 10
        while not os.path.exists(instance) and time.monotonic() < deadline:
            time.sleep(0.02)
        if len(self.ports) < 2 or not os.path.exists(instance):
            self.stop()
            raise RuntimeError("nsqshm start did not come up")
        self.tcp = f"127.0.0.1:{self.ports['TCP']}"
        self.http = f"127.0.0.1:{self.ports['HTTP']}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for entry in os.listdir("/dev/shm"):
            if entry.startswith(self.prefix):
                try:
                    os.unlink(f"/dev/shm/{entry}")
                except FileNotFoundError:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)


def publish(broker, topic, n):
    """n messages of SIZE bytes through shared memory, pumped into channel "spark"."""
    import numpy as np

    from nsqshm.local import Producer
    from nsqshm.local.broker import Broker as Local

    local = Local(shm_prefix=broker.prefix)
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


def ceiling_source():
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from nsqshm.spark.schema import SCHEMA

    class Reader(DataSourceReader):
        def __init__(self, n, parts, batch):
            self.n, self.parts, self.batch = n, parts, batch

        def partitions(self):
            return [InputPartition(i) for i in range(self.parts)]

        def read(self, partition):
            # the in-memory list: Arrow batches of the same schema and sizes as the
            # shared-memory source yields, built before the first row is handed over
            from nsqshm._core.localbatch import Columns
            from nsqshm.local.arrow import record_batch

            per = self.n // self.parts + (partition.value < self.n % self.parts)
            k = min(self.batch, per)
            body = b"x" * SIZE
            msg = (b"\x00" * 8) + b"\x00\x01" + b"0123456789abcdef" + body
            frames = (len(msg) + 4).to_bytes(4, "big") + (2).to_bytes(4, "big") + msg
            cols = Columns()
            cols.add_frames(frames * k)
            full = record_batch(cols.export(), "bench", "spark")
            batches = [full] * (per // k)
            if per % k:
                batches.append(full.slice(0, per % k))
            yield from batches

    class Ceiling(DataSource):
        @classmethod
        def name(cls):
            return "nsqshm_ceiling"

        def schema(self):
            return SCHEMA

        def reader(self, schema):
            return Reader(int(self.options["n"]), int(self.options.get("parts", 2)),
                          int(self.options.get("batch", 65536)))

    return Ceiling


def timed(fn):
    t0 = time.perf_counter()
    rows = fn()
    return rows, time.perf_counter() - t0


def run(messages, runs, parts, batch):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from nsqshm.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("nsqshm-bench-spark")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(ceiling_source())
    broker = Broker(f"--mem-queue-size={messages + 100_000}")
    results = {"shm": [], "tcp": [], "ceiling": []}
    try:
        shm = {"shmPrefix": broker.prefix, "numPartitions": parts, "batchSize": batch}
        tcp = {"nsqdTcpAddress": broker.tcp, "nsqdHttpAddress": broker.http,
               "transport": "tcp", "numPartitions": parts, "batchSize": batch}

        def read(options):
            return spark.read.format("nsqshm").option("topic", "bench").options(**options) \
                .load().count()

        def ceiling():
            return spark.read.format("nsqshm_ceiling").option("n", messages) \
                .option("parts", parts).option("batch", batch).load().count()

        sources = [("ceiling", ceiling), ("shm", lambda: read(shm)), ("tcp", lambda: read(tcp))]
        for i in range(runs + 1):  # run 0 warms the JVM and the Python workers up
            # a different order each run, so no source always follows the same one
            for name, fn in sources[i % 3:] + sources[:i % 3]:
                if name != "ceiling":
                    publish(broker, "bench", messages)
                rows, secs = timed(fn)
                if rows != messages:
                    raise RuntimeError(f"{name}: {rows} rows, expected {messages}")
                rate = rows / secs
                print(f"run {i} {name:8s} {rows} rows in {secs:6.2f} s: "
                      f"{rate / 1e6:5.2f} M rows/s{'  (warm-up)' if i == 0 else ''}",
                      file=sys.stderr, flush=True)
                if i:
                    results[name].append(rate)
    finally:
        broker.stop()
        spark.stop()
    return results


def report(results, messages, runs, parts, batch):
    med = {k: statistics.median(v) for k, v in results.items()}
    doc = {
        "benchmark": "rows/s into Spark through the nsqshm source (issue 9)",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "messages": messages, "body_bytes": SIZE, "runs": runs, "partitions": parts,
        "arrow_batch_rows": batch, "master": "local[2]",
        "rows_per_s": {k: round(v) for k, v in med.items()},
        "all_runs": {k: [round(x) for x in v] for k, v in results.items()},
        "ratios": {"shm_to_ceiling": round(med["shm"] / med["ceiling"], 3),
                   "tcp_to_ceiling": round(med["tcp"] / med["ceiling"], 3),
                   "shm_to_tcp": round(med["shm"] / med["tcp"], 2)},
        "target_rows_per_s": TARGET, "target_met": med["shm"] >= TARGET,
    }
    print(f"\nrows/s into Spark, local[2], {messages} x {SIZE} B, median of {runs} runs:")
    for name in ("shm", "tcp", "ceiling"):
        print(f"  {name:8s} {med[name] / 1e6:6.2f} M rows/s")
    r = doc["ratios"]
    print(f"  shm/ceiling {r['shm_to_ceiling']:.2f}   tcp/ceiling {r['tcp_to_ceiling']:.2f}   "
          f"shm/tcp {r['shm_to_tcp']:.1f}x")
    print(f"  target >= {TARGET / 1e6:.0f} M rows/s through shm: "
          f"{'met' if doc['target_met'] else 'NOT met'}")
    return doc


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=4_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--batch", type=int, default=65536, help="rows per Arrow batch")
    ap.add_argument("--json", help="write the results here (e.g. bench/results/spark.json)")
    args = ap.parse_args(argv)
    results = run(args.messages, args.runs, args.partitions, args.batch)
    doc = report(results, args.messages, args.runs, args.partitions, args.batch)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
