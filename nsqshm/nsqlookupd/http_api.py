"""nsqlookupd's HTTP API (nsqlookupd/http.go) on werkzeug and gevent.

Routing, V1 responses, error bodies and the access log are nsqd's
(nsqshm.nsqd.http_api: httprouter's 404/405/redirect/OPTIONS rules,
{"message":"TEXT"} errors, `X-NSQ-Content-Type: nsq; version=1.0`); only the
routes differ:

    GET  /ping /info /debug /lookup /topics /channels /nodes
    POST /topic/create /topic/delete /topic/tombstone /channel/create /channel/delete

and in cluster mode Youzan's `POST /topic/partition/move` and
`POST /cluster/node/remove`, and nsqshm's `GET /cluster/topic` (a topic's
partitions: leader, ISR, catch-up, epochs) and `GET /cluster/nodes` (each nsqd
node's leaderships, replicas and removal state);
there `/topic/create` and `/topic/delete` (with Youzan's `partition=**`) make
and delete the topic in etcd, and the nsqd nodes follow.

JSON objects that nsqlookupd builds from Go maps have their keys sorted, as
Go's encoder writes them; structs keep their field order.
"""

from nsqshm import NSQD_COMPAT_VERSION
from nsqshm.consistence.errors import (
    CoordinationError,
    InvalidName,
    NodeNotFound,
    TopicExists,
    TopicNotFound,
)
from nsqshm.consistence.topology import MAX_PARTITIONS, NODE_ID
from nsqshm.httpserver import HTTPServer
from nsqshm.nsqd.ext import wants_ext
from nsqshm.nsqd.http_api import HTTPAPI, Err, Route, Router, _App
from nsqshm.nsqd.logtopics.logtopic import (
    MAX_RETENTION_BYTES,
    MAX_RETENTION_DAYS,
    MAX_SYNC_EVERY,
)
from nsqshm.nsqd.names import is_ephemeral, is_valid_name
from nsqshm.nsqlookupd.registration_db import filter_by_active, filter_registrations, keys, subkeys
from nsqshm.nsqlookupd.topic_meta import TopicMeta
from nsqshm.youzan.go_strconv import atoi, parse_int
from nsqshm.youzan.http import HTTPError
from nsqshm.youzan.http import topic_create as youzan_topic_create
from nsqshm.youzan.lookup import NO_CHANNEL_FOR_WRITE, lookup_data, lookup_query

GO_ZERO_TIME_UNIX_NANO = -6795364578871345152  # time.Time{}.UnixNano(), overflowed as in Go


