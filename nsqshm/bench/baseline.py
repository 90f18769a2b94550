"""Baselines run in the same program as the broker: servers that do the
least an NSQ server must, so the load generator alone can be measured.

- throughput: an MPUB sink that skips each body and answers OK, and a source
  that streams prebuilt message frames in windows of RDY and reads back the
  FINs.  The load generator's rate against it is its ceiling; the broker's
  ratio against it says how much of loopback TCP the broker leaves unused.
- latency: a relay that turns each PUB into a message frame for a
  subscriber at once; its latency is the floor of the load generator,
  loopback TCP and the scheduler.
"""

import os
import socket
import struct
import threading
import time

from .common import CTX

OK_FRAME = struct.pack(">II", 6, 0) + b"OK"


class _Reader:
    def __init__(self, conn):
        self.conn, self.buf = conn, bytearray()

    def need(self, n):
        while len(self.buf) < n:
            data = self.conn.recv(1 << 20)
            if not data:
                raise EOFError
            self.buf.extend(data)

    def line(self):
        while b"\n" not in self.buf:
            self.need(len(self.buf) + 1)
        i = self.buf.index(b"\n")
        out = bytes(self.buf[:i])
        del self.buf[:i + 1]
        return out

    def sized(self):
        self.need(4)
        n = struct.unpack(">I", self.buf[:4])[0]
        self.need(4 + n)
        body = bytes(self.buf[4:4 + n])
        del self.buf[:4 + n]
        return body


def _throughput_conn(conn, size, rdy, per_consumer):
    # bodies are skipped into a scratch buffer and FINs only counted, and
    # deliveries are pipelined (a quarter of RDY per write, at most RDY
    # unfinished): no per-message Python work, so this is not the limit
    r = _Reader(conn)
    scratch = memoryview(bytearray(1 << 20))

    def skip(n):
        take = min(n, len(r.buf))
        del r.buf[:take]
        n -= take
        while n:
            k = conn.recv_into(scratch[:min(n, len(scratch))])
            if not k:
                raise EOFError
            n -= k

    def fin_bytes():
        k = len(r.buf)
        del r.buf[:]
        if not k:
            k = conn.recv_into(scratch)
            if not k:
                raise EOFError
        return k

    frame = struct.pack(">II", 4 + 26 + size, 2) + struct.pack(">QH", time.time_ns(), 1)
    chunk = max(1, rdy // 4)
    frames = b"".join(frame + f"{k:016x}".encode() + b"x" * size for k in range(chunk))
    try:
        r.need(4)
        del r.buf[:4]
        while True:
            verb = r.line().split(b" ")[0]
            if verb in (b"MPUB", b"IDENTIFY", b"PUB"):
                r.need(4)
                n = struct.unpack(">I", r.buf[:4])[0]
                del r.buf[:4]
                skip(n)
                conn.sendall(OK_FRAME)
            elif verb == b"SUB":
                conn.sendall(OK_FRAME)
            elif verb == b"RDY":
                sent = fins = 0  # FIN lines are 21 bytes
                while sent < per_consumer:
                    k = min(chunk, per_consumer - sent)
                    while sent + k - fins // 21 > rdy:
                        fins += fin_bytes()
                    conn.sendall(frames if k == chunk else frames[:k * (34 + size)])
                    sent += k
                while fins // 21 < sent:
                    fins += fin_bytes()
    except (EOFError, OSError):
        pass
    conn.close()


def _serve_forking(listener, handler, *args):
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            handler(conn, *args)
            os._exit(0)
        conn.close()


def start_throughput(size, rdy, per_consumer):
    """(process, address) of the raw-socket baseline server; kill it after."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    proc = CTX.Process(target=_serve_forking, daemon=True,
                       args=(listener, _throughput_conn, size, rdy, per_consumer))
    proc.start()
    address = listener.getsockname()
    listener.close()
    return proc, address


# -- latency: PUB in, a message frame out at once --------------------------------------

def _mpub_bodies(body):
    n, pos, out = struct.unpack_from(">I", body)[0], 4, []
    for _ in range(n):
        size = struct.unpack_from(">I", body, pos)[0]
        out.append(body[pos + 4:pos + 4 + size])
        pos += 4 + size
    return out


def _relay(listener):
    subscribers, lock, seq = [], threading.Lock(), [0]

    def handle(conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        r = _Reader(conn)
        try:
            r.need(4)
            del r.buf[:4]
            while True:
                # everything already received is handled before one send per peer
                frames, replies = [], []
                while True:
                    verb = r.line().split(b" ")[0]
                    if verb in (b"PUB", b"MPUB"):
                        body = r.sized()
                        for msg in (_mpub_bodies(body) if verb == b"MPUB" else [body]):
                            seq[0] += 1
                            frames.append(struct.pack(">IIQH", 30 + len(msg), 2, time.time_ns(), 1)
                                          + f"{seq[0]:016x}".encode() + msg)
                        replies.append(OK_FRAME)
                    elif verb == b"IDENTIFY":
                        r.sized()
                        replies.append(OK_FRAME)
                    elif verb == b"SUB":
                        with lock:
                            subscribers.append(conn)
                        replies.append(OK_FRAME)
                    if not r.buf:
                        break
                if frames and subscribers:
                    target = subscribers[seq[0] % len(subscribers)]
                    with lock:
                        target.sendall(b"".join(frames))
                if replies:
                    conn.sendall(b"".join(replies))
        except (EOFError, OSError):
            pass
        with lock:
            if conn in subscribers:
                subscribers.remove(conn)
        conn.close()

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def start_relay():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    proc = CTX.Process(target=_relay, args=(listener,), daemon=True)
    proc.start()
    address = listener.getsockname()
    listener.close()
    return proc, address
