"""What nsqadmin knows about the cluster (internal/clusterinfo/data.go): the
topics, channels and producers nsqlookupd knows of, or the given nsqd nodes
when nsqadmin runs without lookupd, and the /stats of those nodes, gathered
side by side (one greenlet per node) and aggregated as nsqadmin does.

Errors follow clusterinfo's two kinds:

- a query that failed everywhere raises ``UpstreamError`` ("Failed to query
  any nsqd: ..."; note that with nothing to ask, as for a topic no node has,
  "everywhere" is also true, as in nsqadmin), which the API answers 502;
- a query that failed on some nodes returns its result with the list of
  errors (Go's PartialErr), which the API reports as a WARNING message.

Gathering functions return ``(result, errors)``; actions return ``errors``.
Topic and channel names go into query strings escaped (url.QueryEscape).
"""

import json
from urllib.parse import quote_plus

import gevent

from nsqshm.nsqadmin.client import ACCEPT_V1, ClientError, DialError, status_text
from nsqshm.nsqadmin.stats import ChannelStats, Producer, TopicStats, semver_key
from nsqshm.nsqd.names import go_quote

# what a node's bad answer raises: ClientError from the request, the others from its JSON
QUERY_ERRORS = (ClientError, ValueError, TypeError, AttributeError, KeyError)
# what a lookupd without a coordinator (nsqshm's standalone) or without the route
# (NSQ's) answers a cluster-mode request
NOT_CLUSTER_MODE = ("MISSING_COORDINATOR", "NOT_FOUND", "METHOD_NOT_ALLOWED")
# a partition move's wait on the lookupd, which answers once the move is done or
# given up (consistence/lookupd_coordinator.py MOVE_WAIT, 70 s), with room
MOVE_TIMEOUT = 90.0


class UpstreamError(Exception):
    """A cluster query that failed on every node; str() is nsqadmin's text."""


def _qs(**params):
    return "&".join(f"{k}={quote_plus(v)}" for k, v in params.items())


def _uniq_sorted(names):
    """stringy.Uniq then sort.Strings; None (Go's nil) when empty."""
    out = sorted(set(names))
    return out or None


