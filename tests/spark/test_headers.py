"""Headers through Spark: the sink's `headers` column published with
MPUB_EXT, the source's includeHeaders (Kafka's headers column), on ext log
topics and ext classic topics, over shared memory and TCP; a real local[2]
session and real brokers."""

import json
import socket
import struct

import pytest

from nsqshm import protocol as proto
from nsqshm._core.ext import split_ext
from tests.local.conftest import started
from tests.spark.logtopics.test_logtopic import load, make, stats

HEADERS = "array<struct<key:string,value:binary>>"


@pytest.fixture
def ext_broker(nsqd_factory):
    return started(nsqd_factory("--mem-queue-size=100000"))


def rows_with_headers(n):
    """(body, partition, headers): every third row without headers (null),
    the others with two pairs, one needing JSON escapes."""
    out = []
    for i in range(n):
        headers = None if i % 3 == 0 else [("k", f"v{i}".encode()),
                                           ("q\"\n", f"é\\{i}".encode())]
        out.append((f"m{i}".encode(), i % 2, headers))
    return out


def write(spark, broker, topic, rows, schema, **options):
    w = spark.createDataFrame(rows, schema).coalesce(1).write.format("nsqshm") \
        .option("topic", topic).option("shmPrefix", broker.prefix)
    for key, value in options.items():
        w = w.option(key, value)
    w.mode("append").save()


def as_pairs(headers):
    return None if headers is None else [(h.key, bytes(h.value)) for h in headers]


@pytest.mark.workers(1, 2)
def test_log_topic_headers_round_trip(spark, ext_broker):
    make(ext_broker, "hl", 2, ext="true")
    sent = rows_with_headers(300)
    write(spark, ext_broker, "hl", sent,
          "body binary, partition int, headers array<struct<key:string,value:binary>>")
    want = sorted((body, p, headers) for body, p, headers in sent)

    df = load(spark, ext_broker, "hl", includeHeaders="true")
    assert df.schema.simpleString().endswith(f",offset:bigint,headers:{HEADERS}>")
    got = sorted((bytes(r.body), r.partition, as_pairs(r.headers)) for r in df.collect())
    assert got == want

    # over TCP (a broker on another host): extend_support frames, the same rows
    tcp = {"transport": "tcp", "nsqdTcpAddress": f"127.0.0.1:{ext_broker.tcp_port}",
           "nsqdHttpAddress": f"127.0.0.1:{ext_broker.http_port}", "batchSize": 64}
    remote = load(spark, ext_broker, "hl", includeHeaders="true", **tcp).collect()
    assert sorted((bytes(r.body), r.partition, as_pairs(r.headers)) for r in remote) == want

    # without includeHeaders: plain bodies (the ext part cut), no headers column
    for options in ({}, tcp):
        plain = load(spark, ext_broker, "hl", **options)
        assert "headers" not in plain.columns
        assert sorted(bytes(r.body) for r in plain.collect()) == sorted(b for b, _, _ in sent)


def test_log_topic_without_ext_has_null_headers(spark, ext_broker):
    make(ext_broker, "plainlog", 1)
    write(spark, ext_broker, "plainlog", [(b"a",), (b"b",)], "body binary")
    rows = load(spark, ext_broker, "plainlog", includeHeaders="true").collect()
    assert sorted((bytes(r.body), r.headers) for r in rows) == [(b"a", None), (b"b", None)]


def _consume_ext(broker, topic, channel, count):
    """A raw Youzan consumer (IDENTIFY extend_support): the stored ext parts."""
    sock = socket.create_connection(("127.0.0.1", broker.tcp_port), timeout=10)
    sock.sendall(proto.MAGIC_V2 + proto.identify({"extend_support": True}))
    buf = b""
    got = []

    def frame():
        nonlocal buf
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
            buf += sock.recv(1 << 16)
        size = struct.unpack(">I", buf[:4])[0]
        ftype, data = struct.unpack(">I", buf[4:8])[0], buf[8:4 + size]
        buf = buf[4 + size:]
        return ftype, data

    frame()
    sock.sendall(proto.sub(topic, channel) + proto.rdy(count))
    frame()
    while len(got) < count:
        ftype, data = frame()
        if ftype == proto.FRAME_TYPE_MESSAGE:
            got.append(split_ext(data[26:]))
            sock.sendall(proto.fin(data[10:26]))
    sock.close()
    return got


