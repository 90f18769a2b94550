"""The broker: topics, the shared-memory naming, the scan loop and the
listeners (nsqd's nsqd.go).

Shared memory lives under a per-instance prefix: `--shm-prefix`, or
`nsqshm.<12 hex digits of sha1(absolute data path)>`, so two brokers with
different data paths never share a segment and a broker restarted on the
same data path finds its rings again.

The scan loop (nsqd's queueScanLoop) sleeps until the earliest in-flight
deadline or deferred due time of any channel, and is woken early when an
earlier one is scheduled; an idle broker does not wake at all.

With several workers (arbiter.py) each runs one NSQD.  Every worker knows
every topic and channel (cluster.py carries the changes), publishes into
the topic rings and consumes the channel rings; a topic's owner, a stable
hash of its name, alone runs its pump and owns its disk queues.  The
messages a worker holds (in flight, deferred) live in its arena in shared
memory, and a new worker puts a dead one's back (recovery.py).
"""

import contextlib
import errno
import json
import os
import random
import socket
import time
import zlib

import gevent
import gevent.event
import gevent.local
from gevent.server import StreamServer

from nsqshm import NSQD_COMPAT_VERSION
from nsqshm._core.arena import Arena
from nsqshm._core.codec import LEASE_FILE as ID_LEASE_FILE
from nsqshm._core.codec import IdGenerator
from nsqshm.flags import format_address
from nsqshm.nsqd import ext
from nsqshm.nsqd.local import instance
from nsqshm.nsqd.log import LEVELS, Logger
from nsqshm.nsqd.logtopics.logspecs import load_specs, write_specs
from nsqshm.nsqd.logtopics.logtopic import LogTopic, LogTopicError, append_for_peer, make_spec
from nsqshm.nsqd.names import is_ephemeral, is_valid_name
from nsqshm.nsqd.policies import peek, policy
from nsqshm.nsqd.topic import Topic
from nsqshm.nsqd.tracing import trace
from nsqshm.nsqd.workers import listeners
from nsqshm.nsqd.workers.scratch import ScratchPool
from nsqshm.ring import Ring, use_gevent

MESSAGE_OVERHEAD = 26 + 8  # message header, ring record header
# the options nsqd lets change while running (PUT /config/<opt>, SIGHUP here):
# every worker holds the same values, so any worker answers GET /config alike
RUNTIME_OPTIONS = ("lookupd_tcp_address", "log_level")
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# cluster.py ops of issue 18's modules: peek, policies, redrive
PEER_OPS = {**peek.PEER_OPS, **policy.PEER_OPS, **ext.PEER_OPS, **trace.PEER_OPS}


split_address = listeners.split_address


def ring_capacity(opts):
    """Bytes for one queue: room for --mem-queue-size messages of 512 bytes,
    and always for two of the largest."""
    need = max(opts.mem_queue_size * 512, 2 * (opts.max_msg_size + MESSAGE_OVERHEAD) + 4096)
    cap = 4096
    while cap < need:
        cap <<= 1
    return cap


