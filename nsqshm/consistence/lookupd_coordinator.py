"""nsqlookupd in cluster mode (Youzan's NsqLookupCoordinator, nsqlookup_coordinator.go):
its registration in etcd, the master campaign (master.py), topic creation with the
partitions placed on the live nsqd nodes (placement.py), and the partition leaders
for `/lookup?access=w`.

Any nsqlookupd can create a topic: the creation is one etcd transaction that fails
when the topic exists, so two concurrent creations cannot both succeed.  Elections
are run by the ISR members themselves (nsqd_coordinator.py) as etcd transactions;
an operator's move (`/topic/partition/move`) is a MoveRequest key the
partition's leader carries out; the master puts one itself for a replica whose node
has been gone too long (migrator.py), and moves everything off a node an operator
removes (`/cluster/node/remove`), and hands leaderships back to their preferred
leaders (Kafka's preferred replica election).  Balancing by load is not built.
"""

import time

import gevent

from nsqshm.consistence.errors import CoordinationError, NodeNotFound, TopicNotFound
from nsqshm.consistence.etcd.session import EtcdSession
from nsqshm.consistence.master import Master
from nsqshm.consistence.migrator import Migrator
from nsqshm.consistence.options import endpoints
from nsqshm.consistence.topology import MoveRequest, NodeInfo, TopicMeta, Topology

RETRY = 0.5
MOVE_WAIT = 70.0  # s: the leader's MOVE_TIMEOUT for the catch-up, the hand-off, the election
MOVE_POLL = 0.1


