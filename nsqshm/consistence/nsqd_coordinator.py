"""An nsqd worker in cluster mode (Youzan's NsqdCoordinator, nsqd_coordinator.go):
the etcd session, the node's registration, the partitions this worker holds and its
role in each, the replication RPC.  It drives the broker only through ReplicaHost
(nsqd/logtopics/replica.py); the broker knows nothing of etcd.

Per worker (each has its own session and lease):

- worker 0 registers the node (NsqdNodes/Node-<id>, on its lease); the node ID is
  "<broadcast address>:<rpc port>";
- a watch on the cluster's Topics/ prefix: for every partition with this node among
  its replicas (leader, ISR, catch-up) whose log this worker owns, the log topic is
  made locally (every worker of the node), its gate set to "not leader", and a role
  watch (leadership.py) started;
- the role decides the gate: LEADER: a PartitionLeader (replicator.py) replicates
  and acknowledges; CANDIDATE (in the ISR, no live leader): run the election (etcd
  decides, exactly one ISR member wins); FOLLOWER, CATCHUP, NONE: writes refused
  with E_FAILED_ON_NOT_LEADER and the leader's APPENDs taken on the RPC port;
- a lost lease fences every partition this worker leads at once (the local
  deadline comes before etcd's expiry, so before any successor is elected).
"""

import functools
import ipaddress
import secrets
import time

import gevent
import gevent.event
import gevent.socket

from nsqshm.consistence import rpc
from nsqshm.consistence.errors import (
    CompareFailed,
    CoordinationError,
    LeaderAlive,
    NotInISR,
    TopicNotFound,
)
from nsqshm.consistence.etcd.session import EtcdSession
from nsqshm.consistence.leadership import CANDIDATE, LEADER, Leadership
from nsqshm.consistence.options import endpoints
from nsqshm.consistence.replicator import HAND_OFF_TIMEOUT, PartitionLeader
from nsqshm.consistence.topology import UNREADABLE, NodeInfo, Topology
from nsqshm.nsqd.logtopics.logtopic import LogTopicError
from nsqshm.nsqd.logtopics.partition import partition_owner
from nsqshm.nsqd.logtopics.replica import NotLeader, NotLeaderGate, OffsetMismatch
from nsqshm.nsqd.topic import TopicError

LAG_TIMEOUT = 2.0  # an ISR follower behind this long leaves the ISR (PUBs wait at most ~this)
RETRY = 0.5
ELECTION_DEFER = 0.5  # a candidate waits this long for a better one to win
DESIGNATED_WAIT = 3.0  # and for the designated leader while it is registered, at most
# this (or the lease TTL): a worker of its node hung or dead adds no more to a failover
PROBE_TIMEOUT = 0.5  # asking another candidate how long its log is
NEWER_LEADER_FOR = 0.5  # a newer leader etcd confirmed is taken this long on that read


def registered_peer(topology, node_id, ip):
    """Whether a connection from `ip` saying it is `node_id` comes from a node
    registered (live) in etcd for this cluster, at its NodeIP: the RPC port takes
    nothing else.  False when etcd does not answer."""
    try:
        node = next((n for n in topology.nodes() if n.id == node_id), None)
    except CoordinationError:
        return False
    if node is None:
        return False
    try:
        return gevent.socket.gethostbyname(node.ip) == ip
    except OSError:
        return False


def lease_ttl(opts):
    return max(2, round(opts.cluster_lease_ttl))  # etcd grants whole seconds


