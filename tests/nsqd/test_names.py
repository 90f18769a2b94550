"""Every topic and channel name nsqd accepts works, on two workers: as a
ring's name, as a disk queue's files, across a restart -- and a name no
part of the broker wanted never costs another client anything."""

import os
import time
import zlib

import pytest

from nsqshm import protocol as p
from tests.nsqd.workers.test_workers import Client, client_on_worker

pytestmark = pytest.mark.timeout(120)

# valid in nsqd's protocol/names.go ([.a-zA-Z0-9_-]{1,64}, optionally #ephemeral)
# and each odd in its own way as a file or segment name
ODD_TOPICS = [".", "..", "...", "t#ephemeral", "T" * 64, "-", "_x", "a.diskqueue.000000",
              "a.w00-0123456789abcdef", "x" * 54 + "#ephemeral"]
ODD_CHANNELS = [".", "..", "...", "c#ephemeral", "C" * 64, "-", "d.deferred"]


def ok(client):
    assert client.response() == (p.FRAME_TYPE_RESPONSE, b"OK")


def tracebacks(server):
    return [line for line in server.lines if "Traceback" in line or "Error:" in line]


def consume(client, n):
    bodies = []
    while len(bodies) < n:
        msg = client.message()
        bodies.append(msg.body)
        client.send(p.fin(msg.id))
    return bodies


