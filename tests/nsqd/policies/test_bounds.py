"""Bounded queues (issue 18, nsqshm/nsqd/policies/bounds.py): a topic's or channel's
max_depth under a flood of publishes, with reject (backpressure: exactly
what was accepted is kept) and drop-oldest (exactly the newest are kept,
the rest counted as dropped)."""

import base64
import json

from prometheus_client.parser import text_string_to_metric_families

from nsqshm import protocol as p
from tests.nsqd.conftest import http_call, http_on_worker, wait_for
from tests.nsqd.tcp.test_protocol_v2 import Conn

WORKER_COUNTS = (1, 2)  # every test on one worker and on two (conftest.py)


def create(server, topic, channel=None):
    assert server.post(f"/topic/create?topic={topic}")[0] == 200
    if channel:
        assert server.post(f"/channel/create?topic={topic}&channel={channel}")[0] == 200


def set_policy(server, path):
    status, body = server.post(path)
    assert status == 200, body
    return json.loads(body)


def flood(server, topic, n):
    """n HTTP publishes m0..m(n-1), one at a time: the statuses."""
    return [server.post(f"/pub?topic={topic}", f"m{i}".encode()) for i in range(n)]


def topic_stats(server, topic):
    return json.loads(server.get(f"/stats?format=json&topic={topic}")[1])["topics"][0]


def queued(server, path):
    doc = json.loads(server.get(path)[1])
    return [base64.b64decode(m["body"]).decode() for m in doc["messages"]]


def test_topic_reject_keeps_exactly_what_was_accepted(nsqd):
    create(nsqd, "t")
    assert set_policy(nsqd, "/topic/policy?topic=t&max_depth=5") == \
        {"ttl_ms": 0, "max_depth": 5, "max_bytes": 0, "overflow": "reject"}
    answers = flood(nsqd, "t", 40)
    assert answers[:5] == [(200, b"OK")] * 5
    assert answers[5:] == [(503, b'{"message":"QUEUE_FULL"}')] * 35
    c = Conn(nsqd)
    c.send(p.pub("t", b"tcp"))
    assert c.frame() == (1, b"E_PUB_FAILED PUB failed topic t is full (max_depth 5)")
    stats = topic_stats(nsqd, "t")
    assert (stats["depth"], stats["rejected_count"], stats["dropped_count"]) == (5, 36, 0)
    assert queued(nsqd, "/topic/peek?topic=t") == [f"m{i}" for i in range(5)]
    samples = {(s.name, tuple(s.labels.items())): s.value
               for family in text_string_to_metric_families(nsqd.get("/metrics")[1].decode())
               for s in family.samples}
    assert samples[("nsq_topic_rejected_total", (("topic", "t"),))] == 36
    got = Conn(nsqd).subscribe("t", "c", rdy=10).messages(5)
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(5)]


def test_channel_reject_is_backpressure_for_publishers(nsqd):
    create(nsqd, "t", "c")
    create(nsqd, "t", "other")
    set_policy(nsqd, "/channel/policy?topic=t&channel=c&max_depth=4&overflow=reject")
    mpub = Conn(nsqd)
    mpub.send(p.mpub("t", [b"a", b"b", b"c"]))
    assert mpub.frame() == (0, b"OK")
    mpub.send(p.mpub("t", [b"d", b"e"]))  # 3 + 2 > 4: the whole MPUB is refused
    assert mpub.frame() == (1, b"E_MPUB_FAILED MPUB failed channel t:c is full (max_depth 4)")
    answers = flood(nsqd, "t", 10)
    assert [s for s, _ in answers] == [200] + [503] * 9
    c = [ch for ch in topic_stats(nsqd, "t")["channels"] if ch["channel_name"] == "c"][0]
    assert (c["depth"], c["rejected_count"]) == (4, 11)
    sub = Conn(nsqd).subscribe("t", "c", rdy=10)
    assert [m.body for m in sub.messages(4)] == [b"a", b"b", b"c", b"m0"]
    assert sub.nothing_for(0.3)


def test_channel_drop_oldest_keeps_the_newest(nsqd):
    create(nsqd, "t", "c")
    set_policy(nsqd, "/channel/policy?topic=t&channel=c&max_depth=4&overflow=drop-oldest")
    assert all(a == (200, b"OK") for a in flood(nsqd, "t", 30))

    def channel():
        return topic_stats(nsqd, "t")["channels"][0]

    assert wait_for(lambda: channel()["dropped_count"] == 26, 5), channel()
    assert (channel()["depth"], channel()["rejected_count"]) == (4, 0)
    assert queued(nsqd, "/channel/peek?topic=t&channel=c") == [f"m{i}" for i in range(26, 30)]
    sub = Conn(nsqd).subscribe("t", "c", rdy=10)
    assert [m.body for m in sub.messages(4)] == [f"m{i}".encode() for i in range(26, 30)]
    assert sub.nothing_for(0.3)


