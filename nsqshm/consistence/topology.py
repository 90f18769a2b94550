"""The cluster's metadata in etcd, after Youzan's layout (youzan/nsq consistence/:
nsqd_node_etcd.go, nsq_lookupd_etcd.go; keys and JSON field names as there, on the
v3 API instead of v2):

    /NSQMetaData/<cluster-id>/
        NsqdNodes/Node-<id>                       NodeInfo JSON, on the node's lease
        NsqlookupdInfo/NsqlookupdNodes/Node-<id>  NodeInfo JSON of an nsqlookupd, leased
        NsqlookupdInfo/RemovingNodes/Node-<id>    nsqshm's: {"State": ...}, an nsqd node
                                                  an operator removes (Youzan's
                                                  removingNodes, kept in etcd here)
        Topics/<topic>/TopicMeta                  TopicMeta JSON (partitions, replicas, ...)
        Topics/<topic>/<partition>/ReplicaInfo    ReplicaInfo JSON: Leader, ISR, CatchupList
        Topics/<topic>/<partition>/LeaderSession  LeaderSession JSON, on the leader's lease
        Topics/<topic>/<partition>/MoveRequest    nsqshm's: MoveRequest JSON, an operator's
                                                  move the partition's leader carries out
        Topics/<topic>/DeletedChannels/<partition>  nsqshm's: {"Channels": [...]}, the
                                                  channels its leaders deleted (outside the
                                                  partition's prefix: no role watch fires)

A partition's **epoch** is the mod_revision of its ReplicaInfo key, as Youzan's is
the key's ModifiedIndex: every change of leader or ISR is a compare-and-set on it, so
each change makes a new, larger epoch and a writer holding an older one is refused.
The LeaderSession key lives on the leader node's lease: it vanishes when the leader
dies or is cut off from etcd longer than the TTL, which is what allows an election
(leadership.py).
"""

import json
import logging
import re
from collections import Counter
from dataclasses import asdict, dataclass, field

from nsqshm.consistence.errors import InvalidName, NodeRemoving, TopicExists, TopicNotFound
from nsqshm.consistence.etcd.txn import Compare, Op
from nsqshm.consistence.options import MAX_WORKERS
from nsqshm.consistence.placement import spread
from nsqshm.nsqd.names import is_ephemeral, is_valid_name

ROOT = "/NSQMetaData"
NODE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
CLUSTER_ID = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
MAX_PARTITIONS = 1024
# a removed node's states (Youzan's): marked by the operator; pending while it holds
# replicas; data_transferred once it holds none (it can be stopped: its mark goes
# when its registration does)
REMOVE_MARKED, REMOVE_PENDING, REMOVE_DONE = "marked", "pending", "data_transferred"
REMOVE_STATES = (REMOVE_MARKED, REMOVE_PENDING, REMOVE_DONE)
log = logging.getLogger("nsqshm.consistence")
# what reading a key that is not one of ours raises (a name with "/" is InvalidName,
# a ValueError; a value of another shape any of the others): its readers leave it out
UNREADABLE = (ValueError, KeyError, TypeError, AttributeError)


def check_topic(topic):
    # nsqd's names cannot hold "/", so a topic cannot reach outside its own key prefix
    if not isinstance(topic, str) or not is_valid_name(topic) or is_ephemeral(topic):
        raise InvalidName(f"bad topic name {topic!r} (ephemeral topics are not replicated)")
    return topic


def check_node_id(node_id):
    if not isinstance(node_id, str) or not NODE_ID.match(node_id):
        raise InvalidName(f"bad node ID {node_id!r}")
    return node_id


def check_partition(partition):
    if not isinstance(partition, int) or isinstance(partition, bool) \
            or not 0 <= partition < MAX_PARTITIONS:
        raise InvalidName(f"bad partition {partition!r}")
    return partition


def _nodes_of(kvs):
    nodes = []
    for kv in kvs:
        try:
            nodes.append(NodeInfo.from_json(json.loads(kv.value)))
        except UNREADABLE:
            log.warning("etcd: %s does not hold a node; left out", kv.key)
    return nodes


