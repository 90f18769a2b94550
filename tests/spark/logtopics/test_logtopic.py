"""The "nsqshm" source and sink on log topics (offset ranges, Kafka's
options), with a real local[2] session and real brokers."""

import json
import re
import time

import pytest

from nsqshm.ring import Ring
from tests.local.conftest import started
from tests.spark.conftest import wait_for


@pytest.fixture
def log_broker(nsqd_factory):
    # small segments, so that retention can remove some in a test
    return started(nsqd_factory("--max-bytes-per-file=4096"))


def make(broker, topic, partitions, **extra):
    query = "".join(f"&{k}={v}" for k, v in extra.items())
    status, body = broker.post(f"/topic/create?topic={topic}&partition_num={partitions}{query}")
    assert status == 200, body


def publish(broker, topic, partition, bodies):
    status, body = broker.post(f"/mpub?topic={topic}&partition={partition}",
                               b"\n".join(bodies))
    assert status == 200, body


def stats(broker, topic):
    status, body = broker.get(f"/stats?format=json&topic={topic}")
    return json.loads(body)["topics"][0]


def cursor(broker, topic, channel):
    chans = {c["channel_name"]: c for c in stats(broker, topic)["channels"]}
    return {e["partition"]: e["confirmed_offset"] for e in chans[channel]["partitions"]}


def load(spark, broker, topic, **options):
    r = spark.read.format("nsqshm").option("shmPrefix", broker.prefix)
    if topic is not None:
        r = r.option("topic", topic)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


@pytest.mark.workers(1, 2)
def test_batch_read_offsets_partitions_and_ranges(spark, log_broker):
    make(log_broker, "lt", 3)
    sent = {p: [f"p{p}-{i}".encode() for i in range(200 * (p + 1))] for p in range(3)}
    for p, bodies in sent.items():
        publish(log_broker, "lt", p, bodies)
    df = load(spark, log_broker, "lt")
    assert df.schema.simpleString() == (
        "struct<body:binary,id:string,timestamp:timestamp,attempts:int,topic:string,"
        "channel:string,partition:int,offset:bigint>")
    rows = df.collect()
    assert len(rows) == 1200
    for r in rows:  # each row where the log has it; the ID is its position
        assert r.body == sent[r.partition][r.offset]
        assert int(r.id, 16) == (r.partition << 48) | r.offset
    assert {r.topic for r in rows} == {"lt"} and {r.channel for r in rows} == {None}
    # nothing consumed: the same read again reads the same rows
    assert load(spark, log_broker, "lt").count() == 1200

    ranged = load(spark, log_broker, "lt", minPartitions=6,
                  startingOffsets='{"lt":{"0":10,"1":-2,"2":395}}',
                  endingOffsets='{"lt":{"0":20,"1":-1,"2":1000}}')
    assert ranged.rdd.getNumPartitions() >= 6   # partition 1's 400 offsets split
    got = {}
    for r in ranged.select("partition", "offset").collect():
        got.setdefault(r.partition, []).append(r.offset)
    assert {p: sorted(offs) for p, offs in got.items()} == {
        0: list(range(10, 20)), 1: list(range(400)), 2: list(range(395, 600))}


@pytest.mark.workers(2)
def test_tcp_reads_the_same_ranges(spark, log_broker):
    """A broker on another host: SUB_ADVANCED per range, each offset once."""
    make(log_broker, "far", 3)
    for p in range(3):
        publish(log_broker, "far", p, [f"f{p}-{i}".encode() for i in range(300)])
    tcp = {"transport": "tcp", "nsqdTcpAddress": f"127.0.0.1:{log_broker.tcp_port}",
           "nsqdHttpAddress": f"127.0.0.1:{log_broker.http_port}", "batchSize": 100}
    spec = {"startingOffsets": '{"far":{"0":0,"1":50,"2":299}}', "minPartitions": 4}
    remote = sorted((r.partition, r.offset, r.body, r.id) for r in
                    load(spark, log_broker, "far", **tcp, **spec).collect())
    local = sorted((r.partition, r.offset, r.body, r.id) for r in
                   load(spark, log_broker, "far", **spec).collect())
    assert remote == local and len(remote) == 300 + 250 + 1
    assert all(body == f"f{p}-{o}".encode() for p, o, body, _ in remote)
    # the tasks' channels were ephemeral: gone with their connections
    assert wait_for(lambda: not stats(log_broker, "far")["channels"])


