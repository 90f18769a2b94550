"""A Jepsen-style audit of replicated log topics (issue 17): publishers and consumers
follow the leader through /lookup while a nemesis SIGKILLs the leader or takes its link
down, then brings it back, or restarts etcd, over and over.  At the end every acknowledged message must
have been delivered on both channels, a plain one (SUB) and an ordered one
(SUB_ORDERED), and be readable from the leader.  The plain consumer REQs about one
message in REQ_EVERY once, with a delay, and counts it delivered only when it comes back
(through failovers: the cursors' retry tables, docs/consistence.md).  The ordered channel must deliver in
log order: a message's first delivery is the one after the last new one (redelivery
goes back, never ahead), and an offset delivered twice holds the same message both
times (the leader delivers only what every ISR member has: nothing that a new leader
could hold another message in place of).  Nothing acknowledged by a fenced leader
alone: such a message would be missing from the new leader's log, so lost.  Reports
acknowledged, lost (must be 0), duplicates (what a client retried after an error whose
write had landed), redeliveries and failover times.

A short audit runs by default (w1 and w2); the soak one as long as asked:

    NSQSHM_AUDIT_SECONDS=300 pytest -m soak tests/consistence/test_audit.py -s
"""

import os
import random
import statistics
import threading
import time
import zlib

import pytest

from nsqshm import protocol as p
from nsqshm._core.logcursor import decode_message_id
from nsqshm.youzan.frames import decode_message
from tests.consistence.cluster import Client, Cluster
from tests.consistence.etcd_server import ETCD
from tests.consistence.netns import available
from tests.consistence.test_replication import channel_cursor, isr, wait_until

pytestmark = [
    pytest.mark.skipif(bool(available()), reason=available() or "available"),
    pytest.mark.skipif(ETCD is None, reason="etcd not installed (scripts/setup.sh)"),
]

SOAK_SECONDS = float(os.environ.get("NSQSHM_AUDIT_SECONDS", "120"))
SHORT_SECONDS = 8.0
TOPIC = "jepsen"
REQ_EVERY = 25         # the plain consumer REQs about one message in this many, once
REQ_DELAY_MS = 300


class Publisher(threading.Thread):
    """PUBs unique bodies to whichever node /lookup names leader; notes each OK."""

    def __init__(self, cluster, name, stop):
        super().__init__(daemon=True)
        self.cluster, self.name, self.stop = cluster, name, stop
        self.acked = []  # (body, monotonic time of the OK, node id)
        self.errors = 0

    def run(self):
        seq = 0
        client = node = None
        while not self.stop.is_set():
            try:
                if client is None:
                    node = self.cluster.leader(TOPIC, timeout=30)
                    client = Client(node, timeout=3)
                body = b"%s-%d" % (self.name.encode(), seq)
                seq += 1
                kind, data = client.pub(TOPIC, body)
                if (kind, data) == (0, b"OK"):
                    self.acked.append((body, time.monotonic(), node.id))
                    continue
                self.errors += 1
            except (OSError, ConnectionError, AssertionError):
                self.errors += 1
            if client is not None:
                client.close()
            client = None
            time.sleep(0.05)


