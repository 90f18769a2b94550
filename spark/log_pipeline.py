"""Exactly once from a log topic to Parquet: JSON events read from a log
topic through the "nsqshm" source (offset ranges, docs/spark.md "Log
topics"), parsed, and appended to Parquet by Spark's file sink.

    nsqshm start --data-path=./nsq-data &
    python spark/log_pipeline.py --data-path ./nsq-data --generate 200000 --out ./log-out

Exactly once end to end, after any crash of the job: Spark writes each
micro-batch's offset range to the checkpoint's offset log before running
it; a restarted query runs that batch again over the same range (the log
still holds it), and the file sink's own log (OUT/events/_spark_metadata)
lists only the files of committed batches, so a batch's output is in the
table once however often it ran.  Read the table through Spark
(spark.read.parquet) or anything that honours _spark_metadata: files of a
batch cut short by a crash stay in the directory but are not in the table.

--generate publishes synthetic events first (HTTP /mpub, spread over the
partitions); --partitions makes the log topic if it is missing.
--trigger availableNow (the default) drains what the log holds and stops;
--trigger 0.5 runs a micro-batch every 0.5 s until killed.  Run it again
with the same --out to go on where it stopped.  It prints a summary: rows
read, rows in the table, events per action.
"""

import argparse
import json
import os
import random
import sys
import time
import urllib.request
from urllib.parse import quote

import pipeline  # the classic-topic pipeline beside this file (its Spark session)

ACTIONS = pipeline.ACTIONS


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-path", help="the broker's --data-path (broker on this host)")
    where.add_argument("--shm-prefix", help="the broker's --shm-prefix (broker on this host)")
    where.add_argument("--nsqd-http-address", help="host:port of a remote broker's HTTP API")
    ap.add_argument("--nsqd-tcp-address", help="host:port of a remote broker's TCP")
    ap.add_argument("--topic", default="events")
    ap.add_argument("--partitions", type=int, default=4, help="of a log topic made here")
    ap.add_argument("--channel", help="a channel whose cursor follows the committed offsets")
    ap.add_argument("--out", default="log-pipeline-out", help="directory for Parquet and "
                                                              "checkpoint")
    ap.add_argument("--trigger", default="availableNow",
                    help="availableNow, or seconds between micro-batches")
    ap.add_argument("--max-per-trigger", type=int, default=500_000)
    ap.add_argument("--generate", type=int, default=0, help="publish this many events first")
    ap.add_argument("--master", default="local[2]")
    return ap.parse_args(argv)


def source_options(args):
    if args.nsqd_http_address:
        opts = {"nsqdHttpAddress": args.nsqd_http_address}
        if args.nsqd_tcp_address:
            opts["nsqdTcpAddress"] = args.nsqd_tcp_address
        return opts
    if args.data_path:
        return {"dataPath": os.path.abspath(args.data_path)}
    return {"shmPrefix": args.shm_prefix}


def http_address(args):
    if args.nsqd_http_address:
        return args.nsqd_http_address
    from nsqshm.local.broker import Broker

    return Broker(args.data_path and os.path.abspath(args.data_path),
                  args.shm_prefix).http_address


def _post(address, path, body=b""):
    req = urllib.request.Request(f"http://{address}{path}", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def generate(args, n, seed=7, chunk=5000):
    """Make the log topic (if missing) and publish n events; returns
    {action: count} of what was published."""
    address = http_address(args)
    topic = quote(args.topic, safe="")
    _post(address, f"/topic/create?topic={topic}&partition_num={args.partitions}")
    rng = random.Random(seed)
    counts = dict.fromkeys(ACTIONS, 0)
    now = time.time()
    for first in range(0, n, chunk):
        events = []
        for i in range(first, min(n, first + chunk)):
            action = rng.choice(ACTIONS)
            counts[action] += 1
            events.append(json.dumps({"seq": i, "ts": now + i / 1000, "user": f"u{rng.randrange(500)}",
                                      "action": action, "value": rng.randrange(1, 10)}))
        _post(address, f"/mpub?topic={topic}", "\n".join(events).encode())
    return counts


def build(spark, args):
    """The streaming DataFrame of parsed events, with where each is in the log."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    event = StructType([StructField("seq", LongType()), StructField("ts", DoubleType()),
                        StructField("user", StringType()), StructField("action", StringType()),
                        StructField("value", DoubleType())])
    reader = (spark.readStream.format("nsqshm").option("topic", args.topic)
              .option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", args.max_per_trigger))
    if args.channel:
        reader = reader.option("channel", args.channel)
    for key, value in source_options(args).items():
        reader = reader.option(key, value)
    return (reader.load()
            .select("partition", "offset", "timestamp",
                    F.from_json(F.col("body").cast("string"), event).alias("e"))
            .select("partition", "offset", "timestamp", "e.*"))


def paths(args):
    out = os.path.abspath(args.out)
    return os.path.join(out, "events"), os.path.join(out, "checkpoint")


def run(spark, args):
    """Run the query (until availableNow drains the log, or forever)."""
    from nsqshm.spark import register

    register(spark)
    table, checkpoint = paths(args)
    query = (build(spark, args).writeStream.format("parquet").outputMode("append")
             .option("path", table).option("checkpointLocation", checkpoint))
    if args.trigger == "availableNow":
        query = query.trigger(availableNow=True)
    else:
        query = query.trigger(processingTime=f"{float(args.trigger)} seconds")
    started = time.monotonic()
    q = query.start()
    try:
        q.awaitTermination()
    except KeyboardInterrupt:
        q.stop()
    return {"input_rows": sum(p.get("numInputRows", 0) for p in q.recentProgress),
            "seconds": round(time.monotonic() - started, 1), "table": table}


def summarize(spark, table):
    """What the table holds (through _spark_metadata: committed batches only)."""
    df = spark.read.parquet(table)
    rows = df.count()
    distinct = df.select("partition", "offset").distinct().count()
    per_action = {r["action"]: r["count"] for r in df.groupBy("action").count().collect()}
    return {"rows": rows, "distinct_offsets": distinct, "per_action": per_action}


def session(master):
    return pipeline.session(master, "nsqshm-log-pipeline")


def main(argv=None):
    args = parse_args(argv)
    if args.generate:
        counts = generate(args, args.generate)
        print(f"published {sum(counts.values())} events to {args.topic!r}: {counts}",
              file=sys.stderr)
    spark = session(args.master)
    try:
        summary = run(spark, args)
        summary.update(summarize(spark, summary["table"]))
        print(json.dumps(summary))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
