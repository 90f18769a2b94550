"""The numbers the JSON API and the pages show, gathered as nsqadmin's
handlers gather them (nsqadmin/http.go, the part before the response): a
query that failed on some nodes adds a warning to ``messages``, one that
failed everywhere is a 502 UPSTREAM_ERROR (``Err``), each logged with
nsqadmin's words ("failed to get topic producers - ...")."""

from nsqshm.nsqadmin.clusterinfo import QUERY_ERRORS, UpstreamError
from nsqshm.nsqadmin.stats import Producer, TopicStats, search
from nsqshm.nsqd.http_api import Err


def _replication_row(part, nodes, ends):
    """One partition of the layout, each member with its lag behind the leader's end."""
    index = part.get("partition")
    leader = part.get("leader") or ""
    leader_end = ends.get((leader, index))

    def member(node_id, role):
        end = ends.get((node_id, index))
        producer = nodes.get(node_id)
        return {"id": node_id, "role": role, "end_offset": end,
                "lag": None if leader_end is None or end is None else leader_end - end,
                "node": producer.http_address() if producer else "",
                "hostname": producer.hostname if producer else node_id}

    return {"partition": index, "leader": leader, "epoch": part.get("epoch"),
            "preferred": part.get("preferred_leader") or "",
            "leader_epoch": part.get("leader_epoch"), "moving": part.get("moving"),
            "isr": [member(n, "leader" if n == leader else "isr") for n in part.get("isr") or ()],
            "catchup": [member(n, "catchup") for n in part.get("catchup") or ()]}


def _cluster_node_row(doc):
    """One node of a lookupd's GET /cluster/nodes, with its HTTP address when registered."""
    producer = Producer.from_json(doc) if doc.get("registered") is True else None
    return {"id": doc["id"], "registered": producer is not None,
            "hostname": producer.hostname if producer else "",
            "node": producer.http_address() if producer else "",
            "leaders": int(doc.get("leaders") or 0), "replicas": int(doc.get("replicas") or 0),
            "removing": str(doc.get("removing") or "")}


def maybe_warn(messages):
    """nsqadmin's "message" field: "" or "WARNING: ..." joined with "; "."""
    return "WARNING: " + "; ".join(messages) if messages else ""