def test_every_odd_valid_name_works_as_topic_and_channel(nsqd_factory, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory("--workers=2", data_path=data)
    pub = Client(server)
    subs = {}
    for i, topic in enumerate(ODD_TOPICS):
        channel = ODD_CHANNELS[i % len(ODD_CHANNELS)]
        sub = Client(server)
        sub.send(p.sub(topic, channel))
        ok(sub)
        sub.send(p.rdy(10))
        subs[topic] = (channel, sub)
    # every channel name on one topic too
    for channel in ODD_CHANNELS:
        if channel == subs[".."][0]:
            continue  # subscribed above: one message per channel
        sub = Client(server)
        sub.send(p.sub("..", channel))
        ok(sub)
        sub.send(p.rdy(10))
        subs[("..", channel)] = (channel, sub)
    # a PUB right after a SUB's OK may miss a channel made on the other worker
    # (a race of its own, seen with plain names too): let the owner learn them
    time.sleep(0.5)
    for topic in ODD_TOPICS:
        pub.send(p.pub(topic, f"to {topic}".encode()))
        ok(pub)
    for key, (channel, sub) in subs.items():
        topic = key[0] if isinstance(key, tuple) else key
        assert consume(sub, 1) == [f"to {topic}".encode()], (topic, channel)
    pub.send(p.pub("..", b"again"))
    ok(pub)
    for key, (_, sub) in subs.items():
        if key == ".." or isinstance(key, tuple):
            assert consume(sub, 1) == [b"again"], key
    # kept on disk at the stop under Go nsqd's file names, across a restart
    for _, sub in subs.values():
        sub.send(p.cls())
        assert sub.response() == (p.FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")
        sub.close()
    for topic in ("..", ".", "..."):
        pub.send(p.pub(topic, b"kept"))
        ok(pub)
    pub.close()
    assert server.stop() == 0
    names = set(os.listdir(data))
    for topic in (".", "..", "...", "T" * 64):
        assert f"{topic}.diskqueue.meta.dat" in names
    for topic, channel in ((".", "."), ("..", ".."), ("..", "C" * 64), ("..", "d.deferred")):
        assert f"{topic}:{channel}.diskqueue.meta.dat" in names
    # no queue of an ephemeral topic or channel (a channel of one may have files)
    assert not [n for n in names if n.split(".diskqueue.")[0].endswith("#ephemeral")]
    assert not [n for n in os.listdir(tmp_path) if n != "data"]  # nothing outside it
    assert not tracebacks(server), tracebacks(server)
    again = nsqd_factory("--workers=2", data_path=data,
                         prefix=server.prefix)
    for topic, channel in ((".", "."), ("..", ".."), ("..", "C" * 64), ("...", "...")):
        sub = Client(again)
        sub.send(p.sub(topic, channel))
        ok(sub)
        sub.send(p.rdy(10))
        assert consume(sub, 1) == [b"kept"], (topic, channel)
        sub.close()
    assert not tracebacks(again), tracebacks(again)


def silent(conn, wait):
    """True if nothing arrives on conn within `wait` seconds (and it is open)."""
    conn.sock.settimeout(wait)
    try:
        data = conn.sock.recv(1 << 16)
    except TimeoutError:
        return True
    finally:
        conn.sock.settimeout(5)
    raise AssertionError(f"a connection that only sent the magic received {data[:80]!r}")


def test_pub_dotdot_closes_no_descriptor_and_leaks_no_message(nsqd_factory):
    """issue 21.1: `PUB ..` made the owner's disk queue raise before its
    descriptor was -1, and its __dealloc__ closed descriptor 0 -- later a
    subscriber's socket, whose frames then went to the next connection."""
    server = nsqd_factory("--workers=2")
    owner = zlib.crc32(b"..") % 2
    attacker = Client(server)
    attacker.send(p.pub("..", b"first"))
    ok(attacker)
    # a subscriber on the owner worker: the lowest free descriptor there
    victim = client_on_worker(server, owner, "victim", "c")
    victim.send(p.rdy(100))
    attacker.send(p.pub("..", b"second"))
    ok(attacker)
    bystanders = [Client(server) for _ in range(8)]  # sent the magic, nothing else
    publisher = Client(server)
    bodies = [f"v{i}".encode() for i in range(20)]
    publisher.send(p.mpub("victim", bodies))
    ok(publisher)
    assert consume(victim, len(bodies)) == bodies
    for conn in bystanders:
        assert silent(conn, 0.2)
    for conn in bystanders:  # and none was disconnected
        conn.send(p.pub("alive", b"x"))
        ok(conn)
    sub = Client(server)
    sub.send(p.sub("..", "c"))
    ok(sub)
    sub.send(p.rdy(10))
    assert sorted(consume(sub, 2)) == [b"first", b"second"]
    time.sleep(0.2)
    assert not tracebacks(server), tracebacks(server)


def test_deferred_messages_stay_with_their_channel_across_a_restart(nsqd_factory, tmp_path):
    """A channel's deferred file is <topic>:<channel>.deferred[.w<i>].dat:
    channel "c" must not take "c.deferred.w1"'s (a prefix of its name)."""
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory("--workers=2", data_path=data)
    channels = ["c", "c.deferred.w1", "c.deferred"]
    subs = []
    for channel in channels:
        sub = Client(server)
        sub.send(p.sub("dt", channel))
        ok(sub)
        subs.append(sub)
    time.sleep(0.5)  # see test_every_odd_valid_name_works_as_topic_and_channel
    pub = Client(server)
    pub.send(p.pub("dt", b"deferred"))
    ok(pub)
    for sub in subs:
        sub.send(p.rdy(1))
        msg = sub.message()
        sub.send(p.req(msg.id, 1500))  # deferred in its channel, saved at the stop
    for sub in subs:
        sub.send(p.cls())
        assert sub.response() == (p.FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")
        sub.close()
    assert server.stop() == 0
    assert sum(".deferred" in n and n.split(".deferred")[0].startswith("dt:")
               for n in os.listdir(data)) >= 3
    again = nsqd_factory("--workers=2", data_path=data, prefix=server.prefix)
    for channel in channels:
        sub = Client(again)
        sub.send(p.sub("dt", channel))
        ok(sub)
        sub.send(p.rdy(10))
        assert consume(sub, 1) == [b"deferred"], channel
        sub.sock.settimeout(1)
        with pytest.raises(TimeoutError):  # exactly one: not another channel's too
            sub.message()
        sub.close()
    assert not tracebacks(again), tracebacks(again)
