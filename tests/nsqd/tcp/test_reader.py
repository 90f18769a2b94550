"""Batched reads of a consumer's input (Reader.batch_reads, --consumer-read-delay),
over raw sockets against a real server on --workers 1 and 2: while a consumer holds
at least 256 messages in flight, its input is read once 8 KiB are there or after the
delay, whichever comes first; holding fewer, while its worker publishes, or with the
delay 0, at once."""

import json
import socket
import struct
import threading
import time

import pytest

from nsqshm import protocol as p
from nsqshm.nsqd.tcp import fairshare
from nsqshm.nsqd.tcp.protocol_v2 import READ_DELAY_IN_FLIGHT
from nsqshm.nsqd.tcp.reader import BATCH_BYTES
from tests.nsqd.conftest import wait_for

WORKER_COUNTS = (1, 2)


def hold(server, topic, n):
    """A consumer holding n messages of topic in flight: (socket, their IDs)."""
    pub = socket.create_connection(server.tcp, timeout=10)
    pub.sendall(p.MAGIC_V2 + p.mpub(topic, [b"m%d" % i for i in range(n)]))
    assert pub.recv(64) == struct.pack(">ii", 6, 0) + b"OK"
    pub.close()
    sock = socket.create_connection(server.tcp, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(p.MAGIC_V2 + p.sub(topic, "c") + p.rdy(n))
    buf, ids = bytearray(), []
    while len(ids) < n:
        data = sock.recv(1 << 20)
        assert data, "closed"
        buf += data
        while len(buf) >= 8:
            size, ftype = struct.unpack_from(">ii", buf)
            if len(buf) < 4 + size:
                break
            if ftype == p.FRAME_TYPE_MESSAGE:
                ids.append(bytes(buf[8 + 10:8 + 26]))
            del buf[:4 + size]
    time.sleep(2 * fairshare.RECENT)  # the MPUB above is past: the worker is not publishing
    return sock, ids


def in_flight(server, topic):
    stats = json.loads(server.get(f"/stats?format=json&topic={topic}")[1])
    return sum(ch["in_flight_count"] for t in stats["topics"] for ch in t["channels"])


def test_a_batch_is_read_at_once_and_a_lone_fin_after_the_delay(nsqd_factory):
    server = nsqd_factory("--consumer-read-delay=3s")
    sock, ids = hold(server, "batched", 700)
    assert in_flight(server, "batched") == 700
    # the first FIN after a quiet spell: read at once (the reader waited with none in flight)
    sock.sendall(p.fin(ids[0]))
    assert wait_for(lambda: in_flight(server, "batched") == 699, timeout=1.5)
    # a batch past the mark (BATCH_BYTES) in one send: read at once, not after the delay
    n = BATCH_BYTES // len(p.fin(ids[0])) + 10
    sock.sendall(b"".join(p.fin(i) for i in ids[1:1 + n]))
    assert wait_for(lambda: in_flight(server, "batched") == 699 - n, timeout=1.5)
    # holding 256 or more, 50 FINs wait for the delay
    start = time.monotonic()
    sock.sendall(b"".join(p.fin(i) for i in ids[1 + n:51 + n]))
    assert wait_for(lambda: in_flight(server, "batched") == 649 - n, timeout=6)
    assert time.monotonic() - start >= 2.5
    # holding fewer than 256: a lone FIN is read at once
    assert 649 - n < READ_DELAY_IN_FLIGHT
    sock.sendall(p.fin(ids[51 + n]))
    assert wait_for(lambda: in_flight(server, "batched") == 648 - n, timeout=1.5)
    sock.close()


def test_a_consumer_holding_many_has_a_lone_command_read_within_the_delay(nsqd_factory):
    server = nsqd_factory("--consumer-read-delay=2s")
    sock, ids = hold(server, "held", 300)
    # the reader decides before each wait: it waited for the SUB with nothing in flight,
    # so the first FIN is read at once; from then on the consumer holds at least 256
    sock.sendall(p.fin(ids[0]))
    assert wait_for(lambda: in_flight(server, "held") == 299, timeout=1.5)
    start = time.monotonic()
    sock.sendall(p.fin(ids[1]))
    time.sleep(1.0)
    assert in_flight(server, "held") == 299  # the FIN waits in the socket
    assert wait_for(lambda: in_flight(server, "held") == 298, timeout=5)
    assert 1.8 <= time.monotonic() - start < 4.0
    # a command answered, from a consumer holding 298: at most the delay too
    start = time.monotonic()
    sock.sendall(p.cls())
    data = b""
    while len(data) < 18:
        data += sock.recv(64)
    assert data == struct.pack(">ii", 14, 0) + b"CLOSE_WAIT"
    assert 1.8 <= time.monotonic() - start < 4.0
    sock.close()


def test_no_delay_reads_each_fin_at_once(nsqd_factory):
    server = nsqd_factory("--consumer-read-delay=0")
    sock, ids = hold(server, "eager", 300)
    for n, msg_id in enumerate(ids[:5], 1):
        sock.sendall(p.fin(msg_id))
        assert wait_for(lambda n=n: in_flight(server, "eager") == 300 - n, timeout=0.5)
    sock.close()


@pytest.mark.workers(1)  # the publisher and the consumer on one worker
def test_a_consumer_is_read_at_once_while_its_worker_publishes(nsqd_factory):
    server = nsqd_factory("--consumer-read-delay=2s")
    sock, ids = hold(server, "shared", 300)
    sock.sendall(p.fin(ids[0]))  # after a quiet spell: at once
    assert wait_for(lambda: in_flight(server, "shared") == 299, timeout=1.5)
    pub = socket.create_connection(server.tcp, timeout=10)
    pub.sendall(p.MAGIC_V2)
    stop = threading.Event()

    def publish():  # the fair share: a worker that publishes reads its consumers at once
        while not stop.is_set():
            pub.sendall(p.pub("other", b"x"))
            assert pub.recv(64) == struct.pack(">ii", 6, 0) + b"OK"
            time.sleep(0.01)

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        time.sleep(0.2)
        # the reader decided before its wait, with nothing published for a while: this FIN
        # ends it after the delay at most; from then on the worker publishes (a PUB every
        # 10 ms) and FINs are read at once
        sock.sendall(p.fin(ids[1]))
        assert wait_for(lambda: in_flight(server, "shared") == 298, timeout=4)
        for n, msg_id in enumerate(ids[2:5], 2):
            start = time.monotonic()
            sock.sendall(p.fin(msg_id))
            assert wait_for(lambda n=n: in_flight(server, "shared") == 299 - n, timeout=1.5), (n, in_flight(server, "shared"), time.monotonic() - start)
            assert time.monotonic() - start < 1.0
    finally:
        stop.set()
        publisher.join()
    pub.close()
    sock.close()
