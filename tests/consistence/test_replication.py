"""Replicated log topics across hosts (issue 17): three nsqd, each in its own network
namespace, a real etcd, an nsqlookupd in cluster mode (cluster.py).  Every PUB
acknowledged must be readable from whichever node leads after a failure."""

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from nsqshm import protocol as p
from nsqshm._core.commitlog import segment_name
from nsqshm.consistence.etcd.session import EtcdSession
from nsqshm.consistence.topology import Topology
from nsqshm.nsqd.logtopics.partition import partition_owner
from nsqshm.youzan import client as youzan
from nsqshm.youzan.frames import decode_message
from tests.consistence.cluster import Client, Cluster
from tests.consistence.etcd_server import ETCD
from tests.consistence.netns import available

pytestmark = [
    pytest.mark.skipif(bool(available()), reason=available() or "available"),
    pytest.mark.skipif(ETCD is None, reason="etcd not installed (scripts/setup.sh)"),
    pytest.mark.timeout(90),
]


@pytest.fixture
def make_cluster(tmp_path):
    made = []

    def make(workers=1, ttl="2s", args=(), lookupd_args=()):
        cluster = Cluster(tmp_path, workers=workers, ttl=ttl, args=args,
                          lookupd_args=lookupd_args)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


def publish(node, topic, bodies, settle=5.0, partition=0):
    """PUB each body to a partition of node; every one must be acknowledged.  The
    first may be refused with E_FAILED_ON_NOT_LEADER for up to `settle` seconds, as a
    client that follows /lookup sees it: the node is named once elected, and takes
    writes once it has read its new role."""
    client = Client(node)
    end = time.monotonic() + settle
    try:
        answer = client.pub(topic, bodies[0], partition)
        while answer[1].startswith(b"E_FAILED_ON_NOT_LEADER") and time.monotonic() < end:
            time.sleep(0.05)
            answer = client.pub(topic, bodies[0], partition)
        assert answer == (0, b"OK"), bodies[0]
        for body in bodies[1:]:
            assert client.pub(topic, body, partition) == (0, b"OK"), body
    finally:
        client.close()


def consume_all(node, topic, count):
    client = Client(node)
    try:
        return client.consume(topic, "audit", count)
    finally:
        client.close()


def isr(cluster, topic, partition=0):
    """The partition's ISR as etcd has it (read through our own etcd client)."""
    session = EtcdSession(cluster.etcd.endpoint, ttl=5).start()
    try:
        state = Topology(session, "nsq-test-cluster").partition(topic, partition)
        return set(state.replicas.isr)
    finally:
        session.close()