@dataclass(frozen=True)
class NodeInfo:
    """An nsqd (or nsqlookupd) of the cluster: Youzan's NsqdNodeInfo."""
    id: str
    ip: str
    tcp_port: int = 0
    http_port: int = 0
    rpc_port: int = 0
    version: str = ""
    # nsqshm's: worker k of the node takes replication on rpc_port + k (the partition
    # owner's); "Workers" is written only when more than one (Youzan's fields otherwise)
    workers: int = 1

    def to_json(self):
        d = {"ID": self.id, "NodeIP": self.ip, "TcpPort": str(self.tcp_port),
             "HttpPort": str(self.http_port), "RpcPort": str(self.rpc_port),
             "Version": self.version}
        if self.workers != 1:
            d["Workers"] = self.workers
        return d

    @classmethod
    def from_json(cls, d):
        """ValueError (or InvalidName) for a value that is not a node's: an ID that
        is not one, ports outside 0-65535, a worker count outside 1-MAX_WORKERS."""
        if not isinstance(d, dict):
            raise ValueError(f"a node's value is a JSON object, not {type(d).__name__}")
        node = cls(id=check_node_id(d.get("ID")), ip=str(d.get("NodeIP", "")),
                   tcp_port=int(d.get("TcpPort") or 0), http_port=int(d.get("HttpPort") or 0),
                   rpc_port=int(d.get("RpcPort") or 0), version=str(d.get("Version", "")),
                   workers=int(d["Workers"]) if "Workers" in d else 1)
        if not all(0 <= port <= 65535 for port in (node.tcp_port, node.http_port,
                                                   node.rpc_port + node.workers - 1)) \
                or not 1 <= node.workers <= MAX_WORKERS:
            raise ValueError(f"node {node.id}: bad ports or worker count")
        return node


@dataclass(frozen=True)
class TopicMeta:
    """A topic's settings: Youzan's TopicMetaInfo."""
    partition_num: int
    replica: int
    sync_every: int = 0
    retention_day: int = 0
    ordered_multi: bool = False
    ext: bool = False
    retention_bytes: int = -1  # nsqshm's (not in Youzan's meta): per partition, -1: none

    _NAMES = {"partition_num": "PartitionNum", "replica": "Replica", "sync_every": "SyncEvery",
              "retention_day": "RetentionDay", "ordered_multi": "OrderedMulti", "ext": "Ext",
              "retention_bytes": "RetentionBytes"}

    def to_json(self):
        return {self._NAMES[k]: v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, d):
        return cls(**{k: d[n] for k, n in cls._NAMES.items() if n in d})


@dataclass(frozen=True)
class ReplicaInfo:
    """Who holds a partition: Youzan's TopicPartitionReplicaInfo.  epoch is the key's
    mod_revision (not stored in the value); epoch_for_write counts leader changes, from
    the store's revision when the topic was made (Topology.create_topic).  preferred:
    nsqshm's "Preferred", Kafka's preferred replica -- the leader the placement chose
    (the node that took its replica's place after a move), to which the master hands
    the leadership back once it is in sync again (migrator.rebalance); "" in a key
    written without it: no rebalance."""
    leader: str
    isr: tuple
    catchup: tuple = ()
    epoch_for_write: int = 0
    epoch: int = 0
    preferred: str = ""

    def to_json(self):
        d = {"Leader": self.leader, "ISR": list(self.isr), "CatchupList": list(self.catchup),
             "EpochForWrite": self.epoch_for_write}
        if self.preferred:
            d["Preferred"] = self.preferred
        return d

    @classmethod
    def from_kv(cls, kv):
        d = json.loads(kv.value)
        preferred = d.get("Preferred")
        return cls(leader=d.get("Leader", ""), isr=tuple(d.get("ISR") or ()),
                   catchup=tuple(d.get("CatchupList") or ()),
                   epoch_for_write=int(d.get("EpochForWrite", 0)), epoch=kv.mod_revision,
                   preferred=preferred if isinstance(preferred, str)
                   and NODE_ID.match(preferred) else "")


@dataclass(frozen=True)
class LeaderSession:
    """The live leadership of a partition: Youzan's TopicLeaderSession.  Its key is on
    the leader's lease; create_revision tells one holding from the next."""
    topic: str
    partition: int
    leader: NodeInfo
    session: str  # the leader's lease ID in hex
    leader_epoch: int  # the ReplicaInfo's epoch_for_write it was elected at
    create_revision: int = 0

    def to_json(self):
        return {"Topic": self.topic, "Partition": self.partition,
                "LeaderNode": self.leader.to_json(), "Session": self.session,
                "LeaderEpoch": self.leader_epoch}

    @classmethod
    def from_kv(cls, kv):
        d = json.loads(kv.value)
        return cls(topic=d["Topic"], partition=int(d["Partition"]),
                   leader=NodeInfo.from_json(d["LeaderNode"]), session=d.get("Session", ""),
                   leader_epoch=int(d.get("LeaderEpoch", 0)), create_revision=kv.create_revision)


