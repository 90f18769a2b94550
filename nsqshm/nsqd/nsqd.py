"""The broker: topics, the shared-memory naming, the scan loop and the
listeners (nsqd's nsqd.go).

Shared memory lives under a per-instance prefix: `--shm-prefix`, or
`nsqshm.<12 hex digits of sha1(absolute data path)>`, so two brokers with
different data paths never share a segment and a broker restarted on the
same data path finds its rings again.

The scan loop (nsqd's queueScanLoop) sleeps until the earliest in-flight
deadline or deferred due time of any channel, and is woken early when an
earlier one is scheduled; an idle broker does not wake at all.
"""

import json
import os
import random
import socket
import time

import gevent
import gevent.event
from gevent.server import StreamServer

from nsqshm import NSQD_COMPAT_VERSION
from nsqshm._core.codec import IdGenerator
from nsqshm.nsqd import instance
from nsqshm.nsqd.log import Logger
from nsqshm.nsqd.names import is_ephemeral, is_valid_name
from nsqshm.nsqd.topic import Topic
from nsqshm.ring import Ring, use_gevent

MESSAGE_OVERHEAD = 26 + 8  # message header, ring record header


def split_address(address):
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def ring_capacity(opts):
    """Bytes for one queue: room for --mem-queue-size messages of 512 bytes,
    and always for two of the largest."""
    need = max(opts.mem_queue_size * 512, 2 * (opts.max_msg_size + MESSAGE_OVERHEAD) + 4096)
    cap = 4096
    while cap < need:
        cap <<= 1
    return cap