@pytest.mark.workers(2)  # (the log test above runs both worker counts)
def test_classic_ext_topic_headers(spark, ext_broker):
    status, body = ext_broker.post("/topic/create?topic=hc&ext=true")
    assert status == 200, body
    for channel in ("spark", "youzan"):
        assert ext_broker.post(f"/channel/create?topic=hc&channel={channel}")[0] == 200
    sent = [(b, h) for b, _, h in rows_with_headers(90)]
    write(spark, ext_broker, "hc", sent,
          "body binary, headers array<struct<key:string,value:binary>>")
    # a Youzan client sees each row's pairs as one JSON object of strings
    youzan = _consume_ext(ext_broker, "hc", "youzan", len(sent))
    as_json = sorted((b, None if h is None else json.loads(h)) for h, b in youzan)
    assert as_json == sorted((b, None if h is None else {k: v.decode() for k, v in h})
                             for b, h in sent)

    df = spark.read.format("nsqshm").option("topic", "hc").option("shmPrefix", ext_broker.prefix) \
        .option("includeHeaders", "true").load()
    assert df.schema.simpleString().endswith(f",channel:string,headers:{HEADERS}>")
    got = sorted((bytes(r.body), as_pairs(r.headers)) for r in df.collect())
    assert got == sorted(sent)


def test_classic_ext_topic_over_tcp(spark, ext_broker):
    """The TCP read asks for extend_support only with includeHeaders."""
    assert ext_broker.post("/topic/create?topic=ht&ext=true")[0] == 200
    for channel in ("a", "b"):
        assert ext_broker.post(f"/channel/create?topic=ht&channel={channel}")[0] == 200
    sent = [(b, h) for b, _, h in rows_with_headers(30)]
    write(spark, ext_broker, "ht", sent,
          "body binary, headers array<struct<key:string,value:binary>>")
    tcp = {"transport": "tcp", "nsqdTcpAddress": f"127.0.0.1:{ext_broker.tcp_port}",
           "nsqdHttpAddress": f"127.0.0.1:{ext_broker.http_port}", "maxMessages": 30}
    r = spark.read.format("nsqshm").option("topic", "ht")
    for key, value in tcp.items():
        r = r.option(key, value)
    with_headers = r.option("channel", "a").option("includeHeaders", "true").load().collect()
    assert sorted((bytes(x.body), as_pairs(x.headers)) for x in with_headers) == sorted(sent)
    plain = r.option("channel", "b").load().collect()
    assert sorted(bytes(x.body) for x in plain) == sorted(b for b, _ in sent)


def test_headers_errors(spark, ext_broker):
    make(ext_broker, "he", 1, ext="true")
    with pytest.raises(Exception, match="includeHeaders 'maybe' is not true or false"):
        load(spark, ext_broker, "he", includeHeaders="maybe").collect()
    with pytest.raises(Exception, match='column "headers" is array<string>, not'):
        write(spark, ext_broker, "he", [(b"x", ["a"])], "body binary, headers array<string>")
    with pytest.raises(Exception, match="a header with a null key or value"):
        write(spark, ext_broker, "he", [(b"x", [("k", None)])],
              "body binary, headers array<struct<key:string,value:binary>>")
    # headers to a topic made without ext: the broker's error, nothing written
    make(ext_broker, "noext", 1)
    with pytest.raises(Exception, match="E_EXT_NOT_SUPPORT"):
        write(spark, ext_broker, "noext", [(b"x", [("k", b"v")])],
              "body binary, headers array<struct<key:string,value:binary>>")
    assert stats(ext_broker, "noext")["partitions"][0]["end_offset"] == 0


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_stream_of_an_ext_topic(spark, ext_broker, tmp_path, transport):
    """A streaming query's batches (shared memory: arenas; TCP: frames)
    carry the headers too."""
    topic = f"hs{transport}"
    assert ext_broker.post(f"/topic/create?topic={topic}&ext=true")[0] == 200
    assert ext_broker.post(f"/channel/create?topic={topic}&channel=spark")[0] == 200
    sent = [(b, h) for b, _, h in rows_with_headers(120)]
    write(spark, ext_broker, topic, sent,
          "body binary, headers array<struct<key:string,value:binary>>")
    r = spark.readStream.format("nsqshm").option("topic", topic) \
        .option("includeHeaders", "true").option("maxMessagesPerTrigger", 50)
    if transport == "tcp":
        r = r.option("transport", "tcp").option("idleTimeout", 0.3) \
            .option("nsqdTcpAddress", f"127.0.0.1:{ext_broker.tcp_port}") \
            .option("nsqdHttpAddress", f"127.0.0.1:{ext_broker.http_port}")
    else:
        r = r.option("shmPrefix", ext_broker.prefix)
    q = (r.load().writeStream.format("memory").queryName(f"headers_{transport}")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
         .start())
    assert q.awaitTermination(180)
    rows = spark.sql(f"select body, headers from headers_{transport}").collect()
    assert sorted((bytes(x.body), as_pairs(x.headers)) for x in rows) == sorted(sent)
