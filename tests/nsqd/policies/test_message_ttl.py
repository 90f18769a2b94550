"""A message's own time to live (issue 18, nsqshm/nsqd/policies/message_ttl.py and
includes/message_expiry.h): ttl= on /pub and /mpub, kept with the message
through memory, disk, REQ and a restart, never delivered once expired
(dropped, or dead-lettered per the channel), counted in expired_count;
clients and dead-letter topics get the message as nsqd encodes it."""

import base64
import json
import time
import urllib.parse
import urllib.request

from nsqshm import protocol as p
from tests.nsqd.conftest import wait_for
from tests.nsqd.logtopics.test_log_topics import nothing_more, take
from tests.nsqd.tcp.test_protocol_v2 import Conn
from tests.nsqd.test_ext import Client, consumer, create_ext, ext_data, mpub_ext, pub_ext

WORKER_COUNTS = (1, 2)  # every test on one worker and on two (conftest.py)


def create(server, topic, channel):
    assert server.post(f"/topic/create?topic={topic}")[0] == 200
    assert server.post(f"/channel/create?topic={topic}&channel={channel}")[0] == 200


def channel_stats(server, topic, channel):
    doc = json.loads(server.get(f"/stats?format=json&topic={topic}")[1])
    return next(c for c in doc["topics"][0]["channels"] if c["channel_name"] == channel)


def peeked(server, topic, channel):
    doc = json.loads(server.get(f"/channel/peek?topic={topic}&channel={channel}&n=100")[1])
    return [(base64.b64decode(m["body"]), "expires" in m) for m in doc["messages"]]


def _peek_when(server, path, count):
    """The peek's document once it shows `count` messages, else None."""
    doc = json.loads(server.get(path)[1])
    return doc if len(doc["messages"]) >= count else None


def test_expired_messages_are_never_delivered_but_counted_or_dead_lettered(nsqd):
    create(nsqd, "t", "c")
    before = time.time_ns()
    assert nsqd.post("/pub?topic=t&ttl=300", b"short") == (200, b"OK")
    assert nsqd.post("/pub?topic=t&ttl=600000", b"long") == (200, b"OK")
    assert nsqd.post("/pub?topic=t", b"none") == (200, b"OK")
    assert nsqd.post("/mpub?topic=t&ttl=300", b"a\nb") == (200, b"OK")
    assert nsqd.post("/mpub?topic=t&ttl=600000&binary=true",
                     p.mpub("t", [b"bin"])[len(b"MPUB t\n") + 4:]) == (200, b"OK")
    assert nsqd.post("/pub?topic=t&ttl=0", b"zero") == (200, b"OK")  # 0: none, as defer=0
    # (on two workers a publish the other worker took reaches the channel a moment
    # after its OK: the owner's pump moves it from the topic ring)
    doc = wait_for(lambda: _peek_when(nsqd, "/channel/peek?topic=t&channel=c&n=10", 7), 5)
    expires = {base64.b64decode(m["body"]): m.get("expires") for m in doc["messages"]}
    assert list(expires) == [b"short", b"long", b"none", b"a", b"b", b"bin", b"zero"]
    assert before + 300_000_000 <= expires[b"short"] < time.time_ns() + 300_000_000
    assert expires[b"none"] is None and expires[b"zero"] is None
    assert [m["attempts"] for m in doc["messages"]] == [0] * 7
    time.sleep(0.4)  # the 300 ms ones are past their deadline
    c = Conn(nsqd).subscribe("t", "c", rdy=10)
    got = c.messages(4)
    assert [(m.body, m.attempts) for m in got] == [(b"long", 1), (b"none", 1), (b"bin", 1),
                                                   (b"zero", 1)]
    assert c.nothing_for(0.3)
    # REQ: the deadline goes back with the message; the client still gets it plain
    c.send(p.req(got[0].id))
    again = c.messages(1)[0]
    assert (again.body, again.attempts) == (b"long", 2)
    # with defer=: a deadline before the message is due, and one after
    assert nsqd.post("/pub?topic=t&defer=300&ttl=100", b"gone") == (200, b"OK")
    assert nsqd.post("/pub?topic=t&defer=300&ttl=600000", b"later") == (200, b"OK")
    late = c.messages(1, timeout=10)[0]
    assert (late.body, late.attempts) == (b"later", 1)
    assert c.nothing_for(0.3)
    stats = channel_stats(nsqd, "t", "c")
    assert (stats["expired_count"], stats["depth"], stats["in_flight_count"]) == (4, 0, 5)
    doc = json.loads(nsqd.get("/stats?format=json&topic=t")[1])["topics"][0]
    assert doc["expired_count"] == 4

    # with the channel's dead_letter_expired, to its dead-letter topic instead
    create(nsqd, "u", "c")
    status, _ = nsqd.post("/channel/policy?topic=u&channel=c&dead_letter_expired=true")
    assert status == 200
    assert nsqd.post("/mpub?topic=u&ttl=200", b"x\ny") == (200, b"OK")
    time.sleep(0.3)
    c = Conn(nsqd).subscribe("u", "c", rdy=10)
    assert c.nothing_for(0.3)
    stats = channel_stats(nsqd, "u", "c")
    assert (stats["expired_count"], stats["dead_letter_expired_count"]) == (2, 2)
    # the dead letters are plain messages: their topic's consumers get them, never expired
    dead = Conn(nsqd).subscribe("u.c.dead", "inspect", rdy=10)
    got = dead.messages(2)
    assert sorted((m.body, m.attempts) for m in got) == [(b"x", 1), (b"y", 1)]
    assert channel_stats(nsqd, "u.c.dead", "inspect").get("expired_count", 0) == 0