class NSQD:
    def __init__(self, opts, log=None, index=0, workers=1):
        self.opts = opts
        self.index = index
        self.nworkers = max(1, workers)
        self.arena = None    # this worker's in-flight arena, from start()
        self.cluster = None  # the other workers (cluster.py), when there are any
        # cluster mode: the log topics in etcd with a replica here (replica.py), which
        # only the cluster deletes
        self.replicated_topics = set()
        self._remote = gevent.local.local()  # set while applying a peer's change
        self.log = log or Logger(prefix=opts.log_prefix, level=opts.log_level)
        self.data_path = os.path.abspath(opts.data_path or ".")
        self.shm_prefix = instance.prefix_for(self.data_path, opts.shm_prefix)
        self.ids = IdGenerator.open(f"{self.shm_prefix}.ids", node_id=opts.node_id,
                                    lease_path=os.path.join(self.data_path, ID_LEASE_FILE))
        self.topics = {}
        self.clients = {}
        # delivery rounds with more to deliver on this worker: publishers yield to
        # them (fairshare.py)
        self.delivery_rounds = 0
        self.last_publish = float("-inf")  # monotonic time (fairshare.py)
        self.trace_switches = None
        trace.switches(self)  # the tracing switches persisted in the data path
        self.start_time = time.time()
        self.hostname = socket.gethostname()
        self._health = "OK"      # this worker's: its last disk write
        self._peer_health = {}   # the other workers' (index -> text), as they report it
        self._health_probe = None
        self.version = NSQD_COMPAT_VERSION
        self.capacity = ring_capacity(opts)
        self.max_record = opts.max_msg_size + MESSAGE_OVERHEAD
        # batches of records: at least two of the largest (scratch.py)
        self.scratch = ScratchPool(max(1 << 20, 2 * (self.max_record + 4)))
        self._client_seq = 0
        self._scan_wake = gevent.event.Event()
        self._scan_at = None
        self._scanner = None
        self.tcp_server = None
        self.http_server = None
        self.https_server = None
        self.tls_context = None  # --tls-cert/--tls-key (nsqshm.nsqd.tcp.tls)
        self.exiting = False
        self.loading = False
        # set once start() loaded the topology: before that a peer asking for it
        # (all workers start together after a group kill) must not take our
        # empty one for the broker's, write it to nsqd.dat and drop messages
        self.topology_loaded = False
        self._dirty_backends = set()
        self._syncer = None
        self.publish_instance = True  # the supervisor writes it when there are workers
        self.lookup = None  # nsqlookupd registration (nsqshm.nsqd.lookup), from start()
        self.statsd = None  # statsd pushes (nsqshm.nsqd.monitoring.statsd), with --statsd-address
        self.local_watch = None  # worker 0: local clients' arenas (local_watch.py)

    # -- shared memory ----------------------------------------------------------------

    def make_ring(self, suffix):
        ring = Ring.create(f"{self.shm_prefix}.{suffix}", self.capacity,
                           max_record=self.max_record, exist_ok=True)
        if ring.retired:  # (kept by a stop whose last drain or flush failed: it goes on)
            ring.unretire()
        return ring

    # -- topics ---------------------------------------------------------------------

    def get_topic(self, name):
        topic = self.topics.get(name)
        if topic is None:
            if not is_valid_name(name):
                raise ValueError(f"invalid topic name {name!r}")
            topic = Topic(self, name)
            self.topics[name] = topic
            self.notify_change(topic=name)
            self.broadcast_change("topic_create", name)
        return topic

    def get_existing_topic(self, name):
        """The topic if it exists: here, or made on another worker a moment
        ago (its ring exists), so a create on one connection is seen by the
        next request whichever worker takes it."""
        topic = self.topics.get(name)
        if topic is None and self.cluster is not None and is_valid_name(name) \
                and Ring.exists(f"{self.shm_prefix}.t.{name}"):
            topic = self.get_topic(name)
        return topic

    def delete_topic(self, name, rings=None):
        """Delete the topic and its channels.  rings: applying another
        worker's delete, the identities of the rings it removed; a channel
        on another ring was made here meanwhile (a SUB here before the delete
        arrived, whose create the deleter applies after its delete): its
        ring, disk queue and messages stay, and the topic and channel are
        made again on them, as the deleter has them."""
        topic = self.topics.pop(name, None)
        if topic is None:
            raise KeyError(name)
        channels = list(topic.channels)
        removed = None if topic.is_log else \
            [topic.ring.identity, *(c.ring.identity for c in topic.channels.values())]
        newer = [] if rings is None or topic.is_log else \
            [c for c in channels if topic.channels[c].ring.identity not in rings]
        if newer:
            topic.close(delete=True, keep=newer)
        else:
            topic.close(delete=True)
        if topic.is_log:
            self.persist_log_topics()
        self.notify_change(topic=name, deleted=True, channels=channels)
        self.broadcast_change("topic_delete", name, rings=removed)
        if newer:
            again = self.get_topic(name)
            for channel in newer:
                again.get_channel(channel)

    # -- log topics (logtopic.py) ----------------------------------------------------------

    def create_log_topic(self, name, partition_num, retention_days=-1, retention_bytes=-1,
                         sync_every=0, ordered=False):
        """POST /topic/create with partition_num: the log topic, made here and
        on every other worker before the answer.  LogTopicError with the HTTP
        error text when the name is a classic topic's or the parameters differ
        from the existing log topic's."""
        if not is_valid_name(name) or is_ephemeral(name):
            raise LogTopicError("INVALID_TOPIC")
        spec = make_spec(name, partition_num, retention_days, retention_bytes, sync_every,
                         ordered)
        return self.apply_log_topic(spec)

    def apply_log_topic(self, spec):
        name = spec["name"]
        topic = self.topics.get(name)
        if topic is None and self.cluster is not None \
                and Ring.exists(f"{self.shm_prefix}.t.{name}"):
            topic = self.get_existing_topic(name)  # a classic topic made a moment ago
        if topic is not None:
            if not topic.is_log:
                raise LogTopicError("TOPIC_EXISTS_AS_CLASSIC_TOPIC")
            if topic.spec["partition_num"] != spec["partition_num"]:
                raise LogTopicError("TOPIC_EXISTS_WITH_OTHER_PARTITION_NUM")
            every = spec.get("sync_every", 0)
            changed = {}
            if every and every != topic.spec.get("sync_every", 0):
                # syncdisk given again (in cluster mode: TopicMeta's, on a topic made before)
                changed["sync_every"] = every
            if spec.get("ordered") and not topic.ordered:  # orderedmulti given again
                changed["ordered"] = True
            if changed:
                topic.spec.update(changed)
                self._persist_log_topics()
                self._share_log_topic(topic.spec)
            return topic
        topic = LogTopic(self, name, spec)
        self.topics[name] = topic
        self._persist_log_topics()  # before nsqd.dat lists it (notify_change)
        self.notify_change(topic=name)
        self._share_log_topic(spec)
        return topic

    def _persist_log_topics(self):
        if not self.loading:
            try:
                self.persist_log_topics()
            except OSError as err:
                self.set_health(err)

    def _share_log_topic(self, spec):
        """A log topic made or changed here, sent to the other workers."""
        if self.cluster is not None and not self.loading \
                and not getattr(self._remote, "active", False):
            self.cluster.broadcast({"op": "logtopic", "spec": spec})
            if not self.exiting:
                self.cluster.flush()

    def log_topic_specs(self):
        return [t.spec for t in self.topics.values() if t.is_log]

    def persist_log_topics(self):
        """nsqshm.logtopics.json: worker 0 writes it, as nsqd.dat."""
        if self.index != 0:
            return
        write_specs(self.data_path, self.log_topic_specs())

    def load_log_topics(self, specs):
        for spec in specs:
            try:
                spec = make_spec(spec.get("name", ""), spec.get("partition_num"),
                                 spec.get("retention_days", -1), spec.get("retention_bytes", -1),
                                 spec.get("sync_every", 0), spec.get("ordered") is True)
                if not is_valid_name(spec["name"]) or is_ephemeral(spec["name"]):
                    raise LogTopicError("INVALID_TOPIC")
                self.apply_log_topic(spec)
            except LogTopicError as err:
                self.logf("error", f"skipping log topic {spec!r} - {err.code}")

    # -- the other workers --------------------------------------------------------------

    def owns(self, topic_name):
        """Whether this worker runs the topic's pump and owns its disk queues."""
        return zlib.crc32(topic_name.encode()) % self.nworkers == self.index

    def owner_of(self, topic_name):
        return zlib.crc32(topic_name.encode()) % self.nworkers

    def broadcast_change(self, change, topic, channel=None, rings=None):
        """Tell the other workers about a change made here (not one applied
        from a peer, and not while loading what every worker loads); a
        delete names the rings it removed (apply_change)."""
        if self.cluster is None or self.loading or getattr(self._remote, "active", False):
            return
        msg = {"op": "apply", "change": change, "topic": topic, "channel": channel}
        if rings is not None:
            msg["rings"] = [list(identity) for identity in rings]
        self.cluster.broadcast(msg)
        if not self.exiting:  # answered once every worker has it (one broker)
            self.cluster.flush()

    def applying_peer_change(self):
        """Whether the running greenlet applies another worker's change."""
        return getattr(self._remote, "active", False)

    @contextlib.contextmanager
    def own_changes(self):
        """Changes made inside are this worker's and go to the others, even in
        a greenlet applying a peer's change (which are not sent back)."""
        was = getattr(self._remote, "active", False)
        self._remote.active = False
        try:
            yield
        finally:
            self._remote.active = was

    def handle_peer(self, msg):
        """A message from another worker (cluster.py); returns the reply or None."""
        op = msg.get("op")
        if op == "apply":
            self._remote.active = True
            try:
                self.apply_change(msg["change"], msg["topic"], msg.get("channel"),
                                  msg.get("rings"))
            except Exception as err:  # a peer's change must never kill this worker
                self.logf("error", f"WORKER: failed to apply {msg} - {err!r}")
            finally:
                self._remote.active = False
            return None
        if op == "want":  # the topic ring is full: the owner's pump should run
            topic = self.topics.get(msg["topic"])
            if topic is not None:
                topic.wake()
            return None
        if op == "logtopic":  # a log topic created on another worker
            self._remote.active = True
            try:
                self.apply_log_topic(msg["spec"])
            except Exception as err:  # a peer's change must never kill this worker
                self.logf("error", f"WORKER: failed to apply {msg} - {err!r}")
            finally:
                self._remote.active = False
            return None
        if op in PEER_OPS:
            return PEER_OPS[op](self, msg)
        if op == "barrier":  # every change sent before it on this connection is applied
            return {"ok": True}
        if op == "options":  # PUT /config on another worker: apply, then acknowledge
            self.apply_options(msg.get("values") or {})
            return {"ok": True}
        if op == "stats":  # this worker's part of the broker's /stats, /metrics, statsd
            from nsqshm.nsqd.monitoring.stats import worker_stats

            return worker_stats(self, msg.get("topic", ""), msg.get("channel", ""),
                                msg.get("clients", True), msg.get("mem", False),
                                msg.get("sketches", False))
        if op == "topology":  # with the run-time options, for a worker starting up
            if not self.topology_loaded:
                # answered at once (falsy: nothing to take over): no answer made workers
                # booting together wait out each other's 2 s gather, one start in three
                return {}
            return dict(self.topology(), options=self.runtime_options())
        if op == "health":
            self._peer_health[msg.get("index")] = msg.get("health", "OK")
            return None
        if op == "log_append":  # a traced publish another worker took for our partition
            return append_for_peer(self, msg)
        if op == "subscribers":  # a starting worker recounts every channel's (recovery.py)
            return {f"{t.name}:{c.name}": [len(c.clients), c.direct_clients]
                    for t in self.topics.values() for c in t.channels.values() if c.clients}
        if op == "clients":
            topic = self.topics.get(msg["topic"])
            channel = topic and topic.channels.get(msg["channel"])
            return {"count": 0 if channel is None
                    else channel.clients_taking(msg.get("partition", -1))}
        if op == "in_flight":  # a FIN/REQ/TOUCH on another worker found no such message
            topic = self.topics.get(msg["topic"])
            channel = topic and topic.channels.get(msg["channel"])
            try:
                msg_id = bytes.fromhex(msg["id"])
                found = channel is not None and len(msg_id) == 16 \
                    and channel.inflight.get_first_deadline(msg_id) >= 0
            except (ValueError, TypeError):
                found = False
            return {"in_flight": bool(found)}
        return {"error": f"unknown op {op!r}"}

    def in_flight_elsewhere(self, topic, channel, msg_id):
        """Whether a message of the channel is in flight on another worker."""
        if self.cluster is None:
            return False
        replies = self.cluster.gather({"op": "in_flight", "topic": topic, "channel": channel,
                                       "id": bytes(msg_id).hex()}, timeout=2)
        return any((r or {}).get("in_flight") for r in replies)

    def tell_owner(self, topic):
        """Ask the topic's owner to run its pump: its ring is full.  (An empty
        channel ring asks for a refill through the ring itself: Ring.nudge.)"""
        if self.cluster is not None:
            self.cluster.tell(self.owner_of(topic), {"op": "want", "topic": topic})

    def apply_change(self, change, topic_name, channel_name, rings=None):
        """Another worker's change.  A delete names the rings it removed:
        a queue here on another ring was made after it (a create the deleter
        has yet to apply, or has applied after its delete), and stays."""
        if self.exiting or not is_valid_name(topic_name or ""):
            return
        if rings is not None:
            try:
                rings = {(int(dev), int(ino)) for dev, ino in rings}
            except (TypeError, ValueError):
                rings = None
        kind, _, action = change.partition("_")
        if action == "create":
            topic = self.get_topic(topic_name)
            if kind == "channel":
                topic.get_channel(channel_name)
            return
        topic = self.topics.get(topic_name)
        if topic is None:
            return
        target = topic if kind == "topic" else topic.channels.get(channel_name)
        if target is None:
            return
        if action == "delete":
            ring = getattr(target, "ring", None)  # (a log topic has none)
            if rings is not None and ring is not None and ring.identity not in rings:
                return  # made here after that delete: newer than what it deleted
            if kind == "topic":
                self.delete_topic(topic_name, rings)
            else:
                topic.delete_channel(channel_name)
        elif action in ("pause", "unpause", "empty"):
            getattr(target, action)()

    def topology(self):
        """Every topic and channel, ephemeral ones too, in nsqd.dat's shape."""
        return {"topics": [
            {"name": t.name, "paused": t.paused, **policy.meta(t), **ext.meta(t),
             "channels": [{"name": c.name, "paused": c.paused, **policy.meta(c)}
                          for c in t.channels.values()]}
            for t in self.topics.values()], "log_topics": self.log_topic_specs()}

    def notify_change(self, topic=None, channel=None, deleted=False, channels=()):
        """Topology changed: persist nsqd.dat; tell nsqlookupd when a topic
        (channel None) or channel was created or deleted (channels: those a
        deleted topic had)."""
        if not self.loading:
            try:
                self.persist_metadata()
            except OSError as err:
                self.set_health(err)
        if self.lookup is not None and topic is not None:
            self.lookup.notify(topic, channel, deleted, channels)

    def runtime_options(self):
        return {key: getattr(self.opts, key) for key in RUNTIME_OPTIONS}

    def set_options(self, values):
        """PUT /config/<opt>: apply values here and on every other worker;
        returns once each peer has acknowledged, so that the next request,
        whichever worker takes it, sees them.  A peer that does not answer
        (stopping, or being replaced) is logged; a worker that starts takes
        the options from a running peer with the topology."""
        self.apply_options(values)
        if self.cluster is None:
            return
        replies = self.cluster.gather({"op": "options", "values": values})
        missed = [peer for peer, reply in zip(self.cluster.peers, replies, strict=True)
                  if not (reply or {}).get("ok")]
        if missed:
            self.logf("warn", f"WORKER: options not acknowledged by workers {missed}")

    def apply_options(self, values):
        """Set run-time options (nsqd's swapOpts) and act on them: the log
        level at once, the lookupd peers in the lookup loop (worker 0's)."""
        for key, value in values.items():
            if key == "log_level" and str(value).lower() in LEVELS:
                self.opts.log_level = str(value).lower()
            elif key == "lookupd_tcp_address" and isinstance(value, list) \
                    and all(isinstance(v, str) for v in value):
                self.opts.lookupd_tcp_address = list(value)
        self.log.level = LEVELS.get(str(self.opts.log_level).lower(), self.log.level)
        self.options_changed()

    def options_changed(self):
        """An option changed (nsqd's triggerOptsNotification)."""
        if self.lookup is not None:
            self.lookup.options_changed()

    # -- logging and health ---------------------------------------------------------

    def logf(self, level, msg):
        getattr(self.log, level)(msg)

    def set_health(self, err=None):
        """nsqd's health: "OK", or "NOK - <error>" after a failed disk write,
        until a write succeeds.  The broker's is NOK while any worker's is
        (each tells the others), so /ping on any worker reports a full disk;
        and a full disk that gets room again is noticed without a write
        (_probe_disk), so /ping says OK again by itself."""
        health = "OK" if err is None else f"NOK - {err}"
        if health == self._health:
            return
        if err is not None:
            self.logf("error", f"health check failed - {err}")
            if getattr(err, "errno", None) in DISK_FULL and self._health_probe is None:
                self._health_probe = gevent.spawn(self._probe_disk)
        self._health = health
        if self.cluster is not None:
            self.cluster.broadcast({"op": "health", "index": self.index, "health": health})

    @property
    def health(self):
        if self._health != "OK":
            return self._health
        return next((h for h in self._peer_health.values() if h != "OK"), "OK")

    def _probe_disk(self):
        """While a full disk made this worker NOK: OK again once the data
        path has room for two of the largest messages (the next write then
        tells for sure).  Polls only while the disk is full."""
        try:
            while self._health != "OK" and not self.exiting:
                gevent.sleep(0.5)
                try:
                    st = os.statvfs(self.data_path)
                except OSError:
                    continue
                if st.f_bavail * st.f_frsize >= 2 * self.max_record + (1 << 16):
                    self.set_health()
        finally:
            self._health_probe = None

    # -- nsqd.dat: topics, channels and paused state --------------------------------------
    #
    # {"topics":[{"name":"t","paused":false,"channels":[{"name":"c","paused":false}]}],
    #  "version":"1.3.0"}   -- compact, ephemeral ones left out, as nsqd writes it;
    # a topic or channel with a policy has its keys too (policy.py), which Go ignores

    @property
    def metadata_path(self):
        return os.path.join(self.data_path, "nsqd.dat")

    def persist_metadata(self):
        if self.index != 0:  # one writer: every worker holds the same topology
            return
        topics = []
        for topic in self.topics.values():
            if topic.ephemeral:
                continue
            channels = [{"name": c.name, "paused": c.paused, **policy.meta(c)}
                        for c in topic.channels.values() if not c.ephemeral]
            topics.append({"name": topic.name, "paused": topic.paused,
                           "channels": channels or None, **policy.meta(topic),
                           **ext.meta(topic)})
        data = json.dumps({"topics": topics or None, "version": self.version},
                          separators=(",", ":"))
        tmp = f"{self.metadata_path}.{random.getrandbits(31)}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, self.metadata_path)
        except OSError as err:
            self.logf("error", f"failed to persist metadata - {err}")
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def load_metadata(self):
        """Recreate the topics and channels of nsqd.dat (ours or a Go nsqd's)."""
        try:
            with open(self.metadata_path) as f:
                data = json.load(f)
        except FileNotFoundError:
            data = {}
        except ValueError as err:
            raise RuntimeError(f"failed to parse metadata file {self.metadata_path} - {err}") from None
        data["log_topics"] = load_specs(self.data_path)  # (not in nsqd.dat: Go's shape)
        self.load_topology(data)

    def load_topology(self, data, ephemeral=False):
        """Create the topics and channels of data (nsqd.dat's shape); ephemeral
        ones only when they come from a running peer."""
        self.loading = True
        try:
            self.load_log_topics(data.get("log_topics") or [])  # before their channels
            for t in data.get("topics") or []:
                name = t.get("name", "")
                if not is_valid_name(name) or (is_ephemeral(name) and not ephemeral):
                    self.logf("warn", f"skipping creation of invalid topic {name}")
                    continue
                topic = self.get_topic(name)
                ext.load(topic, t)
                policy.load(self, topic, t, channel_level=False)
                if t.get("paused"):
                    topic.pause()
                for c in t.get("channels") or []:
                    cname = c.get("name", "")
                    if not is_valid_name(cname) or (is_ephemeral(cname) and not ephemeral):
                        self.logf("warn", f"skipping creation of invalid channel {cname}")
                        continue
                    channel = topic.get_channel(cname)
                    policy.load(self, channel, c, channel_level=True)
                    if c.get("paused"):
                        channel.pause()
        finally:
            self.loading = False

    # -- disk queue syncs -----------------------------------------------------------------

    def backend_written(self, backend):
        """A backend has unsynced writes: sync it within --sync-timeout."""
        if backend.needs_sync:
            self._dirty_backends.add(backend)
            if self._syncer is None:
                self._syncer = gevent.spawn_later(self.opts.sync_timeout, self._sync_backends)

    def _sync_backends(self):
        self._syncer = None
        dirty, self._dirty_backends = self._dirty_backends, set()
        for backend in dirty:
            try:
                if backend.needs_sync:
                    backend.sync()
            except OSError as err:
                self.set_health(err)

    def next_client_id(self):
        self._client_seq += 1
        return self._client_seq

    # -- the scan loop ----------------------------------------------------------------

    def schedule_scan(self, when_ns):
        """Make sure the scan loop runs by when_ns (monotonic ns)."""
        if self._scan_at is None or when_ns < self._scan_at:
            self._scan_at = when_ns
            self._scan_wake.set()

    def _scan_loop(self):
        while not self.exiting:
            now = time.monotonic_ns()
            earliest = None
            for topic in list(self.topics.values()):
                for channel in list(topic.channels.values()):
                    if len(channel.inflight):
                        channel.process_timeouts(now)
                    if len(channel.deferred):
                        channel.process_deferred(now)
                    d = channel.next_deadline()
                    if d >= 0 and (earliest is None or d < earliest):
                        earliest = d
            self._scan_at = earliest
            self._scan_wake.clear()
            if earliest is None:
                self._scan_wake.wait()
            else:
                self._scan_wake.wait(max(0.0, (earliest - time.monotonic_ns()) / 1e9) + 0.001)

    # -- lifecycle --------------------------------------------------------------------

    def start(self):
        """Bind and start the TCP and HTTP listeners; returns their addresses
        (http None when --http-address is empty)."""
        from nsqshm.nsqd.http_api import make_http_server
        from nsqshm.nsqd.tcp.protocol_v2 import ProtocolV2

        use_gevent()
        # the random tail: a dead worker's arena may carry a pid now reused
        self.arena = Arena.create(
            f"{self.shm_prefix}.f.w{self.index}.{os.getpid()}.{os.urandom(3).hex()}",
            label=f"nsqd worker {self.index}",
            # a queue per topic and channel: tens of thousands fit (256 bytes
            # each, in pages touched only as used)
            max_queues=1 << 16)
        # which ordered lanes each channel here attached (LogChannel._mark_ordered_lanes)
        self.arena.keep_queue_lanes()
        peers_topology = None
        if self.nworkers > 1:
            from nsqshm.nsqd.workers.cluster import Cluster

            self.cluster = Cluster(self)
            self.cluster.start()
            # a dead predecessor's NOK is no longer this index's health
            self.cluster.broadcast({"op": "health", "index": self.index, "health": self._health})
            peers_topology = next((t for t in self.cluster.gather({"op": "topology"}, timeout=2)
                                   if t), None)
        if peers_topology is not None:  # a worker replacing a dead one
            # options changed at run time (PUT /config, SIGHUP) hold here too
            self.apply_options(peers_topology.get("options") or {})
            self.load_topology(peers_topology, ephemeral=True)
        else:
            self.load_metadata()
        self.topology_loaded = True
        self.persist_metadata()  # fails at start-up, as nsqd, when the data path is unwritable
        if not os.access(self.data_path, os.W_OK):
            raise RuntimeError(f"data path {self.data_path} is not writable")
        from nsqshm.nsqd.workers import recovery

        recovery.remove_stale_fifos(self)
        recovery.recover_orphans(self)
        recovery.recover_overflows(self)
        recovery.recount_subscribers(self)
        self.protocol = ProtocolV2(self)
        self.tcp_server = StreamServer(listeners.listen(self.listen_address("tcp_address")),
                                       self.protocol.handle)
        self.tcp_server.init_socket()
        self.tcp_server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.opts.http_address:  # empty: no HTTP listener, as nsqd
            self.http_server = make_http_server(self)
        from nsqshm.nsqd.tcp import tls

        self.tls_context = tls.build_server_context(self.opts)
        self.https_server = tls.install_https(self)
        self.tcp_server.start()
        for server in (self.http_server, self.https_server):
            if server is not None:
                server.start()
        self._scanner = gevent.spawn(self._scan_loop)
        from nsqshm.nsqd import lookup
        from nsqshm.nsqd.monitoring import statsd

        lookup.resolve_broadcast_ports(self)
        if self.index == 0:  # one registration and one statsd feed for the whole broker
            self.lookup = lookup.Lookup(self)
            self.lookup.start()
            self.statsd = statsd.start(self)
            from nsqshm.nsqd.local.watch import LocalWatch

            self.local_watch = LocalWatch(self)  # local clients that die
            self.local_watch.start()
        if self.publish_instance:
            self.write_instance()
        return self.tcp_server.address, self.http_server and self.http_server.address

    def listen_address(self, key):
        """Where to listen: the port the supervisor reserved, else the flag."""
        return getattr(self.opts, "bound", {}).get(key) or getattr(self.opts, key)

    def write_instance(self):
        """Let local clients find this broker (nsqshm.nsqd.local.instance)."""
        http = self.http_server and self.http_server.address
        instance.write(self.shm_prefix, instance.record(
            self.shm_prefix, self.data_path, format_address(self.tcp_server.address),
            format_address(http) if http else None, self.nworkers, self.opts))

    def stop(self, alone=False):
        """Stop this broker (or, alone, this worker while the others go on)."""
        self.stop_clients()
        if alone:
            self.close_queues()
        else:
            self.stop_queues()

    def stop_clients(self):
        """Graceful stop, phase 1: stop listening, close the clients, put the
        in-flight messages back into their channels and write the deferred
        ones to disk."""
        if self.exiting:
            return
        self.exiting = True
        if self.publish_instance:
            instance.remove(self.shm_prefix, pid=os.getpid())
        for service in (self.lookup, self.statsd, self.local_watch):
            if service is not None:
                service.stop()
        for server in (self.tcp_server, self.http_server, self.https_server):
            if server is not None:
                server.stop(timeout=1)
        for client in list(self.clients.values()):
            client.close()
        if self._scanner is not None:
            self._scanner.kill(block=False)
        for topic in list(self.topics.values()):
            topic.stop_overflow()
            for channel in list(topic.channels.values()):
                channel.give_back()

    def stop_queues(self):
        """Graceful stop, phase 2 (every worker has done phase 1): the owners
        write what the rings hold to disk and remove them."""
        if self._syncer is not None:
            self._syncer.kill(block=False)
        if self.cluster is not None:
            self.cluster.stop()
        try:
            self.persist_metadata()
        except OSError:
            pass
        for topic in list(self.topics.values()):
            if topic.owned or topic.is_log:  # (a log topic: each worker its partitions)
                topic.close(delete=False)  # rings, in-flight and deferred messages to disk
            else:
                topic.close_handles()
        self.close_arena()
        self.ids.close()

    def close_queues(self):
        """A worker stopping alone: disk queues synced and closed, rings left
        for the others and the next worker."""
        if self._syncer is not None:
            self._syncer.kill(block=False)
        if self.cluster is not None:
            self.cluster.stop()
        for topic in list(self.topics.values()):
            topic.close_handles(sync=True)
        self.close_arena()
        self.ids.close()

    def close_arena(self):
        """Remove the arena when it holds nothing; else leave it for recovery."""
        if self.arena is None:
            return
        if self.arena.live_blocks == 0:
            self.arena.unlink()
        else:
            self.logf("warn", f"{self.arena.live_blocks} messages stay in {self.arena.name} "
                              f"for the next start")
        self.arena.close()
        self.arena = None