@dataclass(frozen=True)
class MoveRequest:
    """An operator's move of a partition (nsqlookupd's `/topic/partition/move`, after
    Youzan's): `to` joins the replicas (catching up first), then `from_` leaves them;
    with `leader`, `from_` is the leader and hands its leadership to `to`.  The
    partition's leader carries it out (replicator.py) and deletes the key when done
    or given up; create_revision tells one request from the next."""
    from_: str
    to: str
    leader: bool
    create_revision: int = 0

    def to_json(self):
        return {"From": self.from_, "To": self.to, "Leader": self.leader}

    @classmethod
    def from_kv(cls, kv):
        d = json.loads(kv.value)
        return cls(from_=check_node_id(d["From"]), to=check_node_id(d["To"]),
                   leader=bool(d.get("Leader")), create_revision=kv.create_revision)


@dataclass(frozen=True)
class PartitionState:
    """A partition as read at one revision: its replicas and its live leader, if any."""
    topic: str
    partition: int
    replicas: ReplicaInfo
    leader_session: LeaderSession | None = None
    revision: int = 0  # the store revision the state was read at
    move: MoveRequest | None = None  # a move under way

    @property
    def epoch(self):
        return self.replicas.epoch

    @property
    def leader(self):
        """The node ID of the live leader, or "" while there is none."""
        return self.leader_session.leader.id if self.leader_session is not None else ""


@dataclass
class Keys:
    """The key layout of one cluster (drawn at the top of this module)."""
    cluster_id: str
    root: str = field(init=False)

    def __post_init__(self):
        if not CLUSTER_ID.match(self.cluster_id):
            raise InvalidName(f"bad cluster ID {self.cluster_id!r}")
        self.root = f"{ROOT}/{self.cluster_id}/"

    def nodes(self):
        return self.root + "NsqdNodes/"

    def node(self, node_id):
        return self.nodes() + "Node-" + check_node_id(node_id)

    def lookupd_nodes(self):
        return self.root + "NsqlookupdInfo/NsqlookupdNodes/"

    def lookupd_node(self, node_id):
        return self.lookupd_nodes() + "Node-" + check_node_id(node_id)

    def removing_nodes(self):
        return self.root + "NsqlookupdInfo/RemovingNodes/"

    def removing_node(self, node_id):
        return self.removing_nodes() + "Node-" + check_node_id(node_id)

    def topics(self):
        return self.root + "Topics/"

    def topic(self, topic):
        return self.topics() + check_topic(topic) + "/"

    def topic_meta(self, topic):
        return self.topic(topic) + "TopicMeta"

    def partition(self, topic, partition):
        return self.topic(topic) + str(check_partition(partition)) + "/"

    def replica_info(self, topic, partition):
        return self.partition(topic, partition) + "ReplicaInfo"

    def leader_session(self, topic, partition):
        return self.partition(topic, partition) + "LeaderSession"

    def move_request(self, topic, partition):
        return self.partition(topic, partition) + "MoveRequest"

    def deleted_channels(self, topic, partition):
        return self.topic(topic) + "DeletedChannels/" + str(check_partition(partition))