def test_batch_read_between_two_timestamps(spark, log_broker):
    make(log_broker, "ts", 2)
    for p in range(2):
        publish(log_broker, "ts", p, [b"before"] * 50)
    # t1 on a whole second: the broker's search by seconds finds the first
    # "between" itself, which a reader off by one would skip
    second = int(time.time()) + 1
    time.sleep(second - time.time() + 0.02)
    t1 = second * 1000
    for p in range(2):
        publish(log_broker, "ts", p, [b"between"] * (30 + p))
    time.sleep(0.05)
    t2 = int(time.time() * 1000)
    time.sleep(0.05)
    for p in range(2):
        publish(log_broker, "ts", p, [b"after"] * 20)
    # on this host (the logs' time index), and as from another host (the broker's
    # /message/get by timestamp, then by count, refined to the millisecond)
    tcp = {"transport": "tcp", "nsqdTcpAddress": f"127.0.0.1:{log_broker.tcp_port}",
           "nsqdHttpAddress": f"127.0.0.1:{log_broker.http_port}"}
    for how in ({}, tcp):
        df = load(spark, log_broker, "ts", startingTimestamp=t1, endingTimestamp=t2, **how)
        rows = df.collect()
        assert sorted(r.body for r in rows) == [b"between"] * 61, how
        by_ts = load(spark, log_broker, "ts", **how,
                     startingOffsetsByTimestamp=json.dumps({"ts": {"0": t1, "1": t2}}))
        got = sorted((r.partition, r.body) for r in by_ts.collect())
        assert got == [(0, b"after")] * 20 + [(0, b"between")] * 30 + [(1, b"after")] * 20
        until = load(spark, log_broker, "ts", **how,
                     endingOffsetsByTimestamp=json.dumps({"ts": {"0": t1, "1": t2}}))
        got = sorted((r.partition, r.body) for r in until.collect())
        assert got == [(0, b"before")] * 50 + [(1, b"before")] * 50 + [(1, b"between")] * 31


OPTION_ERRORS = [
    ({"startingOffsets": '{"opt":{"0":1}}'}, "you must specify all of them"),
    ({"startingOffsets": "latest"}, "latest is not allowed"),
    ({"endingOffsets": '{"opt":{"0":-2,"1":-1}}'}, "offset -2 is not allowed"),
    ({"startingOffsets": '{"other":{"0":1}}'}, "names topic 'other', which is not read"),
    ({"failOnDataLoss": "maybe"}, "failOnDataLoss 'maybe' is not true or false"),
    ({"topic": "opt,classic"}, r"are log topics and \['classic'\] are not"),
    ({"topic": "classic", "endingOffsets": "latest"}, "need a log topic"),
    ({"includeHeaders": "yes"}, "includeHeaders 'yes' is not true or false"),
    ({"minOffsetsPerTrigger": "5", "maxTriggerDelay": "soon"},
     "option maxTriggerDelay='soon' is not a time"),
    ({"maxTriggerDelay": "1s"}, "maxTriggerDelay applies only with minOffsetsPerTrigger"),
    ({"subscribePattern": "o.*"}, "Only one of the following options can be specified"),
    ({"topic": None, "subscribePattern": " "}, "Pattern to subscribe is empty"),
    ({"topic": None, "subscribePattern": "(op"}, "is not a regular expression"),
    ({"topic": None, "subscribePattern": "nothing.*"}, "matches no log topic"),
    ({"topic": None, "subscribePattern": "op"}, "matches no log topic"),  # a whole name
    ({"assign": '{"opt":[0]}'}, "Only one of the following options can be specified"),
    ({"topic": None, "assign": "opt"},
     "No topicpartitions to assign as specified value for option 'assign' is 'opt'"),
    ({"topic": None, "assign": '{"opt":[0,"x"]}'},
     re.escape('Expected e.g. {"topicA":[0,1],"topicB":[0,1]}, got {"opt":[0,"x"]}')),
    ({"topic": None, "assign": '{"opt":[2]}'},
     r"assign names partitions \[2\] of log topic 'opt', which has partitions 0..1"),
    ({"topic": None, "assign": '{"classic":[0]}'}, r"\['assign'\] need a log topic"),
    ({"topic": None, "subscribe": ","},
     "No topics to subscribe to as specified value for option 'subscribe' is ','"),
]


