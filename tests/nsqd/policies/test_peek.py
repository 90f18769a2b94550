"""Peek (issue 18, nsqshm/nsqd/policies/peek.py): the next messages of a topic or
channel, from memory and disk, without taking them; the same answer from
every worker; a consumer afterwards receives them all, in that order."""

import base64
import json

from nsqshm import protocol as p
from tests.nsqd.conftest import http_call, http_on_each_worker, wait_for
from tests.nsqd.tcp.test_protocol_v2 import Conn, publish

WORKER_COUNTS = (1, 2)  # every test on one worker and on two (conftest.py)


def peek_everywhere(server, path):
    """The answer of every worker to GET path (they must agree)."""
    answers = []
    for conn in http_on_each_worker(server).values():
        status, body = http_call(conn, "GET", path)
        assert status == 200, body
        answers.append(json.loads(body))
        conn.close()
    for other in answers[1:]:
        assert strip_times(other) == strip_times(answers[0])
        for key, time_key in (("in_flight", "deadline"), ("deferred", "due")):
            for a, b in zip(other.get(key, ()), answers[0].get(key, ()), strict=True):
                # wall clock from each worker's monotonic deadline: a few us apart
                assert abs(a[time_key] - b[time_key]) < 10_000_000
    return answers[0]


def strip_times(doc):
    return {k: [{f: v for f, v in m.items() if f not in ("deadline", "due")} for m in v]
            if isinstance(v, list) else v for k, v in doc.items()}


def create(server, topic, channel):
    """nsqd's /channel/create needs the topic: /topic/create first."""
    assert server.post(f"/topic/create?topic={topic}")[0] == 200
    assert server.post(f"/channel/create?topic={topic}&channel={channel}")[0] == 200


def bodies(entries):
    return [base64.b64decode(m["body"]) for m in entries]


def channel_stats(server, topic, channel):
    doc = json.loads(server.get(f"/stats?format=json&topic={topic}&channel={channel}")[1])
    return doc["topics"][0]["channels"][0]


def test_channel_peek_of_a_memory_backlog_then_consume_it_all(nsqd):
    create(nsqd, "t", "c")
    sent = [f"m{i}".encode() for i in range(5)]
    publish(nsqd, "t", *sent)
    assert wait_for(lambda: channel_stats(nsqd, "t", "c")["depth"] == 5)  # pumped
    doc = peek_everywhere(nsqd, "/channel/peek?topic=t&channel=c&n=3")
    assert (doc["topic_name"], doc["channel_name"], doc["depth"]) == ("t", "c", 5)
    assert bodies(doc["messages"]) == sent[:3]
    assert all(m["attempts"] == 0 and len(m["id"]) == 16 for m in doc["messages"])
    assert doc["in_flight"] == [] and doc["deferred"] == []
    again = peek_everywhere(nsqd, "/channel/peek?topic=t&channel=c&n=10")
    assert again["messages"][:3] == doc["messages"]  # nothing taken, nothing reordered
    assert bodies(again["messages"]) == sent
    msgs = Conn(nsqd).subscribe("t", "c", rdy=10).messages(5)
    assert [m.body for m in msgs] == sent
    assert [m.id.decode() for m in msgs] == [m["id"] for m in again["messages"]]


def test_channel_peek_reads_the_disk_queue_in_order(nsqd_factory):
    server = nsqd_factory("--mem-queue-size=2")
    create(server, "t", "c")
    sent = [f"d{i}".encode() for i in range(7)]
    publish(server, "t", *sent)
    assert wait_for(lambda: channel_stats(server, "t", "c")["depth"] == 7)  # pumped
    stats = channel_stats(server, "t", "c")
    assert (stats["depth"], stats["backend_depth"]) == (7, 5)  # 2 in the ring, 5 on disk
    doc = peek_everywhere(server, "/channel/peek?topic=t&channel=c&n=100")
    assert bodies(doc["messages"]) == sent
    assert bodies(peek_everywhere(server, "/channel/peek?topic=t&channel=c&n=4")
                  ["messages"]) == sent[:4]
    assert channel_stats(server, "t", "c")["backend_depth"] == 5  # the disk queue did not move
    c = Conn(server).subscribe("t", "c", rdy=10)
    msgs = c.messages(7)
    assert [m.body for m in msgs] == sent
    assert [m.id.decode() for m in msgs] == [m["id"] for m in doc["messages"]]


def test_in_flight_and_deferred_are_listed_apart(nsqd):
    publish(nsqd, "t", b"a", b"b", b"c")
    c = Conn(nsqd).subscribe("t", "c", rdy=1)
    a = c.messages(1)[0]
    c.send(p.req(a.id, 120_000))  # a: deferred for 2 minutes (past b's 60 s timeout)
    b = c.messages(1)[0]         # b: in flight
    doc = peek_everywhere(nsqd, "/channel/peek?topic=t&channel=c&n=10")
    assert bodies(doc["messages"]) == [b"c"]
    assert bodies(doc["in_flight"]) == [b"b"] and doc["in_flight"][0]["id"] == b.id.decode()
    assert doc["in_flight"][0]["attempts"] == 1 and "deadline" in doc["in_flight"][0]
    assert bodies(doc["deferred"]) == [b"a"] and doc["deferred"][0]["attempts"] == 1
    assert doc["deferred"][0]["due"] > doc["in_flight"][0]["deadline"]
    c.send(p.fin(b.id))
    assert c.messages(1)[0].body == b"c"  # peek took nothing


def test_topic_peek_before_any_channel(nsqd):
    publish(nsqd, "t", b"x", b"y")
    c = Conn(nsqd)
    c.send(p.dpub("t", 60_000, b"later"))
    assert c.frame() == (0, b"OK")
    doc = peek_everywhere(nsqd, "/topic/peek?topic=t")
    assert doc["topic_name"] == "t" and "channel_name" not in doc
    assert bodies(doc["messages"]) == [b"x", b"y"]
    assert bodies(doc["deferred"]) == [b"later"]
    assert [m.body for m in Conn(nsqd).subscribe("t", "c", rdy=5).messages(2)] == [b"x", b"y"]


def test_peek_errors_in_nsqds_style(nsqd):
    publish(nsqd, "t", b"x")
    cases = [("/channel/peek?channel=c", 400, "MISSING_ARG_TOPIC"),
             ("/channel/peek?topic=t", 400, "MISSING_ARG_CHANNEL"),
             ("/channel/peek?topic=nope&channel=c", 404, "TOPIC_NOT_FOUND"),
             ("/channel/peek?topic=t&channel=nope", 404, "CHANNEL_NOT_FOUND"),
             ("/topic/peek?topic=nope", 404, "TOPIC_NOT_FOUND"),
             ("/topic/peek?topic=bad/name", 400, "INVALID_TOPIC"),
             ("/topic/peek?topic=t&n=0", 400, "INVALID_N"),
             ("/topic/peek?topic=t&n=x", 400, "INVALID_N"),
             ("/topic/peek?topic=t&n=1001", 400, "INVALID_N")]
    for path, status, text in cases:
        try:
            got = nsqd.get(path)
        except Exception as err:  # urllib raises on 4xx
            got = (err.code, err.read())
        assert got == (status, json.dumps({"message": text}).replace(" ", "").encode()), path
