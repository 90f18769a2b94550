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

import hashlib
import os
import socket
import time

import gevent
import gevent.event
from gevent.server import StreamServer

from nsqshm import NSQD_COMPAT_VERSION
from nsqshm._core.codec import IdGenerator
from nsqshm.nsqd.names import is_valid_name
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
    def __init__(self, opts):
        self.opts = opts
        self.data_path = os.path.abspath(opts.data_path or ".")
        digest = hashlib.sha1(self.data_path.encode()).hexdigest()[:12]
        self.shm_prefix = opts.shm_prefix or f"nsqshm.{digest}"
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
        self.exiting = False

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
            self.notify_change()
        return topic

    def get_existing_topic(self, name):
        return self.topics.get(name)

    def delete_topic(self, name):
        topic = self.topics.pop(name, None)
        if topic is None:
            raise KeyError(name)
        topic.close(delete=True)
        self.notify_change()

    def notify_change(self):
        """Topology changed (lookupd registration and nsqd.dat hook)."""

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
        self.protocol = ProtocolV2(self)
        self.tcp_server = StreamServer(split_address(self.opts.tcp_address), self.protocol.handle,
                                       backlog=1024)
        self.tcp_server.init_socket()
        self.tcp_server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.opts.http_address:  # empty: no HTTP listener, as nsqd
            self.http_server = make_http_server(self)
        self.tcp_server.start()
        if self.http_server is not None:
            self.http_server.start()
        self._scanner = gevent.spawn(self._scan_loop)
        return self.tcp_server.address, self.http_server and self.http_server.address

    def stop(self):
        """Stop listening, close clients, put in-flight messages back, close rings."""
        if self.exiting:
            return
        self.exiting = True
        for server in (self.tcp_server, self.http_server):
            if server is not None:
                server.stop(timeout=1)
        for client in list(self.clients.values()):
            client.close()
        if self._scanner is not None:
            self._scanner.kill(block=False)
        for topic in list(self.topics.values()):
            topic.close(delete=False)
        self.ids.close()