def test_option_errors(spark, log_broker):
    make(log_broker, "opt", 2)
    log_broker.post("/topic/create?topic=classic")
    for options, error in OPTION_ERRORS:  # one broker for all: each case is a load()
        options = dict(options)
        with pytest.raises(Exception, match=error):
            load(spark, log_broker, options.pop("topic", "opt"), **options).collect()


@pytest.mark.workers(2)
def test_subscribe_pattern_reads_every_log_topic_it_matches(spark, log_broker):
    """Kafka's subscribePattern: the log topics whose whole name matches, not
    a classic topic, not a name it matches only in part."""
    for topic, n in (("pa.1", 10), ("pa.2", 20), ("pax", 5), ("xpa.3", 7)):
        make(log_broker, topic, 2)
        publish(log_broker, topic, 0, [topic.encode()] * n)
    log_broker.post("/topic/create?topic=pa.classic")
    rows = load(spark, log_broker, None, subscribePattern=r"pa\.\d+").collect()
    assert sorted((r.topic, r.body) for r in rows) == \
        [("pa.1", b"pa.1")] * 10 + [("pa.2", b"pa.2")] * 20
    rows = load(spark, log_broker, None, subscribePattern="pa.*").collect()
    assert sorted({r.topic for r in rows}) == ["pa.1", "pa.2", "pax"]


def test_subscribe_pattern_restarted_reads_a_new_topic_from_its_earliest(
        spark, log_broker, tmp_path):
    """A topic made while the query was stopped matches its pattern at the
    restart: read from its earliest offset (as Kafka's source reads a new
    partition), not from its end, which would skip what it already holds."""
    make(log_broker, "pn.1", 2)
    publish(log_broker, "pn.1", 0, [b"one"] * 10)
    out, cp = str(tmp_path / "out"), str(tmp_path / "cp")

    def run():
        (spark.readStream.format("nsqshm").option("subscribePattern", r"pn\.\d")
         .option("shmPrefix", log_broker.prefix).option("startingOffsets", "earliest")
         .load().writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", cp).trigger(availableNow=True).start()
         .awaitTermination(120))

    run()
    assert spark.read.parquet(out).count() == 10
    make(log_broker, "pn.2", 2)
    publish(log_broker, "pn.2", 1, [b"two"] * 7)
    publish(log_broker, "pn.1", 1, [b"one"] * 5)
    run()
    rows = spark.read.parquet(out).select("topic", "partition", "offset").collect()
    assert len(rows) == len(set(rows)) == 22
    assert sorted((r.topic, r.partition) for r in rows) == \
        [("pn.1", 0)] * 10 + [("pn.1", 1)] * 5 + [("pn.2", 1)] * 7