class LookupHTTPAPI(HTTPAPI):
    def __init__(self, lookupd):
        self.nsqd = lookupd  # HTTPAPI logs through .nsqd.log
        self.lookupd = lookupd
        self.db = lookupd.db
        self.topic_meta = TopicMeta()  # a standalone lookupd's Youzan `meta` (topic_meta.py)
        self.router = Router()
        add = self.router.add
        add(Route("GET", "/ping", self.ping, plain=True))
        add(Route("GET", "/info", self.info))
        add(Route("GET", "/debug", self.debug))
        add(Route("GET", "/lookup", self.lookup))
        add(Route("GET", "/topics", self.topics))
        add(Route("GET", "/channels", self.channels))
        add(Route("GET", "/nodes", self.nodes))
        add(Route("POST", "/topic/create", self.topic_create))
        add(Route("POST", "/topic/delete", self.topic_delete))
        add(Route("POST", "/channel/create", self.channel_create))
        add(Route("POST", "/channel/delete", self.channel_delete))
        add(Route("POST", "/topic/tombstone", self.topic_tombstone))
        add(Route("POST", "/topic/partition/move", self.topic_partition_move))
        add(Route("GET", "/cluster/topic", self.cluster_topic))
        add(Route("POST", "/cluster/node/remove", self.cluster_node_remove))
        add(Route("GET", "/cluster/nodes", self.cluster_nodes))
        add(Route("GET", "/listlookup", self.list_lookup))

    # -- helpers -----------------------------------------------------------------------

    def _arg(self, values, key, missing):
        """ReqParams.Get: the first value, or 400 `missing`."""
        found = values.get(key)
        if found is None:
            raise Err(400, missing)
        return found[0]

    def _topic_channel_args(self, values):
        """http_api.GetTopicChannelArgs."""
        topic = self._arg(values, "topic", "MISSING_ARG_TOPIC")
        if not is_valid_name(topic):
            raise Err(400, "INVALID_ARG_TOPIC")
        channel = self._arg(values, "channel", "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel):
            raise Err(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    def _req_params(self, req):
        """http_api.NewReqParams (HTTPAPI._params: the query, then the body read)."""
        return self._params(req)

    # -- endpoints -----------------------------------------------------------------------

    def ping(self, req):
        return "OK"

    def info(self, req):
        return {"version": NSQD_COMPAT_VERSION}

    def topics(self, req):
        return {"topics": keys(self.db.find_registrations("topic", "*", ""))}

    def channels(self, req):
        topic = self._arg(self._req_params(req), "topic", "MISSING_ARG_TOPIC")
        return {"channels": subkeys(self.db.find_registrations("channel", topic, "*"))}

    def lookup(self, req):
        values = self._req_params(req)
        topic = self._arg(values, "topic", "MISSING_ARG_TOPIC")
        if self.lookupd.coordinator is not None:
            layout = self._cluster_layout(topic)
            if layout is not None:
                return self._cluster_lookup(topic, *layout)
        if not self.db.find_registrations("topic", topic, ""):
            raise Err(404, "TOPIC_NOT_FOUND")
        channels = subkeys(self.db.find_registrations("channel", topic, "*"))
        opts = self.lookupd.opts
        if "access" in values or "metainfo" in values:
            return self._partitioned_lookup(topic, values, channels)
        producers = filter_by_active(self.db.find_producers("topic", topic, ""),
                                     opts.inactive_producer_timeout, opts.tombstone_lifetime)
        return {"channels": channels, "producers": [p.peer_info.to_json() for p in producers]}

    def _partitioned_lookup(self, topic, values, channels):
        """Youzan's lookup (a request with `access` or `metainfo`, as Youzan's
        go-nsq sends; youzan.lookup's codec): `partitions` maps each partition
        of a log topic to the nsqd holding it; `producers` the nsqds (those of
        `partition` alone when given).  access=w leaves tombstoned producers
        out, access=r keeps them (Youzan's: readers drain a node being
        emptied).  With metainfo, a log topic's `meta` (partition count, ext)
        as an nsqd holding it says (topic_meta.py; Youzan's standalone lookupd
        has none to give).  Unless --allow-write-with-nochannels, access=w
        also leaves out a node with no channel of the topic, and answers 404
        when that left nothing (Youzan's doLookup: a writer should not fill a
        topic nobody reads)."""
        try:
            query = lookup_query(values)
        except HTTPError as err:
            raise Err(err.status, err.text) from None
        opts = self.lookupd.opts
        tombstones = opts.tombstone_lifetime if query.access == "w" else 0
        # (a tombstone is set on the topic's producer: it rules its partitions too)
        active = {p.peer_info.id: p for p in filter_by_active(
            self.db.find_producers("topic", topic, ""), opts.inactive_producer_timeout,
            tombstones)}
        no_channels = set()
        if query.access == "w" and not opts.allow_write_with_nochannels:
            readers = {p.peer_info.id for reg in self.db.find_registrations("channel", topic, "*")
                       for p in self.db.find_producers(*reg)}
            no_channels = {peer_id for peer_id in active if peer_id not in readers}
            for peer_id in no_channels:
                del active[peer_id]
        partitions = {}
        holders = {}
        for reg in self.db.find_registrations("partition", topic, query.partition):
            for p in self.db.find_producers(*reg):
                if p.peer_info.id in active:
                    partitions.setdefault(reg[2], p.peer_info.to_json())
                    holders.setdefault(p.peer_info.id, active[p.peer_info.id])
        found = active.values() if query.partition == "*" else holders.values()
        if no_channels and not partitions and not found:
            raise Err(*NO_CHANNEL_FOR_WRITE)
        meta = None
        if query.metainfo and self.db.find_registrations("partition", topic, "*"):
            live = {p.peer_info.id for p in filter_by_active(
                self.db.find_producers("topic", topic, ""), opts.inactive_producer_timeout, 0)}
            peers = {p.peer_info.id: p.peer_info
                     for reg in self.db.find_registrations("partition", topic, "*")
                     for p in self.db.find_producers(*reg) if p.peer_info.id in live}
            meta = self.topic_meta.get(topic, list(peers.values()))
        return lookup_data(channels, [p.peer_info.to_json() for p in found], partitions, meta)

    def topic_create(self, req):
        values = self._req_params(req)
        topic = self._arg(values, "topic", "MISSING_ARG_TOPIC")
        if not is_valid_name(topic):
            raise Err(400, "INVALID_ARG_TOPIC")
        if self.lookupd.coordinator is not None:
            return self._cluster_topic_create(topic, values)
        self._log("info", f"DB: adding topic({topic})")
        self.db.add_registration(("topic", topic, ""))

    # -- cluster mode (consistence/lookupd_coordinator.py) ----------------------------

    def _cluster_topic_create(self, topic, values):
        """Youzan's: partition_num and replicator (and syncdisk, retention in days,
        orderedmulti, ext; nsqshm's retention_bytes, as nsqd's own); the layout goes to etcd and every nsqd holding a replica
        makes its partitions from there."""
        if is_ephemeral(topic):
            raise Err(400, "INVALID_ARG_TOPIC")  # an ephemeral topic is not replicated
        try:  # doCreateTopic's checks, in its order, with Go's strconv (youzan/http.py)
            want = youzan_topic_create({k: v for k, v in values.items()
                                        if k != "retention_bytes"})
        except HTTPError as err:
            raise Err(err.status, err.text) from None
        if not 0 <= want.sync_disk <= MAX_SYNC_EVERY:
            raise Err(400, "INVALID_ARG_TOPIC_SYNC_DISK")
        if want.retention_days > MAX_RETENTION_DAYS:
            raise Err(400, "INVALID_ARG_TOPIC_RETENTION")
        size = values.get("retention_bytes", [""])[0] or "-1"  # nsqshm's, as nsqd's own
        try:
            size = parse_int(size)
        except ValueError:
            size = 0
        if size != -1 and not 0 < size <= MAX_RETENTION_BYTES:
            raise Err(400, "INVALID_RETENTION")
        # (suggestload is checked, as Youzan's, and not used: placement.py balances the
        # partitions each node leads and holds)
        try:
            self.lookupd.coordinator.create_topic(
                topic, want.partition_num, want.replicator, sync_every=want.sync_disk,
                ordered=want.ordered_multi, ext=wants_ext(values),
                retention_days=want.retention_days, retention_bytes=size)
        except TopicExists:
            raise Err(400, "TOPIC_EXISTS") from None
        except ValueError as err:  # fewer live nodes than replicas
            raise Err(400, f"E_NOT_ENOUGH_NODES {err}") from None
        except CoordinationError as err:
            raise Err(500, f"E_CLUSTER {err}") from None

    def _cluster_topic_delete(self, topic, values):
        """Youzan's for a topic in etcd: every partition at once (partition=**); its
        keys leave etcd and every node holding a replica deletes its log
        (nsqd_coordinator.py).  A topic not in etcd (a classic topic's registrations,
        an ephemeral one) is deleted as a standalone nsqlookupd does (the caller)."""
        partition = values.get("partition", [""])[0]
        if partition and partition != "**":
            raise Err(400, "REMOVE_SINGLE_PARTITION_NOT_ALLOWED")
        if not is_valid_name(topic) or is_ephemeral(topic) or self._cluster_layout(topic) is None:
            return
        if not partition:
            raise Err(400, "MISSING_ARG_TOPIC_PARTITION")
        self._log("warn", f"removing all the partitions of topic: {topic}")
        try:
            self.lookupd.coordinator.delete_topic(topic)
        except CoordinationError as err:
            raise Err(500, f"E_CLUSTER {err}") from None

    def _cluster_layout(self, topic):
        try:
            return self.lookupd.coordinator.topic_layout(topic)
        except (TopicNotFound, InvalidName):
            return None
        except CoordinationError as err:
            raise Err(500, f"E_CLUSTER {err}") from None

    def _cluster_lookup(self, topic, meta, states):
        """Youzan's lookup answer: per partition its live leader (what a writer
        connects to), the producers the leaders, meta the partition count."""
        partitions = {}
        for state in states:
            if state.leader_session is not None:
                partitions[str(state.partition)] = _peer(state.leader_session.leader)
        producers = {p["broadcast_address"] + ":" + str(p["tcp_port"]): p
                     for p in partitions.values()}
        channels = subkeys(self.db.find_registrations("channel", topic, "*"))
        return {"channels": channels,
                "meta": {"partition_num": meta.partition_num, "replica": meta.replica},
                "partitions": partitions, "producers": list(producers.values())}

    def list_lookup(self, req):
        """Youzan's GET /listlookup (doListLookup), which youzan/go-nsq polls:
        the cluster's nsqlookupd nodes as etcd has them, and the master; a
        standalone lookupd answers nothing (200, no data), as Youzan's."""
        coordinator = self.lookupd.coordinator
        if coordinator is None:
            return None
        try:
            nodes = coordinator.topology.lookupd_nodes()
        except CoordinationError as err:
            raise Err(500, f"E_CLUSTER {err}") from None
        master = coordinator.master.master
        return {"lookupdnodes": [n.to_json() for n in nodes],
                "lookupdleader": master.to_json() if master is not None else {}}

    def _coordinator(self):
        if self.lookupd.coordinator is None:
            raise Err(500, "MISSING_COORDINATOR")
        return self.lookupd.coordinator

    def topic_partition_move(self, req):
        """Youzan's: topic, partition, move_leader=true|false, move_from, move_to
        (node IDs); answers once the move is done."""
        coordinator = self._coordinator()
        values = self._req_params(req)
        topic = self._arg(values, "topic", "MISSING_ARG_TOPIC")
        raw = self._arg(values, "partition", "MISSING_ARG_TOPIC_PARTITION")
        try:  # (Youzan's strconv.Atoi; ASCII digits only)
            partition = atoi(raw)
        except ValueError:
            partition = -1
        if not 0 <= partition < MAX_PARTITIONS:
            raise Err(400, "INVALID_ARG_TOPIC_PARTITION_NUM")
        move_leader = values.get("move_leader", [""])[0] == "true"
        ends = [values.get(k, [""])[0] for k in ("move_from", "move_to")]
        if not all(NODE_ID.match(n) for n in ends):
            raise Err(400, "INVALID_ARG_NODE")
        try:
            coordinator.move_partition(topic, partition, move_leader, *ends)
        except (TopicNotFound, InvalidName):
            raise Err(404, "TOPIC_NOT_FOUND") from None
        except ValueError as err:
            raise Err(400, str(err)) from None
        except TimeoutError as err:
            raise Err(500, str(err)) from None
        except CoordinationError as err:
            raise Err(500, f"E_CLUSTER {err}") from None

    def cluster_node_remove(self, req):
        """Youzan's: remove_node=<node ID> marks the nsqd node for removal; the master
        moves its leaderships and replicas off it (consistence/migrator.py).  nsqshm's
        restore=true calls the removal off.  -> {"node", "state"}."""
        coordinator = self._coordinator()
        values = self._req_params(req)
        node = self._arg(values, "remove_node", "MISSING_ARG_NODE")
        if not NODE_ID.match(node):
            raise Err(400, "INVALID_ARG_NODE")
        try:
            state = coordinator.remove_node(node, values.get("restore", [""])[0] == "true")
        except NodeNotFound as err:
            raise Err(404, str(err)) from None
        except CoordinationError as err:
            raise Err(500, f"E_CLUSTER {err}") from None
        return {"node": node, "state": state}

    def cluster_nodes(self, req):
        """nsqshm's: every nsqd node of the cluster (registered, holding replicas, or
        being removed) with the partitions it leads and holds and its removal state
        ("" when not being removed; "marked", "pending", "data_transferred")."""
        coordinator = self._coordinator()
        try:
            nodes = coordinator.cluster_nodes()
        except CoordinationError as err:
            raise Err(500, f"E_CLUSTER {err}") from None
        return {"nodes": [{"id": node_id, "registered": info is not None,
                           **(_peer(info) if info is not None else {}),
                           "leaders": leads, "replicas": holds, "removing": removing}
                          for node_id, info, leads, holds, removing in nodes]}

    def cluster_topic(self, req):
        """A topic's layout as etcd has it, with the nodes it names: what nsqadmin
        shows (each partition's leader, ISR, catch-up, a move under way)."""
        coordinator = self._coordinator()
        topic = self._arg(self._req_params(req), "topic", "MISSING_ARG_TOPIC")
        try:
            meta, states = coordinator.topic_layout(topic)
            nodes = coordinator.topology.nodes()
        except (TopicNotFound, InvalidName):
            raise Err(404, "TOPIC_NOT_FOUND") from None
        except CoordinationError as err:
            raise Err(500, f"E_CLUSTER {err}") from None
        named = {n for st in states
                 for n in (st.leader, *st.replicas.isr, *st.replicas.catchup) if n}
        return {"topic": topic,
                "meta": {"partition_num": meta.partition_num, "replica": meta.replica,
                         "sync_every": meta.sync_every},
                "partitions": [_layout(st) for st in states],
                "nodes": [{"id": n.id, **_peer(n)} for n in nodes if n.id in named]}

    def topic_delete(self, req):
        values = self._req_params(req)
        topic = self._arg(values, "topic", "MISSING_ARG_TOPIC")
        if self.lookupd.coordinator is not None:
            self._cluster_topic_delete(topic, values)
        for reg in self.db.find_registrations("partition", topic, "*"):
            self.db.remove_registration(reg)
        for reg in self.db.find_registrations("channel", topic, "*"):
            self._log("info", f"DB: removing channel({reg[2]}) from topic({topic})")
            self.db.remove_registration(reg)
        for reg in self.db.find_registrations("topic", topic, ""):
            self._log("info", f"DB: removing topic({topic})")
            self.db.remove_registration(reg)

    def topic_tombstone(self, req):
        values = self._req_params(req)
        topic = self._arg(values, "topic", "MISSING_ARG_TOPIC")
        node = self._arg(values, "node", "MISSING_ARG_NODE")
        self._log("info", f"DB: setting tombstone for producer@{node} of topic({topic})")
        for producer in self.db.find_producers("topic", topic, ""):
            peer = producer.peer_info
            if f"{peer.broadcast_address}:{peer.http_port}" == node:
                producer.tombstone()

    def channel_create(self, req):
        topic, channel = self._topic_channel_args(self._req_params(req))
        self._log("info", f"DB: adding channel({channel}) in topic({topic})")
        self.db.add_registration(("channel", topic, channel))
        self._log("info", f"DB: adding topic({topic})")
        self.db.add_registration(("topic", topic, ""))

    def channel_delete(self, req):
        topic, channel = self._topic_channel_args(self._req_params(req))
        regs = self.db.find_registrations("channel", topic, channel)
        if not regs:
            raise Err(404, "CHANNEL_NOT_FOUND")
        self._log("info", f"DB: removing channel({channel}) from topic({topic})")
        for reg in regs:
            self.db.remove_registration(reg)

    def nodes(self, req):
        opts = self.lookupd.opts
        # tombstoned nodes are not filtered out
        producers = filter_by_active(self.db.find_producers("client", "", ""),
                                     opts.inactive_producer_timeout, 0)
        by_topic = {}
        nodes = []
        for p in producers:
            peer = p.peer_info
            topics = keys(filter_registrations(self.db.lookup_registrations(peer.id),
                                               "topic", "*", ""))
            tombstones = [False] * len(topics)
            for j, topic in enumerate(topics):
                if topic not in by_topic:
                    by_topic[topic] = self.db.find_producers("topic", topic, "")
                for tp in by_topic[topic]:
                    if tp.peer_info is peer:
                        tombstones[j] = tp.is_tombstoned(opts.tombstone_lifetime)
                        break
            nodes.append({
                "remote_address": peer.remote_address,
                "hostname": peer.hostname,
                "broadcast_address": peer.broadcast_address,
                "tcp_port": peer.tcp_port,
                "http_port": peer.http_port,
                "version": peer.version,
                "tombstones": tombstones,
                "topics": topics,
            })
        return {"producers": nodes}

    def debug(self, req):
        data = {}
        for reg, producers in self.db.registrations.items():
            key = f"{reg[0]}:{reg[1]}:{reg[2]}"
            for p in producers.values():
                peer = p.peer_info
                data.setdefault(key, []).append({  # a Go map: keys sorted
                    "broadcast_address": peer.broadcast_address,
                    "hostname": peer.hostname,
                    "http_port": peer.http_port,
                    "id": peer.id,
                    "last_update": peer.last_update,
                    "tcp_port": peer.tcp_port,
                    "tombstoned": p.tombstoned,
                    "tombstoned_at": (GO_ZERO_TIME_UNIX_NANO if p.tombstoned_at is None
                                      else p.tombstoned_at),
                    "version": peer.version,
                })
        return {k: data[k] for k in sorted(data, key=lambda k: k.encode("utf-8", "surrogateescape"))}


def _peer(node):
    """A NodeInfo as a lookup producer entry."""
    return {"remote_address": f"{node.ip}:{node.tcp_port}", "hostname": node.ip,
            "broadcast_address": node.ip, "tcp_port": node.tcp_port,
            "http_port": node.http_port, "version": node.version}


def _layout(state):
    move = state.move
    return {"partition": state.partition, "leader": state.leader,
            "designated_leader": state.replicas.leader,
            "preferred_leader": state.replicas.preferred, "isr": list(state.replicas.isr),
            "catchup": list(state.replicas.catchup), "epoch": state.epoch,
            "leader_epoch": state.replicas.epoch_for_write,
            "moving": None if move is None else {"from": move.from_, "to": move.to,
                                                 "leader": move.leader}}


def create_app(lookupd):
    app = _App("nsqshm.nsqlookupd")
    app.nsq_api = LookupHTTPAPI(lookupd)
    return app


def make_http_server(lookupd, address):
    """The HTTP listener on (host, port), bound but not started."""
    log = getattr(lookupd, "log", None)
    server = HTTPServer(address, create_app(lookupd), log_error=log.warn if log else None)
    server.init_socket()
    return server
