"""The numbers nsqadmin gathers and aggregates (internal/clusterinfo/types.go
and internal/quantile/aggregate.go): producers (nsqd nodes), topic, channel
and client stats, end-to-end latency aggregates.

Each type reads the JSON nsqd or nsqlookupd sends (``from_json``, raising
``ValueError`` when it has the wrong shape, as Go's decoder would fail) and
writes nsqadmin's JSON (``to_json``: fields in Go's struct order, ``None``
for Go's nil slices and pointers).  ``add`` is Go's ``Add`` line for line,
quirks included: the first node's channel object becomes the aggregate of a
topic's channel across nodes, a new percentile's ``min`` starts from 0.
"""

import re
import socket
import time


def _int(doc, key):
    value = doc.get(key, 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"json: cannot unmarshal {type(value).__name__} into Go struct field "
                         f".{key} of type int64")
    return value


def _str(doc, key):
    value = doc.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"json: cannot unmarshal {type(value).__name__} into Go struct field "
                         f".{key} of type string")
    return value


def _bool(doc, key):
    value = doc.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ValueError(f"json: cannot unmarshal {type(value).__name__} into Go struct field "
                         f".{key} of type bool")
    return value


def _list(doc, key):
    """A JSON array (None for null or absent, as Go's nil slice)."""
    value = doc.get(key)
    if value is not None and not isinstance(value, list):
        raise ValueError(f"json: cannot unmarshal {type(value).__name__} into Go struct field "
                         f".{key} of type slice")
    return value


def _object(value):
    if not isinstance(value, dict):
        raise ValueError(f"json: cannot unmarshal {type(value).__name__} into Go value of "
                         "type struct")
    return value


def join_host_port(host, port):
    """net.JoinHostPort."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# ---------------------------------------------------------------------------
# semantic versions (blang/semver), for a producer's out_of_date

_SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                     r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?(?:\+[0-9A-Za-z.-]+)?\Z")


def semver_key(version):
    """A sort key for a version; an invalid one counts as 0.0.0, as nsqadmin's parse."""
    m = _SEMVER.match(version or "")
    if m is None:
        return (0, 0, 0, 1, ())
    pre = m.group(4)
    ids = ()
    if pre:
        ids = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    # a release sorts after its pre-releases
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), 0 if pre else 1, ids)


# ---------------------------------------------------------------------------
# producers


class Producer:
    """An nsqd node, as nsqlookupd's /nodes or /lookup, or nsqd's /info, describes it."""

    JSON_FIELDS = ("remote_addresses", "remote_address", "hostname", "broadcast_address",
                   "tcp_port", "http_port", "version")  # then topics, out_of_date

    def __init__(self, broadcast_address="", hostname="", tcp_port=0, http_port=0, version="",
                 remote_address="", topics=None):
        self.remote_addresses = None
        self.remote_address = remote_address
        self.hostname = hostname
        self.broadcast_address = broadcast_address
        self.tcp_port = tcp_port
        self.http_port = http_port
        self.version = version
        self.topics = topics  # [(topic, tombstoned)] or None
        self.out_of_date = False

    @classmethod
    def from_json(cls, doc):
        doc = _object(doc)
        names = _list(doc, "topics")
        tombstones = _list(doc, "tombstones") or []
        topics = None
        if names:
            if len(tombstones) < len(names):  # Go indexes past the end and panics
                raise ValueError("runtime error: index out of range")
            topics = [(str(name), bool(tombstones[i])) for i, name in enumerate(names)]
        return cls(broadcast_address=_str(doc, "broadcast_address"),
                   hostname=_str(doc, "hostname"), tcp_port=_int(doc, "tcp_port"),
                   http_port=_int(doc, "http_port"), version=_str(doc, "version"),
                   remote_address=_str(doc, "remote_address"), topics=topics)

    @property
    def version_key(self):
        return semver_key(self.version)

    def address(self):
        return self.remote_address or "N/A"

    def http_address(self):
        return join_host_port(self.broadcast_address, self.http_port)

    def tcp_address(self):
        return join_host_port(self.broadcast_address, self.tcp_port)

    def sort_topics(self):
        if self.topics:
            self.topics.sort(key=lambda t: t[0])

    def to_json(self):
        out = {k: getattr(self, k) for k in self.JSON_FIELDS}
        out["topics"] = None if self.topics is None else [
            {"topic": name, "tombstoned": dead} for name, dead in self.topics]
        out["out_of_date"] = self.out_of_date
        return out