class NsqdCoordinator:
    def __init__(self, host, opts, logf, version=""):
        self.host = host
        self.opts = opts
        self.logf = logf
        self.cluster_id = opts.cluster_id
        rpc_port = int(opts.rpc_port)
        ip = opts.broadcast_address
        self.node = NodeInfo(id=f"{ip}:{rpc_port}", ip=ip, tcp_port=opts.broadcast_tcp_port,
                             http_port=opts.broadcast_http_port, rpc_port=rpc_port,
                             version=version, workers=host.workers)
        self.lag_timeout = LAG_TIMEOUT
        self._committed_heard = {}  # (topic, partition) -> committed end its leader sent
        # (topic, partition) -> (write epoch, leader, when) etcd confirmed for a frame
        # newer than the role watch's state (_from_leader; read again after
        # NEWER_LEADER_FOR: a leader deposed meanwhile is not taken for long)
        self._newer_leaders = {}
        self._unreadable = set()  # topic names whose keys did not parse (said once)
        # what this node's workers say to each other (rpc.py HELLO): the supervisor's,
        # made before it forked them; a process on its own (no supervisor) has no
        # other worker to hear from
        self._secret = getattr(opts, "node_secret", None) or secrets.token_hex(16)
        self.session = EtcdSession(endpoints(opts), ttl=lease_ttl(opts))
        self.topology = Topology(self.session, opts.cluster_id)
        self.leadership = Leadership(self.topology, self.node)
        self.roles = {}  # (topic, partition) -> RoleWatch
        self.leaders = {}  # (topic, partition) -> PartitionLeader
        self._dirty = gevent.event.Event()
        self._deleted = set()  # topics whose meta the watch saw deleted (_topics_changed)
        self._nodes_read, self._nodes_read_at = {}, -ELECTION_DEFER - 1.0  # _registered_nodes
        self._watch = None
        self._loop = None
        self.stopped = False
        try:
            bind = self._source = str(ipaddress.ip_address(ip))
        except ValueError:  # a host name: any interface, connections from the route's
            bind, self._source = "0.0.0.0", None
        self.rpc = rpc.RPCServer((bind, rpc_port + host.worker), self.cluster_id, self.node.id,
                                 self.is_peer, self.on_append, self.on_publish, logf,
                                 on_cursors=self.on_cursors, secret=self._secret)
        self._idle = {}  # worker index -> [RPCClient]: connections to this node's workers
        host.forwarder = self.forward

    # -- life ------------------------------------------------------------------------

    def start(self):
        self.rpc.start()
        self._loop = gevent.spawn(self._run)
        return self

    def close(self, resign=True):
        """A graceful stop: hand the leaderships off at once (to the most caught-up ISR
        follower, with the log's end and the cursors: it is elected without waiting
        for the TTL and its consumers go on from here), give the lease up."""
        self.stopped = True
        if resign:
            handing = [gevent.spawn(self._hand_off, leader)
                       for leader in list(self.leaders.values())]
            gevent.joinall(handing, timeout=HAND_OFF_TIMEOUT + 1.0)
        for leader in list(self.leaders.values()):
            leader.stop("stopping")
            if resign:
                try:
                    self.leadership.resign(leader.state)
                except CoordinationError:
                    pass
        for watch in list(self.roles.values()):
            watch.stop()
        if self._loop is not None:
            self._loop.kill(block=False)
        self.rpc.stop()
        self.session.close(revoke=resign)

    def _hand_off(self, leader):
        to = leader.successor()
        if to is None:
            return
        try:
            why_not = leader.hand_off(to)
        except (CoordinationError, ValueError) as err:
            why_not = str(err)
        if why_not:
            self.logf("info", f"cluster: {leader!r} not handed off: {why_not}")

    def lease_alive(self):
        lease = self.session.lease
        return lease is not None and lease.alive

    def _run(self):
        """Connect (retried while etcd does not answer), then follow the topics."""
        while not self.stopped:
            try:
                self.session.start()
                if self.host.worker == 0:
                    self.topology.register_node(self.node)
                revision = self.session.revision()
                break
            except CoordinationError as err:
                self.logf("warn", f"cluster: etcd not reachable yet ({err}); retrying")
                gevent.sleep(RETRY)
        self.session.on_lease_lost(self._lease_lost)
        self.session.on_new_lease(lambda session: self._dirty.set())
        self._watch = self.session.watch(self.topology.keys.topics(), self._topics_changed,
                                         prefix=True, start_revision=revision + 1)
        self.logf("info", f"cluster: node {self.node.id} worker {self.host.worker} joined "
                          f"cluster {self.cluster_id}")
        self._dirty.set()
        while not self.stopped:
            self._dirty.wait()
            self._dirty.clear()
            try:
                self._sync_topics()
            except CoordinationError as err:
                self.logf("warn", f"cluster: reading the topics failed ({err}); retrying")
                gevent.sleep(RETRY)
                self._dirty.set()
            except (TopicError, LogTopicError, OSError, ValueError) as err:
                # the broker refused (a topic made again with another partition count
                # while this node's old one is still here, a full disk): said, tried
                # again, and the loop goes on
                self.logf("error", f"cluster: making the topics here failed ({err}); retrying")
                gevent.sleep(RETRY * 4)
                self._dirty.set()

    def _topics_changed(self, events):
        prefix = self.topology.keys.topics()
        for e in events:
            if e.type == "DELETE" and e.kv.key.endswith("/TopicMeta"):
                # (only a deletion seen happen removes a log: one missing at a start,
                # or after a compaction, may be etcd's data lost, not a delete)
                self._deleted.add(e.kv.key[len(prefix):-len("/TopicMeta")])
        if any(e.type == "COMPACTED" or e.kv.key.endswith(("/TopicMeta", "/ReplicaInfo"))
               for e in events):
            self._dirty.set()

    def _lease_lost(self, session):
        for leader in list(self.leaders.values()):
            leader.fence("lost its etcd lease")

    # -- partitions and roles ----------------------------------------------------------

    def _sync_topics(self):
        me = self.node.id
        seen_deleted = set(self._deleted)  # (before the read, which yields: a deletion
        names = self.topology.topics()     # seen during it waits for the next sync)
        self._deleted -= seen_deleted
        self._drop_deleted(set(names), seen_deleted)
        refused = []
        for name in names:
            try:
                states = self.topology.partitions(name)
                mine = [s for s in states if me == s.replicas.leader or me in s.replicas.isr
                        or me in s.replicas.catchup]
                if not mine:
                    continue
                meta = self.topology.topic_meta(name)
            except TopicNotFound:
                continue  # deleted meanwhile
            except UNREADABLE as err:
                # (a key under the topics that is not one of ours, or a value written
                # by something else: the other topics go on)
                if name not in self._unreadable:
                    self.logf("error", f"cluster: topic {name!r} in etcd is not readable "
                                       f"({type(err).__name__}: {err}); left out")
                self._unreadable.add(name)
                continue
            self._unreadable.discard(name)
            try:
                self.host.ensure_topic(name, len(states), meta.sync_every, meta.ordered_multi,
                                       meta.ext, retention_days=meta.retention_day,
                                       retention_bytes=meta.retention_bytes)
            except (TopicError, LogTopicError, OSError, ValueError) as err:
                # the broker refused (a topic made again with another partition count
                # while this node's old one is still here, a full disk, a definition an
                # older build took): the other topics go on, this one is tried again
                refused.append(f"{name}: {err}")
                continue
            for state in mine:
                key = (name, state.partition)
                if key in self.roles:
                    continue
                part = self.host.partition(name, state.partition)
                if part is None:  # another worker of this node owns its log: only
                    # whether this node leads it (a PUB without a partition goes there)
                    gate = self.host.forward_gate(name, state.partition)
                    if gate is not None:
                        self.roles[key] = self.leadership.watch_role(
                            name, state.partition, functools.partial(self._owner_role, gate))
                    continue
                self.host.set_gate(part, NotLeaderGate("has no known leader here yet"))
                self.roles[key] = self.leadership.watch_role(
                    name, state.partition, functools.partial(self._role, key, part))
        if refused:
            raise TopicError("; ".join(refused))  # (_run says so, and tries again)

    def _drop_deleted(self, names, deleted):
        """Topics deleted in the cluster (`/topic/delete?partition=**` on an
        nsqlookupd; `deleted`: the deletions the watch saw): their role watches and
        leaders stop on every worker, and worker 0 deletes the log topic on the whole
        node (nsqd's topic delete).  A topic deleted and made again before this sync
        (its name in both) loses its old log too: the new one starts empty."""
        for key in [k for k in self.roles if k[0] not in names or k[0] in deleted]:
            self.roles.pop(key).stop()
            self._committed_heard.pop(key, None)  # (a topic made again starts from 0)
            self._newer_leaders.pop(key, None)
            leader = self.leaders.pop(key, None)
            if leader is not None:
                leader.stop("its topic was deleted")
        for name in sorted(deleted):
            if self.host.delete_topic(name, here=self.host.worker == 0):
                self.logf("info", f"cluster: topic {name} was deleted in the cluster: "
                                  f"its log here is removed")

    def _role(self, key, part, role, state):
        """The role watch's callback (in its greenlet): set the partition's gate."""
        if role == LEADER:
            leader = self.leaders.get(key)
            if leader is not None and leader.fenced is None:
                leader.set_state(state)
                return
            if leader is not None and leader.resigning is not None \
                    and state.leader_session.create_revision == leader.resigning:
                return  # handed off, its resign not yet answered: it leads no more
            leader = PartitionLeader(self, part, state)
            self.leaders[key] = leader
            self.host.set_gate(part, leader)
            self.logf("info", f"cluster: {key[0]}-{key[1]}: leading, write epoch {leader.epoch}, "
                              f"ISR {list(state.replicas.isr)}")
            return
        leader = self.leaders.pop(key, None)
        if leader is not None:
            leader.stop(f"is now {role}")
        if role == CANDIDATE:
            self.host.set_gate(part, NotLeaderGate("has no leader: an election runs"))
            gevent.spawn(self._elect, key)
        else:
            led_by = state.leader if state is not None and state.leader else "nobody"
            self.host.set_gate(part, NotLeaderGate(f"is led by {led_by}"))

    def _probed_ends(self, key, watch):
        """{node: its log's end} of the other ISR members that answered a PROBE (a
        short timeout each: a cut-off member must not delay the election much)."""
        ends = {}
        for node in watch.state.replicas.isr:
            if node == self.node.id:
                continue
            try:
                info = self._registered_nodes().get(node)
                if info is None:
                    continue
                port = info.rpc_port + partition_owner(key[0], key[1], info.workers)
                client = rpc.RPCClient(info.ip, port, self.cluster_id, self.node.id,
                                       PROBE_TIMEOUT, source=self._source)
                try:
                    status, end, _ = client.append(rpc.encode_append(*key, 0, rpc.PROBE), b"")
                finally:
                    client.close()
            except (rpc.RPCError, OSError, CoordinationError):
                continue
            if status != rpc.UNKNOWN:
                ends[node] = end
        return ends

    def _registered_nodes(self):
        """{node ID: NodeInfo} of the nodes registered in etcd, read at most every
        ELECTION_DEFER for every partition's election (an etcd restart makes them
        all candidates at once)."""
        now = time.monotonic()
        if now - self._nodes_read_at > ELECTION_DEFER:
            self._nodes_read = {node.id: node for node in self.topology.nodes()}
            self._nodes_read_at = now
        return self._nodes_read

    def _owner_role(self, gate, role, state):
        gate.writable = role == LEADER  # (the owner worker runs the election)

    def _better_one_won(self, key):
        """Wait while a better candidate may win (ELECTION_DEFER, and for the
        designated leader while it is registered).  -> whether this node must not
        run the election (it no longer is a candidate, or it stops)."""
        watch = self.roles.get(key)
        part = self.host.partition(*key)
        if watch is None or watch.state is None or part is None:
            return False
        # the partition's designated leader: the placement's at creation, the last
        # leader after, the target of a move (leaders stay spread as placed)
        preferred = watch.state.replicas.leader
        designated = preferred == self.node.id
        # the longest log holds every acknowledged message and the most
        # unacknowledged ones: electing it spares the others a reset (they hold no
        # record it lacks); of equal ones, the designated leader, else the smaller ID
        mine = self.host.end_offset(part)
        ends = self._probed_ends(key, watch)
        longer = any(end > mine or not designated and end == mine and node < self.node.id
                     for node, end in ends.items())
        # the designated leader goes first while it is alive (unless it answered with
        # a shorter log), at most DESIGNATED_WAIT: on a loaded host it may take more
        # than the defer to elect, and the leader that just handed it the leadership
        # (a move) must not win it back meanwhile
        waits_for = preferred if not designated and preferred \
            and ends.get(preferred, mine) >= mine and preferred in self._registered_nodes() \
            else None
        if not waits_for and not longer:
            return False
        gevent.sleep(ELECTION_DEFER)
        end = time.monotonic() + min(DESIGNATED_WAIT, self.session.ttl)
        while waits_for and watch.role == CANDIDATE and not self.stopped \
                and time.monotonic() < end and waits_for in self._registered_nodes():
            gevent.sleep(ELECTION_DEFER)
        return watch.role != CANDIDATE or self.stopped

    def _elect(self, key):
        if self.stopped:  # (a stopping node that handed off: it must not win it back)
            return
        try:
            if self._better_one_won(key):
                return
            self.leadership.elect(*key)
            # lead at once (the lookupd names this node from now on), not when the
            # role watch's stream brings the change
            watch = self.roles.get(key)
            if watch is not None:
                watch.recheck()
        except (LeaderAlive, NotInISR, CompareFailed) as err:
            self.logf("info", f"cluster: {key[0]}-{key[1]}: not elected ({err})")
        except CoordinationError as err:
            self.logf("warn", f"cluster: {key[0]}-{key[1]}: election failed ({err}); retrying")
            gevent.sleep(RETRY)
            watch = self.roles.get(key)
            if watch is not None and watch.role == CANDIDATE and not self.stopped:
                gevent.spawn(self._elect, key)

    # -- the RPC -------------------------------------------------------------------------

    def node_info(self, node_id):
        for node in self.topology.nodes():
            if node.id == node_id:
                return node
        return None

    def is_peer(self, node_id, ip):
        return registered_peer(self.topology, node_id, ip)

    def connect(self, node_id, topic, partition):
        """An RPC connection to the worker of node_id that owns topic-partition."""
        node = self.node_info(node_id)
        if node is None:
            raise rpc.RPCError(f"{node_id} is not registered (down?)")
        port = node.rpc_port + partition_owner(topic, partition, node.workers)
        return rpc.RPCClient(node.ip, port, self.cluster_id, self.node.id, self.lag_timeout,
                             source=self._source)

    def _from_leader(self, peer, topic, partition, epoch):
        """Whether a frame from `peer` at write `epoch` comes from the partition's
        leader as this node knows it: (partition, None) if so, else (partition or
        None, the status to answer).  A newer leader's frame deposes ours."""
        key = (topic, partition)
        part = self.host.partition(topic, partition)
        watch = self.roles.get(key) if part is not None else None
        if watch is None or watch.state is None:
            return None, rpc.UNKNOWN
        known = watch.state.replicas
        if epoch < known.epoch_for_write or (epoch == known.epoch_for_write
                                             and peer != known.leader):
            return part, rpc.FENCED
        confirmed = self._newer_leaders.get(key)
        if epoch > known.epoch_for_write and (
                confirmed is None or confirmed[:2] != (epoch, peer)
                or time.monotonic() - confirmed[2] > NEWER_LEADER_FOR):
            # a leader elected since our role watch last heard: etcd must say so (a
            # linearizable read) before its frames depose ours or reach our log -- a
            # frame from any other registered address would otherwise take the
            # partition over by claiming a higher number
            try:
                fresh = self.topology.partition(topic, partition)
            except (CoordinationError, *UNREADABLE):
                return part, rpc.UNKNOWN  # (not now: the leader tries again)
            if fresh.replicas.epoch_for_write != epoch or fresh.replicas.leader != peer \
                    or fresh.leader != peer:
                self.logf("warn", f"cluster: {topic}-{partition}: refused {peer}'s frame at "
                                  f"write epoch {epoch}: etcd names {fresh.leader or 'nobody'} "
                                  f"leading at write epoch {fresh.replicas.epoch_for_write}")
                return part, rpc.FENCED
            self._newer_leaders[key] = (epoch, peer, time.monotonic())
        mine = self.leaders.get(key)
        if mine is not None and mine.fenced is None:
            if epoch <= mine.epoch:
                return part, rpc.FENCED
            mine.fence(f"{peer} leads at write epoch {epoch}")
        return part, None

    def committed_heard(self, partition):
        """The largest committed end a leader of the partition told this node
        (CURSORS frames) since its log was last reset; 0 if none."""
        return self._committed_heard.get((partition.topic.name, partition.index), 0)

    def on_cursors(self, peer, topic, partition, epoch, committed, cursors):
        """The leader's channel cursors of a partition: the channels here take
        them (ReplicaHost.adopt_cursors), and those it deleted go here too
        (drop_channels); its committed end is kept (committed_heard) -> (status,
        end).  (Committed ends only grow, from one leader to the next: a new
        leader's is at least what it heard, which every ISR member holds.)"""
        part, refused = self._from_leader(peer, topic, partition, epoch)
        if refused is not None:
            return refused, self.host.end_offset(part) if part is not None else 0
        key = (topic, partition)
        self._committed_heard[key] = max(self._committed_heard.get(key, 0), committed)
        self.host.drop_channels(part, [name for name, confirmed, *_ in cursors
                                       if confirmed == rpc.DELETED])
        self.host.adopt_cursors(part, [c for c in cursors if c[1] != rpc.DELETED])
        return rpc.OK, self.host.end_offset(part)

    def on_append(self, peer, topic, partition, epoch, first, prev_crc, records, stream):
        """A leader's APPEND: taken only from the leader this node knows, at a write
        epoch no older than the one it knows, and where our record before `first` is
        the leader's (prev_crc: its crc32; not checked where this connection's last
        APPEND of the partition ended: `stream`, its per-connection record of that).
        -> (status, end, tail crc or None)."""
        key = (topic, partition)
        continues = stream.pop(key, None) == first  # (kept again only once taken)
        part, refused = self._from_leader(peer, topic, partition, epoch)
        if part is None:
            return rpc.UNKNOWN, 0, None
        end = self.host.end_offset(part)
        if refused is not None:
            return refused, end, None
        known = self.roles[(topic, partition)].state.replicas
        mine = self.leaders.get((topic, partition))
        if first == rpc.PROBE:  # where the log ends, and what its last record is (or
            # the record before an offset: the leader's search for where we diverged)
            if records:
                if len(records) != rpc.AT.size:
                    raise rpc.RPCError(f"a PROBE of {len(records)} bytes")
                return rpc.MISMATCH, end, self.host.tail_crc(part, *rpc.AT.unpack(records))
            return rpc.MISMATCH, end, self.host.tail_crc(part, end)
        if first == rpc.TRUNCATE:  # our log diverged from the leader's there
            if len(records) != rpc.AT.size:
                raise rpc.RPCError(f"a TRUNCATE of {len(records)} bytes")
            if self.node.id not in known.isr and mine is None:  # (not while in the ISR)
                (keep,) = rpc.AT.unpack(records)
                if self.host.truncate_log(part, keep):
                    if key in self._committed_heard:  # (never above keep: the leader
                        # holds every committed record, and keeps what matches its own)
                        self._committed_heard[key] = min(self._committed_heard[key], keep)
            end = self.host.end_offset(part)
            return rpc.MISMATCH, end, self.host.tail_crc(part, end)
        if first == rpc.RESET:  # our log diverged from the leader's, or ends below its
            # start: start again where the leader's log begins
            if len(records) != rpc.RESET_START.size:
                raise rpc.RPCError(f"a RESET of {len(records)} bytes")
            if self.node.id in known.isr or mine is not None:
                return rpc.MISMATCH, end, self.host.tail_crc(part, end)  # not while in the ISR
            self.host.reset_log(part, *rpc.RESET_START.unpack(records))
            self._committed_heard.pop((topic, partition), None)
            end = self.host.end_offset(part)
            return rpc.MISMATCH, end, self.host.tail_crc(part, end)
        if first == end and not continues and first > self.host.start_offset(part) \
                and self.host.tail_crc(part, first) != prev_crc:
            # (our record before first is not the leader's: it probes, and repairs)
            return rpc.MISMATCH, end, self.host.tail_crc(part, end)
        try:
            end = self.host.append_at(part, first, records)
        except OffsetMismatch as err:
            return rpc.MISMATCH, err.end, None
        stream[key] = end
        return rpc.OK, end, None

    # -- PUBs that landed on another worker of this node ---------------------------------

    def forward(self, topic, partition, packed):
        """Hand a PUB's records to the worker that owns the partition (PUBLISH on its
        RPC port) and raise what it answers: the PUB is acknowledged only once the
        owner has replicated it.  A connection per concurrent PUB, kept for reuse."""
        owner = partition_owner(topic, partition, self.host.workers)
        idle = self._idle.setdefault(owner, [])
        try:
            client = idle.pop() if idle else rpc.RPCClient(
                self.node.ip, self.node.rpc_port + owner, self.cluster_id, self.node.id,
                self.lag_timeout * 4, source=self._source, secret=self._secret)
        except (rpc.RPCError, OSError) as err:
            raise NotLeader(f"{topic}-{partition}: its owner worker {owner} is not "
                            f"reachable ({err})") from None
        try:
            status, text = client.publish(topic, partition, packed)
        except (rpc.RPCError, OSError) as err:
            client.close()
            raise TopicError(f"{topic}-{partition}: forwarding to worker {owner} failed "
                             f"({err})") from None
        idle.append(client)
        if status == rpc.NOT_LEADER:
            raise NotLeader(text)
        if status != rpc.OK:
            raise TopicError(text)

    def on_publish(self, topic, partition, records):
        """PUBLISH from another worker of this node: append as a PUB would (the gate
        replicates and waits) -> (status, text)."""
        part = self.host.partition(topic, partition)
        if part is None:
            return rpc.NOT_LEADER, f"{topic}-{partition} is not owned by this worker"
        try:
            part.append(records)
        except NotLeader as err:
            return rpc.NOT_LEADER, str(err)
        except (TopicError, ValueError, OSError) as err:
            return rpc.FAILED, str(err)
        return rpc.OK, ""
