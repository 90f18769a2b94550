"""The replication RPC between the nsqd of a cluster: a small length-prefixed binary
protocol on --rpc-port (worker k of a node listens on rpc-port + k: the worker that
owns a partition's log takes its replication, see nsqd/logtopics/partition.py's owner rule).

Every frame:

    +----------------+--------+---------------------------+
    | u32 BE  length | u8 kind|  body (length - 1 bytes)  |
    +----------------+--------+---------------------------+

    HELLO    (peer -> server)  JSON {"cluster": id, "node": node ID, "byteorder": ...,
                                     "version": PROTOCOL_VERSION[, "secret": hex]}
      secret: only between the workers of one node (PUBLISH), the node's own,
      which its supervisor made before it forked them (Arbiter.node_secret): a
      HELLO naming the server's own node ID without it is refused
    WELCOME  (server -> peer)  JSON {"node": node ID}          (or ERROR, then close)
      A peer of another protocol version is refused (the ERROR names both): the
      frames below change between builds, and a frame read by another layout would
      be taken wrong, not refused.  A follower that refuses its leader this way falls
      out of the ISR; the leader goes on with the others (one build per cluster).
    ERROR                      JSON {"error": text}
    APPEND   (leader -> follower)
        | u16 BE topic len | topic | u16 BE partition | u64 BE write epoch |
        | u64 BE first msg offset | u32 BE prev crc | records ...        |
      prev crc: crc32 of the leader's record at first - 1 (0 when its log holds
      none there); the follower takes the records only if its own record there is
      the same (or it holds none there), so that two logs that match at an offset
      match below it too (Raft's check of the previous entry).  Not checked, and
      sent as 0, on a frame that continues the connection's stream: the previous
      APPEND of the partition on this connection was taken and ended at first;
      records: the leader's log as LogReader.read_into packs it, [u32 size][message]...
      (the size in the hosts' native order: the cluster's hosts share one byte order,
      HELLO checks it); one frame carries a whole batch, not one message.  A frame with
      first offset PROBE and no records asks the follower where its log ends (and
      the crc32 of its last record); PROBE with records `| u64 BE offset |` asks for
      the crc32 of the record before that offset instead (0 if it holds none there:
      the leader's search for where a diverged log parts from its own).  TRUNCATE
      with records `| u64 BE offset |` has a follower out of the ISR whose log
      diverged there remove what it holds from that offset on (nothing if it holds
      nothing below it: its answer's end says).  RESET has a follower out of the ISR
      whose log diverged, or ends below the leader's start (retention removed the
      rest), remove it and begin an empty one where the leader's begins; its records
      are then that start:
        | u64 BE start msg offset | u64 BE start virtual offset |
    ACK      (follower -> leader)
        | u8 status | u16 BE topic len | topic | u16 BE partition | u64 BE end offset |
        | u32 BE crc32 of the record at end - 1 (answer to a PROBE only) |
      status OK: the records are in the follower's log, which ends at `end`;
      MISMATCH: nothing written, the log ends at `end` (send from there);
      FENCED: the follower knows a newer write epoch or another leader: the sender is
      deposed; UNKNOWN: no such partition on the follower's worker.
    PUBLISH  (a worker -> the worker of the same node that owns the partition)
        | u16 BE topic len | topic | u16 BE partition | records ... |
      a PUB that landed on another worker of the node: the owner appends and
      replicates it as its own, then answers
    PUBLISHED | u8 status | text |   status OK, NOT_LEADER or FAILED (text: why)
    CURSORS  (leader -> follower)   the partition's channel cursors, answered by an ACK
        | u16 BE topic len | topic | u16 BE partition | u64 BE write epoch |
        | u64 BE committed end | u16 BE count |
        |                count x ( u8 name len | name | u64 BE confirmed |
        |                          u64 BE delivered | u32 BE window len | window |
        |                          u32 BE retries len | retries ) |
      window: the cursor's finished-above bits as Cursor.snapshot gives them (native
      u64 words; empty when nothing above confirmed is finished).  retries: what the
      channel put back of the partition (REQ, timeout), as Cursor.retries gives it:
      18 bytes each, | u64 BE msg offset | u16 BE attempts | i64 BE due unix ms |.
      The follower's channel takes them (ReplicaHost.adopt_cursors), so a new leader
      resumes where the old one's consumers were, and delivers what was put back
      with its attempts, once due (LogChannel.take_up_retries).  delivered: one past the
      highest msg offset the leader put in flight (Cursor.delivered): a new leader
      gives what is below it, unfinished and not in the retries, the attempts of one
      delivery (it was in flight at the failover).  confirmed DELETED (u64 max, no window): the
      channel was deleted on the leader, and goes on the follower too
      (ReplicaHost.drop_channels).  committed end: the leader's (what every ISR
      member holds, replicator.committed_end), sent also when only it moved: a
      follower elected leader delivers up to it before its first acks come.

The server takes only peers registered in etcd for the cluster: the HELLO's node ID
must be a live nsqd node whose NodeIP is the connection's source address (and, for
its own node ID, the node's secret: another process on the host is not a worker).
"""