class Topology:
    """Reads and writes the layout above through one EtcdSession."""

    def __init__(self, session, cluster_id):
        self.session = session
        self.keys = Keys(cluster_id)

    # -- nodes -----------------------------------------------------------------------

    def register_node(self, node):
        """The node's key on the session's lease (put again under a new lease)."""
        return self.session.keep(self.keys.node(node.id), json.dumps(node.to_json()))

    def unregister_node(self, node_id):
        return self.session.forget(self.keys.node(node_id))

    def nodes(self):
        """The live nsqd nodes, by ID (a value that is not a node's left out)."""
        return _nodes_of(self.session.get_prefix(self.keys.nodes()))

    def register_lookupd(self, node):
        return self.session.keep(self.keys.lookupd_node(node.id), json.dumps(node.to_json()))

    def lookupd_nodes(self):
        return _nodes_of(self.session.get_prefix(self.keys.lookupd_nodes()))

    # -- nodes an operator removes (`/cluster/node/remove`, migrator.py) --------------

    def mark_removing(self, node_id):
        """Mark the node for removal (state "marked") unless it is already.  -> whether
        it was marked now."""
        key = self.keys.removing_node(node_id)
        result = self.session.txn([Compare.absent(key)],
                                  [Op.put(key, json.dumps({"State": REMOVE_MARKED}))])
        return result.succeeded

    def removing_nodes(self):
        """{node ID: removal state} (REMOVE_STATES; another value reads as marked)."""
        prefix = self.keys.removing_nodes() + "Node-"
        out = {}
        for kv in self.session.get_prefix(prefix):
            node_id = kv.key[len(prefix):]
            if not NODE_ID.match(node_id):
                continue  # (not one of ours: ignored, as an unknown key)
            try:
                state = json.loads(kv.value).get("State")
            except (ValueError, AttributeError):
                state = None
            out[node_id] = state if state in REMOVE_STATES else REMOVE_MARKED
        return out

    def set_removing_state(self, node_id, state):
        """The removal's state, only while the node is still marked.  -> whether set."""
        key = self.keys.removing_node(node_id)
        result = self.session.txn([Compare.version(key, ">", 0)],
                                  [Op.put(key, json.dumps({"State": state}))])
        return result.succeeded

    def unmark_removing(self, node_id):
        """The node is no longer being removed (its removal done, or called off).
        -> whether it was marked."""
        return bool(self.session.delete(self.keys.removing_node(node_id)))

    # -- topics ----------------------------------------------------------------------

    def create_topic(self, topic, meta, placement):
        """The topic's meta and one ReplicaInfo per partition, in one transaction, only
        if the topic does not exist (else TopicExists).  placement[p] lists partition
        p's replicas, the first its intended leader; all start in the ISR (a new
        partition is empty, so every replica is in sync).  -> revision."""
        check_topic(topic)
        if len(placement) != meta.partition_num or meta.partition_num < 1:
            raise ValueError(f"{len(placement)} placements for {meta.partition_num} partitions")
        puts = [Op.put(self.keys.topic_meta(topic), json.dumps(meta.to_json()))]
        # write epochs start at the store's revision: above every epoch a topic of this
        # name had before (each election is a write, so an epoch never passes the
        # revision), so a late frame from a deleted topic's leader is refused as stale
        first_epoch = self.session.revision()
        for p, replicas in enumerate(placement):
            replicas = tuple(check_node_id(n) for n in replicas)
            if len(replicas) != meta.replica or len(set(replicas)) != len(replicas):
                raise ValueError(f"partition {p}: replicas {replicas} for replica={meta.replica}")
            info = ReplicaInfo(leader=replicas[0], isr=replicas, epoch_for_write=first_epoch,
                               preferred=replicas[0])
            puts.append(Op.put(self.keys.replica_info(topic, p), json.dumps(info.to_json())))
        # no replica on a node marked for removal meanwhile (the marks were read
        # before this transaction: create_topic_on_live_nodes)
        placed = sorted({n for replicas in placement for n in replicas})
        guards = [Compare.absent(self.keys.removing_node(n)) for n in placed]
        result = self.session.txn([Compare.absent(self.keys.topic_meta(topic)), *guards], puts)
        if not result.succeeded:
            if self.session.get(self.keys.topic_meta(topic)) is not None:
                raise TopicExists(topic)
            raise NodeRemoving(f"a node of {placement} is being removed")
        return result.revision

    def delete_topic(self, topic):
        """Every key of the topic.  -> how many were deleted."""
        return self.session.delete_prefix(self.keys.topic(topic))

    def topic_meta(self, topic):
        kv = self.session.get(self.keys.topic_meta(topic))
        if kv is None:
            raise TopicNotFound(topic)
        return TopicMeta.from_json(json.loads(kv.value))

    def topics(self):
        """The names of every topic with a meta key."""
        prefix = self.keys.topics()
        return sorted(kv.key[len(prefix):-len("/TopicMeta")]
                      for kv in self.session.get_prefix(prefix)
                      if kv.key.endswith("/TopicMeta"))

    def partition(self, topic, partition):
        """The partition's state, read at one revision (one range over its keys)."""
        kvs = self.session.get_prefix(self.keys.partition(topic, partition))
        return self.state_from(topic, partition, kvs)

    def partitions(self, topic):
        """Every partition's state, all read at one revision (one range)."""
        prefix = self.keys.topic(topic)
        by_partition = {}
        meta = None
        for kv in self.session.get_prefix(prefix):
            head, _, tail = kv.key[len(prefix):].partition("/")
            if head == "TopicMeta":
                meta = TopicMeta.from_json(json.loads(kv.value))
            elif head.isdigit() and tail:
                by_partition.setdefault(int(head), []).append(kv)
        if meta is None:
            raise TopicNotFound(topic)
        return [self.state_from(topic, p, by_partition.get(p, ()))
                for p in range(meta.partition_num)]

    def leaders(self, topic):
        """Per partition, its live leader's NodeInfo, or None while it has none: what
        nsqlookupd's `/lookup?access=w` names, so that clients write to the leader."""
        return [st.leader_session.leader if st.leader_session is not None else None
                for st in self.partitions(topic)]

    def load(self):
        """{node ID: (partitions it leads, copies it holds: ISR and catch-up)} over
        every topic's partitions, read at one revision (one range): what a new
        topic's placement balances (placement.spread)."""
        leads, holds = Counter(), Counter()
        prefix = self.keys.topics()
        for kv in self.session.get_prefix(prefix):
            if not kv.key.endswith("/ReplicaInfo"):
                continue
            try:
                info = ReplicaInfo.from_kv(kv)
            except UNREADABLE:
                continue  # (not one of ours: left out, as an unknown key)
            if info.leader:
                leads[info.leader] += 1
            for node in dict.fromkeys((*info.isr, *info.catchup)):
                holds[node] += 1
        return {node: (leads[node], holds[node]) for node in set(leads) | set(holds)}

    def create_topic_on_live_nodes(self, topic, meta, tries=3):
        """create_topic with its partitions spread over the nodes registered now, but
        those being removed (placed again if one is marked meanwhile), balancing
        what each already leads and holds (load)."""
        for attempt in range(tries):
            removing = self.removing_nodes()
            placement = spread([n.id for n in self.nodes() if n.id not in removing],
                               meta.partition_num, meta.replica, self.load())
            try:
                self.create_topic(topic, meta, placement)
                return placement
            except NodeRemoving:
                if attempt == tries - 1:
                    raise

    def state_from(self, topic, partition, kvs, revision=0):
        """A PartitionState from the KeyValues of the partition's prefix."""
        replicas = session = move = None
        for kv in kvs:
            if kv.key.endswith("/ReplicaInfo"):
                replicas = ReplicaInfo.from_kv(kv)
            elif kv.key.endswith("/LeaderSession"):
                session = LeaderSession.from_kv(kv)
            elif kv.key.endswith("/MoveRequest"):
                try:
                    move = MoveRequest.from_kv(kv)
                except (ValueError, KeyError, TypeError, InvalidName):
                    move = None  # (not one of ours: ignored, as an unknown key)
        if replicas is None:
            raise TopicNotFound(f"{topic} partition {partition}")
        return PartitionState(topic, partition, replicas, session, revision, move)

    # -- channels deleted on a partition's leader (replicator.py) ------------------------

    def deleted_channels(self, topic, partition):
        """The channel names the partition's leaders deleted (valid names only)."""
        kv = self.session.get(self.keys.deleted_channels(topic, partition))
        if kv is None:
            return set()
        try:
            names = json.loads(kv.value)["Channels"]
        except (ValueError, KeyError, TypeError):
            return set()  # (not one of ours: ignored, as an unknown key)
        return {n for n in names if isinstance(n, str) and is_valid_name(n)} \
            if isinstance(names, list) else set()

    def set_deleted_channels(self, topic, partition, names, leader_session):
        """Keep the tombstones, as the partition's leader whose session key has the
        create_revision `leader_session`: nothing is written once that session is
        gone (a deposed leader; a deleted topic, whose tombstones would be inherited by
        a topic made again under its name).  -> whether written."""
        key = self.keys.deleted_channels(topic, partition)
        op = Op.put(key, json.dumps({"Channels": sorted(names)})) if names else Op.delete(key)
        return self.session.txn(
            [Compare.create_revision(self.keys.leader_session(topic, partition), "=",
                                     leader_session)], [op]).succeeded

    # -- moves (an operator's, carried out by the partition's leader) ------------------

    def request_move(self, state, move):
        """Put a MoveRequest for the partition read as `state`: only if nobody changed
        its replicas since, no other move is under way and its destination is not being
        removed.  -> the request's revision
        (its create_revision), or 0 if not put."""
        topic, partition = state.topic, state.partition
        key = self.keys.move_request(topic, partition)
        result = self.session.txn(
            [Compare.mod_revision(self.keys.replica_info(topic, partition), "=", state.epoch),
             Compare.absent(key),
             # nothing moves to a node marked for removal (since the caller read the marks)
             Compare.absent(self.keys.removing_node(move.to))],
            [Op.put(key, json.dumps(move.to_json()))])
        return result.revision if result.succeeded else 0

    def end_move(self, topic, partition, move):
        """Delete the MoveRequest `move` (not a later one).  -> True if deleted."""
        key = self.keys.move_request(topic, partition)
        result = self.session.txn([Compare.create_revision(key, "=", move.create_revision)],
                                  [Op.delete(key)])
        return result.succeeded
