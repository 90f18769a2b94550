"""Partition leadership: elections among the ISR, ISR changes fenced by the epoch, and
a watch telling a node its role.

Election (one transaction):

    if   ReplicaInfo.mod_revision == epoch read       (nobody changed the partition since)
    and  LeaderSession does not exist                 (the last leader's lease is gone)
    then ReplicaInfo := {Leader: me, EpochForWrite + 1, ISR, CatchupList}   -> new epoch
         LeaderSession := {me, my lease, LeaderEpoch} on my lease
    else refused

Only an ISR member may be elected: it has every acknowledged message (a write is
acknowledged once every ISR member has it).  Of several candidates exactly one wins;
the others see CompareFailed.  A leader that dies or is cut off from etcd loses its
lease after the TTL: its LeaderSession vanishes and the followers' role watches say
CANDIDATE, so they run the election; the new leader is in place within about one TTL.

ISR change (shrink, expand, catch-up list; one transaction):

    if   ReplicaInfo.mod_revision == my epoch
    and  LeaderSession.create_revision == the one I created
    then ReplicaInfo := new lists                                          -> new epoch

A deposed leader holds an old epoch, or its session key is gone or is another's: its
change is refused (Fenced), and it must stop acknowledging.  Every change returns the
new PartitionState, whose epoch the holder uses for its next change.
"""

import json
import logging

import gevent
import gevent.lock

from nsqshm.consistence.errors import (
    CoordinationError,
    Fenced,
    LeaderAlive,
    NotInISR,
    TopicNotFound,
)
from nsqshm.consistence.etcd.txn import Compare, Op
from nsqshm.consistence.topology import LeaderSession, ReplicaInfo, check_node_id

log = logging.getLogger("nsqshm.consistence")

LEADER = "leader"  # this node holds the partition's live leader session
FOLLOWER = "follower"  # in the ISR, another node leads
CANDIDATE = "candidate"  # in the ISR and no live leader: should run an election
CATCHUP = "catchup"  # catching up from the leader's log, not yet in the ISR
NONE = "none"  # no replica here


def role_of(state, node_id):
    """What node_id is for the partition in state."""
    if state.leader_session is not None and state.leader == node_id:
        return LEADER
    if node_id in state.replicas.isr:
        return FOLLOWER if state.leader_session is not None else CANDIDATE
    if node_id in state.replicas.catchup:
        return CATCHUP
    return NONE