def test_a_batch_bigger_than_the_room_keeps_its_newest(nsqd):
    """One MPUB (one batch for the channel) of more than max_depth or
    max_bytes: its own oldest messages go, as drop-oldest promises, and not
    a queue left past its bound (a pump batches several publishes too)."""
    create(nsqd, "t", "c")
    set_policy(nsqd, "/channel/policy?topic=t&channel=c&max_depth=2&overflow=drop-oldest")
    mpub = Conn(nsqd)
    mpub.send(p.mpub("t", [b"a", b"b", b"c", b"d", b"e"]))
    assert mpub.frame() == (0, b"OK")

    def channel(topic):
        return topic_stats(nsqd, topic)["channels"][0]

    assert wait_for(lambda: channel("t")["dropped_count"] == 3, 5), channel("t")
    assert channel("t")["depth"] == 2
    assert queued(nsqd, "/channel/peek?topic=t&channel=c") == ["d", "e"]

    create(nsqd, "u", "c")  # 126 bytes each: 7 fit in 1000
    set_policy(nsqd, "/channel/policy?topic=u&channel=c&max_bytes=1000&overflow=drop-oldest")
    mpub.send(p.mpub("u", [body(i, 100) for i in range(10)]))
    assert mpub.frame() == (0, b"OK")
    assert wait_for(lambda: channel("u")["dropped_count"] == 3, 5), channel("u")
    assert channel("u")["depth"] == 7
    sub = Conn(nsqd).subscribe("u", "c", rdy=10)
    assert [m.body for m in sub.messages(7)] == [body(i, 100) for i in range(3, 10)]
    assert sub.nothing_for(0.3)


def test_topic_drop_oldest_while_it_holds_messages(nsqd):
    create(nsqd, "t")
    set_policy(nsqd, "/topic/policy?topic=t&max_depth=3&overflow=drop-oldest")
    assert all(a == (200, b"OK") for a in flood(nsqd, "t", 20))
    assert wait_for(lambda: topic_stats(nsqd, "t")["dropped_count"] == 17, 5), \
        topic_stats(nsqd, "t")
    assert topic_stats(nsqd, "t")["depth"] == 3
    assert queued(nsqd, "/topic/peek?topic=t") == ["m17", "m18", "m19"]


def test_bound_errors_and_nsqd_dat(nsqd, tmp_path):
    create(nsqd, "t", "c")
    for path, text in [("/topic/policy?topic=t&max_depth=-2", "INVALID_MAX_DEPTH"),
                       ("/topic/policy?topic=t&overflow=block", "INVALID_OVERFLOW"),
                       ("/channel/policy?topic=t&channel=c&max_depth=x", "INVALID_MAX_DEPTH")]:
        assert nsqd.post(path) == (400, json.dumps({"message": text}).encode().replace(b" ", b""))
    set_policy(nsqd, "/channel/policy?topic=t&channel=c&max_depth=7&overflow=drop-oldest")
    with open(tmp_path / "nsqd.dat") as f:
        meta = json.load(f)
    assert meta["topics"][0]["channels"][0] == {"name": "c", "paused": False, "max_depth": 7,
                                                "overflow": "drop-oldest"}


def test_flags_bound_every_new_queue_until_its_own_policy(nsqd_factory, tmp_path):
    server = nsqd_factory("--max-queue-depth=3", "--queue-overflow=reject")
    answers = flood(server, "t", 5)  # /pub makes the topic: bounded from the start
    assert [s for s, _ in answers] == [200, 200, 200, 503, 503]
    stats = topic_stats(server, "t")
    assert (stats["max_depth"], stats["overflow"], stats["rejected_count"]) == (3, "reject", 2)
    assert set_policy(server, "/topic/policy?topic=t&max_depth=0")["max_depth"] == 0
    assert server.post("/pub?topic=t", b"more") == (200, b"OK")
    with open(tmp_path / "nsqd.dat") as f:  # the default is not written, taking it off is
        topic = json.load(f)["topics"][0]
    assert (topic["max_depth"], topic["overflow"]) == (0, "reject")


# -- byte bounds: max_bytes counts each message as nsqd encodes it (26 + body) --------


def body(i, size):
    """A body of `size` bytes numbered i."""
    return f"m{i}-".encode().ljust(size, b"x")


