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
change under the nodes' keys, by a change under the topics' keys (an ISR change,
an election, a move's end) while a replica is lost, and by a timer at a lost
replica's due time.  The lost-since times are the master's own: a new master
starts them again.
"""

import time
from collections import Counter

import gevent
import gevent.event

from nsqshm.consistence.errors import CoordinationError, TopicNotFound
from nsqshm.consistence.topology import MoveRequest

CHECK_INTERVAL = 1.0  # s before a check that failed (etcd) is tried again


def plan(partitions, live, lost_since, now, wait, urgent_wait):
    """The replacements due, and when to look again: ([(state, MoveRequest)], seconds
    from now or None -- not before the nodes change).  At most one move a partition.

    partitions: [(PartitionState, replicator)]; live: the registered node IDs;
    lost_since: {(topic, partition, node): when first seen lost} (updated here: lost
    replicas added, the others dropped); wait: seconds a replica may be lost (0:
    never replaced); urgent_wait: the same when no more than half the partition's
    replicas are live ISR members (Youzan's emergency; 0: wait).

    The node a lost replica moves to: a live catch-up member (a move before it gave
    up: the copy goes on), else, while the partition has fewer live replicas than
    its replicator, the spare node with the fewest replicas, else (copies enough) a
    live ISR member: the lost one only leaves.  The live leader's node is never
    lost: its session is on the lease of the worker that leads, the node's key on
    worker 0's, which may stall alone.  A partition is left alone while it has no
    live leader (the election comes first; the leader carries the move out) or a
    move under way."""
    load = Counter()  # replicas per node, the moves planned counted as they are
    for state, _ in partitions:
        for node in (*state.replicas.isr, *state.replicas.catchup):
            load[node] += 1
    seen, moves, again = set(), [], None

    def look_again(seconds):
        nonlocal again
        again = seconds if again is None else min(again, seconds)

    for state, replicator in partitions:
        replicas = state.replicas
        holders = list(dict.fromkeys((*replicas.isr, *replicas.catchup)))
        lost = [n for n in holders if n not in live and n != state.leader]
        for node in lost:
            seen.add((state.topic, state.partition, node))
            lost_since.setdefault((state.topic, state.partition, node), now)
        if not lost:
            continue
        if state.leader_session is None or state.move is not None:
            continue  # (the election or the end of the move wakes the check)
        alive = len(holders) - len(lost)  # copies, or copies coming (live catch-up)
        urgent = sum(n not in lost for n in replicas.isr) <= replicator // 2  # (Youzan's)
        due = (urgent_wait or wait) if urgent else wait
        if not due:
            continue
        catching = [n for n in replicas.catchup if n not in lost]
        spare = sorted((n for n in live if n not in holders), key=lambda n: (load[n], n))
        if alive < replicator:
            if not spare:
                continue  # (a node that comes wakes the check)
            to = spare[0]
        elif catching:  # (its copy going on: it takes the lost one's place)
            to = catching[0]
        else:  # (any ISR member: it is one already, the move only removes)
            to = next((n for n in replicas.isr if n not in lost and n != state.leader),
                      state.leader)
        first = min(lost, key=lambda n: lost_since[(state.topic, state.partition, n)])
        left = lost_since[(state.topic, state.partition, first)] + due - now
        if left > 0:
            look_again(left)
            continue
        moves.append((state, MoveRequest(first, to, False)))  # (its end wakes the check)
        load[to] += 1
    for key in [k for k in lost_since if k not in seen]:
        del lost_since[key]
    return moves, again


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
        self._watches = []
        self._loop = None

    def start(self):
        if not (self.wait or self.urgent_wait):
            return self  # (both 0: lost replicas are never replaced)
        session, keys = self.topology.session, self.topology.keys
        self._watches = [
            session.watch(keys.nodes(), lambda events: self.wake(), prefix=True),
            # an ISR change, an election, a move's end: what a lost replica waits for
            session.watch(keys.topics(), lambda events: self.lost_since and self.wake(),
                          prefix=True)]
        self._loop = gevent.spawn(self._run)
        self._wake.set()  # a check at once: nodes may have been lost before we started
        return self

    def stop(self):
        for watch in self._watches:
            self.topology.session.unwatch(watch)
        self._watches = []
        if self._loop is not None:
            self._loop.kill(block=False)
            self._loop = None

    def wake(self):
        """Nodes changed, or the mastership did: check now."""
        self._wake.set()

    def _run(self):
        again = None
        while True:
            self._wake.wait(again)
            self._wake.clear()
            if not self.is_master():
                self.lost_since.clear()
                again = None
                continue
            try:
                again = self.check()
            except CoordinationError as err:
                self.logf("info", f"cluster: lost-replica check failed: {err}")
                again = CHECK_INTERVAL
            except Exception as err:  # (a malformed key: the check must go on)
                self.logf("error", f"cluster: lost-replica check failed: {err!r}")
                again = CHECK_INTERVAL

    def check(self):
        """One pass: read the layout, put the replacements due.  -> when to look
        again (seconds, or None: when the nodes change)."""
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
        moves, again = plan(partitions, live, self.lost_since, now, self.wait,
                            self.urgent_wait)
        for state, move in moves:
            if self.topology.request_move(state, move):
                since = self.lost_since[(state.topic, state.partition, move.from_)]
                self.logf("warn", f"cluster: {state.topic}-{state.partition}: the replica on "
                                  f"{move.from_}, lost for {now - since:.0f}s, moves to "
                                  f"{move.to}")
        return again