import hmac
import json
import struct
import sys

import gevent
import gevent.socket
from gevent.server import StreamServer

from nsqshm.consistence.topology import NODE_ID

HELLO, WELCOME, ERROR, APPEND, ACK, PUBLISH, PUBLISHED, CURSORS = 1, 2, 3, 4, 5, 6, 7, 8
OK, MISMATCH, FENCED, UNKNOWN = 0, 1, 2, 3  # ACK
NOT_LEADER, FAILED = 1, 2  # PUBLISHED (OK: 0)
PUBLISH_FIXED = struct.Struct(">H")
PROBE = (1 << 64) - 1
RESET = (1 << 64) - 2
TRUNCATE = (1 << 64) - 3
DELETED = (1 << 64) - 1  # a CURSORS entry's confirmed offset: the channel was deleted
MAX_FRAME = 64 << 20  # larger than any batch a leader sends (replicator.BATCH_BYTES, ~4 MiB)
# what a connection may send before the server knows it is a peer: a HELLO, within
# HELLO_TIMEOUT (a frame's length is read before its body is allocated)
MAX_HELLO = 4096
HELLO_TIMEOUT = 10.0
HEADER = struct.Struct(">IB")
APPEND_FIXED = struct.Struct(">HQQI")  # partition, write epoch, first offset, prev crc
RESET_START = struct.Struct(">QQ")  # a RESET's records: the leader's start (msg, virtual)
AT = struct.Struct(">Q")  # a PROBE's or TRUNCATE's records: a msg offset
ACK_END = struct.Struct(">HQ")  # partition, end offset
BYTE_ORDER = sys.byteorder
# the frames' layout: raised whenever a frame changes (3: APPEND's prev crc, RESET's
# start; builds before it send none and are refused as version None; 4: the CURSORS
# entries' retry tables; 5: their delivered marks)
PROTOCOL_VERSION = 5


class RPCError(Exception):
    """The peer broke the protocol, refused us, or the connection failed."""


def frame(kind, body):
    return HEADER.pack(len(body) + 1, kind) + body


def _topic(topic):
    raw = topic.encode()
    return struct.pack(">H", len(raw)) + raw


def encode_append(topic, partition, epoch, first, records_bytes=0, prev_crc=0):
    """An APPEND frame's head; the records_bytes of records follow it on the wire
    as they are (sent from the read buffer, not copied into the frame)."""
    body = _topic(topic) + APPEND_FIXED.pack(partition, epoch, first, prev_crc)
    return HEADER.pack(len(body) + 1 + records_bytes, APPEND) + body


def decode_append(body):
    """-> (topic, partition, epoch, first offset, prev crc, records memoryview)."""
    view = memoryview(body)
    (n,) = struct.unpack_from(">H", view, 0)
    if 2 + n + APPEND_FIXED.size > len(view):
        raise RPCError("short APPEND")
    topic = bytes(view[2:2 + n]).decode()
    partition, epoch, first, prev_crc = APPEND_FIXED.unpack_from(view, 2 + n)
    return topic, partition, epoch, first, prev_crc, view[2 + n + APPEND_FIXED.size:]


