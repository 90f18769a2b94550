"""Batch reads and writes of the "nsqshm" source with a real local[2] session."""

import json
import urllib.request

import pytest

from nsqshm.local import Consumer, Producer
from tests.spark.conftest import wait_for


def depth(broker, topic, channel):
    with urllib.request.urlopen(broker.url(f"/stats?format=json&topic={topic}"), timeout=10) as r:
        doc = json.loads(r.read())
    for t in doc["topics"] or []:
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c["depth"]
    return None


def consume_all(broker, topic, channel, n, timeout=10):
    got = []
    with Consumer(topic, channel, shm_prefix=broker.prefix) as c:
        while len(got) < n:
            batch = c.fetch(n - len(got), timeout=timeout)
            if not batch:
                break
            got += [bytes(b) for b in batch.bodies()]
            batch.finish()
    return got


def reader(spark, broker, topic, **options):
    r = spark.read.format("nsqshm").option("topic", topic)
    for key, value in {"shmPrefix": broker.prefix, **options}.items():
        r = r.option(key, value)
    return r.load()


def test_batch_read_write_round_trip(spark, broker):
    sent = [f"event-{i}".encode() for i in range(5000)]
    broker.post("/topic/create?topic=in")
    broker.post("/channel/create?topic=in&channel=spark")
    with Producer("in", shm_prefix=broker.prefix) as p:
        p.publish_many(sent)
    df = reader(spark, broker, "in", numPartitions=3)
    assert df.schema.simpleString() == ("struct<body:binary,id:string,timestamp:timestamp,"
                                        "attempts:int,topic:string,channel:string>")
    rows = df.collect()
    assert sorted(r.body for r in rows) == sorted(sent)
    assert {r.attempts for r in rows} == {1} and {r.topic for r in rows} == {"in"}
    assert {r.channel for r in rows} == {"spark"} and len({r.id for r in rows}) == 5000
    assert depth(broker, "in", "spark") == 0  # read means consumed
    assert reader(spark, broker, "in").count() == 0  # nothing queued now

    broker.post("/topic/create?topic=out")
    broker.post("/channel/create?topic=out&channel=check")
    (spark.createDataFrame([(r.body.decode().upper(),) for r in rows], "body string")
     .write.format("nsqshm").option("topic", "out").option("shmPrefix", broker.prefix)
     .mode("append").save())
    got = consume_all(broker, "out", "check", 5000)
    assert sorted(got) == sorted(b.decode().upper().encode() for b in sent)


def test_write_routes_rows_by_their_topic_column(spark, broker):
    for t in ("a", "b"):
        broker.post(f"/topic/create?topic={t}")
        broker.post(f"/channel/create?topic={t}&channel=check")
    rows = [(bytes([65 + i % 26]) * 3, "a" if i % 3 else "b") for i in range(300)]
    (spark.createDataFrame(rows, "body binary, topic string").repartition(2)
     .write.format("nsqshm").option("shmPrefix", broker.prefix).mode("append").save())
    assert sorted(consume_all(broker, "a", "check", 200)) == sorted(b for b, t in rows if t == "a")
    assert sorted(consume_all(broker, "b", "check", 100)) == sorted(b for b, t in rows if t == "b")


def test_tcp_read_and_write(spark, broker):
    tcp = {"nsqdTcpAddress": f"127.0.0.1:{broker.tcp_port}",
           "nsqdHttpAddress": f"127.0.0.1:{broker.http_port}", "transport": "tcp"}
    (spark.createDataFrame([(f"t{i}",) for i in range(3000)], "body string").repartition(2)
     .write.format("nsqshm").option("topic", "tcp").options(**tcp).mode("append").save())
    broker.post("/channel/create?topic=tcp&channel=spark")
    assert wait_for(lambda: depth(broker, "tcp", "spark") == 3000)
    df = (spark.read.format("nsqshm").option("topic", "tcp").options(**tcp)
          .option("batchSize", 1000).load())
    rows = df.collect()
    assert sorted(r.body for r in rows) == sorted(f"t{i}".encode() for i in range(3000))
    assert {r.attempts for r in rows} == {1}
    assert depth(broker, "tcp", "spark") == 0


def test_max_messages_and_starting_timestamp(spark, broker):
    broker.post("/topic/create?topic=lim")
    broker.post("/channel/create?topic=lim&channel=spark")
    with Producer("lim", shm_prefix=broker.prefix) as p:
        p.publish_many([b"x"] * 1000)
    assert reader(spark, broker, "lim", maxMessages=100).count() == 100
    assert depth(broker, "lim", "spark") == 900
    assert reader(spark, broker, "lim", startingOffsets="latest").count() == 0  # all older
    assert depth(broker, "lim", "spark") == 0  # ... and consumed, as Kafka's offsets skip them


@pytest.mark.parametrize("options,error", [
    ({}, "One of the following options must be specified for nsqshm source: topic, subscribe, "
         "subscribePattern"),
    ({"topic": " , "}, "No topics to subscribe to as specified value for option 'topic' is ' , '"),
    ({"topic": "t", "channel": "bad/name"}, "invalid channel name"),
    ({"topic": "t", "numPartitions": "0"}, "must be >= 1"),
])
def test_option_errors(spark, broker, options, error):
    r = spark.read.format("nsqshm").option("shmPrefix", broker.prefix)
    for key, value in options.items():
        r = r.option(key, value)
    with pytest.raises(Exception, match=error):
        r.load().collect()