class NSQD:
    def __init__(self, opts, log=None):
        self.opts = opts
        self.log = log or Logger(prefix=opts.log_prefix, level=opts.log_level)
        self.data_path = os.path.abspath(opts.data_path or ".")
        self.shm_prefix = instance.prefix_for(self.data_path, opts.shm_prefix)
        self.ids = IdGenerator.open(f"{self.shm_prefix}.ids")
        self.topics = {}
        self.clients = {}
        self.start_time = time.time()
        self.hostname = socket.gethostname()
        self.health = "OK"
        self.version = NSQD_COMPAT_VERSION
        self.capacity = ring_capacity(opts)
        self.max_record = opts.max_msg_size + MESSAGE_OVERHEAD
        self._client_seq = 0
        self._scan_wake = gevent.event.Event()
        self._scan_at = None
        self._scanner = None
        self.tcp_server = None
        self.http_server = None
        self.https_server = None
        self.tls_context = None  # --tls-cert/--tls-key (nsqshm.nsqd.tls)
        self.exiting = False
        self.loading = False
        self._dirty_backends = set()
        self._syncer = None
        self.publish_instance = True  # the supervisor writes it when there are workers
        self.lookup = None  # nsqlookupd registration (nsqshm.nsqd.lookup), from start()
        self.statsd = None  # statsd pushes (nsqshm.nsqd.statsd), with --statsd-address

    # -- shared memory ----------------------------------------------------------------

    def make_ring(self, suffix):
        return Ring.create(f"{self.shm_prefix}.{suffix}", self.capacity,
                           max_record=self.max_record, exist_ok=True)

    # -- topics ---------------------------------------------------------------------

    def get_topic(self, name):
        topic = self.topics.get(name)
        if topic is None:
            if not is_valid_name(name):
                raise ValueError(f"invalid topic name {name!r}")
            topic = Topic(self, name)
            self.topics[name] = topic
            self.notify_change(topic=name)
        return topic

    def get_existing_topic(self, name):
        return self.topics.get(name)

    def delete_topic(self, name):
        topic = self.topics.pop(name, None)
        if topic is None:
            raise KeyError(name)
        channels = list(topic.channels)
        topic.close(delete=True)
        self.notify_change(topic=name, deleted=True, channels=channels)

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

    def options_changed(self):
        """PUT /config/<opt> changed an option (nsqd's triggerOptsNotification)."""
        if self.lookup is not None:
            self.lookup.options_changed()

    # -- logging and health ---------------------------------------------------------

    def logf(self, level, msg):
        getattr(self.log, level)(msg)

    def set_health(self, err=None):
        """nsqd's health: "OK", or "NOK - <error>" after a failed backend write."""
        health = "OK" if err is None else f"NOK - {err}"
        if health != self.health and err is not None:
            self.logf("error", f"health check failed - {err}")
        self.health = health

    # -- nsqd.dat: topics, channels and paused state --------------------------------------
    #
    # {"topics":[{"name":"t","paused":false,"channels":[{"name":"c","paused":false}]}],
    #  "version":"1.3.0"}   -- compact, ephemeral ones left out, as nsqd writes it

    @property
    def metadata_path(self):
        return os.path.join(self.data_path, "nsqd.dat")

    def persist_metadata(self):
        topics = []
        for topic in self.topics.values():
            if topic.ephemeral:
                continue
            channels = [{"name": c.name, "paused": c.paused}
                        for c in topic.channels.values() if not c.ephemeral]
            topics.append({"name": topic.name, "paused": topic.paused,
                           "channels": channels or None})
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
            return
        except ValueError as err:
            raise RuntimeError(f"failed to parse metadata file {self.metadata_path} - {err}") from None
        self.loading = True
        try:
            for t in data.get("topics") or []:
                name = t.get("name", "")
                if not is_valid_name(name) or is_ephemeral(name):
                    self.logf("warn", f"skipping creation of invalid topic {name}")
                    continue
                topic = self.get_topic(name)
                if t.get("paused"):
                    topic.pause()
                for c in t.get("channels") or []:
                    cname = c.get("name", "")
                    if not is_valid_name(cname) or is_ephemeral(cname):
                        self.logf("warn", f"skipping creation of invalid channel {cname}")
                        continue
                    channel = topic.get_channel(cname)
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
        from nsqshm.nsqd.protocol_v2 import ProtocolV2

        use_gevent()
        self.load_metadata()
        self.persist_metadata()  # fails at start-up, as nsqd, when the data path is unwritable
        self.protocol = ProtocolV2(self)
        self.tcp_server = StreamServer(split_address(self.opts.tcp_address), self.protocol.handle,
                                       backlog=1024)
        self.tcp_server.init_socket()
        self.tcp_server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.opts.http_address:  # empty: no HTTP listener, as nsqd
            self.http_server = make_http_server(self)
        from nsqshm.nsqd import tls

        self.tls_context = tls.build_server_context(self.opts)
        self.https_server = tls.install_https(self)
        self.tcp_server.start()
        for server in (self.http_server, self.https_server):
            if server is not None:
                server.start()
        self._scanner = gevent.spawn(self._scan_loop)
        from nsqshm.nsqd import lookup, statsd

        lookup.resolve_broadcast_ports(self)
        self.lookup = lookup.Lookup(self)
        self.lookup.start()
        self.statsd = statsd.start(self)
        if self.publish_instance:
            self.write_instance()
        return self.tcp_server.address, self.http_server and self.http_server.address

    def write_instance(self):
        """Let local clients find this broker (nsqshm.nsqd.instance)."""
        from nsqshm.nsqd.main import format_address

        http = self.http_server and self.http_server.address
        instance.write(self.shm_prefix, {
            "pid": os.getpid(), "prefix": self.shm_prefix, "data_path": self.data_path,
            "tcp_address": format_address(self.tcp_server.address),
            "http_address": format_address(http) if http else None,
            "workers": 1, "max_msg_size": self.opts.max_msg_size,
            "msg_timeout": self.opts.msg_timeout})

    def stop(self):
        """Stop listening, close clients, put in-flight messages back, close rings."""
        if self.exiting:
            return
        self.exiting = True
        instance.remove(self.shm_prefix, pid=os.getpid())
        for service in (self.lookup, self.statsd):
            if service is not None:
                service.stop()
        for server in (self.tcp_server, self.http_server, self.https_server):
            if server is not None:
                server.stop(timeout=1)
        for client in list(self.clients.values()):
            client.close()
        if self._scanner is not None:
            self._scanner.kill(block=False)
        if self._syncer is not None:
            self._syncer.kill(block=False)
        try:
            self.persist_metadata()
        except OSError:
            pass
        for topic in list(self.topics.values()):
            topic.close(delete=False)  # rings, in-flight and deferred messages to disk
        self.ids.close()
