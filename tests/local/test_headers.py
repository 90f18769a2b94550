"""nsqshm.local on topics made with ext=true (Youzan's headers, docs/local.md):
a Consumer gets plain bodies, as a TCP client that did not ask for
extend_support, or with headers=True the headers too; a Producer stores its
messages with the empty ext part a PUB gets; on classic and log topics, one
and two workers."""

import json

from nsqshm import protocol as p
from nsqshm.local import Consumer, Producer
from tests.nsqd.test_ext import OK, consumer, create_ext, pub_ext
from tests.nsqd.workers.test_workers import Client

from .conftest import started, wait_for

WORKER_COUNTS = (1, 2)


def fetch(c, n, timeout=10.0):
    """[(body, headers)] of n messages, each batch finished, and the last Arrow batch."""
    import time

    got, arrow = [], None
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        batch = c.fetch(n - len(got), timeout=0.5)
        if batch:
            got += [(bytes(m.body), m.headers) for m in batch]
            arrow = batch.to_arrow()
            assert [bytes(b) for b in arrow.column("body").to_pylist()] == \
                [bytes(m.body) for m in batch]
            batch.finish()
    return got, arrow


def publish_three(server, topic):
    """b1 with headers (PUB_EXT), b2 plain over TCP (PUB), b3 from a local Producer."""
    pc = Client(server)
    pc.send(pub_ext(topic, json.dumps({"k": "v", "n": "1"}).encode(), b"b1"))
    assert pc.response() == OK
    pc.send(p.pub(topic, b"b2"))
    assert pc.response() == OK
    with Producer(topic, shm_prefix=server.prefix) as prod:
        prod.publish(b"b3")


def test_plain_bodies_or_headers_on_a_classic_ext_topic(nsqd_factory):
    server = started(nsqd_factory())
    create_ext(server, "e")
    with Consumer("e", "plain", shm_prefix=server.prefix) as plain, \
            Consumer("e", "hdr", shm_prefix=server.prefix, headers=True) as hdr:
        tcp = consumer(server, "e", "tcp")  # no extend_support: plain bodies
        assert plain.ext and not plain.headers and hdr.headers
        publish_three(server, "e")
        got, arrow = fetch(plain, 3)
        assert sorted(got) == [(b"b1", {}), (b"b2", {}), (b"b3", {})]
        assert "headers" not in arrow.schema.names
        got, arrow = fetch(hdr, 3)
        assert sorted(got) == [(b"b1", {"k": "v", "n": "1"}), (b"b2", {}), (b"b3", {})]
        assert arrow.schema.names[-1] == "headers"
        # the Producer's record is an ext topic's: a TCP client reads it as any other
        bodies = sorted(tcp.message().body for _ in range(3))
        assert bodies == [b"b1", b"b2", b"b3"]


def test_headers_on_a_log_ext_topic_and_the_cursors_move(nsqd_factory):
    server = started(nsqd_factory())
    create_ext(server, "le", "&partition_num=2")
    with Consumer("le", "hdr", shm_prefix=server.prefix, headers=True) as hdr:
        assert hdr.is_log and hdr.headers
        pc = Client(server)
        for i in range(10):
            pc.send(pub_ext("le", json.dumps({"i": str(i)}).encode(), b"m%d" % i, i % 2))
            assert pc.response() == OK
        got, _ = fetch(hdr, 10)
        assert sorted(got) == sorted((b"m%d" % i, {"i": str(i)}) for i in range(10))

        def caught_up():
            doc = json.loads(server.get("/stats?format=json&topic=le")[1])
            entry = doc["topics"][0]
            ends = [x["end_offset"] for x in entry["partitions"]]
            chan = entry["channels"][0]["partitions"]
            return ends == [x["confirmed_offset"] for x in chan] == [5, 5]
        assert wait_for(caught_up, 5)