class Consumer(threading.Thread):
    """Consumes a channel from whichever node /lookup names leader, FINs every
    message, reconnects on any error or 2 s of silence.  Plain: SUB, RDY 50.
    Ordered: SUB_ORDERED on partition 0, checking the order as it goes."""

    def __init__(self, cluster, channel, ordered, stop):
        super().__init__(daemon=True)
        self.cluster, self.channel, self.ordered, self.stop = cluster, channel, ordered, stop
        self.bodies = set()       # every body delivered
        self.deliveries = 0
        self.next = 0             # ordered: the offset of the next new message
        self.at = {}              # ordered: offset -> body first delivered there
        self.redelivered = 0      # ordered: deliveries of an offset below next
        self.violations = []      # ordered: (offset, expected) delivered ahead of order
        self.mismatches = []      # ordered: (offset, first body, body) another message
        self.reconnects = 0
        self.error_frames = []    # the broker's error frames, as sent
        self.requeued = set()     # plain: bodies REQ'd once (a delay of REQ_DELAY_MS)
        self.back = 0             # plain: of those, how many came back
        self.back_fresh = 0       # plain: came back with attempts 1 (put back not known)

    def run(self):
        while not self.stop.is_set():
            client = None
            try:
                node = self.cluster.leader(TOPIC, timeout=30)
                client = Client(node, timeout=2)
                if self.ordered:
                    client.send(b"SUB_ORDERED %s %s 0\n" % (TOPIC.encode(), self.channel.encode()))
                else:
                    client.send(p.sub(TOPIC, self.channel))
                if client.response() != (p.FRAME_TYPE_RESPONSE, b"OK"):
                    raise ConnectionError("SUB refused")
                client.send(p.rdy(1 if self.ordered else 50))
                while not self.stop.is_set():
                    self._take(client)
            except (OSError, ConnectionError, AssertionError, ValueError):
                self.reconnects += 1
                time.sleep(0.05)
            finally:
                if client is not None:
                    client.close()

    def _take(self, client):
        while True:  # (Client.message_frame, noting error frames: a FIN refused, ...)
            kind, data = client.frame()
            if kind == p.FRAME_TYPE_MESSAGE:
                break
            if kind == p.FRAME_TYPE_ERROR:
                self.error_frames.append(bytes(data[:100]))
            elif data == p.HEARTBEAT:
                client.send(p.nop())
        if self.ordered:
            m = decode_message(data, detail=True)
            self._check_order(decode_message_id(m.id)[1], m.body)
        else:
            m = p.decode_message(data)
        self.deliveries += 1
        if not self.ordered and m.body in self.requeued:
            self.back += 1
            self.back_fresh += m.attempts == 1
        elif not self.ordered and zlib.crc32(m.body) % REQ_EVERY == 0:
            # put back once, with a delay: it counts as delivered only when it comes
            # back (through failovers: the cursors' retry tables)
            self.requeued.add(m.body)
            client.send(p.req(m.id, REQ_DELAY_MS))
            return
        self.bodies.add(m.body)
        client.send(p.fin(m.id))

    def _check_order(self, offset, body):
        if offset == self.next:
            self.at[offset] = body
            self.next += 1
        elif offset < self.next:
            self.redelivered += 1
            if self.at.get(offset, body) != body:
                self.mismatches.append((offset, self.at[offset], body))
        else:
            self.violations.append((offset, self.next))


def wait_progressing(done, progress, stall, what):
    """Wait until done(); AssertionError once progress() has not changed for `stall` s."""
    last, since = progress(), time.monotonic()
    while not done():
        now = progress()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > stall:
            raise AssertionError(f"no progress for {stall:.0f}s: {what}")
        time.sleep(0.1)


def ordered_state(cluster):
    """{node: the ordered channel's /stats (depth, in flight, its partition's cursor)}."""
    state = {}
    for node in cluster.nodes:
        try:
            for t in node.get_json(f"/stats?format=json&topic={TOPIC}")["topics"] or ():
                for c in t["channels"]:
                    if c["channel_name"] == "ordered":
                        state[node.id] = {k: c.get(k) for k in (
                            "depth", "in_flight_count", "deferred_count", "requeue_count",
                            "timeout_count", "client_count", "partitions")}
        except Exception as err:  # (a node down: say so, and go on with the others)
            state[node.id] = repr(err)
    return state


