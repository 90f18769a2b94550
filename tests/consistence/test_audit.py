"""A Jepsen-style audit of replicated log topics (issue 17), a soak test: publishers
follow the leader through /lookup while a nemesis SIGKILLs the leader or takes its link
down, then brings it back, over and over.  At the end every acknowledged message must
be readable from the leader.  Reports acknowledged, lost (must be 0), duplicates (what
a client retried after an error whose write had landed) and failover times.

    NSQSHM_AUDIT_SECONDS=120 pytest -m soak tests/consistence/test_audit.py -s
"""

import os
import random
import statistics
import threading
import time

import pytest

from tests.consistence.cluster import Client, Cluster
from tests.consistence.etcd_server import ETCD
from tests.consistence.netns import available
from tests.consistence.test_replication import isr, wait_until

pytestmark = [
    pytest.mark.soak,
    pytest.mark.skipif(bool(available()), reason=available() or "available"),
    pytest.mark.skipif(ETCD is None, reason="etcd not installed (scripts/setup.sh)"),
]

SECONDS = float(os.environ.get("NSQSHM_AUDIT_SECONDS", "120"))
TOPIC = "jepsen"


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


def test_audit_every_acknowledged_message_survives_leader_kills_and_cuts(tmp_path):
    rng = random.Random(int(os.environ.get("NSQSHM_AUDIT_SEED", "17")))
    cluster = Cluster(tmp_path)
    try:
        assert cluster.create_topic(TOPIC, 1, 3)[0] == 200
        stop = threading.Event()
        publishers = [Publisher(cluster, f"p{i}", stop) for i in range(2)]
        for p in publishers:
            p.start()
        faults = []  # (kind, victim id, monotonic time)
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            time.sleep(3)
            # the nemesis waits for a full ISR: with a member still catching up, a
            # second fault could leave no candidate (the guarantee is R-1 failures)
            wait_until(lambda: len(isr(cluster, TOPIC)) == 3, 60, "a full ISR")
            leader = cluster.leader(TOPIC, timeout=30)
            kind = rng.choice(["kill", "cut"])
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
        stop.set()
        for p in publishers:
            p.join(30)
        wait_until(lambda: len(isr(cluster, TOPIC)) == 3, 60, "a full ISR at the end")
        leader = cluster.leader(TOPIC)
        total = leader.end_offset(TOPIC)
        client = Client(leader, timeout=30)
        received = client.consume(TOPIC, "audit", total)
        client.close()

        acked = [a for p in publishers for a in p.acked]
        got = set(received)
        lost = [body for body, _, _ in acked if body not in got]
        duplicates = len(received) - len(got)
        failovers = []
        for _, victim, at in faults:  # fault to the first OK from another node
            oks = [t for _, t, node in acked if t > at and node != victim]
            if oks:
                failovers.append(min(oks) - at)
        print(f"\naudit: {SECONDS:.0f}s, {len(faults)} faults "
              f"({sum(k == 'kill' for k, _, _ in faults)} kills, "
              f"{sum(k == 'cut' for k, _, _ in faults)} cuts), acknowledged {len(acked)}, "
              f"lost {len(lost)}, duplicates {duplicates}, in the log {total}, "
              f"publish errors {sum(p.errors for p in publishers)}")
        if failovers:
            print(f"audit: failover (fault to the first OK from the new leader) p50 "
                  f"{statistics.median(failovers):.2f}s max {max(failovers):.2f}s")
        assert not lost, lost[:10]
        assert len(acked) > 0 and faults
    finally:
        cluster.close()