class ClusterInfo:
    def __init__(self, client, log=None):
        self.client = client
        self.log = log

    def _logf(self, msg):
        if self.log is not None:
            self.log.info(msg)

    def _get(self, kind, endpoint):
        self._logf(f"CI: querying {kind} {endpoint}")
        return self.client.get_v1(endpoint)

    def _each(self, items, query, what):
        """query(item) for every item side by side: ([(item, result)], [error text]).
        Raises UpstreamError when every one failed (or there was none)."""
        def attempt(item):
            # an expected failure is a result, not a dead greenlet (gevent would print it)
            try:
                return True, query(item)
            except QUERY_ERRORS as err:
                return False, str(err)

        jobs = [(item, gevent.spawn(attempt, item)) for item in items]
        gevent.joinall([job for _, job in jobs], raise_error=True)
        results, errs = [], []
        for item, job in jobs:
            ok, value = job.value
            if ok:
                results.append((item, value))
            else:
                errs.append(value)
        if len(errs) == len(jobs):
            raise UpstreamError(f"Failed to query any {what}: {chr(10).join(errs)}")
        return results, errs

    # -- nsqlookupd -------------------------------------------------------------------

    def get_lookupd_topics(self, lookupd):
        results, errs = self._each(
            lookupd, lambda a: self._get("nsqlookupd", f"http://{a}/topics").get("topics") or [],
            "nsqlookupd")
        return _uniq_sorted(t for _, topics in results for t in topics), errs

    def get_lookupd_topic_channels(self, topic, lookupd):
        def query(addr):
            doc = self._get("nsqlookupd", f"http://{addr}/channels?{_qs(topic=topic)}")
            return doc.get("channels") or []

        results, errs = self._each(lookupd, query, "nsqlookupd")
        return _uniq_sorted(c for _, channels in results for c in channels), errs

    def get_lookupd_producers(self, lookupd):
        def query(addr):
            doc = self._get("nsqlookupd", f"http://{addr}/nodes")
            return [Producer.from_json(p) for p in doc.get("producers") or []]

        results, errs = self._each(lookupd, query, "nsqlookupd")
        producers, by_addr = [], {}
        for addr, found in results:
            for producer in found:
                known = by_addr.get(producer.tcp_address())
                if known is None:
                    known = by_addr[producer.tcp_address()] = producer
                    producer.sort_topics()
                    producers.append(producer)
                known.remote_addresses = [*(known.remote_addresses or ()),
                                          f"{addr}/{producer.address()}"]
        newest = max((p.version_key for p in producers), default=semver_key("0.0.0"))
        for producer in producers:
            producer.out_of_date = producer.version_key < newest
        producers.sort(key=lambda p: p.hostname)
        return producers, errs

    def get_lookupd_topic_producers(self, topic, lookupd):
        def query(addr):
            doc = self._get("nsqlookupd", f"http://{addr}/lookup?{_qs(topic=topic)}")
            return [Producer.from_json(p) for p in doc.get("producers") or []]

        results, errs = self._each(lookupd, query, "nsqlookupd")
        producers, seen = [], set()
        for _, found in results:
            for producer in found:
                if producer.http_address() not in seen:
                    seen.add(producer.http_address())
                    producers.append(producer)
        return producers, errs

    def _first_cluster_answer(self, lookupd, uri, what):
        """GET uri (a cluster-mode route) from the first lookupd that answers it; None
        when none does: standalone lookupds (500 MISSING_COORDINATOR) and NSQ's (404)
        have no cluster to show, which is not an error."""
        for addr in lookupd:
            try:
                return self._get("nsqlookupd", f"http://{addr}/{uri}")
            except QUERY_ERRORS as err:
                self._logf(f"CI: no {what} from {addr}: {err}")
        return None

    def get_cluster_topic(self, topic, lookupd):
        """A replicated topic's layout (nsqshm's lookupd in cluster mode: GET
        /cluster/topic), from the first lookupd that has it (None for a classic topic)."""
        return self._first_cluster_answer(lookupd, f"cluster/topic?{_qs(topic=topic)}",
                                          f"cluster layout of {topic}")

    def get_cluster_nodes(self, lookupd):
        """The cluster's nsqd nodes with their leaderships, replicas and removal state
        (nsqshm's lookupd in cluster mode: GET /cluster/nodes)."""
        return self._first_cluster_answer(lookupd, "cluster/nodes", "cluster nodes")

    # -- nsqd ---------------------------------------------------------------------------

    def _topic_names(self, addr, topic=""):
        endpoint = f"http://{addr}/stats?format=json&include_clients=false"
        if topic:
            endpoint += "&" + _qs(topic=topic)
        topics = self._get("nsqd", endpoint).get("topics") or []
        return [t.get("topic_name") or "" for t in topics]

    def _info(self, addr):
        return self._get("nsqd", f"http://{addr}/info")

    @staticmethod
    def _producer(addr, info, topics):
        """A Producer from nsqd's /info and its topic names."""
        producer = Producer(broadcast_address=info.get("broadcast_address") or "",
                            hostname=info.get("hostname") or "",
                            tcp_port=int(info.get("tcp_port") or 0),
                            http_port=int(info.get("http_port") or 0),
                            version=info.get("version") or "",
                            topics=[(t, False) for t in topics] or None)
        if not producer.broadcast_address:  # older nsqd: the address nsqadmin was given
            host, _, port = addr.rpartition(":")
            producer.broadcast_address, producer.http_port = host.strip("[]"), int(port)
        if not producer.hostname:
            producer.hostname = addr.rpartition(":")[0].strip("[]")
        return producer

    def get_nsqd_topics(self, nsqd):
        results, errs = self._each(nsqd, self._topic_names, "nsqd")
        names = []
        for _, topics in results:
            names += [t for t in topics if t not in names]
        return sorted(names) or None, errs

    def get_nsqd_producers(self, nsqd):
        def query(addr):
            info = self._info(addr)  # nsqadmin asks /info first
            return self._producer(addr, info, self._topic_names(addr))

        results, errs = self._each(nsqd, query, "nsqd")
        return [p for _, p in results], errs

    def get_nsqd_topic_producers(self, topic, nsqd):
        def query(addr):
            topics = self._topic_names(addr, topic)
            if topic not in topics:
                return None
            return self._producer(addr, self._info(addr), topics)

        results, errs = self._each(nsqd, query, "nsqd")
        return [p for _, p in results if p is not None], errs

    def get_nsqd_stats(self, producers, topic="", channel="", include_clients=False):
        """([TopicStats] per node, {key: ChannelStats} across nodes, errors); the key
        is the channel name, or "topic:channel" when no topic is selected."""
        def query(producer):
            endpoint = (f"http://{producer.http_address()}/stats?format=json"
                        f"&include_clients={'true' if include_clients else 'false'}")
            if topic:
                endpoint += "&" + _qs(topic=topic)
                if channel:
                    endpoint += "&" + _qs(channel=channel)
            return [TopicStats.from_json(t) for t in self._get("nsqd", endpoint).get("topics") or []]

        results, errs = self._each(producers, query, "nsqd")
        topic_stats, channel_stats = [], {}
        for producer, topics in results:
            addr = producer.http_address()
            for t in topics:
                t.node, t.hostname = addr, producer.hostname
                t.memory_depth = t.depth - t.backend_depth
                if topic and t.topic_name != topic:
                    continue
                topic_stats.append(t)
                for c in t.channels or ():
                    c.node, c.hostname, c.topic_name = addr, producer.hostname, t.topic_name
                    c.memory_depth = c.depth - c.backend_depth
                    key = c.channel_name if topic else f"{t.topic_name}:{c.channel_name}"
                    total = channel_stats.get(key)
                    if total is None:
                        total = channel_stats[key] = ChannelStats(
                            addr, topic_name=t.topic_name, channel_name=c.channel_name)
                    for client in c.clients or ():
                        client.node = addr
                    total.add(c)
        topic_stats.sort(key=lambda s: s.hostname)
        return topic_stats, channel_stats, errs

    def get_producers(self, lookupd, nsqd):
        if lookupd:
            return self.get_lookupd_producers(lookupd)
        return self.get_nsqd_producers(nsqd)

    def get_message_trace(self, producers, topic, msg_id="", trace_id=""):
        """A message's trace events from every node (nsqd's GET /message/trace,
        docs/headers.md), in time order: (events, errors)."""
        query = _qs(topic=topic, **({"trace_id": trace_id} if trace_id else {"id": msg_id}))

        def ask(producer):
            endpoint = f"http://{producer.http_address()}/message/trace?{query}"
            return self._get("nsqd", endpoint).get("events") or []

        results, errs = self._each(producers, ask, "nsqd")
        seen, events = set(), []
        for producer, found in results:
            for e in found:
                key = (e.get("ts"), e.get("event"), e.get("id"), e.get("worker"))
                if key not in seen:  # (two addresses of one broker answer the same)
                    seen.add(key)
                    events.append(dict(e, node=producer.http_address()))
        return sorted(events, key=lambda e: e.get("ts") or 0), errs

    def get_topic_producers(self, topic, lookupd, nsqd):
        if lookupd:
            return self.get_lookupd_topic_producers(topic, lookupd)
        return self.get_nsqd_topic_producers(topic, nsqd)

    # -- actions --------------------------------------------------------------------------

    def _post(self, kind, addrs, uri, qs, body=b""):
        errs = []
        for addr in addrs:
            endpoint = f"http://{addr}/{uri}?{qs}"
            self._logf(f"CI: querying {kind} {endpoint}")
            try:
                self.client.post_v1(endpoint, body)
            except ClientError as err:
                errs.append(str(err))
        return errs

    def _post_lookupd(self, lookupd, uri, qs):
        return self._post("nsqlookupd", lookupd, uri, qs)

    def _post_producers(self, producers, uri, qs, body=b""):
        return self._post("nsqd", [p.http_address() for p in producers], uri, qs, body)

    def tombstone_node_for_topic(self, topic, node, lookupd):
        errs = self._post_lookupd(lookupd, "topic/tombstone", _qs(topic=topic, node=node))
        producers, more = self.get_nsqd_producers([node])
        return errs + more + self._post_producers(producers, "topic/delete", _qs(topic=topic))

    def create_topic_channel(self, topic, channel, lookupd):
        errs = self._post_lookupd(lookupd, "topic/create", _qs(topic=topic))
        if channel:
            qs = _qs(topic=topic, channel=channel)
            errs += self._post_lookupd(lookupd, "channel/create", qs)
            producers, more = self.get_lookupd_topic_producers(topic, lookupd)
            errs += more + self._post_producers(producers, "channel/create", qs)
        return errs

    def delete_topic(self, topic, lookupd, nsqd):
        producers, errs = self.get_topic_producers(topic, lookupd, nsqd)  # before they forget it
        qs = _qs(topic=topic)
        # (partition=**: Youzan's, which a cluster-mode nsqlookupd asks of a topic in etcd;
        # a standalone one ignores it)
        errs += self._post_lookupd(lookupd, "topic/delete", _qs(topic=topic, partition="**"))
        return errs + self._post_producers(producers, "topic/delete", qs)

    def delete_channel(self, topic, channel, lookupd, nsqd):
        producers, errs = self.get_topic_producers(topic, lookupd, nsqd)
        qs = _qs(topic=topic, channel=channel)
        errs += self._post_lookupd(lookupd, "channel/delete", qs)
        return errs + self._post_producers(producers, "channel/delete", qs)

    def topic_action(self, action, topic, lookupd, nsqd):
        """pause, unpause or empty a topic on every node that has it."""
        producers, errs = self.get_topic_producers(topic, lookupd, nsqd)
        return errs + self._post_producers(producers, f"topic/{action}", _qs(topic=topic))

    def channel_setoffset(self, position, topic, channel, lookupd, nsqd):
        """Move a log topic's channel to `position` (Youzan's "<type>:<value>")
        in every partition, on every node that has the topic (nsqd's POST
        /channel/setoffset)."""
        producers, errs = self.get_topic_producers(topic, lookupd, nsqd)
        return errs + self._post_producers(producers, "channel/setoffset",
                                           _qs(topic=topic, channel=channel), position.encode())

    def remove_cluster_node(self, node, restore, lookupd):
        """Youzan's POST /cluster/node/remove?remove_node= (restore=true calls it off),
        sent to one lookupd: any of the cluster's passes it to etcd, so the first that
        takes it is enough.  -> ((status, {"node", "state"} or the refusal's message),
        errors): the first 2xx, else the first refusal (a 4xx, e.g. 404 for a node
        the cluster does not know), with the errors of the lookupds that failed.
        UpstreamError when none took or refused it (down, or standalone)."""
        qs = _qs(remove_node=node, **({"restore": "true"} if restore else {}))
        return self._cluster_post(lookupd, f"cluster/node/remove?{qs}")

    def move_partition(self, topic, partition, move_leader, from_, to, lookupd):
        """Youzan's POST /topic/partition/move?topic=&partition=&move_leader=&move_from=
        &move_to= on one lookupd, which answers once the move is done (the new
        replica copied, the leadership handed off: up to a minute and more), so
        it gets at least MOVE_TIMEOUT.  -> as remove_cluster_node's, but a move
        goes to a second lookupd only when the first could not be reached, or
        answered that it does not run in cluster mode: once one has the request
        (its answer, whatever it is, or none in time), a second would find the
        move under way and refuse it."""
        qs = _qs(topic=topic, partition=str(partition),
                 move_leader="true" if move_leader else "false", move_from=from_, move_to=to)
        return self._cluster_post(lookupd, f"topic/partition/move?{qs}", MOVE_TIMEOUT,
                                  final=True)

    def _cluster_post(self, lookupd, uri, timeout=None, final=False):
        """POST uri to the lookupds in turn until one in cluster mode answers it.
        final: whatever a lookupd in cluster mode that got the request answers
        (or a failure after it was sent: 504) is the answer (else only a 4xx
        is, and a 5xx or a failure goes on to the next)."""
        refused, errs = None, []
        for addr in lookupd:
            endpoint = f"http://{addr}/{uri}"
            self._logf(f"CI: querying nsqlookupd {endpoint}")
            try:
                # (not post_v1: a refusal's status and message are the answer here)
                status, _, body = self.client.request("POST", endpoint, b"",
                                                      {"Accept": ACCEPT_V1}, timeout=timeout)
            except ClientError as err:
                if final and not isinstance(err, DialError):
                    return (504, f"nsqlookupd {addr} took the request but gave no answer "
                                 f"({err}): it may still be carried out"), errs
                errs.append(str(err))
                continue
            try:
                doc = json.loads(body) if body.strip() else None
            except ValueError:
                doc = None
            message = doc.get("message") if isinstance(doc, dict) else None
            if 200 <= status < 300 and (final or isinstance(doc, dict)):
                return (status, doc if isinstance(doc, dict) else {}), errs
            if message in NOT_CLUSTER_MODE:
                errs.append(f"nsqlookupd {addr} does not run in cluster mode ({message})")
            elif final:
                return (status, message if isinstance(message, str)
                        else f"got response {status_text(status, '')} {go_quote(body)}"), errs
            elif isinstance(message, str) and refused is None and 400 <= status < 500:
                refused = status, message
            else:  # Go's POSTV1 text
                errs.append(f"got response {status_text(status, '')} {go_quote(body)}")
        if refused is not None:
            return refused, errs
        raise UpstreamError(f"Failed to query any nsqlookupd: {chr(10).join(errs)}")

    def channel_action(self, action, topic, channel, lookupd, nsqd):
        """pause, unpause or empty a channel on every node that has its topic."""
        producers, errs = self.get_topic_producers(topic, lookupd, nsqd)
        return errs + self._post_producers(producers, f"channel/{action}",
                                           _qs(topic=topic, channel=channel))