def audit(tmp_path, seconds, seed, workers=1, kinds=("kill", "cut")):
    """kinds: the nemesis' faults, by turns from one drawn: "kill" (SIGKILL of the
    leader's node, started again after), "cut" (its link down, then up), "etcd"
    (etcd killed, started again 1-4 s later: every lease past its 2 s TTL is lost,
    every partition elects again, with the publishers and consumers at work)."""
    rng = random.Random(seed)
    cluster = Cluster(tmp_path, workers=workers)
    stop = threading.Event()
    consumers = []
    try:
        assert cluster.create_topic(TOPIC, 1, 3)[0] == 200
        consumers = [Consumer(cluster, "ordered", True, stop),
                     Consumer(cluster, "plain", False, stop)]
        for c in consumers:
            c.start()
        # both channels on every node before the first message: a channel a new leader
        # lacks would start at its log's end there (nsqd's new channels)
        wait_until(lambda: all(channel_cursor(n, TOPIC, c.channel) is not None
                               for n in cluster.nodes for c in consumers),
                   30, "both channels on every node")
        publishing = threading.Event()  # set: the publishers stop
        publishers = [Publisher(cluster, f"p{i}", publishing) for i in range(2)]
        for pub in publishers:
            pub.start()
        faults = []  # (kind, victim id, monotonic time)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(rng.uniform(1, 3))
            # the nemesis waits for a full ISR: with a member still catching up, a
            # second fault could leave no candidate (the guarantee is R-1 failures)
            wait_until(lambda: len(isr(cluster, TOPIC)) == 3, 60, "a full ISR")
            leader = cluster.leader(TOPIC, timeout=30)
            # the kinds by turns, the first drawn
            turn = kinds.index(faults[-1][0]) + 1 if faults else rng.randrange(len(kinds))
            kind = kinds[turn % len(kinds)]
            if kind == "etcd":  # (no victim: any node may lead after)
                faults.append((kind, "", time.monotonic()))
                cluster.etcd.restart(down_for=rng.uniform(1, 4))
                cluster.leader(TOPIC, timeout=30)
                time.sleep(rng.uniform(1, 2))
                continue
            faults.append((kind, leader.id, time.monotonic()))
            if kind == "kill":
                leader.kill()
            else:
                cluster.hosts.cut(leader.i)
            cluster.leader(TOPIC, not_in=(leader.id,), timeout=30)
            time.sleep(rng.uniform(1, 4))
            if kind == "kill":
                leader.start()
            else:
                cluster.hosts.restore(leader.i)
        publishing.set()
        for pub in publishers:
            pub.join(30)
        wait_until(lambda: len(isr(cluster, TOPIC)) == 3, 60, "a full ISR at the end")
        leader = cluster.leader(TOPIC)
        total = leader.end_offset(TOPIC)
        acked = [a for pub in publishers for a in pub.acked]
        wanted = {body for body, _, _ in acked}
        ordered, plain = consumers
        # a loaded machine drains slowly: it fails only when nothing moves for longer than
        # nsqd's 60 s message timeout (a CI run once saw the ordered channel stall after a
        # failover, cause not found: a message held in flight comes again at its timeout)
        try:
            wait_progressing(lambda: ordered.next >= total and wanted <= plain.bodies,
                             lambda: (ordered.deliveries, plain.deliveries), 75,
                             "both channels delivered everything acknowledged")
        except AssertionError as err:
            raise AssertionError(
                f"{err}: ordered at {ordered.next} of {total}, plain lacks "
                f"{len(wanted - plain.bodies)}; leader {leader.id}, ISR "
                f"{sorted(isr(cluster, TOPIC))}, reconnects {ordered.reconnects} / "
                f"{plain.reconnects}, error frames {ordered.error_frames[-5:]} / "
                f"{plain.error_frames[-5:]}; the ordered channel on each node: "
                f"{ordered_state(cluster)}") from None
        stop.set()
        for c in consumers:
            c.join(10)
        lost = {name: sorted(wanted - c.bodies) for name, c in (("ordered", ordered),
                                                                ("plain", plain))}
        duplicates = total - len({body for body in ordered.at.values()})
        failovers = []
        for kind, victim, at in faults:  # fault to the first OK from another node
            if kind == "etcd":
                continue  # (not a failover: writes may go on where they were)
            oks = [t for _, t, node in acked if t > at and node != victim]
            if oks:
                failovers.append(min(oks) - at)
        print(f"\naudit: {seconds:.0f}s, w{workers}, {len(faults)} faults "
              f"({sum(k == 'kill' for k, _, _ in faults)} kills, "
              f"{sum(k == 'cut' for k, _, _ in faults)} cuts, "
              f"{sum(k == 'etcd' for k, _, _ in faults)} etcd restarts), "
              f"acknowledged {len(acked)}, "
              f"lost {len(lost['ordered']) + len(lost['plain'])}, in the log {total}, "
              f"duplicates in the log {duplicates}, "
              f"publish errors {sum(pub.errors for pub in publishers)}")
        print(f"audit: ordered: {ordered.deliveries} deliveries, {ordered.redelivered} "
              f"redelivered, {len(ordered.violations)} out of order, "
              f"{len(ordered.mismatches)} offsets with two messages; plain: "
              f"{plain.deliveries} deliveries of {len(plain.bodies)} messages, "
              f"{len(plain.requeued)} REQ'd once ({REQ_DELAY_MS} ms), {plain.back} came back "
              f"({plain.back_fresh} with attempts 1); reconnects "
              f"{ordered.reconnects + plain.reconnects}; error frames "
              f"{len(ordered.error_frames) + len(plain.error_frames)} "
              f"{(ordered.error_frames + plain.error_frames)[:3]}")
        if failovers:
            print(f"audit: failover (fault to the first OK from the new leader) p50 "
                  f"{statistics.median(failovers):.2f}s max {max(failovers):.2f}s")
        assert not lost["ordered"] and not lost["plain"], \
            {k: v[:10] for k, v in lost.items()}
        assert not ordered.violations, ordered.violations[:10]
        assert not ordered.mismatches, ordered.mismatches[:10]
        assert ordered.next == total  # every offset of the log, each once in order
        assert len(acked) > 0 and faults and plain.requeued
    except BaseException:
        for node in cluster.nodes:  # what the nodes said went wrong
            if node.server is not None:
                said = [line for line in node.server.lines
                        if "panic" in line or "Traceback" in line or "ERROR" in line]
                print(f"node {node.id}:", "".join(said[-20:]))
        raise
    finally:
        stop.set()
        for c in consumers:
            c.join(10)
        cluster.close()


