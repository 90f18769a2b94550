"""A Structured Streaming pipeline on nsqshm: JSON events published to a
topic are read through the "nsqshm" source, parsed, counted per event-time
window and action, and each finalised window is written to Parquet and
published as JSON to a results topic.

    nsqshm start --data-path=./nsq-data &
    python spark/pipeline.py --data-path ./nsq-data --generate 200000

--generate publishes synthetic events first (through shared memory);
without it the job reads what producers published.  --trigger availableNow
(the default) drains what is queued and stops; --trigger 5 runs a
micro-batch every 5 s until interrupted.  Run again with the same
--checkpoint to go on where it stopped.

An event:  {"ts": 1700000000.5, "user": "u17", "action": "click", "value": 3}
A result:  {"window_start": "...", "window_end": "...", "action": "click", "events": 412,
            "users": 97, "value_sum": 1203.0}
"""

import argparse
import json
import os
import random
import sys
import time

ACTIONS = ("view", "click", "cart", "buy")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--data-path", help="the broker's --data-path (broker on this host)")
    where.add_argument("--shm-prefix", help="the broker's --shm-prefix (broker on this host)")
    where.add_argument("--nsqd-tcp-address", help="host:port of a remote broker (TCP)")
    ap.add_argument("--topic", default="events")
    ap.add_argument("--channel", default="pipeline")
    ap.add_argument("--results-topic", default="event_counts")
    ap.add_argument("--out", default="pipeline-out", help="directory for Parquet and checkpoint")
    ap.add_argument("--checkpoint", help="checkpoint directory (default: OUT/checkpoint)")
    ap.add_argument("--window", default="1 minute")
    ap.add_argument("--watermark", default="30 seconds")
    ap.add_argument("--trigger", default="availableNow",
                    help="availableNow, or seconds between micro-batches")
    ap.add_argument("--max-per-trigger", type=int, default=500_000)
    ap.add_argument("--generate", type=int, default=0, help="publish this many events first")
    ap.add_argument("--minutes", type=int, default=5, help="event-time span of --generate")
    ap.add_argument("--master", default="local[2]")
    return ap.parse_args(argv)


def source_options(args):
    if args.nsqd_tcp_address:
        return {"nsqdTcpAddress": args.nsqd_tcp_address}
    if args.data_path:
        return {"dataPath": os.path.abspath(args.data_path)}
    return {"shmPrefix": args.shm_prefix}


def generate(args, n, seed=7):
    """Publish n events spread over --minutes of event time, then one late
    marker event that moves the watermark past them all (so every window
    is final when the job drains the topic)."""
    from nsqshm.local import Producer

    rng = random.Random(seed)
    start = (int(time.time()) // 60 - args.minutes - 2) * 60.0
    span = args.minutes * 60.0
    events = [json.dumps({"ts": start + span * i / n, "user": f"u{rng.randrange(500)}",
                          "action": rng.choice(ACTIONS), "value": rng.randrange(1, 10)})
              for i in range(n)]
    events.append(json.dumps({"ts": start + span + 3600, "user": "marker", "action": "marker",
                              "value": 0}))
    kw = {"data_path": args.data_path} if args.data_path else {"shm_prefix": args.shm_prefix}
    with Producer(args.topic, **kw) as producer:
        producer.publish_many([e.encode() for e in events])
    return len(events)


def build(spark, args):
    """The streaming DataFrame of finalised windows."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, StringType, StructField, StructType

    event = StructType([StructField("ts", DoubleType()), StructField("user", StringType()),
                        StructField("action", StringType()), StructField("value", DoubleType())])
    reader = (spark.readStream.format("nsqshm").option("topic", args.topic)
              .option("channel", args.channel)
              .option("maxMessagesPerTrigger", args.max_per_trigger))
    for key, value in source_options(args).items():
        reader = reader.option(key, value)
    events = (reader.load()
              .select(F.from_json(F.col("body").cast("string"), event).alias("e"))
              .select("e.*")
              .where(F.col("ts").isNotNull())  # not JSON, or not an event: dropped
              .withColumn("event_time", F.timestamp_seconds("ts")))
    return (events.withWatermark("event_time", args.watermark)
            .groupBy(F.window("event_time", args.window), "action")
            .agg(F.count("*").alias("events"), F.approx_count_distinct("user").alias("users"),
                 F.sum("value").alias("value_sum"))
            .select(F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"), "action", "events", "users",
                    "value_sum"))


def sink(args):
    """foreachBatch: one micro-batch's final windows to Parquet and to the results topic."""
    parquet = os.path.join(os.path.abspath(args.out), "windows")
    options = source_options(args)

    def write(batch, batch_id):
        from pyspark.sql import functions as F

        # the marker only moves the watermark (filtered here: a filter in the
        # streaming plan would be pushed below the watermark and drop it there)
        batch = batch.where(F.col("action") != "marker").cache()
        if batch.isEmpty():
            return
        batch.write.mode("append").parquet(parquet)

        out = batch.select(F.to_json(F.struct(*batch.columns)).alias("body"))
        writer = out.write.format("nsqshm").option("topic", args.results_topic).mode("append")
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.save()
        batch.unpersist()

    return write, parquet


def run(spark, args):
    from nsqshm.spark import register

    register(spark)
    write, parquet = sink(args)
    checkpoint = args.checkpoint or os.path.join(os.path.abspath(args.out), "checkpoint")
    query = (build(spark, args).writeStream.outputMode("append").foreachBatch(write)
             .option("checkpointLocation", checkpoint))
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
    progress = q.recentProgress
    return {"input_rows": sum(p.get("numInputRows", 0) for p in progress),
            "seconds": round(time.monotonic() - started, 1),
            "batches": [[p["batchId"], p.get("numInputRows", 0),
                         p.get("eventTime", {}).get("watermark")] for p in progress],
            "parquet": parquet,
            "results_topic": args.results_topic}


def session(master, app_name="nsqshm-pipeline"):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName(app_name)
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    return spark


def main(argv=None):
    args = parse_args(argv)
    if args.generate:
        if args.nsqd_tcp_address:
            sys.exit("--generate publishes through shared memory: give --data-path or "
                     "--shm-prefix")
        print(f"published {generate(args, args.generate)} events to {args.topic!r}",
              file=sys.stderr)
    spark = session(args.master)
    try:
        summary = run(spark, args)
        windows = spark.read.parquet(summary["parquet"]).count() \
            if os.path.isdir(summary["parquet"]) else 0
        summary["windows_in_parquet"] = windows
        print(json.dumps(summary))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