def test_deadline_survives_the_disk_queue_and_a_restart(nsqd_factory, tmp_path):
    server = nsqd_factory("--mem-queue-size=1")
    create(server, "t", "c")
    for i in range(5):
        assert server.post("/pub?topic=t&ttl=1000", f"d{i}".encode()) == (200, b"OK")
    deadline = time.monotonic() + 1.0  # (past every one of theirs)
    assert server.post("/pub?topic=t", b"kept") == (200, b"OK")
    assert wait_for(lambda: channel_stats(server, "t", "c")["backend_depth"] == 5, 5)
    assert server.stop() == 0
    again = nsqd_factory("--mem-queue-size=1")
    # (in the order the restart put them back: the ring's one after the disk queue's)
    assert sorted(peeked(again, "t", "c")) == [(f"d{i}".encode(), True) for i in range(5)] + \
        [(b"kept", False)]
    time.sleep(max(0.0, deadline - time.monotonic()) + 0.1)
    c = Conn(again).subscribe("t", "c", rdy=10)
    assert c.messages(1)[0].body == b"kept"
    assert c.nothing_for(0.3)
    assert channel_stats(again, "t", "c")["expired_count"] == 5


def test_bad_ttl_and_the_size_it_takes(nsqd_factory):
    server = nsqd_factory("--max-msg-size=100")
    create(server, "t", "c")
    for query in ("ttl=x", "ttl=-1", "ttl=1.5", "ttl=" + "9" * 16, "ttl=1099511627777"):
        assert server.post(f"/pub?topic=t&{query}", b"m") == \
            (400, b'{"message":"INVALID_TTL"}'), query
        assert server.post(f"/mpub?topic=t&{query}", b"m") == \
            (400, b'{"message":"INVALID_TTL"}'), query
    assert server.post("/pub?topic=t&ttl=1000", b"x" * 93) == \
        (413, b'{"message":"MSG_TOO_BIG"}')  # the deadline takes 8 of the 100 bytes
    assert server.post("/mpub?topic=t&ttl=1000", b"x\n" + b"x" * 93) == \
        (413, b'{"message":"MSG_TOO_BIG"}')
    assert server.post("/pub?topic=t&ttl=60000", b"x" * 92) == (200, b"OK")
    assert server.post("/pub?topic=t", b"x" * 100) == (200, b"OK")
    assert channel_stats(server, "t", "c")["depth"] == 2  # nothing refused was kept
    # a log topic keeps its messages in its own log: refused, clearly
    assert server.post("/topic/create?topic=lt&partition_num=1")[0] == 200
    refused = (400, b'{"message":"NOT_SUPPORTED_ON_LOG_TOPIC"}')
    assert server.post("/pub?topic=lt&ttl=1000", b"m") == refused
    assert server.post("/mpub?topic=lt&ttl=1000", b"m") == refused


