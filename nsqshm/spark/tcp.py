"""NSQ over TCP for the Spark source when the broker is not on this host:
a blocking protocol-V2 connection (nsqshm.protocol's codec), frames turned
into Arrow columns and FIN lines in C (localbatch.Columns,
wire.scan_deliveries), bodies into MPUB commands in C (mpub_body)."""

import json
import socket
import struct
import threading

from nsqshm import __version__
from nsqshm import protocol as proto
from nsqshm._core.localbatch import Columns, mpub_body, mpub_ext_body
from nsqshm._core.wire import scan_deliveries

MAX_MPUB_BYTES = 4 << 20   # under nsqd's default --max-body-size (5 MiB)
MAX_HEADER_BYTES = 16 * 1024   # nsqshm.nsqd.ext.MAX_HEADER_BYTES: one message's JSON headers
USER_AGENT = f"nsqshm.spark/{__version__}"


class NsqError(Exception):
    pass


def split(address):
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


class Connection:
    """One protocol-V2 connection: IDENTIFY on connect; frames read into `buf`."""

    def __init__(self, address, msg_timeout=None, timeout=10.0, extend_support=False):
        self.sock = socket.create_connection(split(address), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        ident = {"client_id": socket.gethostname().split(".")[0],
                 "hostname": socket.gethostname(), "user_agent": USER_AGENT,
                 "feature_negotiation": True}
        if msg_timeout:
            ident["msg_timeout"] = int(msg_timeout * 1000)
        if extend_support:  # Youzan's: an ext topic's frames keep their headers
            ident["extend_support"] = True
        self.sock.sendall(proto.MAGIC_V2 + proto.identify(ident))
        ftype, data = self.response()
        self.features = json.loads(data) if data.startswith(b"{") else {}
        self.max_rdy = int(self.features.get("max_rdy_count", 2500))

    def close(self):
        try:
            self.sock.sendall(proto.cls())
        except OSError:
            pass
        self.sock.close()

    def fill(self, timeout):
        """Read what arrives within `timeout` s into buf; False when nothing did."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return False
        if not data:
            raise NsqError("connection closed by nsqd")
        self.buf += data
        return True

    def response(self, timeout=10.0):
        """The next response or error frame (heartbeats answered); ("E", text) raises."""
        while True:
            if len(self.buf) >= 8:
                size, ftype = struct.unpack_from(">II", self.buf)
                if len(self.buf) >= 4 + size:
                    data = bytes(self.buf[8:4 + size])
                    del self.buf[:4 + size]
                    if ftype == proto.FRAME_TYPE_ERROR:
                        raise NsqError(data.decode(errors="replace"))
                    if data == proto.HEARTBEAT:
                        self.sock.sendall(proto.nop())
                        continue
                    return ftype, data
            if not self.fill(timeout):
                raise NsqError("no response from nsqd")

    def check_frames(self, end):
        """Error frames among buf[:end] raise; heartbeats are answered by FIN lines' NOPs."""
        pos = 0
        while pos + 8 <= end:
            size, ftype = struct.unpack_from(">II", self.buf, pos)
            if ftype == proto.FRAME_TYPE_ERROR:
                raise NsqError(bytes(self.buf[pos + 8:pos + 4 + size]).decode(errors="replace"))
            pos += 4 + size


# -- consuming -----------------------------------------------------------------------------

class Subscription:
    """A SUB with a bounded window: collect() gathers messages into Arrow
    columns and their FIN lines; finish() sends the FINs."""

    def __init__(self, address, topic, channel, msg_timeout=None, since_ns=0, ext=False,
                 headers=False):
        """ext: IDENTIFY extend_support (an ext topic's frames keep their
        headers, gathered into a headers column when `headers`)."""
        self.conn = Connection(address, msg_timeout, extend_support=ext)
        self.conn.sock.sendall(proto.sub(topic, channel))
        self.conn.response()
        self.columns = Columns(ext=ext, headers=headers)
        self.columns.since_ns = since_ns
        self.fins = bytearray()
        self.held = 0
        self.detail = False  # SUB_ADVANCED's frames (logtcp.RangeSubscription)

    def collect(self, want, idle_timeout):
        """Receive up to `want` more messages (RDY bounded by nsqd's
        max_rdy_count minus those held); stop at `want` or after idle_timeout s
        without a message.  Returns how many arrived."""
        conn = self.conn
        room = min(want, conn.max_rdy - self.held)
        if room <= 0:
            return 0
        conn.sock.sendall(proto.rdy(self.held + room))
        got = 0
        while got < room:
            consumed, n, others = scan_deliveries(conn.buf, self.fins)
            if others:
                conn.check_frames(consumed)
                if b"NOP\n" in self.fins:  # answer heartbeats now; FINs wait for finish()
                    self.fins = bytearray(self.fins.replace(b"NOP\n", b""))
                    conn.sock.sendall(proto.nop())
            if consumed:
                self.columns.add_frames(conn.buf, 0, consumed, self.detail)
                del conn.buf[:consumed]
                got += n
                self.held += n
                if got >= room:
                    break
            if not conn.fill(idle_timeout):
                break
        conn.sock.sendall(proto.rdy(0))
        return got

    def finish(self):
        """FIN everything held (the batch was handed on)."""
        if self.fins:
            self.conn.sock.sendall(self.fins)
        self.fins = bytearray()
        self.held = 0

    def close(self):
        self.conn.close()


# -- publishing ----------------------------------------------------------------------------

class Publisher:
    """MPUB in chunks of up to MAX_MPUB_BYTES, each acknowledged before the next."""

    def __init__(self, address, max_msg_size=1048576):
        self.conn = Connection(address)
        self.max_msg_size = max_msg_size
        self.published = 0

    def publish_spans(self, topic, data, offsets, width, start, count, partition=None):
        """partition: a log topic's partition (Youzan's `MPUB T p`)."""
        done = 0
        command = b"MPUB " + topic.encode()
        if partition is not None:
            command += b" %d" % partition
        while done < count:
            n = self._chunk(offsets, width, start + done, count - done)
            body = mpub_body(data, offsets, None, start + done, n, width, self.max_msg_size)
            done += self._send(command, body, n)
        return count

    def _send(self, command, body, n):
        """One MPUB or MPUB_EXT of n messages, acknowledged: n."""
        self.conn.sock.sendall(command + b"\n" + struct.pack(">I", len(body)) + body)
        ftype, data = self.conn.response()
        if data != b"OK":
            raise NsqError(f"{command.split()[0].decode()}: {data!r}")
        self.published += n
        return n

    def publish_ext(self, topic, data, offsets, width, start, count, headers, partition=None):
        """MPUB_EXT: each body with its row of `headers` (ext_spans), packed in C."""
        command = b"MPUB_EXT " + topic.encode()
        if partition is not None:
            command += b" %d" % partition
        rows, valid, keys, values, pairs = headers
        done = 0
        while done < count:
            # an ext topic stores [1 version][2 n][JSON][body]: at most --max-msg-size
            body, n = mpub_ext_body(data, offsets, start + done, count - done, width,
                                    rows[done:], valid[done:], *keys, *values, pairs,
                                    self.max_msg_size - 1, MAX_HEADER_BYTES, MAX_MPUB_BYTES)
            done += self._send(command, body, n)
        return count

    @staticmethod
    def _chunk(offsets, width, start, left):
        """How many bodies from `start` fit MAX_MPUB_BYTES (at least one)."""
        import numpy as np

        offs = np.frombuffer(offsets, dtype=np.int32 if width == 4 else np.int64)
        ends = offs[start + 1:start + left + 1] - offs[start]
        sizes = ends + 4 * np.arange(1, len(ends) + 1)
        n = int(np.searchsorted(sizes, MAX_MPUB_BYTES, side="right"))
        return max(1, min(n, left))

    def close(self):
        self.conn.close()



class Taker:
    """A stream reader's long-lived SUB.  A thread reads the socket (answering
    heartbeats between micro-batches) and buffers message frames; take()
    hands over what arrived, finish() FINs a committed batch.  nsqd keeps at
    most max_rdy_count messages in flight on the connection, the batches not
    yet committed included."""

    def __init__(self, address, topic, channel, msg_timeout=None, extend_support=False):
        self.conn = Connection(address, msg_timeout, extend_support=extend_support)
        self.conn.sock.sendall(proto.sub(topic, channel))
        self.conn.response()
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.frames = bytearray()
        self.fins = bytearray()
        self.count = 0
        self.held = 0          # delivered and not finished
        self.error = None
        self.closed = False
        self.thread = threading.Thread(target=self._run, name=f"nsqshm-taker-{topic}",
                                       daemon=True)
        self.thread.start()

    def _send(self, data):
        with self.send_lock:
            self.conn.sock.sendall(data)

    def _run(self):
        conn = self.conn
        scratch = bytearray()
        while not self.closed:
            try:
                if not conn.fill(1.0):
                    continue
                consumed, n, others = scan_deliveries(conn.buf, scratch)
                if others:
                    conn.check_frames(consumed)
                    if b"NOP\n" in scratch:
                        scratch = bytearray(scratch.replace(b"NOP\n", b""))
                        self._send(proto.nop())
                with self.arrived:
                    self.frames += conn.buf[:consumed]
                    self.fins += scratch
                    self.count += n
                    self.arrived.notify_all()
                del conn.buf[:consumed]
                del scratch[:]
            except (OSError, NsqError) as err:
                with self.arrived:
                    self.error = err
                    self.arrived.notify_all()
                return

    def take(self, want, wait):
        """Ask for up to `want` more messages and wait up to `wait` s (from the
        last arrival) for them; returns (frames, FIN lines, count) of all that
        arrived since the last take."""
        with self.arrived:
            if self.error is not None:
                raise NsqError(f"connection to nsqd lost: {self.error}")
            rdy = min(self.conn.max_rdy, self.held + want)
            if rdy > self.held:
                self._send(proto.rdy(rdy))
                goal = rdy - self.held
                while self.count < goal and self.error is None:
                    before = self.count
                    self.arrived.wait(wait)
                    if self.count == before:
                        break
            frames, fins, n = bytes(self.frames), bytes(self.fins), self.count
            self.frames, self.fins, self.count = bytearray(), bytearray(), 0
            self.held += n
        return frames, fins, n

    def finish(self, fins):
        if fins:
            self._send(fins)
            with self.lock:
                self.held -= len(fins) // 21

    def close(self):
        self.closed = True
        try:
            self.conn.close()
        except OSError:
            pass