def search(producers, node):
    """Producers.Search: the producer whose HTTP address is node, or None."""
    for producer in producers:
        if producer.http_address() == node:
            return producer
    return None


# ---------------------------------------------------------------------------
# end-to-end processing latency


class E2eLatency:
    """quantile.E2eProcessingLatencyAggregate."""

    def __init__(self, addr="", topic="", channel=""):
        self.count = 0
        self.percentiles = None  # [{"quantile": q, "value": v, "min":.., ...}] or None
        self.topic = topic
        self.channel = channel
        self.addr = addr

    @classmethod
    def from_json(cls, doc):
        doc = _object(doc)
        e2e = cls(addr=_str(doc, "host"), topic=_str(doc, "topic"), channel=_str(doc, "channel"))
        e2e.count = _int(doc, "count")
        raw = _list(doc, "percentiles")
        if raw is not None:
            e2e.percentiles = []
            for entry in raw:
                p = {k: float(v) for k, v in _object(entry).items()}
                value = p.get("value", 0.0)
                p["min"] = p["max"] = p["average"] = value
                p["count"] = float(e2e.count)
                e2e.percentiles.append(p)
        return e2e

    def add(self, other):
        self.addr = "*"
        if other is None:
            return
        self.count += other.count
        for value in other.percentiles or ():
            mine = None
            for p in self.percentiles or ():
                if value.get("quantile", 0.0) == p.get("quantile", 0.0):
                    mine = p
                    break
            if mine is None:
                mine = {"quantile": value.get("quantile", 0.0)}
                self.percentiles = [*(self.percentiles or ()), mine]
            mine["max"] = max(value.get("max", 0.0), mine.get("max", 0.0))
            mine["min"] = min(value.get("min", 0.0), mine.get("min", 0.0))
            mine["count"] = mine.get("count", 0.0) + value.get("count", 0.0)
            if mine["count"] == 0:
                mine["average"] = 0.0
                continue
            delta = value.get("average", 0.0) - mine.get("average", 0.0)
            mine["average"] = mine.get("average", 0.0) + delta * value.get("count", 0.0) / mine["count"]
        # nsqadmin sorts by a "percentile" key no entry has: the order stays

    def to_json(self):
        percentiles = None
        if self.percentiles is not None:
            percentiles = [{k: p[k] for k in sorted(p)} for p in self.percentiles]  # Go map order
        return {"count": self.count, "percentiles": percentiles, "topic": self.topic,
                "channel": self.channel, "host": self.addr}


def _by_hostname(items):
    items.sort(key=lambda s: s.hostname)


# ---------------------------------------------------------------------------
# clients, channels, topics


class ClientStats:
    STRINGS = ("node", "remote_address", "version", "client_id", "hostname", "user_agent",
               "auth_identity", "auth_identity_url", "tls_cipher_suite", "tls_version",
               "tls_negotiated_protocol")
    INTS = ("connect_ts", "in_flight_count", "ready_count", "finish_count", "requeue_count",
            "message_count", "sample_rate")
    BOOLS = ("deflate", "snappy", "authed", "tls", "tls_negotiated_protocol_is_mutual")
    JSON_FIELDS = ("node", "remote_address", "version", "client_id", "hostname", "user_agent",
                   "connect_ts", "connected", "in_flight_count", "ready_count", "finish_count",
                   "requeue_count", "message_count", "sample_rate", "deflate", "snappy", "authed",
                   "auth_identity", "auth_identity_url", "tls", "tls_cipher_suite",
                   "tls_version", "tls_negotiated_protocol", "tls_negotiated_protocol_is_mutual")

    @classmethod
    def from_json(cls, doc, now=None):
        doc = _object(doc)
        c = cls()
        for keys, read in ((cls.STRINGS, _str), (cls.INTS, _int), (cls.BOOLS, _bool)):
            for key in keys:
                setattr(c, key, read(doc, key))
        # time.Now().Truncate(time.Second).Sub(time.Unix(connect_ts, 0))
        now = int(time.time() if now is None else now)
        c.connected = (now - c.connect_ts) * 1_000_000_000
        return c

    def to_json(self):
        return {k: getattr(self, k) for k in self.JSON_FIELDS}