def test_the_ttl_header_of_an_ext_topic(nsqd_factory):
    """##ttl_ms on PUB_EXT, MPUB_EXT (read in C) and /pub_ext, /mpub_ext: the
    message's own deadline; an ext client still gets its headers as sent."""
    server = nsqd_factory("--max-msg-size=200")
    create_ext(server, "xt")
    for channel in ("e", "plain"):
        assert server.post(f"/channel/create?topic=xt&channel={channel}")[0] == 200
    short, long_ = b'{"##ttl_ms":"300","k":"v"}', b'{"##ttl_ms":"600000"}'
    pc = Client(server)
    for data in (pub_ext("xt", short, b"s1"), pub_ext("xt", long_, b"l1"),
                 pub_ext("xt", b'{"##ttl_ms":"0"}', b"z1"),
                 mpub_ext("xt", [(short, b"s2"), (b"", b"n2"), (long_, b"l2")])):
        pc.send(data)
        assert pc.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    req = urllib.request.Request(server.url("/pub_ext?topic=xt"), data=b"s3", method="POST",
                                 headers={"X-NSQEXT-##ttl_ms": "300"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
    ext = urllib.parse.quote('{"##ttl_ms":"600000"}')
    assert server.post(f"/mpub_ext?topic=xt&ext={ext}", b"l3\nl4") == (200, b"OK")
    # ttl= wins over the header
    assert server.post(f"/pub_ext?topic=xt&ttl=300&ext={ext}", b"s4") == (200, b"OK")
    doc = wait_for(lambda: _peek_when(server, "/channel/peek?topic=xt&channel=e&n=20", 10), 5)
    deadlines = [m.get("expires") for m in doc["messages"]]
    assert [d is not None for d in deadlines] == [True, True, False, True, False, True,
                                                  True, True, True, True]
    assert deadlines[0] < deadlines[1] and deadlines[6] < deadlines[7]
    time.sleep(0.4)  # the 300 ms ones are past their deadline
    ext_client = consumer(server, "xt", "e", extend_support=True)
    plain = consumer(server, "xt", "plain")
    got = sorted(m.body for m in take(ext_client, 6))
    assert got == sorted([ext_data(long_, b"l1"), ext_data(b'{"##ttl_ms":"0"}', b"z1"),
                          ext_data(None, b"n2"), ext_data(long_, b"l2"),
                          ext_data(long_, b"l3"), ext_data(long_, b"l4")])
    assert sorted(m.body for m in take(plain, 6)) == [b"l1", b"l2", b"l3", b"l4", b"n2", b"z1"]
    assert nothing_more(ext_client, 0.3) and nothing_more(plain, 0.1)
    for channel in ("e", "plain"):
        assert channel_stats(server, "xt", channel)["expired_count"] == 4

    # bad values and the 8 bytes a deadline takes; a log topic refuses it
    for headers in (b'{"##ttl_ms":"x"}', b'{"##ttl_ms":5}', b'{"##ttl_ms":"-1"}',
                    b'{"##ttl_ms":"1099511627777"}'):
        c = Client(server)
        c.send(pub_ext("xt", headers, b"m"))
        assert c.response() == (p.FRAME_TYPE_ERROR,
                                b"E_BAD_BODY invalid ##ttl_ms header (INVALID_TTL)"), headers
        c = Client(server)
        c.send(mpub_ext("xt", [(b"", b"ok"), (headers, b"m")]))
        assert c.response() == (p.FRAME_TYPE_ERROR,
                                b"E_BAD_BODY invalid ##ttl_ms header (INVALID_TTL)"), headers
        status, body = server.post(f"/pub_ext?topic=xt&ext={urllib.parse.quote(headers)}", b"m")
        assert (status, body) == (400, b'{"message":"INVALID_TTL"}'), headers
    c = Client(server)  # stored: 26 + 1 + 2 + 18 + body + 8 > 200
    c.send(pub_ext("xt", b'{"##ttl_ms":"9"}', b"x" * (200 - 1 - 2 - 16 - 7)))
    kind, answer = c.response()
    assert kind == p.FRAME_TYPE_ERROR and answer.startswith(b"E_BAD_MESSAGE message too big"), \
        answer
    c = Client(server)
    c.send(pub_ext("xt", b'{"##ttl_ms":"9"}', b"x" * (200 - 1 - 2 - 16 - 8)))
    assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    create_ext(server, "lxt", "&partition_num=1")
    c = Client(server)
    c.send(pub_ext("lxt", short, b"m"))
    assert c.response() == (p.FRAME_TYPE_ERROR, b"E_BAD_BODY invalid ##ttl_ms header "
                                                b"(NOT_SUPPORTED_ON_LOG_TOPIC)")
    assert server.post(f"/pub_ext?topic=lxt&ext={ext}", b"m") == \
        (400, b'{"message":"NOT_SUPPORTED_ON_LOG_TOPIC"}')