@pytest.mark.timeout(SHORT_SECONDS + 300)
@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_audit_short(tmp_path, workers):
    audit(tmp_path, SHORT_SECONDS, seed=17 + workers, workers=workers)


@pytest.mark.timeout(SHORT_SECONDS + 300)
@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_audit_short_etcd_restarted_under_load(tmp_path, workers):
    """etcd killed and started again while publishers and consumers work: every
    lease is lost, every partition elects again; nothing acknowledged is lost."""
    audit(tmp_path, SHORT_SECONDS, seed=29 + workers, workers=workers, kinds=("etcd",))


@pytest.mark.soak
@pytest.mark.timeout(SOAK_SECONDS + 600)
def test_audit_every_acknowledged_message_survives_leader_kills_and_cuts(tmp_path):
    """Kills, cuts and etcd restarts by turns (NSQSHM_AUDIT_FAULTS: a comma list of
    kill, cut, etcd)."""
    kinds = tuple(os.environ.get("NSQSHM_AUDIT_FAULTS", "kill,cut,etcd").split(","))
    assert set(kinds) <= {"kill", "cut", "etcd"}, kinds
    audit(tmp_path, SOAK_SECONDS, seed=int(os.environ.get("NSQSHM_AUDIT_SEED", "17")),
          workers=int(os.environ.get("NSQSHM_AUDIT_WORKERS", "1")), kinds=kinds)
