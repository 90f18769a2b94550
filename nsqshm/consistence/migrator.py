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

A partition led by another node than its preferred leader (the one its placement
chose: ReplicaInfo.preferred) while that one is a live ISR member -- after a
failover, once the old leader is back and in sync -- gets its leadership handed
back after --leader-rebalance-wait (5 minutes), as Kafka's preferred replica
election (auto.leader.rebalance), so leaderships do not pile up on the nodes that
survived failovers (`rebalance`).

A node an operator removes (`POST /cluster/node/remove?remove_node=<id>`, Youzan's
MarkNodeAsRemoving and handleRemovingNodes) is emptied the same way, at once: its
leaderships are handed to ISR members that stay, each of its replicas moves to a
spare node (or only leaves where the copies are enough without it), and no new
topic is placed on it.  Its mark in etcd goes from "marked" to "pending" while it
holds a replica, then "data_transferred": it can be stopped, and its mark is
deleted once its registration is gone.  A node with nowhere to move its replicas
to (every other node holds one) stays "pending" until a node comes.

Nothing runs while every replica's node is registered and no node is being removed:
the check is woken by a change under the nodes' keys or the removal marks, by a
change under the topics' keys (an ISR change, an election, a move's end) while a
partition waits for one (a move planned or under way, no live leader), and by a
timer at a lost replica's due time.  The lost-since times are the master's own: a new master starts them again.
"""

import time
from collections import Counter

import gevent
import gevent.event

from nsqshm.consistence.errors import CoordinationError, TopicNotFound
from nsqshm.consistence.topology import REMOVE_DONE, REMOVE_PENDING, UNREADABLE, MoveRequest

CHECK_INTERVAL = 1.0  # s before a check that failed (etcd) is tried again


def plan(partitions, live, lost_since, now, wait, urgent_wait, removing=frozenset(),
         waiting=None):
    """The moves due, and when to look again: ([(state, MoveRequest)], seconds from now
    or None -- not before the nodes change).  At most one move a partition.  waiting: a
    list given gets the partitions that wait for a change of their keys (an election,
    a move's end, a hand-off), the moves planned included: while there are some, such
    a change is worth a look.

    partitions: [(PartitionState, replicator)]; live: the registered node IDs;
    lost_since: {(topic, partition, node): when first seen lost} (updated here: lost
    replicas added, the others dropped); wait: seconds a replica may be lost (0:
    never replaced); urgent_wait: the same when no more than half the partition's
    replicas are live ISR members (Youzan's emergency; 0: wait); removing: the nodes
    an operator removes (`/cluster/node/remove`): their replicas go now, lost or not.

    A leader on a node being removed hands its leadership to a live ISR member that
    stays, else to a live catch-up member that stays (a hand-off before it gave up:
    its copy goes on), else to the spare node (which catches up first).  Any other replica that
    goes (lost, or on a node being removed) moves to: a live catch-up member (a move
    before it gave up: the copy goes on), else, while the partition would have fewer
    replicas than its replicator without it, the spare node with the fewest replicas,
    else (copies enough) a live ISR member: it only leaves.  A spare node is live, holds
    no replica of the partition and is not being removed.  The live leader's node is
    never lost: its session is on the lease of the worker that leads, the node's key
    on worker 0's, which may stall alone.  A partition is left alone while it has no
    live leader (the election comes first; the leader carries the move out) or a move
    under way."""
    load = Counter()  # replicas per node, the moves planned counted as they are
    for state, _ in partitions:
        for node in (*state.replicas.isr, *state.replicas.catchup):
            load[node] += 1
    seen, moves, again = set(), [], None

    def look_again(seconds):
        nonlocal again
        again = seconds if again is None else min(again, seconds)

    waiting = [] if waiting is None else waiting
    for state, replicator in partitions:
        replicas = state.replicas
        holders = list(dict.fromkeys((*replicas.isr, *replicas.catchup)))
        lost = [n for n in holders if n not in live and n != state.leader]
        if wait or urgent_wait:  # (both 0: never replaced, nothing to time)
            for node in lost:
                seen.add((state.topic, state.partition, node))
                lost_since.setdefault((state.topic, state.partition, node), now)
        leaving = [n for n in holders if n in removing and n != state.leader]
        if not lost and not leaving and state.leader not in removing:
            continue
        if state.leader_session is None or state.move is not None \
                or replicas.leader != state.leader:
            # (the election, the end of the move, or the resignation of a leader that
            # handed off -- it named its successor and ended the move -- wakes the check)
            waiting.append(state)
            continue
        spare = sorted((n for n in live if n not in holders and n not in removing),
                       key=lambda n: (load[n], n))
        if state.leader in removing:
            stay = [n for n in (*replicas.isr, *replicas.catchup)
                    if n != state.leader and n in live and n not in removing]
            to = stay[0] if stay else spare[0] if spare else None
            if to is not None:  # (else a node that comes wakes the check)
                moves.append((state, MoveRequest(state.leader, to, True)))
                waiting.append(state)
                load[to] += 1
            continue
        going = lost + [n for n in leaving if n not in lost]
        staying = len(holders) - len(going)  # copies, or copies coming (live catch-up)
        catching = [n for n in replicas.catchup if n not in going]
        if staying < replicator:
            if not spare:
                continue  # (a node that comes wakes the check)
            to = spare[0]
        elif catching:  # (its copy going on: it takes the lost one's place)
            to = catching[0]
        else:  # (any ISR member: it is one already, the move only removes)
            to = next((n for n in replicas.isr if n not in going and n != state.leader),
                      state.leader)
        if leaving:  # (an operator's: at once; a lost one among them first)
            first = min(leaving, key=lambda n: (n not in lost, n))
        else:
            urgent = sum(n not in lost for n in replicas.isr) <= replicator // 2  # (Youzan's)
            due = (urgent_wait or wait) if urgent else wait
            if not due or not lost:
                continue
            first = min(lost, key=lambda n: lost_since[(state.topic, state.partition, n)])
            left = lost_since[(state.topic, state.partition, first)] + due - now
            if left > 0:
                look_again(left)
                continue
        moves.append((state, MoveRequest(first, to, False)))  # (its end wakes the check)
        waiting.append(state)
        load[to] += 1
    for key in [k for k in lost_since if k not in seen]:
        del lost_since[key]
    return moves, again


def rebalance(partitions, live, removing, imbalanced_since, now, wait, waiting=None):
    """Leaderships handed back to their preferred leaders (Kafka's preferred replica
    election, auto.leader.rebalance): ([(state, MoveRequest)], seconds from now to look
    again or None).  A partition led by another node than its preferred one
    (ReplicaInfo.preferred: the leader its placement chose) while that one is a live
    ISR member not being removed, for `wait` seconds (imbalanced_since: {(topic,
    partition): when first seen so}, updated here), gets a move of its leadership to
    it.  Left alone: no live leader, a move or a hand-off under way, a leader being
    removed (plan's), wait 0.  waiting: as plan's (a preferred leader catching up
    joins the ISR by a change of the partition's keys)."""
    waiting = [] if waiting is None else waiting
    moves, again, seen = [], None, set()
    for state, _ in partitions:
        replicas = state.replicas
        preferred, leader = replicas.preferred, state.leader
        key = (state.topic, state.partition)
        if not wait or not preferred or preferred == leader or preferred not in live \
                or preferred in removing or leader in removing:
            continue
        if not leader or state.move is not None or replicas.leader != leader:
            # (an election, a move or a hand-off under way: its end wakes the check, and
            # the time counted so far stays)
            if key in imbalanced_since:
                seen.add(key)
            waiting.append(state)
            continue
        if preferred not in replicas.isr:
            if preferred in replicas.catchup:
                waiting.append(state)  # (its joining the ISR wakes the check)
            continue
        seen.add(key)
        left = imbalanced_since.setdefault(key, now) + wait - now
        if left > 0:
            again = left if again is None else min(again, left)
            continue
        moves.append((state, MoveRequest(leader, preferred, True)))
        imbalanced_since[key] = now  # (a hand-off that does not take: tried again after
        waiting.append(state)        # another wait, not at every check)
    for key in [k for k in imbalanced_since if k not in seen]:
        del imbalanced_since[key]
    return moves, again


def removal_states(partitions, removing):
    """{node: REMOVE_PENDING while it holds a replica of any partition (leader, ISR or
    catch-up) or a move under way is to give it one, else REMOVE_DONE} for the nodes
    being removed."""
    holding = {n for state, _ in partitions
               for n in (state.replicas.leader, state.leader, *state.replicas.isr,
                         *state.replicas.catchup,
                         *((state.move.to,) if state.move is not None else ()))}
    return {n: REMOVE_PENDING if n in holding else REMOVE_DONE for n in removing}


class Migrator:
    """Runs `plan` on the master nsqlookupd (is_master() says whether this one is), and
    keeps the removal marks' states."""

    def __init__(self, topology, is_master, logf, wait, urgent_wait, rebalance_wait=0.0):
        self.topology = topology
        self.is_master = is_master
        self.logf = logf
        self.wait = wait
        self.urgent_wait = urgent_wait
        self.rebalance_wait = rebalance_wait
        self.lost_since = {}
        self.imbalanced_since = {}  # (topic, partition) -> when first led off its preference
        self.removing = {}  # node ID -> removal state, as the last check read it
        # the last check left partitions waiting for their keys to change (an election,
        # a move's end): only then does a change under Topics/ wake the check -- a node
        # being removed with nowhere to go, or emptied and not stopped yet, waits for
        # the nodes' keys (a scan of every topic per change would be the cost)
        self.topics_wake = False
        self._wake = gevent.event.Event()
        self._watches = []
        self._loop = None

    def start(self):
        session, keys = self.topology.session, self.topology.keys
        self._watches = [
            session.watch(keys.nodes(), lambda events: self.wake(), prefix=True),
            session.watch(keys.removing_nodes(), lambda events: self.wake(), prefix=True),
            # an ISR change, an election, a move's end: what a lost replica or a node
            # being removed waits for
            session.watch(keys.topics(), lambda events: self.topics_wake and self.wake(),
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
                self.imbalanced_since.clear()
                self.removing = {}
                self.topics_wake = False
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
        removing = self.topology.removing_nodes()
        partitions = []
        for topic in self.topology.topics():
            try:
                replicator = self.topology.topic_meta(topic).replica
                states = self.topology.partitions(topic)
            except TopicNotFound:
                continue  # deleted meanwhile
            except UNREADABLE:
                # (not one of ours: a key that does not parse holds up no other topic;
                # the nodes say which, NsqdCoordinator._sync_topics)
                continue
            partitions.extend((state, replicator) for state in states)
        now = time.monotonic()
        waiting = []
        moves, again = plan(partitions, live, self.lost_since, now, self.wait,
                            self.urgent_wait, frozenset(removing), waiting)
        moved = {(state.topic, state.partition) for state, _ in moves}
        back, later = rebalance([(st, r) for st, r in partitions
                                 if (st.topic, st.partition) not in moved],
                                live, frozenset(removing), self.imbalanced_since, now,
                                self.rebalance_wait, waiting)
        if later is not None:
            again = later if again is None else min(again, later)
        self.topics_wake = bool(waiting)
        for state, move in back:
            if self.topology.request_move(state, move):
                self.logf("info", f"cluster: {state.topic}-{state.partition}: the leadership "
                                  f"goes back to its preferred leader {move.to} (led by "
                                  f"{move.from_} for {self.rebalance_wait:.0f}s or more)")
        for state, move in moves:
            if not self.topology.request_move(state, move):
                continue
            name = f"cluster: {state.topic}-{state.partition}"
            if move.from_ in removing:
                what = "leadership" if move.leader else "replica"
                self.logf("info", f"{name}: the {what} on {move.from_}, a node being removed, "
                                  f"moves to {move.to}")
            else:
                since = self.lost_since[(state.topic, state.partition, move.from_)]
                self.logf("warn", f"{name}: the replica on {move.from_}, lost for "
                                  f"{now - since:.0f}s, moves to {move.to}")
        self._record_removals(removal_states(partitions, removing), removing, live)
        return again

    def _record_removals(self, states, marked, live):
        """Each node's removal state into its mark; the mark of a node emptied and no
        longer registered is deleted (Youzan's "done": it left the cluster)."""
        for node, state in states.items():
            if state == REMOVE_DONE and node not in live:
                self.topology.unmark_removing(node)
                self.logf("info", f"cluster: node {node} removed (it holds no replica and "
                                  f"has left)")
            elif marked.get(node) != state:
                self.topology.set_removing_state(node, state)
                if state == REMOVE_DONE:
                    self.logf("info", f"cluster: node {node} holds no replica: it can be "
                                      f"stopped")
        self.removing = {n: s for n, s in states.items()
                         if not (s == REMOVE_DONE and n not in live)}