class ClusterView:
    def __init__(self, admin):
        self.admin = admin

    @property
    def opts(self):
        return self.admin.opts

    @property
    def ci(self):
        return self.admin.ci

    def lists(self):
        """(lookupd addresses, nsqd addresses): nsqadmin uses the first when given."""
        return self.opts.lookupd_http_address, self.opts.nsqd_http_address

    def gather(self, what, messages, fn, *args):
        """fn(*args) -> (..., errors): the result; errors become a warning in
        messages, a failure everywhere a 502 UPSTREAM_ERROR."""
        try:
            *result, errs = fn(*args)
        except UpstreamError as err:
            self.admin.log.error(f"failed to {what} - {err}")
            raise Err(502, f"UPSTREAM_ERROR: {err}") from None
        if errs:
            text = "\n".join(errs)
            self.admin.log.warn(text)
            messages.append(text)
        return result[0] if len(result) == 1 else result

    def act(self, what, messages, fn, *args):
        """Run an action (fn returns its errors); Err(502) when it failed everywhere."""
        self.gather(what, messages, lambda: (None, fn(*args)))

    # -- what the endpoints and pages show ------------------------------------------------

    def topic_names(self, messages):
        lookupd, nsqd = self.lists()
        if lookupd:
            return self.gather("get topics", messages, self.ci.get_lookupd_topics, lookupd)
        return self.gather("get topics", messages, self.ci.get_nsqd_topics, nsqd)

    def inactive_topics(self, topics):
        """{topic: channels} of the topics lookupd knows with no producer left."""
        lookupd, _ = self.lists()
        out = {}
        if not lookupd:
            return out
        for topic in topics or ():
            try:
                producers, _ = self.ci.get_lookupd_topic_producers(topic, lookupd)
            except UpstreamError:
                producers = []
            if not producers:
                try:
                    out[topic], _ = self.ci.get_lookupd_topic_channels(topic, lookupd)
                except UpstreamError:
                    out[topic] = None
        return out

    def topic_stats(self, topic, messages):
        """The topic aggregated across its nodes (nsqadmin's topicHandler)."""
        producers = self.gather("get topic producers", messages, self.ci.get_topic_producers,
                                topic, *self.lists())
        per_node, _ = self.gather("get topic metadata", messages, self.ci.get_nsqd_stats,
                                  producers, topic, "", False)
        total = TopicStats(topic_name=topic)
        for t in per_node:
            total.add(t)
        return total

    def replication(self, topic, total, messages):
        """A replicated log topic's partitions (cluster mode): per partition its
        leader, epochs, a move under way, and each ISR and catch-up member with its
        log's end and its lag behind the leader's end, from the members' /stats.
        None when no lookupd has a layout of the topic."""
        lookupd, _ = self.lists()
        layout = self.ci.get_cluster_topic(topic, lookupd) if lookupd else None
        if not isinstance(layout, dict) or not isinstance(layout.get("partitions"), list):
            return None
        nodes = {n["id"]: Producer.from_json(n) for n in layout.get("nodes") or ()
                 if isinstance(n, dict) and isinstance(n.get("id"), str)}
        stats = {t.node: t for t in total.node_stats or ()}
        missing = [p for p in nodes.values() if p.http_address() not in stats]
        if missing:
            try:
                found, _, errs = self.ci.get_nsqd_stats(missing, topic, "", False)
            except UpstreamError as err:
                found, errs = [], [str(err)]
            for t in found:
                stats[t.node] = t
            if errs:
                messages.append("\n".join(errs))
        ends = {}  # (node ID, partition) -> its log's end offset
        for node_id, producer in nodes.items():
            t = stats.get(producer.http_address())
            for entry in (t.partitions if t is not None else None) or ():
                ends[node_id, entry.get("partition")] = entry.get("end_offset")
        return [_replication_row(part, nodes, ends) for part in layout["partitions"]
                if isinstance(part, dict)]

    def cluster_nodes(self):
        """The cluster's nsqd nodes (cluster mode): per node its ID, whether it is
        registered (its hostname and HTTP address then), the partitions it leads and
        holds, its removal state; None when no lookupd answers GET /cluster/nodes
        (standalone lookupds, or nsqd mode)."""
        lookupd, _ = self.lists()
        doc = self.ci.get_cluster_nodes(lookupd) if lookupd else None
        if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
            return None
        try:
            return [_cluster_node_row(n) for n in doc["nodes"]
                    if isinstance(n, dict) and isinstance(n.get("id"), str)]
        except QUERY_ERRORS as err:  # a lookupd's odd answer: the page goes on without it
            self.admin.log.warn(f"failed to read the cluster's nodes - {err}")
            return None

    def remove_node(self, node, restore, messages):
        """Mark an nsqd node for removal from the cluster (or call that off) through
        the first lookupd that takes it: its {"node", "state"}; a lookupd's refusal
        is answered with its status and message, no lookupd in cluster mode is a 502."""
        return self._lookupd_action(f"{'restore' if restore else 'remove'} cluster node",
                                    messages, self.ci.remove_cluster_node, node, restore)

    def move_partition(self, topic, partition, move_leader, from_, to, messages):
        """A partition's move through the first lookupd in cluster mode; its
        refusal or failure (400 with Youzan's text, 500 timeout waiting move
        data) is answered with its status and message."""
        return self._lookupd_action("move partition", messages, self.ci.move_partition,
                                    topic, partition, move_leader, from_, to)

    def _lookupd_action(self, what, messages, fn, *args):
        """fn(*args, lookupds) -> ((status, answer), errors): the answer of a 2xx,
        else Err with the lookupd's status and message."""
        status, answer = self.gather(what, messages, fn, *args, self.lists()[0])
        if not 200 <= status < 300:
            raise Err(status, answer)
        return answer

    def channel_stats(self, topic, channel, messages):
        """The channel aggregated across nodes, clients included; None if no node has it."""
        producers = self.gather("get topic producers", messages, self.ci.get_topic_producers,
                                topic, *self.lists())
        _, channels = self.gather("get channel metadata", messages, self.ci.get_nsqd_stats,
                                  producers, topic, channel, True)
        return channels.get(channel)

    def producers(self, what, messages):
        return self.gather(what, messages, self.ci.get_producers, *self.lists())

    def all_topic_stats(self, messages):
        """Every node's topics (clients left out)."""
        producers = self.producers("get producers", messages)
        if not producers:
            return []
        per_node, _ = self.gather("get nsqd stats", messages, self.ci.get_nsqd_stats,
                                  producers, "", "", False)
        return per_node

    def node_stats(self, node, messages):
        """(per-topic stats of one node, total messages, total clients)."""
        producer = search(self.producers("get producers", messages), node)
        if producer is None:
            raise Err(404, "NODE_NOT_FOUND")
        try:
            topics, _, errs = self.ci.get_nsqd_stats([producer], "", "", True)
        except UpstreamError as err:
            errs, topics = [str(err)], None
        if errs:  # nsqadmin: any error here is a 502
            self.admin.log.error(f"failed to get nsqd stats - {errs[0]}")
            raise Err(502, f"UPSTREAM_ERROR: {errs[0]}")
        clients = sum(len(c.clients or ()) for t in topics for c in t.channels or ())
        return topics or None, sum(t.message_count for t in topics), clients

    def counter_stats(self, messages):
        """{"topic:channel:node": {node, topic_name, channel_name, message_count}}, sorted."""
        producers = self.producers("get counter producer list", messages)
        _, channels = self.gather("get nsqd stats", messages, self.ci.get_nsqd_stats,
                                  producers, "", "", False)
        stats = {}
        for c in channels.values():
            for node in c.node_stats or ():
                key = f"{c.topic_name}:{c.channel_name}:{node.node}"
                entry = stats.setdefault(key, {"node": node.node, "topic_name": c.topic_name,
                                               "channel_name": c.channel_name,
                                               "message_count": 0})
                entry["message_count"] += node.message_count
        return {k: stats[k] for k in sorted(stats)}  # a Go map: keys sorted