@pytest.mark.workers(2)
def test_assign_reads_only_the_partitions_given(spark, log_broker, tmp_path):
    """Kafka's assign: {"topic": [partitions]}: a batch read and a stream read
    those partitions only, with startingOffsets JSON naming just them."""
    make(log_broker, "as.a", 3)
    make(log_broker, "as.b", 2)
    for topic, parts in (("as.a", 3), ("as.b", 2)):
        for p in range(parts):
            publish(log_broker, topic, p, [f"{topic}-{p}".encode()] * (p + 2))
    rows = load(spark, log_broker, None, assign='{"as.a":[0,2],"as.b":[1]}').collect()
    assert sorted((r.topic, r.partition) for r in rows) == \
        [("as.a", 0)] * 2 + [("as.a", 2)] * 4 + [("as.b", 1)] * 3
    rows = load(spark, log_broker, None, assign='{"as.a":[2]}',
                startingOffsets='{"as.a":{"2":3}}').collect()
    assert [(r.partition, r.offset) for r in rows] == [(2, 3)]
    out, cp = str(tmp_path / "out"), str(tmp_path / "cp")
    (spark.readStream.format("nsqshm").option("assign", '{"as.a":[1]}')
     .option("shmPrefix", log_broker.prefix).option("startingOffsets", "earliest").load()
     .writeStream.format("parquet").option("path", out).option("checkpointLocation", cp)
     .trigger(availableNow=True).start().awaitTermination(120))
    streamed = spark.read.parquet(out).select("topic", "partition").collect()
    assert sorted((r.topic, r.partition) for r in streamed) == [("as.a", 1)] * 3


def test_subscribe_pattern_picks_up_a_topic_made_while_the_query_runs(
        spark, log_broker, tmp_path):
    """A log topic made while a processing-time query runs joins it at a
    trigger, from its earliest offset (Kafka's consumer finds new topics too)."""
    make(log_broker, "pr.1", 1)
    publish(log_broker, "pr.1", 0, [b"one"] * 5)
    seen = []
    q = (spark.readStream.format("nsqshm").option("subscribePattern", r"pr\.\d")
         .option("shmPrefix", log_broker.prefix).option("startingOffsets", "earliest").load()
         .writeStream.foreachBatch(lambda df, _: seen.extend(
             (r.topic, r.partition) for r in df.select("topic", "partition").collect()))
         .option("checkpointLocation", str(tmp_path / "cp"))
         .trigger(processingTime="0.2 seconds").start())
    try:
        assert wait_for(lambda: len(seen) >= 5, timeout=60)
        make(log_broker, "pr.2", 2)
        publish(log_broker, "pr.2", 1, [b"two"] * 7)
        assert wait_for(lambda: len(seen) >= 12, timeout=60)
    finally:
        q.stop()
    assert sorted(seen) == [("pr.1", 0)] * 5 + [("pr.2", 1)] * 7


def _stream(spark, broker, topic, checkpoint, sink_path, **options):
    r = (spark.readStream.format("nsqshm").option("topic", topic)
         .option("shmPrefix", broker.prefix))
    for key, value in options.items():
        r = r.option(key, value)
    return (r.load().writeStream.format("parquet").option("path", sink_path)
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


@pytest.mark.workers(2)
def test_stream_limits_and_channel_cursor(spark, log_broker, tmp_path):
    make(log_broker, "st", 2)
    publish(log_broker, "st", 0, [b"a"] * 300)
    publish(log_broker, "st", 1, [b"b"] * 100)
    out, cp = str(tmp_path / "out"), str(tmp_path / "cp")
    q = _stream(spark, log_broker, "st", cp, out, startingOffsets="earliest",
                maxOffsetsPerTrigger=100, channel="lagview")
    q.awaitTermination(120)
    batches = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert batches == [100, 100, 100, 100]   # the limit, shared 3:1 over the partitions
    first = q.recentProgress[0]["sources"][0]["endOffset"]
    assert json.loads(first) == {"st": {"0": 75, "1": 25}}
    # the channel's cursors followed the committed offsets (availableNow asks
    # latestOffset once more after its last batch: that batch is committed then)
    assert cursor(log_broker, "st", "lagview") == {0: 300, 1: 100}

    assert [e["lag"] for e in
            {c["channel_name"]: c for c in stats(log_broker, "st")["channels"]}["lagview"]
            ["partitions"]] == [0, 0]
    rows = spark.read.parquet(out)
    assert rows.count() == 400 and rows.select("partition", "offset").distinct().count() == 400

    # the topic deleted and made again: its offsets went back, data loss
    assert log_broker.post("/topic/delete?topic=st")[0] == 200
    make(log_broker, "st", 2)
    publish(log_broker, "st", 0, [b"new"] * 5)
    q = _stream(spark, log_broker, "st", cp, out)
    with pytest.raises(Exception, match="st partition 0 ends at offset 5, before offset 300"):
        q.awaitTermination(120)


def _sized_stream(spark, broker, topic, checkpoint, sizes, **options):
    """A processing-time stream (0.2 s) whose batches' row counts go to sizes."""
    r = (spark.readStream.format("nsqshm").option("topic", topic)
         .option("shmPrefix", broker.prefix).option("startingOffsets", "earliest"))
    for key, value in options.items():
        r = r.option(key, value)
    return (r.load().writeStream.foreachBatch(lambda df, _: sizes.append(df.count()))
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="0.2 seconds").start())


