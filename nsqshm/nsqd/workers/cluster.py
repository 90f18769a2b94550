"""Worker-to-worker messages (one broker, several worker processes).

Each worker listens on an abstract unix socket named after the broker's
shared-memory prefix and its index; a peer must run as the same user
(SO_PEERCRED).  One JSON object per line each way.

    {"op": "apply", "change": "channel_pause", "topic": "t", "channel": "c"}
        a topology change made on one worker, applied by every other
        (create, delete, pause, unpause, empty of topics and channels)
    {"op": "want", "topic": "t"}
        to the topic's owner: its topic ring is full, run the pump
    {"op": "stats", ...}   this worker's part of /stats (stats.worker_stats)
    {"op": "topology"}     every topic and channel, and the run-time options,
                           for a worker starting up
    {"op": "options", "values": {"log_level": "warn"}}
        PUT /config on another worker: apply, answer {"ok": true}; the
        PUT is answered once every peer has (NSQD.set_options)
    {"op": "clients", "topic": "t", "channel": "c"}   subscribed clients here
    {"op": "in_flight", "topic": "t", "channel": "c", "id": "<hex>"}
        whether the message is in flight here (FIN of another worker's message)

    {"op": "barrier"}      answered {"ok": true} once what came before it on
                           the same connection is applied

Changes go to each peer in order, over one kept connection per peer; a
peer that is down misses them and asks for the topology when it starts.
A change is answered (HTTP, TCP) only after a barrier on every peer's
connection came back (Cluster.flush): the next request sees it whichever
worker takes it.
"""

import json
import os
import socket
import struct

import gevent
import gevent.event
import gevent.queue
from gevent import socket as gsocket
from gevent.server import StreamServer

TIMEOUT = 5.0
FLUSH_TIMEOUT = 2.0  # a hung peer delays a change this long, then is left behind
MAX_LINE = 64 << 20


def control_address(prefix, index):
    return f"\0{prefix}.ctl.{index}"


def _peer_uid(sock):
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _read_line(fileobj):
    line = fileobj.readline(MAX_LINE)
    if not line:
        return None
    return json.loads(line)


class Cluster:
    def __init__(self, nsqd):
        self.nsqd = nsqd
        self.index = nsqd.index
        self.peers = [i for i in range(nsqd.nworkers) if i != nsqd.index]
        self.queues = {i: gevent.queue.Queue() for i in self.peers}
        self.senders = []
        self.server = None

    # -- serving peers --------------------------------------------------------------------

    def start(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(control_address(self.nsqd.shm_prefix, self.index))
        sock.listen(64)
        self.server = StreamServer(sock, self._handle)
        self.server.start()
        self.senders = [gevent.spawn(self._send_loop, i) for i in self.peers]

    def stop(self):
        if self.server is not None:
            self.server.stop(timeout=1)
        for g in self.senders:
            g.kill(block=False)

    def _handle(self, sock, _address):
        if _peer_uid(sock) != os.getuid():
            sock.close()
            return
        f = sock.makefile("rwb")
        try:
            while True:
                msg = _read_line(f)
                if msg is None:
                    return
                reply = self.nsqd.handle_peer(msg)
                if reply is not None:
                    f.write(json.dumps(reply).encode() + b"\n")
                    f.flush()
        except (OSError, ValueError) as err:
            self.nsqd.logf("warn", f"WORKER: bad message from a peer - {err}")
        finally:
            f.close()
            sock.close()

    # -- talking to peers -----------------------------------------------------------------

    def _connect(self, peer):
        sock = gsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT)
        sock.connect(control_address(self.nsqd.shm_prefix, peer))
        return sock

    def _send_loop(self, peer):
        """Send queued messages to peer, in order; a message queued with a
        result waits for the peer's reply line (None if the peer is down)."""
        sock = f = None
        queue = self.queues[peer]
        while True:
            msg, result = queue.get()
            for _attempt in range(2):
                try:
                    if sock is None:
                        sock = self._connect(peer)
                        f = sock.makefile("rb")
                    sock.sendall(json.dumps(msg).encode() + b"\n")
                    if result is not None:
                        result.set(_read_line(f))
                    break
                except (OSError, ValueError):
                    if sock is not None:
                        f.close()
                        sock.close()
                    sock = f = None
            if result is not None and not result.ready():
                result.set(None)

    def tell(self, peer, msg):
        if peer in self.queues:
            self.queues[peer].put((msg, None))

    def broadcast(self, msg):
        for peer in self.peers:
            self.queues[peer].put((msg, None))

    def flush(self, timeout=FLUSH_TIMEOUT):
        """Wait until every peer has applied what was sent to it so far (a
        barrier behind it on each ordered connection), at most timeout."""
        results = []
        for peer in self.peers:
            result = gevent.event.AsyncResult()
            self.queues[peer].put(({"op": "barrier"}, result))
            results.append(result)
        gevent.wait(results, timeout=timeout)

    def call(self, peer, msg, timeout=TIMEOUT):
        """One request and its reply, or None when the peer does not answer."""
        try:
            with gevent.Timeout(timeout):
                sock = self._connect(peer)
                try:
                    f = sock.makefile("rwb")
                    f.write(json.dumps(msg).encode() + b"\n")
                    f.flush()
                    return _read_line(f)
                finally:
                    sock.close()
        except (OSError, ValueError, gevent.Timeout):
            return None

    def gather(self, msg, timeout=TIMEOUT):
        """Every peer's reply to msg (None for a peer that did not answer)."""
        jobs = [gevent.spawn(self.call, peer, msg, timeout) for peer in self.peers]
        gevent.joinall(jobs)
        return [j.value for j in jobs]