def wait_until(predicate, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {what}")


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_acknowledged_messages_survive_the_leader_sigkill(make_cluster, workers):
    cluster = make_cluster(workers)
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    leader = cluster.leader("orders")
    followers = [n for n in cluster.nodes if n is not leader]
    # a PUB to a follower is refused with Youzan's code, the connection kept
    client = Client(followers[0])
    kind, data = client.pub("orders", b"nope")
    assert (kind, data.split()[0]) == (1, b"E_FAILED_ON_NOT_LEADER")
    client.close()

    bodies = [b"m%04d" % i for i in range(300)]
    publish(leader, "orders", bodies)
    # acknowledged means on every ISR member, at the same offsets
    assert [n.end_offset("orders") for n in cluster.nodes] == [300, 300, 300]

    leader.kill()
    new = cluster.leader("orders", not_in=(leader.id,), timeout=20)
    assert new in followers
    publish(new, "orders", [b"after"])
    got = consume_all(new, "orders", 301)
    assert got == [*bodies, b"after"]


def worker_pid(node, index):
    """The PID of the node's worker `index` (its process title names it)."""
    for pid in node.processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read()
        except OSError:
            continue
        if title.startswith(b"nsqshm: worker %d " % index):
            return pid
    raise AssertionError(f"no worker {index} among {node.processes()}")


def test_a_leader_whose_partition_worker_hangs_is_replaced_and_then_fenced(make_cluster):
    """Two workers, the partition owned by worker 1: that worker of the leader
    hangs (SIGSTOP) while worker 0 keeps the node registered in etcd.  Its
    leader session runs out; the other ISR members wait for it (the designated
    leader, registered) at most DESIGNATED_WAIT or the TTL, then one is
    elected, with every acknowledged message.  Thawed, the old leader
    acknowledges nothing, and its log comes back to the new leader's."""
    cluster = make_cluster(2)
    topic = next(t for t in (f"hang{i}" for i in range(64)) if partition_owner(t, 0, 2) == 1)
    assert cluster.create_topic(topic, 1, 3)[0] == 200
    leader = cluster.leader(topic)
    bodies = [b"h%03d" % i for i in range(100)]
    publish(leader, topic, bodies)
    hung = worker_pid(leader, 1)
    os.kill(hung, signal.SIGSTOP)
    started = time.monotonic()
    try:
        new = cluster.leader(topic, not_in=(leader.id,), timeout=20)
        failover = time.monotonic() - started
        nodes = {n["id"]: n for n in cluster.lookupd.get_json("/cluster/nodes")["nodes"]}
        assert nodes[leader.id]["registered"] is True  # (worker 0 kept it so)
    finally:
        os.kill(hung, signal.SIGCONT)
    # the session's TTL (2 s), then the wait for the designated leader (at most the
    # TTL here), then the election: well under 2 TTLs and the wait's 3 s
    assert failover < 2 * 2 + 3 + 2, failover
    client = Client(leader)
    try:
        kind, data = client.pub(topic, b"stale")
    finally:
        client.close()
    assert kind == p.FRAME_TYPE_ERROR, data
    publish(new, topic, [b"after"])
    assert consume_all(new, topic, 101) == [*bodies, b"after"]
    wait_until(lambda: leader.end_offset(topic) == new.end_offset(topic) == 101, 20,
               "the old leader's log comes back to the new leader's")


def channel_partition(node, topic, channel, field, partition=0):
    """(confirmed offset, `field`) of a channel's entry for a partition in a
    node's /stats, or None (no such channel there)."""
    for t in node.get_json(f"/stats?format=json&topic={topic}")["topics"] or ():
        for c in t["channels"]:
            if c["channel_name"] == channel:
                e = c["partitions"][partition]
                return e["confirmed_offset"], e[field]
    return None


def channel_cursor(node, topic, channel, partition=0):
    """(confirmed offset, finished above) of a channel on a node, or None."""
    return channel_partition(node, topic, channel, "finished_above", partition)


def publish_and_hold(leader, bodies, count, kept):
    """PUB bodies ("m%04d") to orders, then a consumer of channel audit takes the
    first `count` and FINs all but those numbered in `kept`: -> the consumer."""
    publish(leader, "orders", bodies)
    client = Client(leader)
    client.send(p.sub("orders", "audit"))
    assert client.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    client.send(p.rdy(count))
    for _ in range(count):
        m = client.message()
        if int(m.body[1:]) not in kept:
            client.send(p.fin(m.id))
    return client


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_a_new_leader_resumes_the_channel_where_the_old_one_was(make_cluster, workers):
    """The leader sends its channels' cursors to the followers (rpc CURSORS): after
    its SIGKILL the new leader delivers what the old one's consumers had not
    finished (in flight, or not delivered yet), not what they had."""
    cluster = make_cluster(workers)
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    leader = cluster.leader("orders")
    followers = [n for n in cluster.nodes if n is not leader]
    bodies = [b"m%04d" % i for i in range(300)]
    kept = {5, *range(100, 120)}  # received, not finished: in flight at the kill
    client = publish_and_hold(leader, bodies, 120, kept)
    wait_until(lambda: all(channel_cursor(f, "orders", "audit") == (5, 94) for f in followers),
               10, "the followers' channel takes the leader's cursor")

    leader.kill()
    client.close()
    new = cluster.leader("orders", not_in=(leader.id,), timeout=20)
    publish(new, "orders", [b"after"])
    want = [b"m0005", *bodies[100:], b"after"]
    survivor = Client(new)
    try:
        assert survivor.consume("orders", "audit", len(want)) == want
        survivor.sock.settimeout(1.0)  # and nothing else: m0000..m0099 but 5 were done
        with pytest.raises(TimeoutError):
            survivor.message()
    finally:
        survivor.close()


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_a_leader_killed_just_after_fins_redelivers_only_what_was_in_flight(make_cluster,
                                                                           workers):
    """The cursors go to the followers within CURSOR_INTERVAL (50 ms) while the
    partition is busy: a leader SIGKILLed 0.3 s after its consumer's last FIN, with
    no wait for the followers, leaves a new leader that redelivers what was in
    flight and nothing the consumer had finished."""
    cluster = make_cluster(workers)
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    leader = cluster.leader("orders")
    bodies = [b"m%04d" % i for i in range(200)]
    kept = {7, *range(60, 70)}  # received, not finished: in flight at the kill
    client = publish_and_hold(leader, bodies, 150, kept)
    client.send(p.nop())
    time.sleep(0.3)
    leader.kill()
    client.close()
    new = cluster.leader("orders", not_in=(leader.id,), timeout=20)
    want = sorted([b"m%04d" % i for i in kept] + bodies[150:])
    survivor = Client(new)
    try:
        got = survivor.consume("orders", "audit", len(want))
        assert sorted(got) == want
        survivor.sock.settimeout(1.0)  # and nothing the consumer had finished
        with pytest.raises(TimeoutError):
            survivor.message()
    finally:
        survivor.close()


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_a_new_leader_delivers_what_was_committed_before_the_dead_leader_leaves_the_isr(
        make_cluster, workers):
    """The leader tells its followers its committed end (in CURSORS frames), and a
    follower elected leader delivers up to it at once.  Before, its channels waited
    for every ISR member's first ack, and the dead old leader, still in the ISR,
    acknowledges nothing: consumers got nothing until the monitor took it out
    (LAG_TIMEOUT, 2 s after the election)."""
    cluster = make_cluster(workers)
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    leader = cluster.leader("orders")
    followers = [n for n in cluster.nodes if n is not leader]
    bodies = [b"m%04d" % i for i in range(100)]
    client = publish_and_hold(leader, bodies, 10, set())
    wait_until(lambda: all(channel_cursor(f, "orders", "audit") == (10, 0) for f in followers),
               10, "the followers' channel takes the leader's cursor")
    leader.kill()
    client.close()
    new = cluster.leader("orders", not_in=(leader.id,), timeout=20)
    survivor = Client(new)
    try:
        survivor.send(p.sub("orders", "audit"))
        assert survivor.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        survivor.send(p.rdy(100))
        got = [survivor.message().body]
        assert leader.id in isr(cluster, "orders")  # delivered while it is still in the ISR
        for _ in range(89):
            m = survivor.message()
            got.append(m.body)
            survivor.send(p.fin(m.id))
        assert sorted(got) == bodies[10:]
    finally:
        survivor.close()


def put_back(node, topic, channel, partition=0):
    """(confirmed offset, messages put back) of a channel on a node, or None."""
    return channel_partition(node, topic, channel, "put_back", partition)


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_a_new_leader_delivers_what_was_put_back_with_its_attempts_once_due(make_cluster,
                                                                           workers):
    """What the leader's consumers put back (REQ, timeouts) rides with the cursors
    (each cursor's retry table, in CURSORS frames): after the leader's SIGKILL, a
    message REQ'd with a delay comes from the new leader when it is due, not at once,
    and a message REQ'd twice comes with its attempts counted on (3rd delivery: 3)."""
    cluster = make_cluster(workers)
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    leader = cluster.leader("orders")
    followers = [n for n in cluster.nodes if n is not leader]
    bodies = [b"m%04d" % i for i in range(20)]
    publish(leader, "orders", bodies)
    client = Client(leader)
    client.send(p.sub("orders", "audit"))
    assert client.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    client.send(p.rdy(20))
    got = {}
    for _ in range(20):
        m = client.message()
        got[m.body] = m
    client.send(p.req(got[b"m0003"].id, 0))
    again = client.message()
    assert (again.body, again.attempts) == (b"m0003", 2)
    client.send(p.rdy(0))  # what is put back now stays in the channel
    client.send(p.req(again.id, 0))
    client.send(p.req(got[b"m0005"].id, 10_000))
    due = time.time() + 10.0
    for body, m in got.items():
        if body not in (b"m0003", b"m0005"):
            client.send(p.fin(m.id))
    wait_until(lambda: all(put_back(f, "orders", "audit") == (3, 2) for f in followers),
               10, "the followers know the two messages put back")
    leader.kill()
    client.close()
    new = cluster.leader("orders", not_in=(leader.id,), timeout=20)
    assert time.time() < due - 2, "the failover outlasted the delay"
    survivor = Client(new, timeout=15)
    try:
        survivor.send(p.sub("orders", "audit"))
        assert survivor.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        survivor.send(p.rdy(10))
        m = survivor.message()
        assert (m.body, m.attempts) == (b"m0003", 3)
        survivor.send(p.fin(m.id))
        m = survivor.message()
        arrived = time.time()
        assert (m.body, m.attempts) == (b"m0005", 2)
        assert arrived >= due - 0.2, f"delivered {due - arrived:.1f}s before it was due"
        survivor.send(p.fin(m.id))
        survivor.sock.settimeout(1.0)  # and nothing else: the rest were finished
        with pytest.raises(TimeoutError):
            survivor.message()
    finally:
        survivor.close()


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_a_new_leader_gives_an_ordered_head_its_attempts(make_cluster, workers):
    """An ordered lane's head is read from the log again on a new leader (the
    lane's ring is the old leader's); the retry table the cursors carried
    gives it its attempts back (Cursor._claimed_attempts): a head REQ'd
    twice comes as its 3rd delivery, then the rest in order from 1."""
    cluster = make_cluster(workers)
    assert cluster.create_topic("seq", 1, 3)[0] == 200
    leader = cluster.leader("seq")
    followers = [n for n in cluster.nodes if n is not leader]
    publish(leader, "seq", [b"s0", b"s1", b"s2"])
    client = Client(leader)
    client.send(b"SUB_ORDERED seq audit 0\n")
    assert client.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    client.send(p.rdy(1))
    m = client.message()
    assert (m.body[12:], m.attempts) == (b"s0", 1)  # (after the offset and raw size: 12 B)
    client.send(p.req(m.id, 0))
    m = client.message()
    assert (m.body[12:], m.attempts) == (b"s0", 2)
    client.send(p.rdy(0))  # what is put back now stays in the lane
    client.send(p.req(m.id, 0))
    wait_until(lambda: all(put_back(f, "seq", "audit") == (0, 1) for f in followers),
               10, "the followers know the head put back")
    leader.kill()
    client.close()
    new = cluster.leader("seq", not_in=(leader.id,), timeout=20)
    assert ordered_from(new, "seq", "audit", 3) == [(b"s0", 3), (b"s1", 1), (b"s2", 1)]


def ordered_from(node, topic, channel, count):
    """(body, attempts) of the next `count` messages SUB_ORDERED takes of
    partition 0 on a node, each finished before the next comes."""
    client = Client(node, timeout=15)
    try:
        client.send(f"SUB_ORDERED {topic} {channel} 0\n".encode())
        assert client.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        client.send(p.rdy(1))
        got = []
        for _ in range(count):
            m = client.message()
            got.append((m.body[12:], m.attempts))  # (after the offset and raw size: 12 B)
            client.send(p.fin(m.id))
        return got
    finally:
        client.close()


def delivered_mark(node, topic, channel, partition=0):
    """(confirmed offset, delivered offset) of a channel on a node, or None."""
    return channel_partition(node, topic, channel, "delivered_offset", partition)


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_what_was_in_flight_at_a_failover_comes_as_its_next_delivery(make_cluster, workers):
    """The cursors carry the leader's delivered mark (one past the highest offset it
    put in flight): after its SIGKILL, the new leader gives what was in flight --
    delivered once, never put back, not finished -- the attempts of that delivery,
    so it comes as the 2nd (it came as the 1st again before), while what was never
    delivered comes as the 1st; an ordered lane's head in flight the same."""
    cluster = make_cluster(workers)
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    leader = cluster.leader("orders")
    followers = [n for n in cluster.nodes if n is not leader]
    bodies = [b"m%04d" % i for i in range(20)]
    client = Client(leader)
    client.send(p.sub("orders", "audit"))
    assert client.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    ordered = Client(leader)  # (both channels before the messages: new ones start at the end)
    ordered.send(b"SUB_ORDERED orders seq 0\n")
    assert ordered.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    publish(leader, "orders", bodies)
    client.send(p.rdy(10))
    held = [client.message() for _ in range(10)]
    assert sorted(m.body for m in held) == bodies[:10] and {m.attempts for m in held} == {1}
    client.send(p.rdy(0))
    for m in held[:4]:
        client.send(p.fin(m.id))
    in_flight = sorted(m.body for m in held[4:])
    ordered.send(p.rdy(1))
    m = ordered.message()
    assert (m.body[12:], m.attempts) == (b"m0000", 1)  # (after the offset and raw size: 12 B)
    ordered.send(p.rdy(0))
    wait_until(lambda: all(delivered_mark(f, "orders", "seq") == (0, 1) and
                           (delivered_mark(f, "orders", "audit") or (0, 0))[1] == 10
                           for f in followers),
               10, "the followers know what was delivered")
    leader.kill()
    client.close()
    ordered.close()
    new = cluster.leader("orders", not_in=(leader.id,), timeout=20)
    survivor = Client(new, timeout=15)
    try:
        survivor.send(p.sub("orders", "audit"))
        assert survivor.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        survivor.send(p.rdy(20))
        got = {}
        for _ in range(16):
            m = survivor.message()
            got[m.body] = m.attempts
            survivor.send(p.fin(m.id))
        finished = {m.body for m in held[:4]}
        assert got == {b: 2 if b in in_flight else 1 for b in bodies if b not in finished}
    finally:
        survivor.close()
    assert ordered_from(new, "orders", "seq", 3) == [(b"m0000", 2), (b"m0001", 1),
                                                      (b"m0002", 1)]


def test_a_channel_deleted_on_the_leader_goes_on_the_followers(make_cluster):
    """The deletion rides with the cursors (a CURSORS entry with confirmed DELETED):
    a new leader does not bring back a channel its consumers had deleted, and a
    channel made again afterwards is replicated again."""
    cluster = make_cluster()
    assert cluster.create_topic("trail", 1, 3)[0] == 200
    leader = cluster.leader("trail")
    followers = [n for n in cluster.nodes if n is not leader]
    publish(leader, "trail", [b"a", b"b"])
    for name in ("keep", "drop"):
        client = Client(leader)
        client.send(p.sub("trail", name))
        assert client.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        client.close()
    wait_until(lambda: all(channel_cursor(f, "trail", "drop") is not None
                           and channel_cursor(f, "trail", "keep") is not None
                           for f in followers), 10, "the followers have both channels")
    req = urllib.request.Request(f"{leader.http}/channel/delete?topic=trail&channel=drop",
                                 method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200
    wait_until(lambda: all(channel_cursor(f, "trail", "drop") is None for f in followers),
               10, "the followers delete the channel too")
    assert all(channel_cursor(f, "trail", "keep") is not None for f in followers)
    # made again on the leader: replicated again
    client = Client(leader)
    client.send(p.sub("trail", "drop"))
    assert client.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    client.close()
    wait_until(lambda: all(channel_cursor(f, "trail", "drop") is not None for f in followers),
               10, "the channel made again reaches the followers")


def test_a_deletion_a_follower_missed_reaches_it_from_the_next_leader(make_cluster):
    """The leader keeps the names it deleted in etcd (DeletedChannels): a follower
    down while a channel was deleted, back after the leader itself was lost, hears
    of the deletion from the new leader and deletes its copy."""
    cluster = make_cluster()
    assert cluster.create_topic("trail", 1, 3)[0] == 200
    leader = cluster.leader("trail")
    publish(leader, "trail", [b"a"])
    client = Client(leader)
    client.send(p.sub("trail", "drop"))
    assert client.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    client.close()
    missed, other = [n for n in cluster.nodes if n is not leader]
    wait_until(lambda: all(channel_cursor(f, "trail", "drop") is not None
                           for f in (missed, other)), 10, "the followers have the channel")
    missed.kill()
    publish(leader, "trail", [b"b"])  # (waits until the leader moved it out of the ISR)
    req = urllib.request.Request(f"{leader.http}/channel/delete?topic=trail&channel=drop",
                                 method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200
    wait_until(lambda: channel_cursor(other, "trail", "drop") is None, 10,
               "the live follower deletes it")
    leader.kill()
    new = cluster.leader("trail", not_in=(leader.id,), timeout=20)
    assert new is other
    missed.start()
    assert channel_cursor(missed, "trail", "drop") is not None  # its copy, from its disk
    wait_until(lambda: missed.id in isr(cluster, "trail"), 20, "it rejoins the ISR")
    wait_until(lambda: channel_cursor(missed, "trail", "drop") is None, 10,
               "it deletes the channel the old leader deleted")


def test_a_node_delivers_only_the_partitions_it_leads(make_cluster):
    """Three partitions on three nodes, leaders spread: a plain SUB on every node
    (what a lookupd-driven NSQ client does) gets each message once, from its
    partition's leader; a follower's copy is not delivered a second time."""
    cluster = make_cluster()
    assert cluster.create_topic("spread", 3, 3)[0] == 200
    leaders = {part: cluster.leader("spread", part) for part in range(3)}
    sent = []
    for part, node in leaders.items():
        bodies = [b"p%d-%02d" % (part, i) for i in range(20)]
        publish(node, "spread", bodies, partition=part)
        sent += bodies
    got = []
    clients = [Client(node) for node in cluster.nodes]
    try:
        for c in clients:
            c.send(p.sub("spread", "all"))
            assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
            c.send(p.rdy(100))
        for c, node in zip(clients, cluster.nodes, strict=True):
            led = sum(1 for n in leaders.values() if n is node)
            for _ in range(20 * led):
                m = c.message()
                got.append(m.body)
                c.send(p.fin(m.id))
            c.sock.settimeout(1.0)  # and nothing of the partitions it follows
            with pytest.raises(TimeoutError):
                c.message()
    finally:
        for c in clients:
            c.close()
    assert sorted(got) == sorted(sent)


def test_a_follower_down_and_back_catches_up(make_cluster):
    cluster = make_cluster()
    assert cluster.create_topic("audit", 1, 3)[0] == 200
    leader = cluster.leader("audit")
    follower, other = [n for n in cluster.nodes if n is not leader]
    publish(leader, "audit", [b"a%03d" % i for i in range(50)])

    follower.kill()
    # the first PUB waits for the dead follower until the leader moves it out of the ISR
    publish(leader, "audit", [b"b%03d" % i for i in range(50)])
    assert follower.id not in isr(cluster, "audit")

    follower.start()  # same data path and shared memory: its log ends at 50
    wait_until(lambda: follower.id in isr(cluster, "audit"), 20, "the follower rejoins the ISR")
    publish(leader, "audit", [b"c%03d" % i for i in range(50)])
    assert follower.end_offset("audit") == leader.end_offset("audit") == 150

    # only the caught-up follower left: it is elected and holds every acknowledged message
    leader.kill()
    other.kill()
    new = cluster.leader("audit", not_in=(leader.id, other.id), timeout=20)
    assert new is follower
    got = consume_all(new, "audit", 150)
    assert got == [b"%s%03d" % (k, i) for k in (b"a", b"b", b"c") for i in range(50)]


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_a_follower_away_past_the_leaders_retention_copies_its_log_from_its_start(
        make_cluster, workers):
    """A follower down while the leader's retention removed what follows its log's end
    cannot continue its log: the leader has it begin an empty one at the leader's start
    (RESET with that start), copies the rest, and takes it back into the ISR."""
    # 16 KiB segments; each replica keeps at most 48 KiB of the partition; the
    # follower's replica is not moved to the third node while it is away
    cluster = make_cluster(workers, args=["--max-bytes-per-file=16384"],
                           lookupd_args=["--lost-replica-urgent-wait=0"])
    assert cluster.create_topic("kept", 1, 2, extra="&retention_bytes=49152")[0] == 200
    leader = cluster.leader("kept")
    wait_until(lambda: len(isr(cluster, "kept")) == 2, 15, "both replicas in the ISR")
    follower = cluster.node(next(n for n in isr(cluster, "kept") if n != leader.id))
    publish(leader, "kept", [b"a%03d" % i for i in range(20)])
    assert follower.end_offset("kept") == 20

    follower.kill()
    publish(leader, "kept", [b"b%03d" % i + b"x" * 1000 for i in range(300)])  # ~19 segments
    wait_until(lambda: leader.partition_stats("kept")["start_offset"] > 20, 10,
               "the leader's retention removes what follows the follower's end")
    assert follower.id not in isr(cluster, "kept")

    follower.start()  # its log ends at 20, below the leader's start
    wait_until(lambda: follower.id in isr(cluster, "kept"), 20, "the follower rejoins the ISR")
    publish(leader, "kept", [b"c%03d" % i for i in range(20)])
    ours, theirs = leader.partition_stats("kept"), follower.partition_stats("kept")
    assert ours["end_offset"] == theirs["end_offset"] == 340
    assert theirs["start_offset"] >= ours["start_offset"] > 20
    # each message at the same msg offset and virtual offset on both replicas
    for offset in (theirs["start_offset"], theirs["start_offset"] + 1, 319, 339):
        path = f"/message/get?topic=kept&partition=0&search_mode=count&search_pos={offset + 1}"
        assert follower.get_json(path) == leader.get_json(path)
    assert follower.get_json(path)["body"] == "c019"

    # elected, it takes writes after what it copied
    leader.kill()
    assert cluster.leader("kept", not_in=(leader.id,), timeout=20) is follower
    publish(follower, "kept", [b"d000"])
    path = "/message/get?topic=kept&partition=0&search_mode=count&search_pos=341"
    assert follower.get_json(path)["body"] == "d000"


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_a_consumer_gets_only_what_every_isr_member_has(make_cluster, workers):
    """The leader delivers up to the end every ISR member has acknowledged (Kafka's
    high watermark), not its log's end: a record only the leader holds may be
    replaced by another at its offset after a failover.  With both followers cut
    off, a PUB waits and its message is not delivered; once the leader has moved
    them out of the ISR (LAG_TIMEOUT), the PUB is acknowledged and delivered."""
    cluster = make_cluster(workers)
    assert cluster.create_topic("hw", 1, 3)[0] == 200
    leader = cluster.leader("hw")
    publish(leader, "hw", [b"before"])
    consumer = Client(leader)
    consumer.send(p.sub("hw", "c") + p.rdy(10))
    assert consumer.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    m = consumer.message()
    assert m.body == b"before"
    consumer.send(p.fin(m.id))

    followers = [n for n in cluster.nodes if n is not leader]
    for f in followers:
        cluster.hosts.cut(f.i)
    answers = []
    publisher = Client(leader, timeout=30)
    pub = threading.Thread(target=lambda: answers.append(publisher.pub("hw", b"alone")))
    pub.start()
    wait_until(lambda: leader.end_offset("hw") == 2, 5, "the record in the leader's log")
    consumer.sock.settimeout(1.0)  # in the log, not acknowledged: not delivered
    with pytest.raises(TimeoutError):
        consumer.message()
    assert not answers
    pub.join(20)  # the ISR shrinks to the leader: acknowledged, then delivered
    assert answers == [(0, b"OK")]
    assert isr(cluster, "hw") == {leader.id}
    consumer.sock.settimeout(10)
    assert consumer.message().body == b"alone"
    consumer.close()
    publisher.close()
    for f in followers:
        cluster.hosts.restore(f.i)


# PUBs from inside the cut-off leader's own namespace: connected before the cut, sent
# at once after it (a line on stdin), so they reach the leader before it takes its lease
# as lost; on several connections (argv[3]), so that with several workers some land on the one
# that owns the partition (a PUB forwarded to it from another worker after the cut may
# be refused before it is appended); each answer (or error) on a line
PUB_INSIDE = """
import socket, struct, sys
conns = []
for _ in range(int(sys.argv[3])):
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=15)
    s.sendall(b"  V2")
    conns.append(s)
print("ready", flush=True)
sys.stdin.readline()
for s in conns:
    s.sendall(b"PUB orders 0\\n" + struct.pack(">I", 4) + b"late")
for s in conns:
    head = s.recv(8)
    size, kind = struct.unpack(">ii", head)
    print(kind, s.recv(size - 4).decode(), flush=True)
"""


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_a_cut_off_leader_acknowledges_nothing_then_rejoins_with_the_new_log(make_cluster,
                                                                            workers):
    # (its w2 run failed 1 of 3 when the PUB was made after the cut: a process started
    # in the namespace then could reach the leader after it had taken its lease as
    # lost, so "late" was refused before it was appended, and nothing diverged)
    # 4 KiB segments: the 100 messages below the divergence fill several
    cluster = make_cluster(workers, args=["--max-bytes-per-file=4096"])
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    leader = cluster.leader("orders")
    bodies = [b"m%03d" % i + b"." * 100 for i in range(100)]
    publish(leader, "orders", bodies)
    first_segment = os.path.join(leader.data_path, "orders-0.nsqlog", segment_name(0))
    inode = os.stat(first_segment).st_ino

    inside = cluster.hosts.run(leader.i, [sys.executable, "-c", PUB_INSIDE,
                                          *map(str, leader.tcp), "16"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert inside.stdout.readline() == "ready\n"
    cluster.hosts.cut(leader.i)  # no followers, no etcd; its clients on the host remain
    answers = inside.communicate("go\n", timeout=30)[0].splitlines()
    assert len(answers) == 16
    assert all(a.startswith("1 E_FAILED_ON_NOT_LEADER") for a in answers), answers

    new = cluster.leader("orders", not_in=(leader.id,), timeout=20)
    got = consume_all(new, "orders", 100)
    assert got == bodies
    assert new.end_offset("orders") == 100  # "late" was acknowledged by nobody

    # back on the network, the old leader's log holds "late" at offset 100, where the
    # new leader has "other": same length, another record.  Once out of the ISR it
    # removes what it holds from offset 100 on (the leader's search finds where the
    # logs part), copies the leader's from there and rejoins
    publish(new, "orders", [b"other"])
    wait_until(lambda: leader.id not in isr(cluster, "orders"), 10, "the old leader out")
    cluster.hosts.restore(leader.i)
    # (it registers again in etcd first: its lease ran out while cut off)
    wait_until(lambda: any("diverges at offset 100:" in line for line in new.server.lines),
               30, "the new leader sees the divergence")
    wait_until(lambda: leader.id in isr(cluster, "orders"), 30, "the old leader rejoins")
    assert any("log cut at offset 100 (it held" in line for line in leader.server.lines), \
        [line for line in leader.server.lines if "orders" in line][-15:]
    assert os.stat(first_segment).st_ino == inode  # kept where it was, not copied
    # an ISR member holds the channels' cursors (it joined only once it had taken them)
    channels = leader.get_json("/stats?format=json&topic=orders")["topics"][0]["channels"]
    assert [(c["channel_name"], [p["confirmed_offset"] for p in c["partitions"]])
            for c in channels] == [("audit", [100])]
    publish(new, "orders", [b"more"])
    assert {leader.end_offset("orders") for _ in range(20)} == {102}
    # the old leader alone left: it is elected, with the others' records, not its own
    new.kill()
    next(n for n in cluster.nodes if n not in (leader, new)).kill()
    assert cluster.leader("orders", not_in=(new.id,), timeout=20) is leader
    log = [leader.get_json(f"/message/get?topic=orders&partition=0&search_mode=count"
                           f"&search_pos={i + 1}")["body"] for i in range(102)]
    assert log == [b.decode() for b in (*bodies, b"other", b"more")]
    # the channel goes on where the new leader's consumer left it (its cursor came
    # with the others' records): only what was published after
    assert consume_all(leader, "orders", 2) == [b"other", b"more"]


def publish_following(cluster, topic, bodies, timeout=30):
    """PUB each body, following the leader through /lookup after an error (as a
    Youzan client does); -> the bodies acknowledged (each once: retried until OK)."""
    end = time.monotonic() + timeout
    pending = list(bodies)
    client = None
    while pending and time.monotonic() < end:
        try:
            if client is None:
                client = Client(cluster.leader(topic), timeout=5)
            if client.pub(topic, pending[0]) == (0, b"OK"):
                pending.pop(0)
                continue
        except (OSError, ConnectionError):
            pass
        if client is not None:
            client.close()
        client = None
        time.sleep(0.1)
    if client is not None:
        client.close()
    assert not pending, f"{len(pending)} not acknowledged in {timeout}s"


def test_etcd_restarted_under_the_cluster(make_cluster):
    cluster = make_cluster()
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    first = [b"a%03d" % i for i in range(100)]
    publish(cluster.leader("orders"), "orders", first)
    cluster.etcd.restart(down_for=3.0)  # longer than the 2 s TTL: every lease is lost
    second = [b"b%03d" % i for i in range(100)]
    publish_following(cluster, "orders", second)
    leader = cluster.leader("orders")
    total = leader.end_offset("orders")
    got = consume_all(leader, "orders", total)
    # each acknowledged once at least, in publish order (a PUB answered with an error
    # may have been written too: retried, it is there twice)
    assert list(dict.fromkeys(b for b in got if b in set(first + second))) == first + second
    wait_until(lambda: len(isr(cluster, "orders")) == 3, 20, "every node back in the ISR")


def test_a_pub_without_partition_goes_to_one_the_node_leads(make_cluster):
    """What a client that knows no partitions (pynsq, gnsq) sends, on two workers:
    whichever worker takes it, it lands in a partition this node leads."""
    cluster = make_cluster(workers=2)
    assert cluster.create_topic("plain", 3, 2)[0] == 200
    leaders = [cluster.leader("plain", partition) for partition in range(3)]
    assert len({n.id for n in leaders}) == 3  # one partition led by each node

    def pub_new_connection(node, body):
        client = Client(node)  # a new connection: any worker of the node
        try:
            client.send(p.pub("plain", body))
            return client.response()
        finally:
            client.close()

    acked = {}
    for node in cluster.nodes:
        # until each worker has read the roles (each follows them on its own watch): a
        # refusal meanwhile writes nothing
        acked[node.id], streak, end = 0, 0, time.monotonic() + 10
        while streak < 10 and time.monotonic() < end:
            ok = pub_new_connection(node, b"warm-up") == (0, b"OK")
            streak = streak + 1 if ok else 0
            acked[node.id] += ok
        for i in range(20):
            assert pub_new_connection(node, b"%d" % i) == (0, b"OK")
        acked[node.id] += 20
    for partition, leader in enumerate(leaders):
        assert leader.end_offset("plain", partition) == acked[leader.id]

    # syncdisk (TopicMeta's SyncEvery) and retention (Youzan's, in days: RetentionDay)
    # reach every replica's log topic
    create = "/topic/create?topic=synced&partition_num=1&replicator=2"
    assert cluster.lookupd.post(create + "&syncdisk=x") == \
        (400, b'{"message":"INVALID_ARG_TOPIC_SYNC_DISK"}')
    assert cluster.lookupd.post(create + "&retention=x") == \
        (400, b'{"message":"strconv.Atoi: parsing \\"x\\": invalid syntax"}')
    for days in ("-1", "36501"):
        assert cluster.lookupd.post(create + "&retention=" + days) == \
            (400, b'{"message":"INVALID_ARG_TOPIC_RETENTION"}'), days
    # numbers as Go's strconv reads them (Youzan's doCreateTopic): no "_", no spaces,
    # no digits but ASCII ones
    for query, answer in [
            ("partition_num=%C2%B2&replicator=2", b"INVALID_ARG_TOPIC_PARTITION_NUM"),
            ("partition_num=1_0&replicator=2", b"INVALID_ARG_TOPIC_PARTITION_NUM"),
            ("partition_num=1&replicator=%C2%B2", b"INVALID_ARG_TOPIC_REPLICATOR"),
            ("partition_num=1&replicator=2&syncdisk=%C2%B2", b"INVALID_ARG_TOPIC_SYNC_DISK"),
            ("partition_num=1&replicator=2&syncdisk=-1", b"INVALID_ARG_TOPIC_SYNC_DISK"),
            ("partition_num=1&replicator=2&retention=1_0",
             b'strconv.Atoi: parsing \\"1_0\\": invalid syntax')]:
        assert cluster.lookupd.post("/topic/create?topic=synced&" + query) == \
            (400, b'{"message":"' + answer + b'"}'), query
    for size in ("x", "0", "-2", "1.5", str(1 << 63), "1_000"):  # nsqshm's retention_bytes
        assert cluster.lookupd.post(create + "&retention_bytes=" + size) == \
            (400, b'{"message":"INVALID_RETENTION"}'), size
    assert cluster.create_topic("synced", 1, 2, extra="&syncdisk=7&retention=3")[0] == 200
    end = time.monotonic() + 10
    while True:
        specs = [spec["synced"] for spec in (node.log_topic_specs() for node in cluster.nodes)
                 if "synced" in spec]
        if len(specs) == 2 or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert [spec["sync_every"] for spec in specs] == [7, 7]
    assert [spec["retention_days"] for spec in specs] == [3, 3]
    assert [spec["retention_bytes"] for spec in specs] == [-1, -1]  # none given
    # (none given: none, as a standalone log topic made without retention_days)
    assert cluster.leader("plain").log_topic_specs()["plain"]["retention_days"] == -1


@pytest.mark.soak
def test_a_leader_stopped_gracefully_hands_off_before_its_lease_runs_out(make_cluster):
    """SIGTERM: the worker resigns its leaderships and revokes its lease before closing
    its clients, so a follower is elected at once, not a TTL (here 10 s) later."""
    cluster = make_cluster(ttl="10s")
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    leader = cluster.leader("orders")
    bodies = [b"m%03d" % i for i in range(50)]
    publish(leader, "orders", bodies)
    stopped_at = time.monotonic()
    assert leader.server.stop() == 0
    new = cluster.leader("orders", not_in=(leader.id,), timeout=20)
    assert time.monotonic() - stopped_at < 5  # the TTL is 10 s
    publish(new, "orders", [b"after"])
    assert consume_all(new, "orders", 51) == [*bodies, b"after"]


def test_an_ordered_topic_made_through_the_lookupd_is_ordered_on_every_node(make_cluster):
    """POST /topic/create?...&orderedmulti=true on the lookupd: TopicMeta's
    OrderedMulti in etcd, so every node makes the topic ordered (a plain SUB gets
    E_SUB_ORDER_IS_MUST, a PUB without a partition E_BAD_PARTITION), and its
    SUB_ORDERED consumer gets the partition in order, after a failover too."""
    cluster = make_cluster()
    assert cluster.create_topic("seq", 1, 3, extra="&orderedmulti=true")[0] == 200
    leader = cluster.leader("seq")
    wait_until(lambda: all(n.log_topic_specs().get("seq", {}).get("ordered") for n in cluster.nodes),
               10, "the topic ordered on every node")
    c = Client(leader)
    c.send(p.sub("seq", "ch"))
    assert c.response() == (p.FRAME_TYPE_ERROR,
                            b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub")
    c.close()
    c = Client(leader)
    c.send(p.pub("seq", b"x"))
    assert c.response() == (p.FRAME_TYPE_ERROR,
                            b"E_BAD_PARTITION topic partition is not valid for multi partition: -1")
    c.close()
    bodies = [b"s%03d" % i for i in range(30)]
    publish(leader, "seq", bodies)
    c = Client(leader)
    c.send(b"SUB_ORDERED seq ch 0\n")
    assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    c.send(p.rdy(10))
    for want in bodies[:10]:
        m = decode_message(c.message_frame(), detail=True)
        assert m.body == want
        c.send(p.fin(m.id))
    time.sleep(0.3)  # (the cursor reaches the followers within 50 ms)
    leader.kill()
    c.close()
    new = cluster.leader("seq", not_in=(leader.id,), timeout=20)
    c = Client(new)
    c.send(b"SUB_ORDERED seq ch 0\n")
    assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    c.send(p.rdy(10))
    for want in bodies[10:]:
        m = decode_message(c.message_frame(), detail=True)
        assert m.body == want
        c.send(p.fin(m.id))
    c.close()


def test_an_ext_topic_made_through_the_lookupd_carries_headers_on_every_node(make_cluster):
    """POST /topic/create?...&ext=true on the lookupd: TopicMeta's Ext in etcd, so
    every node makes the log topic ext: PUB_EXT's headers are replicated with the
    body, and after a failover the new leader delivers them to an extend_support
    consumer."""
    cluster = make_cluster()
    assert cluster.create_topic("hx", 1, 3, extra="&ext=true")[0] == 200
    leader = cluster.leader("hx")
    wait_until(lambda: all([t.get("is_ext") for t in
                            n.get_json("/stats?format=json&topic=hx")["topics"] or ()
                            if t["topic_name"] == "hx"] == [True] for n in cluster.nodes),
               10, "the topic ext on every node")
    c = Client(leader)
    c.send(youzan.pub_ext("hx", 0, b'{"k":"v"}', b"with headers"))
    assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    c.close()
    follower = next(n for n in cluster.nodes if n is not leader)
    wait_until(lambda: follower.end_offset("hx") == 1, 10, "the record on a follower")
    leader.kill()
    new = cluster.leader("hx", not_in=(leader.id,), timeout=20)
    c = Client(new)
    c.send(youzan.identify(extend_support=True))
    assert c.response()[0] == p.FRAME_TYPE_RESPONSE
    c.send(p.sub("hx", "ch") + p.rdy(1))
    assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    m = decode_message(c.message_frame(), ext=True)
    assert (m.headers, m.body) == (b'{"k":"v"}', b"with headers")
    c.close()


def test_followers_under_steady_load_stay_in_the_isr(make_cluster):
    """Four publishers flat out for 3 lag timeouts: a follower is nearly always a
    frame behind the leader's end, yet it keeps catching up; it stays in the ISR
    (before, "behind at each check" for 2 s dropped healthy followers, and PUBs
    were then acknowledged without them)."""
    cluster = make_cluster()
    assert cluster.create_topic("steady", 1, 3)[0] == 200
    leader = cluster.leader("steady")
    publish(leader, "steady", [b"first"])
    stop = time.monotonic() + 6.0
    oks = []

    def publisher():
        c = Client(leader)
        n = 0
        while time.monotonic() < stop:
            c.send(p.mpub("steady", [b"x" * 200] * 20))
            assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
            n += 20
        oks.append(n)
        c.close()

    threads = [threading.Thread(target=publisher) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(oks) == 4 and sum(oks) > 10_000, oks
    assert isr(cluster, "steady") == {n.id for n in cluster.nodes}
    dropped = [line for line in leader.server.lines if "out of the ISR" in line]
    assert not dropped, dropped


def _has_log(node, topic):
    return any(name.startswith(f"{topic}-") for name in os.listdir(node.data_path))


def test_a_topic_deleted_through_the_lookupd_goes_from_every_node(make_cluster):
    """Youzan's `/topic/delete?topic=&partition=**` on an nsqlookupd: the topic's keys
    leave etcd and every node deletes its log (on 2 workers: whichever owns which
    partition); one node's own /topic/delete is refused meanwhile (the topic would come
    back from the other replicas).  A node down during the delete keeps its log (a
    topic missing at a start may be etcd's data lost, not a delete: nothing is removed
    unseen); it takes no writes, and its own /topic/delete removes it."""
    cluster = make_cluster(workers=2)
    assert cluster.create_topic("gone", 2, 3)[0] == 200
    for partition in (0, 1):
        publish(cluster.leader("gone", partition), "gone", [b"m%d" % partition],
                partition=partition)
    assert cluster.nodes[0].server.post("/topic/delete?topic=gone") == \
        (400, b'{"message":"TOPIC_IS_REPLICATED: delete it through nsqlookupd, '
              b'with partition=**"}')
    down = cluster.nodes[2]
    down.kill()
    lookupd = cluster.lookupd
    assert lookupd.post("/topic/delete?topic=gone") == \
        (400, b'{"message":"MISSING_ARG_TOPIC_PARTITION"}')
    assert lookupd.post("/topic/delete?topic=gone&partition=0") == \
        (400, b'{"message":"REMOVE_SINGLE_PARTITION_NOT_ALLOWED"}')
    assert lookupd.post("/topic/delete?topic=gone&partition=**")[0] == 200
    live = cluster.nodes[:2]
    wait_until(lambda: not any(n.end_offset("gone") is not None or _has_log(n, "gone")
                               or "gone" in n.log_topic_specs() for n in live),
               10, "the topic and its logs gone from every live node")
    # no longer in etcd: deleted as a standalone nsqlookupd deletes (registrations), as a
    # classic topic is (nsqadmin's delete sends partition=**)
    assert lookupd.post("/topic/delete?topic=gone&partition=**") == (200, b"")
    assert lookupd.post("/topic/delete?topic=gone") == (200, b"")

    down.start()  # it did not see the delete: its log is kept, and takes no writes
    assert down.end_offset("gone") == 1 and _has_log(down, "gone")
    c = Client(down)
    kind, data = c.pub("gone", b"late")
    assert kind == p.FRAME_TYPE_ERROR and data.startswith(b"E_FAILED_ON_NOT_LEADER"), data
    c.close()
    assert down.server.post("/topic/delete?topic=gone") == (200, b"")
    assert down.end_offset("gone") is None and not _has_log(down, "gone")

    # the name is free again: a new topic starts with an empty log
    assert cluster.create_topic("gone", 1, 3)[0] == 200
    leader = cluster.leader("gone")
    publish(leader, "gone", [b"new"])
    assert leader.end_offset("gone") == 1