class _QueueStats:
    """What topic and channel stats share (Go's TopicStats and ChannelStats):
    names, counters that add sums, the per-node entries, paused, e2e latency,
    and a list of parts (a topic's channels, a channel's clients)."""

    NAMES = ()
    COUNTS = ()
    PARTS = ""  # the attribute (and JSON key) of the parts
    PART = None  # their class

    def __init__(self, node="", **names):
        self.node = node
        self.hostname = ""
        for key in self.NAMES:
            setattr(self, key, names.get(key, ""))
        for key in self.COUNTS:
            setattr(self, key, 0)
        self.node_stats = None
        setattr(self, self.PARTS, None)
        self.paused = False
        self.e2e = None
        self.partitions = None  # a log topic's (nsqshm's /stats): [{partition, ...}] per node

    @classmethod
    def from_json(cls, doc):
        doc = _object(doc)
        s = cls(node=_str(doc, "node"), **{key: _str(doc, key) for key in cls.NAMES})
        s.hostname = _str(doc, "hostname")
        for key in cls.COUNTS:
            setattr(s, key, _int(doc, key))
        raw = _list(doc, cls.PARTS)
        setattr(s, cls.PARTS, None if raw is None else [cls.PART.from_json(x) for x in raw])
        s.paused = _bool(doc, "paused")
        raw = _list(doc, "partitions")
        s.partitions = None if raw is None else [dict(_object(x)) for x in raw]
        raw = doc.get("e2e_processing_latency")
        s.e2e = None if raw is None else E2eLatency.from_json(raw)
        return s

    def add(self, a):
        self.node = "*"
        for key in self.COUNTS:
            setattr(self, key, getattr(self, key) + getattr(a, key))
        if a.paused:
            self.paused = True
        self.node_stats = [*(self.node_stats or ()), a]
        _by_hostname(self.node_stats)
        if self.e2e is None:
            self.e2e = E2eLatency(addr=self.node, topic=self.topic_name,
                                  channel=getattr(self, "channel_name", ""))
        self.e2e.add(a.e2e)
        self.add_parts(a)

    def add_parts(self, a):
        raise NotImplementedError

    def to_json(self):
        out = {"node": self.node, "hostname": self.hostname}
        for key in self.NAMES + self.COUNTS:
            out[key] = getattr(self, key)
        out["nodes"] = None if self.node_stats is None else [s.to_json() for s in self.node_stats]
        parts = getattr(self, self.PARTS)
        out[self.PARTS] = None if parts is None else [x.to_json() for x in parts]
        out["paused"] = self.paused
        out["e2e_processing_latency"] = None if self.e2e is None else self.e2e.to_json()
        if self.partitions is not None:  # (a classic topic's JSON stays nsqadmin's)
            out["partitions"] = self.partitions
        return out


class ChannelStats(_QueueStats):
    NAMES = ("topic_name", "channel_name")
    COUNTS = ("depth", "memory_depth", "backend_depth", "in_flight_count", "deferred_count",
              "requeue_count", "timeout_count", "message_count", "client_count")
    PARTS = "clients"
    PART = ClientStats

    def add_parts(self, a):
        if a.clients:  # Go's append of nothing leaves a nil slice nil
            self.clients = [*(self.clients or ()), *a.clients]
            _by_hostname(self.clients)


class TopicStats(_QueueStats):
    NAMES = ("topic_name",)
    COUNTS = ("depth", "memory_depth", "backend_depth", "message_count")
    PARTS = "channels"
    PART = ChannelStats

    def add_parts(self, a):
        for theirs in a.channels or ():
            found = False
            for mine in self.channels or ():
                if theirs.channel_name == mine.channel_name:
                    found = True
                    mine.add(theirs)
            if not found:
                self.channels = [*(self.channels or ()), theirs]


def local_hostname():
    """os.Hostname(), the "via" of notifications."""
    return socket.gethostname()