def test_byte_bounds_reject_on_a_topic_drop_oldest_on_a_channel(nsqd):
    create(nsqd, "t")
    got = set_policy(nsqd, "/topic/policy?topic=t&max_bytes=500")
    assert (got["max_bytes"], got["max_depth"], got["overflow"]) == (500, 0, "reject")
    answers = [nsqd.post("/pub?topic=t", body(i, 74)) for i in range(12)]  # 100 bytes each
    assert answers == [(200, b"OK")] * 5 + [(503, b'{"message":"QUEUE_FULL"}')] * 7
    c = Conn(nsqd)
    c.send(p.pub("t", b"x"))  # 27 bytes: 527 > 500
    assert c.frame() == (1, b"E_PUB_FAILED PUB failed topic t is full (max_bytes 500)")
    c = Conn(nsqd)  # (E_PUB_FAILED closes the connection, as in nsqd)
    c.send(p.mpub("t", [b"a", b"b"]))
    assert c.frame() == (1, b"E_MPUB_FAILED MPUB failed topic t is full (max_bytes 500)")
    stats = topic_stats(nsqd, "t")
    assert (stats["depth"], stats["rejected_count"], stats["dropped_count"]) == (5, 10, 0)
    assert stats["max_bytes"] == 500
    assert queued(nsqd, "/topic/peek?topic=t") == [body(i, 74).decode() for i in range(5)]
    got = Conn(nsqd).subscribe("t", "c", rdy=10).messages(5)  # nothing accepted was lost
    assert [m.body for m in got] == [body(i, 74) for i in range(5)]

    # a channel's byte bound with drop-oldest: the newest that fit are kept
    create(nsqd, "u", "c")
    set_policy(nsqd, "/channel/policy?topic=u&channel=c&max_bytes=1000&overflow=drop-oldest")
    # 40 messages of 126 bytes: 7 fit in 1000 (882), the 33 oldest are dropped
    assert all(nsqd.post("/pub?topic=u", body(i, 100)) == (200, b"OK") for i in range(40))

    def channel():
        return topic_stats(nsqd, "u")["channels"][0]

    assert wait_for(lambda: channel()["dropped_count"] == 33, 5), channel()
    assert (channel()["depth"], channel()["rejected_count"]) == (7, 0)
    assert queued(nsqd, "/channel/peek?topic=u&channel=c&n=20") == \
        [body(i, 100).decode() for i in range(33, 40)]
    sub = Conn(nsqd).subscribe("u", "c", rdy=10)
    assert [m.body for m in sub.messages(7)] == [body(i, 100) for i in range(33, 40)]
    assert sub.nothing_for(0.3)


def test_channel_byte_bound_counts_the_disk_queue(nsqd_factory):
    # --mem-queue-size=2: past two messages the channel's backlog is on disk
    server = nsqd_factory("--mem-queue-size=2")
    create(server, "t", "c")
    set_policy(server, "/channel/policy?topic=t&channel=c&max_bytes=1000&overflow=drop-oldest")
    # one kept-alive connection, so one worker, as one producer: past the topic's ring
    # of 2, a worker that does not own the topic keeps what it takes in its overflow
    # queue, behind which its next publishes wait, while the owner's go on: publishes
    # taken by both workers at once may reach the channel in another order (nsqd gives
    # no order either), and drop-oldest drops what came first
    conn = http_on_worker(server, 0)
    assert all(http_call(conn, "POST", "/pub?topic=t", body(i, 100)) == (200, b"OK")
               for i in range(40))

    def channel():
        return topic_stats(server, "t")["channels"][0]

    assert wait_for(lambda: channel()["dropped_count"] == 33, 5), channel()
    assert channel()["depth"] == 7
    assert queued(server, "/channel/peek?topic=t&channel=c&n=20") == \
        [body(i, 100).decode() for i in range(33, 40)]
    sub = Conn(server).subscribe("t", "c", rdy=10)
    assert [m.body for m in sub.messages(7)] == [body(i, 100) for i in range(33, 40)]
    assert sub.nothing_for(0.3)


def test_byte_bound_flag_errors_and_nsqd_dat(nsqd_factory, tmp_path):
    server = nsqd_factory("--max-queue-bytes=300")
    answers = [server.post("/pub?topic=t", body(i, 74)) for i in range(4)]
    assert [s for s, _ in answers] == [200, 200, 200, 503]
    stats = topic_stats(server, "t")
    assert (stats["max_bytes"], stats["rejected_count"]) == (300, 1)
    for path, text in [("/topic/policy?topic=t&max_bytes=-1", "INVALID_MAX_BYTES"),
                       ("/topic/policy?topic=t&max_bytes=1e3", "INVALID_MAX_BYTES")]:
        assert server.post(path) == (400, json.dumps({"message": text}).encode()
                                     .replace(b" ", b""))
    assert set_policy(server, "/topic/policy?topic=t&max_bytes=0")["max_bytes"] == 0
    assert server.post("/pub?topic=t", b"more") == (200, b"OK")
    with open(tmp_path / "nsqd.dat") as f:  # the default is not written, taking it off is
        topic = json.load(f)["topics"][0]
    assert (topic["max_bytes"], topic["overflow"]) == (0, "reject")
    assert "max_depth" not in topic