def encode_publish(topic, partition, records_bytes):
    body = _topic(topic) + PUBLISH_FIXED.pack(partition)
    return HEADER.pack(len(body) + 1 + records_bytes, PUBLISH) + body


def decode_publish(body):
    """-> (topic, partition, records memoryview)."""
    view = memoryview(body)
    (n,) = struct.unpack_from(">H", view, 0)
    if 2 + n + PUBLISH_FIXED.size > len(view):
        raise RPCError("short PUBLISH")
    topic = bytes(view[2:2 + n]).decode()
    (partition,) = PUBLISH_FIXED.unpack_from(view, 2 + n)
    return topic, partition, view[2 + n + PUBLISH_FIXED.size:]


CURSORS_FIXED = struct.Struct(">HQQH")  # partition, write epoch, committed end, count
CURSOR_ENTRY = struct.Struct(">QQI")  # confirmed, delivered, window length
RETRIES_LEN = struct.Struct(">I")
MAX_WINDOW = 1 << 20  # bytes: a cursor's window is 8 KiB (logcursor's 64 Ki bits)
RETRY_ENTRY = 18  # logcursor.RETRY_ENTRY
MAX_RETRIES = RETRY_ENTRY << 20  # bytes: a cursor's retry table has 4 Ki slots


def encode_cursors(topic, partition, epoch, committed, cursors):
    """A CURSORS frame: cursors [(channel name, confirmed, window bytes, retries,
    delivered)]."""
    parts = [_topic(topic), CURSORS_FIXED.pack(partition, epoch, committed, len(cursors))]
    for name, confirmed, window, retries, delivered in cursors:
        raw = name.encode()
        parts += [bytes((len(raw),)), raw, CURSOR_ENTRY.pack(confirmed, delivered, len(window)),
                  window, RETRIES_LEN.pack(len(retries)), retries]
    return frame(CURSORS, b"".join(parts))


def decode_cursors(body):
    """-> (topic, partition, epoch, committed end, [(channel name, confirmed, window
    bytes, retries, delivered)]); RPCError for a body that does not hold what it
    announces."""
    view = memoryview(body)
    (n,) = struct.unpack_from(">H", view, 0)
    pos = 2 + n + CURSORS_FIXED.size
    if pos > len(view):
        raise RPCError("short CURSORS")
    topic = bytes(view[2:2 + n]).decode()
    partition, epoch, committed, count = CURSORS_FIXED.unpack_from(view, 2 + n)
    out = []
    for _ in range(count):
        if pos >= len(view):
            raise RPCError("short CURSORS entry")
        size = view[pos]
        name = bytes(view[pos + 1:pos + 1 + size]).decode()
        pos += 1 + size
        if pos + CURSOR_ENTRY.size > len(view):
            raise RPCError("short CURSORS entry")
        confirmed, delivered, wlen = CURSOR_ENTRY.unpack_from(view, pos)
        pos += CURSOR_ENTRY.size
        if wlen > MAX_WINDOW or pos + wlen + RETRIES_LEN.size > len(view):
            raise RPCError(f"bad CURSORS window length {wlen}")
        window = bytes(view[pos:pos + wlen])
        pos += wlen
        (rlen,) = RETRIES_LEN.unpack_from(view, pos)
        pos += RETRIES_LEN.size
        if rlen > MAX_RETRIES or rlen % RETRY_ENTRY or pos + rlen > len(view):
            raise RPCError(f"bad CURSORS retries length {rlen}")
        out.append((name, confirmed, window, bytes(view[pos:pos + rlen]), delivered))
        pos += rlen
    if pos != len(view):
        raise RPCError("trailing bytes after CURSORS")
    return topic, partition, epoch, committed, out


def encode_ack(status, topic, partition, end, tail_crc=None):
    body = bytes((status,)) + _topic(topic) + ACK_END.pack(partition, end)
    if tail_crc is not None:
        body += struct.pack(">I", tail_crc)
    return frame(ACK, body)


