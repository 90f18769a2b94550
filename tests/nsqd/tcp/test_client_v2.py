"""A consumer's output buffer (nsqd's messagePump and bufio.Writer), over
raw sockets against a real server on --workers 1 and 2: message frames wait
until output_buffer_size bytes are there or output_buffer_timeout has
passed; -1 for either sends each at once; a client that cannot take more
messages, a response or a heartbeat takes them along at once."""

import socket
import statistics
import struct
import threading
import time

import pytest

from nsqshm import protocol as p
from tests.nsqd.conftest import wait_for


@pytest.fixture(params=[1, 2], ids=["workers1", "workers2"])
def server(request, nsqd_factory):
    return nsqd_factory(f"--workers={request.param}")


class Consumer:
    """A subscriber that records, for each recv, when it returned and how
    many message frames completed in it."""

    def __init__(self, server, topic, rdy, **identify):
        self.sock = socket.create_connection(server.tcp, timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.sock.sendall(p.MAGIC_V2 + p.identify({"feature_negotiation": True, **identify})
                          + p.sub(topic, "c") + p.rdy(rdy))
        frames = self.read_frames(2)
        assert frames[1] == (0, b"OK"), frames
        self.recvs = []  # (monotonic time, messages completed by that recv)
        self.bodies = []
        self.times = []
        self.start()

    def read_frames(self, n):
        out = []
        while len(out) < n:
            data = self.sock.recv(65536)
            assert data, "closed"
            self.buf += data
            out += self._parse()
        return out

    def _parse(self):
        out, pos = [], 0
        while len(self.buf) - pos >= 8:
            size, ftype = struct.unpack_from(">ii", self.buf, pos)
            if len(self.buf) - pos - 4 < size:
                break
            out.append((ftype, bytes(self.buf[pos + 8:pos + 4 + size])))
            pos += 4 + size
        del self.buf[:pos]
        return out

    def start(self):
        """Read in a thread from now on, so that receive times are real."""
        self.thread = threading.Thread(target=self._read_loop, daemon=True)
        self.thread.start()
        return self

    def _read_loop(self):
        self.sock.settimeout(30)
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            now = time.monotonic()
            self.buf += data
            messages = [d for t, d in self._parse() if t == p.FRAME_TYPE_MESSAGE]
            for m in messages:
                self.bodies.append(p.decode_message(m).body)
                self.times.append(now)
            if messages:
                self.recvs.append((now, len(messages)))

    def receive(self, n, timeout=10):
        """Wait until n messages have come; returns their receive times."""
        assert wait_for(lambda: len(self.bodies) >= n, timeout), self.bodies
        return self.times[:n]


def publisher(server):
    sock = socket.create_connection(server.tcp, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(p.MAGIC_V2)
    return sock


def pub(sock, topic, body):
    sock.sendall(p.pub(topic, body))
    assert sock.recv(64) == struct.pack(">ii", 6, 0) + b"OK"


def wait_subscribed(server, topic):
    import json
    assert wait_for(lambda: any(
        ch["clients"] for t in json.loads(server.get("/stats?format=json")[1])["topics"]
        if t["topic_name"] == topic for ch in t["channels"]))


def test_a_low_rate_arrives_in_batches_a_timeout_apart(server):
    consumer = Consumer(server, "batched", 100, output_buffer_timeout=100)
    wait_subscribed(server, "batched")
    pub_sock = publisher(server)
    start = time.monotonic()
    for i in range(30):  # 30 messages over about 1 s
        pub(pub_sock, "batched", b"m%d" % i)
        time.sleep(max(0.0, start + (i + 1) / 30 - time.monotonic()))
    consumer.receive(30)
    assert consumer.bodies == [b"m%d" % i for i in range(30)]
    sizes = [n for _, n in consumer.recvs]
    gaps = [b[0] - a[0] for a, b in zip(consumer.recvs, consumer.recvs[1:], strict=False)]
    # about 10 flushes of about 3 messages, about 100 ms apart (not 30 single frames)
    assert len(sizes) <= 15, sizes
    assert statistics.median(sizes) >= 2, sizes
    assert 0.06 <= statistics.median(gaps) <= 0.2, gaps


@pytest.mark.parametrize("identify", [{"output_buffer_timeout": -1}, {"output_buffer_size": -1}],
                         ids=["timeout-1", "size-1"])
def test_minus_one_sends_each_message_at_once(server, identify):
    consumer = Consumer(server, "direct", 100, **identify)
    wait_subscribed(server, "direct")
    pub_sock = publisher(server)
    latencies = []
    for i in range(20):
        sent = time.monotonic()
        pub(pub_sock, "direct", b"m%d" % i)
        received = consumer.receive(i + 1)[-1]
        latencies.append(received - sent)
        time.sleep(0.02)
    assert consumer.bodies == [b"m%d" % i for i in range(20)]
    assert statistics.median(latencies) < 0.02, latencies
    assert max(latencies) < 0.1, latencies


def test_the_default_timeout_holds_messages_at_most_250ms(server):
    consumer = Consumer(server, "default", 100)
    wait_subscribed(server, "default")
    pub_sock = publisher(server)
    sent = time.monotonic()
    pub(pub_sock, "default", b"one")
    (received,) = consumer.receive(1)
    assert 0.15 <= received - sent <= 0.5, received - sent


def test_a_client_that_can_take_no_more_gets_its_messages_at_once(server):
    # RDY 1: after one message in flight nsqd's messagePump is not ready and flushes
    consumer = Consumer(server, "rdy1", 1, output_buffer_timeout=5000)
    wait_subscribed(server, "rdy1")
    pub_sock = publisher(server)
    sent = time.monotonic()
    pub(pub_sock, "rdy1", b"x")
    (received,) = consumer.receive(1)
    assert received - sent < 0.1


def test_a_full_buffer_goes_before_the_timeout(server):
    consumer = Consumer(server, "full", 100, output_buffer_timeout=5000, output_buffer_size=1000)
    wait_subscribed(server, "full")
    pub_sock = publisher(server)
    for i in range(7):  # 7 frames of 8 + 26 + 100 bytes: 938 bytes, held
        pub(pub_sock, "full", bytes([65 + i]) * 100)
    time.sleep(0.3)
    assert consumer.bodies == []
    sent = time.monotonic()
    pub(pub_sock, "full", b"H" * 100)  # 1072 bytes: past the buffer's size
    times = consumer.receive(8, timeout=3)
    assert times[-1] - sent < 0.2
    pub(pub_sock, "full", b"I" * 100)
    consumer.sock.sendall(b"NOP\n")  # no response: the message stays held
    time.sleep(0.3)
    assert len(consumer.bodies) == 8
    sent = time.monotonic()
    consumer.sock.sendall(b"FIN 0123456789abcdef\n")  # an error frame takes it along
    times = consumer.receive(9, timeout=3)
    assert times[-1] - sent < 0.2