@pytest.mark.soak  # processing-time triggers: ~10 s of a loaded machine
def test_min_offsets_per_trigger_waits(spark, log_broker, tmp_path):
    make(log_broker, "few", 2)
    sizes = []
    q = _sized_stream(spark, log_broker, "few", str(tmp_path / "cp"), sizes,
                      minOffsetsPerTrigger=100)
    try:
        # the first batch (empty: the first check always triggers, as Kafka's), then
        # triggers every 0.2 s that find 50 < 100 offsets: a source that did not wait
        # would read the 50 now
        assert wait_for(lambda: sizes, timeout=60)
        publish(log_broker, "few", 0, [b"a"] * 50)
        time.sleep(1.5)
        publish(log_broker, "few", 1, [b"b"] * 60)
        assert wait_for(lambda: sum(sizes) >= 110, timeout=60)
    finally:
        q.stop()
    assert [n for n in sizes if n] == [110]  # one batch, once there were 100


def test_max_trigger_delay_triggers_below_the_minimum(spark, log_broker, tmp_path):
    """minOffsetsPerTrigger never reached: a batch comes maxTriggerDelay after the
    last one, with what is there."""
    make(log_broker, "slow", 1)
    sizes = []
    q = _sized_stream(spark, log_broker, "slow", str(tmp_path / "cp"), sizes,
                      minOffsetsPerTrigger=1000, maxTriggerDelay="4s")
    try:
        assert wait_for(lambda: sizes, timeout=60)  # the first check triggers (empty)
        publish(log_broker, "slow", 0, [b"a"] * 30)
        time.sleep(0.6)  # three 0.2 s triggers: below the minimum, no batch
        early = sum(sizes)
        assert wait_for(lambda: sum(sizes) >= 30, timeout=30)  # 4 s after the first batch
    finally:
        q.stop()
    assert early == 0
    assert [n for n in sizes if n] == [30]


def test_restart_reads_the_planned_batch_again(spark, log_broker, tmp_path):
    """A batch in the offset log and not in the commit log (its driver died)
    runs again over the same ranges, whatever was published since."""
    import os

    make(log_broker, "rp", 2)
    for p in range(2):
        publish(log_broker, "rp", p, [f"a{p}-{i}".encode() for i in range(100)])
    cp = str(tmp_path / "cp")
    seen = {}

    def record(df, batch_id):
        seen.setdefault(batch_id, []).append(
            sorted((r.partition, r.offset, r.body) for r in df.collect()))

    def run():
        (spark.readStream.format("nsqshm").option("topic", "rp")
         .option("shmPrefix", log_broker.prefix).option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", 50).load()
         .writeStream.foreachBatch(record).option("checkpointLocation", cp)
         .trigger(availableNow=True).start().awaitTermination(120))

    run()
    assert sorted(seen) == [0, 1, 2, 3]
    for name in ("3", ".3.crc"):  # as if the driver died before committing batch 3
        os.unlink(os.path.join(cp, "commits", name))
    for p in range(2):
        publish(log_broker, "rp", p, [f"b{p}-{i}".encode() for i in range(100)])
    run()
    assert len(seen[3]) == 2 and seen[3][0] == seen[3][1]   # the same rows again
    assert [len(seen[b]) for b in sorted(seen)] == [1, 1, 1, 2, 1, 1, 1, 1]
    rows = [row for b in sorted(seen) for row in seen[b][-1]]
    assert len(rows) == 400 and len(set(rows)) == 400