def decode_ack(body):
    """-> (status, topic, partition, end, tail crc or None); RPCError for a body
    shorter than it announces."""
    if len(body) < 3:
        raise RPCError(f"short ACK ({len(body)} bytes)")
    status = body[0]
    (n,) = struct.unpack_from(">H", body, 1)
    rest = 3 + n + ACK_END.size
    if len(body) < rest:
        raise RPCError(f"short ACK ({len(body)} bytes)")
    topic = bytes(body[3:3 + n]).decode()
    partition, end = ACK_END.unpack_from(body, 3 + n)
    crc = struct.unpack_from(">I", body, rest)[0] if len(body) >= rest + 4 else None
    return status, topic, partition, end, crc


def read_frame(sock, limit=MAX_FRAME):
    """-> (kind, body bytearray); RPCError at EOF or a length out of 1..limit."""
    head = _read_exact(sock, HEADER.size)
    length, kind = HEADER.unpack(head)
    if not 1 <= length <= limit:
        raise RPCError(f"bad frame length {length}")
    return kind, _read_exact(sock, length - 1)


def _read_exact(sock, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        r = sock.recv_into(view[got:])
        if not r:
            raise RPCError("connection closed")
        got += r
    return buf


def hello_body(cluster_id, node_id, secret=None):
    hello = {"cluster": cluster_id, "node": node_id, "byteorder": BYTE_ORDER,
             "version": PROTOCOL_VERSION}
    if secret is not None:
        hello["secret"] = secret
    return json.dumps(hello).encode()


class RPCServer:
    """A follower worker's listener.  is_peer(node_id, ip) -> bool checks the peer
    against etcd; on_append(peer, topic, partition, epoch, first, prev_crc, records,
    stream) -> (status,
    end) applies a batch; on_cursors(peer, topic, partition, epoch, committed, cursors) ->
    (status, end) takes the leader's channel cursors."""

    def __init__(self, address, cluster_id, node_id, is_peer, on_append, on_publish, logf,
                 on_cursors=None, secret=None):
        self.cluster_id = cluster_id
        self.node_id = node_id
        self.secret = secret  # the node's: what its other workers say (None: none may)
        self.is_peer = is_peer
        self.on_append = on_append
        self.on_publish = on_publish
        self.on_cursors = on_cursors
        self.logf = logf
        self.server = StreamServer(address, self._handle)
        self.server.init_socket()

    @property
    def address(self):
        return self.server.address

    def start(self):
        self.server.start()

    def stop(self):
        self.server.stop(timeout=1)

    def _handle(self, sock, address):
        sock.setsockopt(gevent.socket.IPPROTO_TCP, gevent.socket.TCP_NODELAY, 1)
        try:
            sock.settimeout(HELLO_TIMEOUT)
            kind, body = read_frame(sock, MAX_HELLO)
            peer = self._welcome(sock, kind, body, address[0])
            if peer is None:
                return
            sock.settimeout(None)  # (a leader's connection idles between batches)
            stream = {}  # on_append's: (topic, partition) -> where this connection's APPENDs end
            while True:
                kind, body = read_frame(sock)
                if kind == PUBLISH and peer == self.node_id:  # another worker of this node
                    status, text = self.on_publish(*decode_publish(body))
                    sock.sendall(frame(PUBLISHED, bytes((status,)) + text.encode()))
                    continue
                if kind == CURSORS and self.on_cursors is not None:
                    topic, partition, epoch, committed, cursors = decode_cursors(body)
                    status, end = self.on_cursors(peer, topic, partition, epoch, committed,
                                                  cursors)
                    sock.sendall(encode_ack(status, topic, partition, end))
                    continue
                if kind != APPEND:
                    raise RPCError(f"unexpected frame kind {kind}")
                topic, partition, epoch, first, prev_crc, records = decode_append(body)
                status, end, crc = self.on_append(peer, topic, partition, epoch, first,
                                                  prev_crc, records, stream)
                sock.sendall(encode_ack(status, topic, partition, end, crc))
        except (RPCError, OSError, ValueError, UnicodeDecodeError, struct.error) as err:
            self.logf("debug", f"RPC: peer {address[0]}: {err}")
        finally:
            sock.close()

    def _welcome(self, sock, kind, body, ip):
        try:
            hello = json.loads(body) if kind == HELLO else {}
        except ValueError:
            hello = {}
        node = hello.get("node") if isinstance(hello, dict) else None
        why = None
        if kind != HELLO or not isinstance(node, str) or not NODE_ID.match(node):
            why = "expected HELLO"  # (nothing of it is logged: it may be anything)
        elif hello.get("cluster") != self.cluster_id:
            why = "another cluster"
        elif hello.get("version") != PROTOCOL_VERSION:
            why = (f"replication protocol version {hello.get('version')!r}, this node speaks "
                   f"{PROTOCOL_VERSION} (every node of a cluster must run the same build)")
        elif hello.get("byteorder") != BYTE_ORDER:
            why = f"byte order {hello.get('byteorder')!r}, this host is {BYTE_ORDER}"
        elif node == self.node_id and not (
                self.secret is not None and isinstance(hello.get("secret"), str)
                and hmac.compare_digest(hello["secret"].encode(), self.secret.encode())):
            why = f"{node} is this node, and the HELLO does not hold this node's secret"
        elif not self.is_peer(node, ip):
            why = f"{node} at {ip} is not a node registered in the cluster"
        if why is not None:
            self.logf("warn", f"RPC: refused {ip}: {why}")
            sock.sendall(frame(ERROR, json.dumps({"error": why}).encode()))
            return None
        sock.sendall(frame(WELCOME, json.dumps({"node": self.node_id}).encode()))
        return node


class RPCClient:
    """A leader's connection to one follower worker: request, then its ACK."""

    def __init__(self, ip, port, cluster_id, node_id, timeout, source=None, secret=None):
        """source: the local address to connect from, this node's NodeIP (what the
        server checks), whatever the route would pick (several addresses, loopback);
        secret: the node's, to another worker of this node (PUBLISH)."""
        self.timeout = timeout
        self.sock = gevent.socket.create_connection(
            (ip, port), timeout, source_address=(source, 0) if source else None)
        try:
            self.sock.setsockopt(gevent.socket.IPPROTO_TCP, gevent.socket.TCP_NODELAY, 1)
            self.sock.sendall(frame(HELLO, hello_body(cluster_id, node_id, secret)))
            kind, body = read_frame(self.sock)
            if kind != WELCOME:
                raise RPCError(f"refused by {ip}:{port}: {bytes(body).decode(errors='replace')}")
        except BaseException:
            self.sock.close()
            raise

    def append(self, header, records):
        """Send one APPEND (header: encode_append's for these records) and wait for
        its ACK: (status, end, tail crc or None)."""
        self.sock.sendall(header)
        if records:
            self.sock.sendall(records)
        kind, body = read_frame(self.sock)
        if kind != ACK:
            raise RPCError(f"expected ACK, got kind {kind}")
        status, _, _, end, crc = decode_ack(body)
        return status, end, crc

    def cursors(self, frame_bytes):
        """Send a CURSORS frame (encode_cursors') and wait for its ACK: (status, end)."""
        self.sock.sendall(frame_bytes)
        kind, body = read_frame(self.sock)
        if kind != ACK:
            raise RPCError(f"expected ACK, got kind {kind}")
        status, _, _, end, _ = decode_ack(body)
        return status, end

    def publish(self, topic, partition, records):
        """PUBLISH to the owner worker: (status, text)."""
        self.sock.sendall(encode_publish(topic, partition, len(records)))
        self.sock.sendall(records)
        kind, body = read_frame(self.sock)
        if kind != PUBLISHED or not body:
            raise RPCError(f"expected PUBLISHED, got kind {kind}")
        return body[0], bytes(body[1:]).decode(errors="replace")

    def close(self):
        self.sock.close()
