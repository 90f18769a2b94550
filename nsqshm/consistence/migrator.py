"""The master nsqlookupd's replacement of lost replicas (Youzan's doCheckTopics and
handleTopicMigrate in nsqlookupd_coordinator.go).

A replica is lost when its node is no longer registered in etcd (its lease ran out:
dead, cut off, or stopped).  The partition's leader has already moved it out of the
ISR (replicator.py); while it stays away the partition has fewer copies than its
replicator.  Once a replica has been lost for `wait` (Youzan's waitMigrateInterval,
10 minutes) -- or for `urgent_wait` (its waitEmergencyMigrateInterval, 10 seconds)
when no more than half the partition's replicas are alive -- the master puts a
MoveRequest from the lost node to a live node that holds no replica of the
partition, the one holding the fewest replicas of all.  The partition's leader
carries it out as it does an operator's move: the new node catches up from the
leader's log, joins the ISR, and the lost node leaves the replicas (its copy stays
on its disk, no longer a replica).

Nothing runs while every replica's node is registered: the check is woken by a
change under the nodes' keys, and polls (CHECK_INTERVAL) only while a replica is
lost.  The lost-since times are the master's own: a new master starts them again.
"""

import time
from collections import Counter

import gevent
import gevent.event

from nsqshm.consistence.errors import CoordinationError, TopicNotFound
from nsqshm.consistence.topology import MoveRequest

CHECK_INTERVAL = 1.0  # s between checks while a replica is lost


def plan(partitions, live, lost_since, now, wait, urgent_wait):
    """The replacements due: [(state, MoveRequest)], at most one per partition.

    partitions: [(PartitionState, replicator)]; live: the registered node IDs;
    lost_since: {(topic, partition, node): when first seen lost} (updated here: lost
    replicas added, the others dropped); wait / urgent_wait: seconds (0: never).
    A partition is left alone while it has no live leader (the election comes
    first; the leader carries the move out) or a move under way."""
    load = Counter()  # replicas per live node, the new ones counted as they are planned
    for state, _ in partitions:
        for node in (*state.replicas.isr, *state.replicas.catchup):
            load[node] += 1
    seen = set()
    moves = []
    for state, replicator in partitions:
        holders = list(dict.fromkeys((*state.replicas.isr, *state.replicas.catchup)))
        lost = [n for n in holders if n not in live]
        for node in lost:
            key = (state.topic, state.partition, node)
            lost_since.setdefault(key, now)
            seen.add(key)
        alive = len(holders) - len(lost)
        if not lost or alive >= replicator or state.leader_session is None \
                or state.move is not None:
            continue
        due = urgent_wait if alive <= replicator // 2 else wait
        if not due:
            continue
        ready = [n for n in lost if now - lost_since[(state.topic, state.partition, n)] >= due]
        spare = sorted((n for n in live if n not in holders), key=lambda n: (load[n], n))
        if not ready or not spare:
            continue
        moves.append((state, MoveRequest(ready[0], spare[0], False)))
        load[spare[0]] += 1
    for key in [k for k in lost_since if k not in seen]:
        del lost_since[key]
    return moves


class Migrator:
    """Runs `plan` on the master nsqlookupd (is_master() says whether this one is)."""

    def __init__(self, topology, is_master, logf, wait, urgent_wait):
        self.topology = topology
        self.is_master = is_master
        self.logf = logf
        self.wait = wait
        self.urgent_wait = urgent_wait
        self.lost_since = {}
        self._wake = gevent.event.Event()
        self._watch = None
        self._loop = None

    def start(self):
        if not (self.wait or self.urgent_wait):
            return self  # (both 0: lost replicas are never replaced)
        self._watch = self.topology.session.watch(self.topology.keys.nodes(),
                                                  lambda events: self.wake(), prefix=True)
        self._loop = gevent.spawn(self._run)
        self._wake.set()  # a check at once: nodes may have been lost before we started
        return self

    def stop(self):
        if self._watch is not None:
            self.topology.session.unwatch(self._watch)
            self._watch = None
        if self._loop is not None:
            self._loop.kill(block=False)
            self._loop = None

    def wake(self):
        """Nodes changed, or the mastership did: check now."""
        self._wake.set()

    def _run(self):
        while True:
            self._wake.wait(CHECK_INTERVAL if self.lost_since else None)
            self._wake.clear()
            if not self.is_master():
                self.lost_since.clear()
                continue
            try:
                self.check()
            except CoordinationError as err:
                self.logf("info", f"cluster: lost-replica check failed: {err}")
                self._wake.wait(CHECK_INTERVAL)

    def check(self):
        """One pass: read the layout, put the replacements due."""
        live = {node.id for node in self.topology.nodes()}
        partitions = []
        for topic in self.topology.topics():
            try:
                replicator = self.topology.topic_meta(topic).replica
                states = self.topology.partitions(topic)
            except TopicNotFound:
                continue  # deleted meanwhile
            partitions.extend((state, replicator) for state in states)
        now = time.monotonic()
        for state, move in plan(partitions, live, self.lost_since, now, self.wait,
                                self.urgent_wait):
            if self.topology.request_move(state, move):
                since = self.lost_since[(state.topic, state.partition, move.from_)]
                self.logf("warn", f"cluster: {state.topic}-{state.partition}: the replica on "
                                  f"{move.from_}, lost for {now - since:.0f}s, moves to "
                                  f"{move.to}")