class LookupdCoordinator:
    def __init__(self, opts, logf, tcp_port, http_port, version=""):
        self.opts = opts
        self.logf = logf
        ip = opts.broadcast_address
        self.node = NodeInfo(id=f"{ip}:{http_port}", ip=ip, tcp_port=tcp_port,
                             http_port=http_port, version=version)
        self.session = EtcdSession(endpoints(opts), ttl=max(2, round(opts.cluster_lease_ttl)))
        self.topology = Topology(self.session, opts.cluster_id)
        self.master = Master(self.topology, self.node, self._master_changed)
        self.migrator = Migrator(self.topology, lambda: self.master.is_master, logf,
                                 opts.lost_replica_wait, opts.lost_replica_urgent_wait,
                                 opts.leader_rebalance_wait)
        self._loop = None

    def start(self):
        self._loop = gevent.spawn(self._run)
        return self

    def _run(self):
        while True:
            try:
                self.session.start()
                self.topology.register_lookupd(self.node)
                self.master.start()
                self.migrator.start()
                return
            except CoordinationError as err:
                self.logf("warn", f"cluster: etcd not reachable yet ({err}); retrying")
                gevent.sleep(RETRY)

    def close(self):
        if self._loop is not None:
            self._loop.kill(block=False)
        self.migrator.stop()
        try:
            self.master.stop()
        except CoordinationError:
            pass
        self.session.close()

    def _master_changed(self, master):
        self.logf("info", f"cluster: master nsqlookupd is {master.id if master else 'nobody'}")
        self.migrator.wake()

    # -- topics -----------------------------------------------------------------------

    def create_topic(self, topic, partition_num, replicator, sync_every=0, ordered=False,
                     ext=False, retention_days=0, retention_bytes=-1):
        """The topic's meta and partitions in etcd, placed on the live nodes.  ValueError
        (not enough nodes, bad counts), TopicExists, CoordinationError.  -> placement.
        ordered: Youzan's orderedmulti (SUB_ORDERED only, PUB by partition); ext: its
        extend (messages with headers); retention_days: its RetentionDay (0: none);
        retention_bytes: nsqshm's, what each partition's log keeps at most (-1: none)."""
        meta = TopicMeta(partition_num=partition_num, replica=replicator, sync_every=sync_every,
                         ordered_multi=ordered, ext=ext, retention_day=retention_days,
                         retention_bytes=retention_bytes)
        placement = self.topology.create_topic_on_live_nodes(topic, meta)
        self.logf("info", f"cluster: topic {topic} created: {partition_num} partitions x "
                          f"{replicator} replicas on {placement}")
        return placement

    def delete_topic(self, topic):
        """Youzan's `/topic/delete?partition=**`: every key of the topic leaves etcd
        (one delete of its prefix); each node holding a replica sees its meta go and
        deletes its log (NsqdCoordinator._sync_topics).  -> whether it was there."""
        deleted = self.topology.delete_topic(topic)
        if deleted:
            self.logf("info", f"cluster: topic {topic} deleted")
        return bool(deleted)

    def move_partition(self, topic, partition, move_leader, from_, to):
        """Youzan's `/topic/partition/move`: `to` takes `from_`'s replica of the
        partition (catching up first), or with move_leader its leadership.  The
        partition's leader carries the move out; this waits until it is done.
        ValueError (Youzan's texts) when refused or given up; TimeoutError;
        TopicNotFound; CoordinationError.  -> the PartitionState after."""
        state = self.topology.partition(topic, partition)
        replicas = state.replicas
        leader = state.leader or replicas.leader
        if from_ == to:
            raise ValueError("move to and from node can not be the same")
        if move_leader and from_ != leader:
            raise ValueError("move from not the topic leader")
        if not move_leader:
            if from_ == leader:
                raise ValueError("can not move leader without moveleader param")
            if from_ not in replicas.isr:
                raise ValueError("the move source node has no replica for the topic")
            if to in replicas.isr:
                raise ValueError("the move destination has the topic data already")
        live = {node.id for node in self.topology.nodes()}
        if to not in live:
            raise ValueError("the move destination is not found in cluster")
        if to in self.topology.removing_nodes():
            raise ValueError("the move destination is being removed from the cluster")
        if from_ not in live:
            raise ValueError("the move source data is lost in cluster")
        if state.leader_session is None:
            raise ValueError("the partition has no leader now: no move until one is elected")
        revision = self.topology.request_move(state, MoveRequest(from_, to, move_leader))
        if not revision:
            raise ValueError("another balance is running, should wait")
        self.logf("info", f"cluster: {topic}-{partition}: moving "
                          f"{'the leadership' if move_leader else 'a replica'} "
                          f"from {from_} to {to}")
        deadline = time.monotonic() + MOVE_WAIT
        while True:
            state = self.topology.partition(topic, partition)
            if state.move is None or state.move.create_revision != revision:
                if move_leader and state.leader == to:
                    return state
                if not move_leader and to in state.replicas.isr \
                        and from_ not in (*state.replicas.isr, *state.replicas.catchup):
                    return state
                # the leader hands off in three writes: `to` designated, the move ended,
                # its leadership resigned; between the last two it still leads
                handed = state.leader_session is None or (state.replicas.leader == to
                                                          and state.leader == from_)
                if state.move is None and move_leader and handed \
                        and time.monotonic() < deadline:
                    gevent.sleep(MOVE_POLL)  # handed off: the election runs
                    continue
                raise ValueError(f"the move was given up by the partition's leader "
                                 f"{leader} (its log says why); leader now "
                                 f"{state.leader or 'none'}, ISR {list(state.replicas.isr)}")
            if time.monotonic() > deadline:  # withdrawn: the next move is not refused
                self.topology.end_move(topic, partition, state.move)
                raise TimeoutError("timeout waiting move data")
            gevent.sleep(MOVE_POLL)

    # -- nodes an operator removes (migrator.py carries it out) ----------------------

    def remove_node(self, node_id, restore=False):
        """Youzan's `/cluster/node/remove`: mark the nsqd node for removal (the master
        moves its leaderships and replicas off it), or with `restore` call that off.
        NodeNotFound when the node is neither registered nor holds a replica (or, to
        restore, is not marked).  A restore does not withdraw a move already put: the
        leader carries it out.  -> its removal state."""
        if restore:
            if not self.topology.unmark_removing(node_id):
                raise NodeNotFound("the node is not being removed")
            self.logf("info", f"cluster: node {node_id}: its removal called off")
            return ""
        marked = self.topology.removing_nodes()
        if node_id in marked:
            return marked[node_id]
        if node_id not in {node.id for node in self.topology.nodes()} \
                and node_id not in self.replica_counts():
            raise NodeNotFound("the node is not found in cluster")
        self.topology.mark_removing(node_id)
        self.logf("info", f"cluster: node {node_id} marked for removal")
        return self.topology.removing_nodes().get(node_id, "")

    def replica_counts(self):
        """{node ID: (partitions it leads, partitions it holds a replica of)}."""
        counts = {}
        for topic in self.topology.topics():
            try:
                states = self.topology.partitions(topic)
            except TopicNotFound:
                continue  # deleted meanwhile
            for state in states:
                for node in dict.fromkeys((*state.replicas.isr, *state.replicas.catchup)):
                    leads, holds = counts.get(node, (0, 0))
                    counts[node] = (leads + (node == state.leader), holds + 1)
        return counts

    def cluster_nodes(self):
        """The registered nsqd nodes and those that hold replicas or are being removed:
        [(node ID, NodeInfo or None when not registered, leads, holds, removal state)]."""
        live = {node.id: node for node in self.topology.nodes()}
        removing = self.topology.removing_nodes()
        counts = self.replica_counts()
        ids = sorted({*live, *removing, *counts})
        return [(n, live.get(n), *counts.get(n, (0, 0)), removing.get(n, "")) for n in ids]

    def topic_layout(self, topic):
        """(TopicMeta, [PartitionState]) -- TopicNotFound when it is not in etcd."""
        return self.topology.topic_meta(topic), self.topology.partitions(topic)
