"""Two workers creating one shared-memory object at the same moment (issue
21.2): six connections SUB to a new channel at once, 900 times; every one
is answered OK and no worker attaches to a half-made ring.  And a delete
racing a create of the same topic on the other worker, and a SUB on one
worker racing a topic delete on the other."""

import os
import socket
import threading
import time

import pytest

from nsqshm import protocol as p
from tests.fuzz.cluster import stale_mappings
from tests.nsqd.conftest import http_call, http_on_worker, wait_for
from tests.nsqd.workers.test_workers import Client, client_on_worker, stats, workers

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


def test_a_sub_racing_a_topic_delete_on_the_other_worker_leaves_one_broker(nsqd_factory):
    """A SUB to a new channel through worker 1 while worker 0 deletes the
    topic: worker 1 can make the channel on its old topic before it applies
    the delete, and worker 0, applying that create after its delete, makes
    the topic again on the channel's ring.  Worker 1's delete then took the
    new channel's ring: worker 0 was left delivering from a ring with no
    name, /stats listed a channel without its ring (found by the fuzz).  A
    delete now names the rings it removed; the channel made meanwhile stays,
    on both workers.  After every round: each topic and channel in /stats
    has its ring, and no worker maps a ring whose name is gone."""
    server = nsqd_factory("--workers=2")
    http0 = http_on_worker(server, 0)
    pids = workers(server)
    topic = "gone"
    bad = []
    for r in range(40):
        assert http_call(http0, "POST", f"/topic/create?topic={topic}")[0] == 200
        assert http_call(http0, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
        time.sleep(0.05)  # worker 1 has the topic
        sub = client_on_worker(server, 1, None)
        go = threading.Barrier(2)

        def subscribe(sub=sub, r=r, go=go):
            go.wait()
            sub.send(p.sub(topic, f"n{r}"))

        t = threading.Thread(target=subscribe)
        t.start()
        go.wait()
        time.sleep(0.0002 * (r % 10))  # the delete at a different point of the SUB each round
        http_call(http0, "POST", f"/topic/delete?topic={topic}")
        t.join()

        def consistent():
            queues = {f"t.{t['topic_name']}" for t in stats(server)["topics"]} | \
                {f"c.{t['topic_name']}:{c['channel_name']}" for t in stats(server)["topics"]
                 for c in t["channels"]}
            rings = {n[len(server.prefix) + 1:] for n in os.listdir("/dev/shm")
                     if n.startswith(f"{server.prefix}.") and ".w" not in n[len(server.prefix):]
                     and n[len(server.prefix) + 1:].startswith(("t.", "c."))}
            return queues == rings and not stale_mappings(pids, server.prefix)

        ok = wait_for(consistent, timeout=3)
        sub.close()
        if not ok:
            bad.append((r, sorted(n for n in os.listdir("/dev/shm") if n.startswith(server.prefix)),
                        stale_mappings(pids, server.prefix)))
            break
        http_call(http0, "POST", f"/topic/delete?topic={topic}")  # (404 if it is gone)
        wait_for(lambda: all(t["topic_name"] != topic for t in stats(server)["topics"]))
    assert not bad, bad
    log = "".join(server.lines)
    assert "Traceback" not in log, log[-3000:]


def test_a_channel_delete_racing_a_sub_on_its_worker_keeps_the_ephemeral_topic_on_one_ring(
        nsqd_factory):
    """Worker 0 deletes the last channel of an ephemeral topic while a SUB to
    another channel comes, on either worker, during the delete's wait for the
    other worker.  Worker 1, applying the delete before it heard of the new channel,
    deleted the topic it saw left without channels (its ring's name with it);
    applying the create next, it made the topic on a new ring, while worker 0
    went on with the old one, whose name was gone (found by the bounded fuzz).
    The worker whose own delete empties the topic decides now.  After every
    round each worker maps the topic's ring by its current name."""
    server = nsqd_factory("--workers=2")
    http0 = http_on_worker(server, 0)
    pids = workers(server)
    topic = "x#ephemeral"
    ring = f"/dev/shm/{server.prefix}.t.{topic}"
    bad = []
    for r in range(40):
        assert http_call(http0, "POST", f"/topic/create?topic={topic}")[0] == 200
        assert http_call(http0, "POST", f"/channel/create?topic={topic}&channel=a")[0] == 200
        assert wait_for(lambda: all(maps_file(pid, ring) for pid in pids), 3)
        sub = Client(server)  # (either worker: the fuzz had it on both)
        go = threading.Barrier(2)

        def subscribe(sub=sub, r=r, go=go):
            go.wait()
            time.sleep(0.0001 * (r % 8))  # the SUB at a different point of the delete
            sub.send(p.sub(topic, f"n{r}"))

        t = threading.Thread(target=subscribe)
        t.start()
        go.wait()
        http_call(http0, "POST", f"/channel/delete?topic={topic}&channel=a")
        t.join()
        assert sub.response() == (p.FRAME_TYPE_RESPONSE, b"OK")

        def one_ring():
            try:
                return all(maps_file(pid, ring) for pid in pids) \
                    and not stale_mappings(pids, server.prefix)
            except FileNotFoundError:  # (the name is gone: no worker has the topic)
                return False

        if not wait_for(one_ring, timeout=3):
            bad.append((r, stale_mappings(pids, server.prefix),
                        [os.path.exists(ring) and maps_file(pid, ring) for pid in pids]))
            sub.close()
            break
        sub.close()  # then the topic goes with its last channel
        http_call(http0, "POST", f"/channel/delete?topic={topic}&channel=n{r}")
        assert wait_for(lambda: all(t["topic_name"] != topic for t in stats(server)["topics"]), 5)
    assert not bad, f"a worker on a ring whose name is gone: {bad}"
    log = "".join(server.lines)
    assert "Traceback" not in log, log[-3000:]
