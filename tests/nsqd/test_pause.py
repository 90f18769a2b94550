"""Pause, unpause, empty and delete over HTTP, seen by TCP consumers."""

import json
import os

from nsqshm import protocol as p
from tests.nsqd.conftest import wait_for
from tests.nsqd.tcp.test_protocol_v2 import Conn, publish

WORKER_COUNTS = (1, 2)  # every test on one worker and on two (conftest.py)


def channel_stats(server, topic, channel):
    status, body = server.get(f"/stats?format=json&topic={topic}")
    topics = json.loads(body)["topics"]
    return next(c for c in topics[0]["channels"] if c["channel_name"] == channel), topics[0]


def test_paused_channel_delivers_nothing_until_unpaused(nsqd):
    c = Conn(nsqd).subscribe("t", "c", rdy=10)
    assert nsqd.post("/channel/pause?topic=t&channel=c")[0] == 200
    publish(nsqd, "t", b"held")
    assert c.nothing_for(0.6)
    ch, _ = channel_stats(nsqd, "t", "c")
    assert ch["paused"] is True and ch["depth"] == 1
    assert nsqd.post("/channel/unpause?topic=t&channel=c")[0] == 200
    assert c.messages(1)[0].body == b"held"


def test_paused_topic_holds_messages_in_the_topic(nsqd):
    c = Conn(nsqd).subscribe("t", "c", rdy=10)
    assert nsqd.post("/topic/pause?topic=t")[0] == 200
    publish(nsqd, "t", b"a", b"b")
    assert c.nothing_for(0.6)
    ch, topic = channel_stats(nsqd, "t", "c")
    assert topic["paused"] is True and topic["depth"] == 2 and ch["depth"] == 0
    assert nsqd.post("/topic/unpause?topic=t")[0] == 200
    assert [m.body for m in c.messages(2)] == [b"a", b"b"]


def test_empty_channel_drops_queued_and_in_flight(nsqd):
    publish(nsqd, "t", *[b"x"] * 5)
    c = Conn(nsqd).subscribe("t", "c", rdy=2)
    msgs = c.messages(2)
    assert nsqd.post("/channel/empty?topic=t&channel=c")[0] == 200
    ch, _ = channel_stats(nsqd, "t", "c")
    assert (ch["depth"], ch["in_flight_count"]) == (0, 0)
    c.send(p.fin(msgs[0].id))  # no longer in flight
    assert c.frame()[1].endswith(b"failed ID not in flight")


def test_delete_channel_closes_its_consumers(nsqd):
    c = Conn(nsqd).subscribe("t", "c", rdy=1)
    assert nsqd.post("/channel/delete?topic=t&channel=c")[0] == 200
    assert c.closed()
    assert wait_for(lambda: not any(".c.t:c" in n for n in os.listdir("/dev/shm")
                                    if n.startswith(nsqd.prefix)))


def test_delete_topic_closes_consumers_and_removes_rings(nsqd):
    c = Conn(nsqd).subscribe("t", "c", rdy=1)
    publish(nsqd, "t", b"x")
    assert nsqd.post("/topic/delete?topic=t")[0] == 200
    assert c.closed()
    assert wait_for(lambda: not [n for n in os.listdir("/dev/shm")
                                 if n.startswith(nsqd.prefix) and (".t.t" in n or ".c.t:" in n)])
