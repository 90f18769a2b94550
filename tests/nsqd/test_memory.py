"""What topics and channels cost, and that churn gives it back (scratch.py,
topic.py, channel.py): the memory of every server process (anonymous and
file-backed resident pages) plus the broker's segments in /dev/shm."""

import os
import socket
import time
import urllib.request

import psutil
import pytest

from nsqshm import protocol as p
from tests.nsqd.conftest import wait_for
from tests.nsqd.workers.test_workers import Client


def server_memory(server, kinds=("RssAnon:", "RssFile:")):
    """Bytes: resident anonymous + file pages of the supervisor and workers,
    plus the blocks of the broker's shared-memory segments (counted once)."""
    total = 0
    procs = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children()]
    for proc in procs:
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith(kinds):
                    total += int(line.split()[1]) * 1024
    for entry in os.listdir("/dev/shm"):
        if entry.startswith(server.prefix):
            try:
                total += os.stat(f"/dev/shm/{entry}").st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def descriptors_and_maps(server):
    procs = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children()]
    fds = sum(proc.num_fds() for proc in procs)
    maps = 0
    for proc in procs:
        with open(f"/proc/{proc.pid}/maps") as f:
            maps += sum(1 for _ in f)
    return fds, maps


def post(server, path):
    req = urllib.request.Request(server.url(path), data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200


def free_garbage(server):
    """POST /debug/freememory on every worker (gc, malloc_trim): what is measured
    is what the queues keep, not garbage a collection has not reached yet (its
    timing moved this test's figure between 73 and 105 KB)."""
    from tests.nsqd.conftest import http_call, http_on_each_worker

    for conn in http_on_each_worker(server).values():
        assert http_call(conn, "POST", "/debug/freememory")[0] == 500  # (nsqd's answer)
        conn.close()


def settle(server):
    time.sleep(1.0)  # topology changes reach the other worker
    return server_memory(server)


def test_an_idle_topic_and_an_idle_channel_cost_under_100_kb(nsqd_factory):
    server = nsqd_factory("--workers=2")
    n = 500
    for i in range(20):  # warm-up: the first of everything allocates for all
        post(server, f"/topic/create?topic=warm{i}")
        post(server, f"/channel/create?topic=warm{i}&channel=c")
    before = settle(server)
    for i in range(n):
        post(server, f"/topic/create?topic=idle{i}")
    topics = settle(server)
    for i in range(n):
        post(server, f"/channel/create?topic=idle{i}&channel=c")
    channels = settle(server)
    per_topic = (topics - before) / n
    per_channel = (channels - topics) / n
    print(f"\n{n} topics and channels on 2 workers: {per_topic / 1000:.1f} KB per idle topic, "
          f"{per_channel / 1000:.1f} KB per idle channel")
    assert per_topic <= 100_000
    assert per_channel <= 100_000


def test_a_topic_and_channel_that_wrote_to_disk_cost_under_100_kb(nsqd_factory):
    """Messages past --mem-queue-size go to the disk queues: a queue that has
    written keeps nothing of it in memory (a staging buffer per disk queue
    kept 1 MiB of heap each: about 510 KB per topic+channel here, 78 KB
    with one for the process).  Memory here is the heap (anonymous pages):
    the disk queues' files, mapped to be read, are page cache that the
    kernel takes back when it needs to, and the rings are a few KB."""
    server = nsqd_factory("--workers=2", "--mem-queue-size=10", "--max-msg-size=4096")
    n = 100
    for i in range(10):  # warm-up: the first of everything allocates for all
        post(server, f"/topic/create?topic=warm{i}")
        post(server, f"/channel/create?topic=warm{i}&channel=c")
    time.sleep(1.0)
    free_garbage(server)
    before = server_memory(server, kinds=("RssAnon:",))
    c = Client(server, timeout=30)
    for i in range(n):
        post(server, f"/topic/create?topic=disk{i}")
        post(server, f"/channel/create?topic=disk{i}&channel=c")
        c.send(p.mpub(f"disk{i}", [b"x" * 4000] * 100))  # 90 of them to disk
        assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    c.close()
    time.sleep(1.0)
    free_garbage(server)
    after = server_memory(server, kinds=("RssAnon:",))
    per_pair = (after - before) / n
    print(f"\n{n} topics with a channel, 100 messages of 4000 bytes each (to disk): "
          f"{per_pair / 1000:.1f} KB per topic+channel")
    assert per_pair <= 100_000


def churn_round(server, r, topics=100, ephemeral=20):
    """Topics with a channel each created, one message through each, deleted;
    ephemeral channels coming and going.  Names are new every round (a
    create racing the other worker's delete of the same name is not what
    this measures)."""
    names = [f"churn{r}.{i}" for i in range(topics)]
    for name in names:
        post(server, f"/topic/create?topic={name}")
        post(server, f"/channel/create?topic={name}&channel=c")
    c = Client(server)
    c.send(b"".join(p.pub(name, b"m%d" % r) for name in names))
    for _ in names:
        assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    c.close()
    for i in range(ephemeral):
        c = Client(server)
        c.send(p.sub(names[0], f"e{r}.{i}#ephemeral"))
        assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        c.close()
    for name in names:
        post(server, f"/topic/delete?topic={name}")


def connections(server, n):
    """n connections opened (magic, a NOP) and closed."""
    for _ in range(n):
        s = socket.create_connection(server.tcp, timeout=5)
        s.sendall(p.MAGIC_V2 + p.nop())
        s.close()


def test_topic_and_channel_churn_gives_memory_back(nsqd_factory):
    server = nsqd_factory("--workers=2")
    for r in range(6):  # warm-up: allocators reach their working size
        churn_round(server, r)
    start = settle(server)
    start_fds, start_maps = descriptors_and_maps(server)
    for r in range(6, 11):
        churn_round(server, r)
    end = settle(server)
    end_fds, end_maps = descriptors_and_maps(server)
    growth = (end - start) / start
    print(f"\nchurn of 500 topics+channels, 100 ephemeral channels: memory "
          f"{start / 1e6:.1f} -> {end / 1e6:.1f} MB ({growth:+.1%}), descriptors "
          f"{start_fds} -> {end_fds}, maps {start_maps} -> {end_maps}")
    assert growth < 0.05
    assert end_fds <= start_fds + 4
    assert end_maps <= start_maps + 16


@pytest.mark.soak
def test_churn_soak_topics_channels_ephemerals_and_100k_connections(nsqd_factory):
    server = nsqd_factory("--workers=2")
    for r in range(10):
        churn_round(server, r)
    connections(server, 5000)
    start = settle(server)
    start_fds, start_maps = descriptors_and_maps(server)
    for r in range(10, 60):
        churn_round(server, r, ephemeral=100)
        connections(server, 2000)
    end = settle(server)
    # connections the workers are still closing hold descriptors a moment
    wait_for(lambda: descriptors_and_maps(server)[0] <= start_fds + 4, timeout=10)
    end_fds, end_maps = descriptors_and_maps(server)
    growth = (end - start) / start
    print(f"\nsoak: 5000 topics+channels, 5000 ephemeral channels, 100000 connections: "
          f"memory {start / 1e6:.1f} -> {end / 1e6:.1f} MB ({growth:+.1%}), descriptors "
          f"{start_fds} -> {end_fds}, maps {start_maps} -> {end_maps}")
    assert growth < 0.05
    assert end_fds <= start_fds + 4
    assert end_maps <= start_maps + 16


@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_10000_topics_with_a_channel_each_created_used_and_deleted(nsqd_factory):
    server = nsqd_factory("--workers=2")
    n = 10_000
    before = settle(server)
    started = time.monotonic()
    c = Client(server, timeout=120)
    for k in range(0, n, 500):  # PUB creates the topic
        c.send(b"".join(p.pub(f"many{i}", b"m%d" % i) for i in range(k, k + 500)))
        for _ in range(k, k + 500):
            assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    c.close()
    published = time.monotonic()
    for i in range(n):  # SUB creates the channel and takes the message
        c = Client(server, timeout=30)
        c.send(p.sub(f"many{i}", "c") + p.rdy(1))
        assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        msg = c.message()
        assert msg.body == b"m%d" % i
        c.send(p.fin(msg.id))
        c.close()
    used = time.monotonic()
    peak = settle(server)
    for i in range(n):
        post(server, f"/topic/delete?topic=many{i}")
    after = settle(server)
    print(f"\n{n} topics with a channel each, used and deleted in "
          f"{time.monotonic() - started:.0f} s (PUBs {published - started:.0f} s, SUBs "
          f"{used - published:.0f} s): {(peak - before) / n / 1000:.1f} KB per "
          f"topic+channel at peak; {before / 1e6:.1f} -> {peak / 1e6:.1f} -> {after / 1e6:.1f} MB")
    assert (peak - before) / n <= 200_000