def test_fail_on_data_loss_both_ways(spark, log_broker, tmp_path):
    make(log_broker, "ret", 1, retention_bytes=8192)
    for _ in range(10):
        publish(log_broker, "ret", 0, [b"x" * 100] * 20)
    # retention (every second) removes the oldest segments
    assert wait_for(lambda: stats(log_broker, "ret")["partitions"][0]["start_offset"] > 0)
    start = stats(log_broker, "ret")["partitions"][0]["start_offset"]
    # a stream whose first batch was planned from offset 0
    q = _stream(spark, log_broker, "ret", str(tmp_path / "cp1"), str(tmp_path / "out1"),
                startingOffsets='{"ret":{"0":0}}')
    with pytest.raises(Exception, match=r"Some data may have been lost.*ret partition 0 "
                                        r"starts at offset \d+, offsets 0\.\.\d+ were removed"):
        q.awaitTermination(120)
    out = str(tmp_path / "out2")
    q = _stream(spark, log_broker, "ret", str(tmp_path / "cp2"), out,
                startingOffsets='{"ret":{"0":0}}', failOnDataLoss="false")
    q.awaitTermination(120)
    offsets = sorted(r.offset for r in spark.read.parquet(out).select("offset").collect())
    assert offsets[0] >= start and offsets == list(range(offsets[0], 200))


@pytest.mark.workers(2)
def test_sink_partition_and_key_columns(spark, log_broker):
    make(log_broker, "sink", 4)
    rows = [(f"r{i}", i % 4) for i in range(200)]
    (spark.createDataFrame(rows, "body string, partition int").repartition(2)
     .write.format("nsqshm").option("topic", "sink").option("shmPrefix", log_broker.prefix)
     .mode("append").save())
    got = load(spark, log_broker, "sink").collect()
    assert sorted((r.body.decode(), r.partition) for r in got) == sorted(rows)
    # through shared memory (the broker is on this host): each partition's inbound
    # ring counts what local producers pushed into it
    for partition in range(4):
        ring = Ring.attach(f"{log_broker.prefix}.t.sink:p{partition}")
        try:
            assert ring.local_published[0] == 50, partition
        finally:
            ring.close()

    make(log_broker, "keyed", 3)
    keyed = [(f"k{i % 7}", f"{i}") for i in range(700)]
    (spark.createDataFrame(keyed, "key string, body string").coalesce(1)
     .write.format("nsqshm").option("topic", "keyed").option("shmPrefix", log_broker.prefix)
     .mode("append").save())
    got = load(spark, log_broker, "keyed").collect()
    assert len(got) == 700
    where = {}
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        i = int(r.body)
        where.setdefault(i % 7, []).append((r.partition, i))
    for key, seen in where.items():  # one partition per key, in the order written
        assert len({p for p, _ in seen}) == 1, key
        assert [i for _, i in seen] == sorted(i for _, i in seen)
    assert len({seen[0][0] for seen in where.values()}) > 1   # and keys spread

    # an ordered topic takes rows that name their partition only, as its PUBs
    make(log_broker, "ord", 2, orderedmulti="true")
    with pytest.raises(Exception, match='log topic \'ord\' is ordered: its rows need a '
                                        '"partition" or a "key" column'):
        (spark.createDataFrame([("x",)], "body string").write.format("nsqshm")
         .option("topic", "ord").option("shmPrefix", log_broker.prefix).mode("append").save())
    (spark.createDataFrame([("o1", 1), ("o2", 1)], "body string, partition int").coalesce(1)
     .write.format("nsqshm").option("topic", "ord").option("shmPrefix", log_broker.prefix)
     .mode("append").save())
    assert sorted(r.body.decode() for r in load(spark, log_broker, "ord").collect()) == \
        ["o1", "o2"]
