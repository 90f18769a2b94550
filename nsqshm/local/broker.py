"""The broker a local client talks to: found through its instance file in
/dev/shm (nsqshm.nsqd.local.instance), asked over its HTTP API to create topics and
channels (it only pumps those it knows), and the names of its segments."""

import json
import os
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import posix_ipc

from nsqshm._core.logcursor import segment_name
from nsqshm.nsqd.local import instance
from nsqshm.nsqd.local.instance import NoBroker
from nsqshm.nsqd.logtopics.logspecs import find_spec
from nsqshm.nsqd.names import inbound_ring_suffix, is_valid_name
from nsqshm.ring import Ring, RingError

ATTACH_WAIT = 5.0  # seconds to wait for a just-created queue's ring to appear


class LocalError(Exception):
    pass


def check_name(kind, name):
    if not is_valid_name(name):
        raise ValueError(f"invalid {kind} name {name!r}: 1-64 characters of "
                         "[.a-zA-Z0-9_-], optionally ending in #ephemeral")
    return name


class Broker:
    """A running nsqshm broker on this host, by data path or shm prefix."""

    def __init__(self, data_path=None, shm_prefix=None):
        self.info = instance.find(data_path, shm_prefix)
        self.prefix = self.info["prefix"]
        self.pid = self.info["pid"]
        self.http_address = self.info.get("http_address")
        self.max_msg_size = int(self.info.get("max_msg_size") or 1048576)
        self.msg_timeout = float(self.info.get("msg_timeout") or 60.0)
        # its log topics are replicated (None: an instance file of an older build, which
        # does not say: its log topics are refused too)
        self.cluster = self.info.get("cluster")

    def __repr__(self):
        return f"<Broker {self.prefix} pid={self.pid}>"

    # -- names -----------------------------------------------------------------------

    def topic_ring_name(self, topic):
        return f"{self.prefix}.t.{check_name('topic', topic)}"

    def partition_ring_name(self, topic, partition):
        """A log topic partition's inbound ring (nsqd/logtopics/partition.py)."""
        return f"{self.prefix}.{inbound_ring_suffix(check_name('topic', topic), partition)}"

    def channel_ring_name(self, topic, channel):
        return f"{self.prefix}.c.{check_name('topic', topic)}:{check_name('channel', channel)}"

    # -- the HTTP API ------------------------------------------------------------------

    def _post(self, path):
        return self._request(path, b"", "POST")

    def _request(self, path, data=None, method="GET"):
        if not self.http_address:
            raise LocalError(f"broker {self.prefix} has no HTTP listener to create queues with")
        req = urllib.request.Request(f"http://{self.http_address}{path}", data=data,
                                     method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.read()
        except urllib.error.HTTPError as err:
            body = err.read()
            try:
                text = json.loads(body).get("message", body)
            except ValueError:
                text = body
            raise LocalError(f"{method} {path}: {err.code} {text}") from None
        except OSError as err:
            raise LocalError(f"{method} {path}: broker at {self.http_address} unreachable "
                             f"({err})") from None

    def create_topic(self, topic):
        self._post(f"/topic/create?topic={quote(check_name('topic', topic), safe='')}")

    def create_channel(self, topic, channel):
        self.create_topic(topic)  # nsqd's /channel/create wants an existing topic
        self._post(f"/channel/create?topic={quote(check_name('topic', topic), safe='')}"
                   f"&channel={quote(check_name('channel', channel), safe='')}")

    def use_lanes(self, topic, channel, partition=None, ordered=False):
        """A log topic's channel delivers the partition (every one: ordered
        without a partition) through its own lane, as a TCP `SUB T C p` or
        `SUB_ORDERED` makes it (nsqd's POST /channel/lane)."""
        query = (f"/channel/lane?topic={quote(check_name('topic', topic), safe='')}"
                 f"&channel={quote(check_name('channel', channel), safe='')}")
        if partition is not None:
            query += f"&partition={int(partition)}"
        if ordered:
            query += "&ordered=true"
        self._post(query)

    def topic_kind(self, topic):
        """(partitions, ext) of `topic` from its /stats entry: how many
        partitions it has if it is a log topic (0: a classic topic, or none
        of that name), and whether it was made with ext=true (its records
        carry Youzan's ext part).  (0, False) when the broker has no HTTP
        listener to ask."""
        name = check_name("topic", topic)
        if not self.http_address:
            return 0, False
        body = self._request(f"/stats?format=json&include_clients=false"
                             f"&topic={quote(name, safe='')}")
        for entry in json.loads(body).get("topics") or ():
            if entry.get("topic_name") == name:
                return len(entry.get("partitions") or ()), bool(entry.get("is_ext"))
        return 0, False

    def channel_cursors(self, topic, channel):
        """The names of a log topic's channel cursors, one per partition in
        order (the broker makes them with the channel); [] for a classic
        topic's channel."""
        names = []
        while True:
            name = self.cursor_name(topic, channel, len(names))
            if not os.path.exists(f"/dev/shm/{name}"):
                return names
            names.append(name)

    def log_topic_spec(self, topic):
        """The log topic's spec (nsqd/logtopics/logspecs.py) from the broker's data path, or
        None: a classic topic, or one not made yet."""
        data_path = self.info.get("data_path")
        return find_spec(data_path, check_name("topic", topic)) if data_path else None

    def cursor_name(self, topic, channel, partition):
        """A log topic's channel cursor in one partition (nsqd/logtopics/logchannel.py)."""
        return segment_name(self.prefix, check_name("topic", topic),
                            check_name("channel", channel), int(partition))

    # -- rings -------------------------------------------------------------------------

    def attach(self, name):
        """Attach a queue's ring, waiting briefly for the broker to create it."""
        deadline = time.monotonic() + ATTACH_WAIT
        while True:
            try:
                return Ring.attach(name)
            except (posix_ipc.ExistentialError, RingError):  # not there, or being made
                if time.monotonic() >= deadline:
                    raise LocalError(f"queue ring {name!r} does not exist (is the topic or "
                                     f"channel created on broker {self.prefix}?)") from None
                time.sleep(0.01)

    def topic_rings(self, topic, create=True):
        """What a Producer publishes into: (rings, ext, ordered, log).  A
        classic topic: [its ring]; a log topic (log True): its partitions'
        inbound rings, in order, which the partitions' owners append to
        their logs.  ext: made
        with ext=true (records carry Youzan's ext part); ordered: a log topic
        that takes publishes to a named partition only.  A log topic of a
        broker in cluster mode is refused (LocalError): its publishes are
        acknowledged once every in-sync replica has them, which a push into
        this host's memory is not."""
        if create:
            self.create_topic(topic)
        partitions, ext = self.topic_kind(topic)
        if not partitions:
            return [self.attach(self.topic_ring_name(topic))], ext, False, False
        if self.cluster is None:
            raise LocalError(f"topic {topic!r} is a log topic of a broker that does not say "
                             "whether it runs in cluster mode (an older build): restart it, "
                             "or publish over TCP or HTTP (PUB, MPUB, /mpub)")
        if self.cluster:
            raise LocalError(f"topic {topic!r} is a replicated log topic (the broker runs in "
                             "cluster mode): a publish to it is acknowledged once every "
                             "in-sync replica has it; publish over TCP or HTTP (PUB, MPUB, "
                             "/mpub) to its partition's leader")
        spec = self.log_topic_spec(topic) or {}
        rings = []
        try:
            for index in range(partitions):
                rings.append(self.attach(self.partition_ring_name(topic, index)))
        except BaseException:
            for ring in rings:
                ring.close()
            raise
        return rings, ext, bool(spec.get("ordered")), True

    def ids(self):
        from nsqshm._core.codec import IdGenerator

        return IdGenerator.open(f"{self.prefix}.ids")


__all__ = ["Broker", "LocalError", "NoBroker", "check_name"]