class Leadership:
    """Leadership operations of one node (`node`, a NodeInfo) through a Topology."""

    def __init__(self, topology, node):
        self.topology = topology
        self.session = topology.session
        self.keys = topology.keys
        self.node = node
        check_node_id(node.id)

    # -- election --------------------------------------------------------------------

    def elect(self, topic, partition):
        """Become the partition's leader.  Refused with LeaderAlive while a leader
        session exists, NotInISR if this node is not in the ISR, CompareFailed if
        another change (another candidate) came first.  -> the new PartitionState."""
        state = self.topology.partition(topic, partition)
        if state.leader_session is not None:
            if state.leader == self.node.id:
                return state  # already ours
            raise LeaderAlive(f"{topic}/{partition}: {state.leader} leads "
                              f"(session {state.leader_session.session})")
        if self.node.id not in state.replicas.isr:
            raise NotInISR(f"{topic}/{partition}: {self.node.id} not in ISR "
                           f"{list(state.replicas.isr)}")
        old = state.replicas
        replicas = ReplicaInfo(leader=self.node.id, isr=old.isr, catchup=old.catchup,
                               epoch_for_write=old.epoch_for_write + 1,
                               preferred=old.preferred)
        lease = self.session.ensure_lease()
        session = LeaderSession(topic, partition, self.node, f"{lease:x}",
                                replicas.epoch_for_write)
        info_key = self.keys.replica_info(topic, partition)
        session_key = self.keys.leader_session(topic, partition)
        result = self.session.txn(
            [Compare.mod_revision(info_key, "=", state.epoch), Compare.absent(session_key)],
            [Op.put(info_key, json.dumps(replicas.to_json())),
             Op.put(session_key, json.dumps(session.to_json()), lease),
             Op.get(self.keys.partition(topic, partition), prefix=True)])
        if not result.succeeded:
            raise Fenced(f"{topic}/{partition}: changed since epoch {state.epoch}; "
                         f"election lost")
        new = self.topology.state_from(topic, partition, result.ranges[0], result.revision)
        log.info("%s/%d: %s elected leader, epoch %d (write epoch %d)", topic, partition,
                 self.node.id, new.epoch, replicas.epoch_for_write)
        return new

    def resign(self, state):
        """Hand the leadership back (graceful leave): delete our leader session if it
        is still ours, so that a follower is elected at once instead of after the
        TTL.  -> True if it was ours."""
        own = state.leader_session
        if own is None or own.leader.id != self.node.id:
            return False
        key = self.keys.leader_session(state.topic, state.partition)
        result = self.session.txn([Compare.create_revision(key, "=", own.create_revision)],
                                  [Op.delete(key)])
        return result.succeeded

    # -- the ISR, fenced by the epoch -------------------------------------------------

    def update_replicas(self, state, isr, catchup, designated=None, preferred=None):
        """Set the ISR and catch-up list, as the partition's leader holding state (and
        the designated leader, who goes first at the next election: this node unless
        it hands off; and the preferred leader, kept unless given).  Fenced if the
        epoch moved or the leader session is no longer ours.  -> the new
        PartitionState (its epoch for the next change)."""
        own = state.leader_session
        if own is None or own.leader.id != self.node.id:
            raise Fenced(f"{state.topic}/{state.partition}: {self.node.id} is not the leader")
        isr = tuple(check_node_id(n) for n in isr)
        catchup = tuple(check_node_id(n) for n in catchup if n not in isr)
        if self.node.id not in isr:
            raise ValueError("the leader cannot leave the ISR it leads")
        designated = check_node_id(designated) if designated else self.node.id
        if designated not in isr:
            raise ValueError("the designated leader must be in the ISR")
        preferred = state.replicas.preferred if preferred is None else check_node_id(preferred)
        replicas = ReplicaInfo(leader=designated, isr=isr, catchup=catchup,
                               epoch_for_write=state.replicas.epoch_for_write,
                               preferred=preferred)
        topic, partition = state.topic, state.partition
        info_key = self.keys.replica_info(topic, partition)
        session_key = self.keys.leader_session(topic, partition)
        result = self.session.txn(
            [Compare.mod_revision(info_key, "=", state.epoch),
             Compare.create_revision(session_key, "=", own.create_revision)],
            [Op.put(info_key, json.dumps(replicas.to_json())),
             Op.get(self.keys.partition(topic, partition), prefix=True)])
        if not result.succeeded:
            raise Fenced(f"{topic}/{partition}: epoch {state.epoch} is stale or the leader "
                         f"session is gone; {self.node.id} must stop acknowledging")
        return self.topology.state_from(topic, partition, result.ranges[0], result.revision)

    def shrink_isr(self, state, node_id):
        """Remove a follower that fell behind or died from the ISR; it goes to the
        catch-up list, to rejoin once it has caught up."""
        isr = [n for n in state.replicas.isr if n != node_id]
        return self.update_replicas(state, isr, [*state.replicas.catchup, node_id])

    def expand_isr(self, state, node_id):
        """Move a caught-up node from the catch-up list into the ISR."""
        catchup = [n for n in state.replicas.catchup if n != node_id]
        isr = [*state.replicas.isr, node_id] if node_id not in state.replicas.isr \
            else list(state.replicas.isr)
        return self.update_replicas(state, isr, catchup)

    def add_catchup(self, state, node_id):
        """A new replica starts catching up (moving a replica to another node)."""
        if node_id in state.replicas.isr or node_id in state.replicas.catchup:
            return state
        return self.update_replicas(state, state.replicas.isr,
                                    [*state.replicas.catchup, node_id])

    # -- the role watch --------------------------------------------------------------

    def watch_role(self, topic, partition, callback):
        """callback(role, state) now and each time this node's role in the partition
        changes (or the partition goes: role NONE, state None), and, while it leads,
        each time a move request comes or goes.  -> RoleWatch."""
        return RoleWatch(self, topic, partition, callback)


class RoleWatch:
    """Re-reads the partition at each change of its keys and calls back when the role
    changed (a leader: also when its replicas or its move changed).  A read that fails (etcd restarting) is retried until it succeeds, so a
    change seen by the watch is never dropped."""

    RETRY = 0.2

    def __init__(self, leadership, topic, partition, callback):
        self.leadership = leadership
        self.topic = topic
        self.partition = partition
        self.callback = callback
        self.role = None
        self.state = None
        self._lock = gevent.lock.Semaphore()
        self._stopped = False
        session = leadership.session
        revision = session.revision()
        self._check()
        # from the revision read before the first check: no change can fall in between
        self._watch = session.watch(leadership.keys.partition(topic, partition),
                                    self._changed, prefix=True, start_revision=revision + 1)

    def stop(self):
        self._stopped = True
        self.leadership.session.unwatch(self._watch)

    def recheck(self):
        """Read the partition now (after a change this node made itself)."""
        self._changed(())

    def _changed(self, events):
        # in the watch's greenlet: the next events wait in the stream meanwhile, and the
        # re-read that succeeds sees them all
        while not self._stopped:
            try:
                self._check()
                return
            except CoordinationError as err:
                log.info("%s/%d: role check failed (%s); retrying", self.topic,
                         self.partition, err)
                gevent.sleep(self.RETRY)

    def _check(self):
        with self._lock:
            try:
                state = self.leadership.topology.partition(self.topic, self.partition)
                role = role_of(state, self.leadership.node.id)
            except TopicNotFound:
                state, role = None, NONE
            # a leader hears of every change of its partition's replicas too: one of
            # its own ISR changes whose answer from etcd was lost is in etcd all the
            # same, and its commits must count the member it added
            moved = role == LEADER and state is not None and (
                self.state is None or state.move != self.state.move
                or state.replicas != self.state.replicas)
            self.state = state
            if role == self.role and not moved:
                return
            self.role = role
        self.callback(role, state)
