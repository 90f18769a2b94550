"""Two workers creating one shared-memory object at the same moment (issue
21.2): six connections SUB to a new channel at once, 900 times; every one
is answered OK and no worker attaches to a half-made ring.  And a delete
racing a create of the same topic on the other worker."""

import os
import socket
import threading
import time

import pytest

from nsqshm import protocol as p

from .test_workers import Client, client_on_worker, workers

pytestmark = pytest.mark.timeout(120)

CONNECTIONS = 6
ROUNDS = 90  # 540 connection attempts (make soak's stress runs go further)


def answer(sock):
    dec = p.FrameDecoder()
    while True:
        data = sock.recv(4096)
        if not data:
            return "closed"
        dec.feed(data)
        for kind, body in dec.frames():
            if body != b"_heartbeat_":
                return (kind, body)


def test_concurrent_subs_to_a_new_channel_on_two_workers_all_get_ok(nsqd_factory):
    server = nsqd_factory("--workers=2")
    barrier = threading.Barrier(CONNECTIONS)
    results = [[] for _ in range(CONNECTIONS)]

    def run(k):
        for r in range(ROUNDS):
            channel = "c#ephemeral" if r % 2 else "c"
            try:
                sock = socket.create_connection(server.tcp, timeout=5)
            except OSError as err:
                barrier.wait()
                results[k].append(f"connect: {err}")
                continue
            with sock:
                sock.sendall(p.MAGIC_V2)
                barrier.wait()  # all six send their SUB together
                try:
                    sock.sendall(p.sub(f"race{r}", channel))
                    results[k].append(answer(sock))
                except OSError as err:
                    results[k].append(f"error: {err}")

    threads = [threading.Thread(target=run, args=(k,)) for k in range(CONNECTIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [res for per in results for res in per]
    assert len(flat) == CONNECTIONS * ROUNDS
    bad = [res for res in flat if res != (p.FRAME_TYPE_RESPONSE, b"OK")]
    assert not bad, f"{len(bad)} of {len(flat)} SUBs not answered OK: {bad[:5]}"
    log = "".join(server.lines)
    assert "RingLayoutError" not in log and "Traceback" not in log, log[-3000:]


def maps_file(pid, path):
    """Whether process pid maps the file now at `path`, whatever name it had
    when mapped (a ring is made as an unnamed file, then linked)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    with open(f"/proc/{pid}/maps") as f:
        return any(fields[3] == dev and fields[4] == str(st.st_ino)
                   for fields in (line.split(None, 5) for line in f) if len(fields) >= 5)


def test_a_delete_racing_a_create_on_the_other_worker_never_takes_the_new_ring(nsqd_factory):
    """A topic deleted through one worker while PUBs on both make it again:
    the worker that deleted can make the topic anew before the other one
    has applied the delete, and the other worker's delete then removed the
    new ring's name (an unlink by name).  The workers were left on two
    different rings of one topic: messages published through one never
    reached the channel the other delivers.  After every round each worker
    maps the ring in /dev/shm, and messages go through."""
    server = nsqd_factory("--workers=2")
    topic = "again"
    stop = threading.Event()
    errors = []

    def publish():
        while not stop.is_set():
            try:
                c = Client(server)
                for _ in range(50):
                    c.send(p.pub(topic, b"x") * 10)
                    for _ in range(10):
                        kind, body = c.response()
                        if body != b"OK":
                            errors.append(body)
                c.close()
            except OSError as err:
                errors.append(repr(err))
                return

    pids = workers(server)
    rings = [f"/dev/shm/{server.prefix}.t.{topic}", f"/dev/shm/{server.prefix}.c.{topic}:c"]
    bad = []
    for r in range(18):  # (each round ~0.7 s)
        stop.clear()
        threads = [threading.Thread(target=publish) for _ in range(4)]
        for t in threads:
            t.start()
        for _ in range(10):
            server.post(f"/topic/create?topic={topic}")
            server.post(f"/channel/create?topic={topic}&channel=c")  # 404 if deleted meanwhile
            server.post(f"/topic/delete?topic={topic}")
        stop.set()
        for t in threads:
            t.join()
        assert server.post(f"/topic/create?topic={topic}")[0] == 200
        assert server.post(f"/channel/create?topic={topic}&channel=c")[0] == 200
        time.sleep(0.2)  # the last changes reach the other worker
        for ring in rings:  # both workers have the topic and channel: the ring in /dev/shm
            if not all(maps_file(pid, ring) for pid in pids):
                bad.append((r, ring.rsplit(".", 1)[-1], [maps_file(pid, ring) for pid in pids]))
        if bad:
            break
    assert not errors, errors[:5]
    assert not bad, f"workers on different rings of one topic: {bad}"
    # and what is published through either worker reaches the channel
    for index in (0, 1):
        c = client_on_worker(server, index, None)  # (publishes a probe to topic "probe")
        c.send(p.pub(topic, b"w%d" % index))
        assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        c.close()
    sub = Client(server)
    sub.send(p.sub(topic, "c") + p.rdy(1000))
    assert sub.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    got = set()
    while not {b"w0", b"w1"} <= got:
        msg = sub.message()
        got.add(msg.body)
        sub.send(p.fin(msg.id))
    sub.close()
