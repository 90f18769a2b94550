"""The disk queue behind a real `nsqshm start`: overflow, roll-over,
restarts, SIGKILL, takeover of an nsqd data directory, a full disk."""

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from nsqshm import protocol as p
from tests.nsqd.conftest import wait_for
from tests.nsqd.tcp.test_protocol_v2 import Conn, publish

WORKER_COUNTS = (1, 2)  # every test on one worker and on two (conftest.py)


def stats(server, topic):
    _, body = server.get(f"/stats?format=json&topic={topic}")
    return json.loads(body)["topics"][0]


def consume_all(server, topic, channel, n, rdy=200, timeout=30):
    """n messages, each FINed.  After a SIGKILL a message can come twice (from
    disk and from the dead worker's in-flight table) while the first is still
    in flight: both frames are sent, as Go nsqd's messagePump sends a message
    whose ID is already in flight, and the second FIN answers E_FIN_FAILED
    (not fatal), which is skipped here."""
    c = Conn(server).subscribe(topic, channel, rdy=rdy)
    msgs = []
    while len(msgs) < n:
        for kind, data in c.frames(1, timeout=timeout):
            if kind == p.FRAME_TYPE_ERROR and data.startswith(b"E_FIN_FAILED "):
                continue
            assert kind == p.FRAME_TYPE_MESSAGE, (kind, data)
            m = p.decode_message(data)
            msgs.append(m)
            c.send(p.fin(m.id))
    return c, msgs


def segment_files(path, name):
    return sorted(f for f in os.listdir(path) if f.startswith(f"{name}.diskqueue.0"))


def test_mem_queue_size_zero_sends_everything_through_disk(nsqd_factory, tmp_path):
    server = nsqd_factory("--mem-queue-size=0")
    c = Conn(server)
    c.send(p.mpub("t", [f"m{i}".encode() for i in range(50)]))
    assert c.frame() == (0, b"OK")
    # (2 workers: a non-owner's MPUB goes through the shared ring to the owner's disk; a
    # /stats taken during that move can count the messages in both: docs/workers.md)
    def depths():
        t = stats(server, "t")
        return t["depth"], t["backend_depth"]

    wait_for(lambda: depths() == (50, 50))
    t = stats(server, "t")
    assert (t["depth"], t["backend_depth"]) == (50, 50)
    assert segment_files(tmp_path, "t") == ["t.diskqueue.000000.dat"]
    _, msgs = consume_all(server, "t", "c", 50)
    assert [m.body for m in msgs] == [f"m{i}".encode() for i in range(50)]


# 2 workers: a PUB taken by a worker that does not own the topic goes into the
# ring past --mem-queue-size (docs/workers.md, known limits): issue 14's "PUB never
# fails because memory is full" brings these to 2 workers
@pytest.mark.workers(1)
def test_overflow_past_mem_queue_size_keeps_fifo_order(nsqd_factory):
    server = nsqd_factory("--mem-queue-size=10")
    bodies = [f"m{i}".encode() for i in range(500)]
    c = Conn(server)
    for i in range(0, 500, 50):
        c.send(p.mpub("t", bodies[i:i + 40]))
        for b in bodies[i + 40:i + 50]:
            c.send(p.pub("t", b))
        assert c.frames(11) == [(0, b"OK")] * 11
    t = stats(server, "t")
    assert t["depth"] == 500 and t["backend_depth"] == 490
    _, msgs = consume_all(server, "t", "c", 500, rdy=37)
    assert [m.body for m in msgs] == bodies


# 2 workers: a PUB taken by a worker that does not own the topic goes into the
# ring past --mem-queue-size (docs/workers.md, known limits): issue 14's "PUB never
# fails because memory is full" brings these to 2 workers
@pytest.mark.workers(1)
def test_segments_roll_over_and_are_deleted_once_read(nsqd_factory, tmp_path):
    server = nsqd_factory("--mem-queue-size=0", "--max-bytes-per-file=2000")
    publish(server, "t", *[b"x" * 100 for _ in range(100)])
    assert len(segment_files(tmp_path, "t")) >= 7  # 130 bytes a record, 15 a file
    consume_all(server, "t", "c", 100)
    assert wait_for(lambda: len(segment_files(tmp_path, "t")) <= 1)


def test_restart_keeps_backlog_in_flight_and_deferred(nsqd_factory, tmp_path):
    prefix = f"nsqshm-test-restart{os.getpid()}"
    first = nsqd_factory("--mem-queue-size=20", prefix=prefix)
    bodies = [f"m{i}".encode() for i in range(100)]
    c = Conn(first)
    c.send(p.mpub("t", bodies))
    assert c.frame() == (0, b"OK")
    sub = Conn(first).subscribe("t", "c", rdy=10)
    in_flight = sub.messages(10)  # never finished
    due = time.time() + 3
    c.send(p.dpub("t", 3000, b"deferred"))
    assert c.frame() == (0, b"OK")
    assert first.stop() == 0
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix) and ".c." in n]
    second = nsqd_factory(data_path=tmp_path, prefix=prefix)
    ch = stats(second, "t")["channels"][0]
    assert ch["depth"] == 100 and ch["deferred_count"] == 1
    consumer, msgs = consume_all(second, "t", "c", 100)
    assert sorted(m.body for m in msgs) == sorted(bodies)
    again = {m.id: m.attempts for m in msgs if m.id in {x.id for x in in_flight}}
    assert len(again) == 10 and set(again.values()) == {2}
    [m] = consumer.messages(1, timeout=10)
    assert m.body == b"deferred" and time.time() >= due - 0.2  # the deferral held


def test_sigkill_during_heavy_writes_loses_nothing_fsynced(nsqd_factory, tmp_path):
    prefix = f"nsqshm-test-kill{os.getpid()}"
    server = nsqd_factory("--mem-queue-size=100", "--sync-every=1", prefix=prefix)
    acked = []
    stop = threading.Event()

    def writer():
        sock = socket.create_connection(server.tcp)
        sock.sendall(p.MAGIC_V2)
        dec = p.FrameDecoder()
        seq = 0
        try:
            while not stop.is_set():
                batch = [f"s{seq + k}".encode() for k in range(20)]
                sock.sendall(p.mpub("k", batch))
                while True:
                    data = sock.recv(4096)
                    if not data:
                        return
                    dec.feed(data)
                    if dec.frames():
                        break
                acked.extend(range(seq, seq + 20))  # OK received: acknowledged
                seq += 20
        except OSError:
            pass

    t = threading.Thread(target=writer)
    Conn(server).subscribe("k", "c")  # the channel exists (and persists in nsqd.dat)
    time.sleep(0.3)
    t.start()
    time.sleep(1.5)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    stop.set()
    t.join(5)
    assert len(acked) > 200
    again = nsqd_factory(data_path=tmp_path, prefix=prefix)
    depth = stats(again, "k")["channels"][0]["depth"]
    assert depth >= len(acked)
    _, msgs = consume_all(again, "k", "c", depth)
    got = [int(m.body[1:]) for m in msgs]
    missing = set(acked) - set(got)
    duplicates = len(got) - len(set(got))
    print(f"acknowledged={len(acked)} delivered={len(got)} duplicates={duplicates}")
    assert not missing, f"{len(missing)} acknowledged messages lost"


def go_record(msg_id, ts, attempts, body):
    data = struct.pack(">QH", ts, attempts) + msg_id + body
    return struct.pack(">I", len(data)) + data


def test_takeover_of_an_nsqd_data_directory(nsqd_factory, tmp_path):
    # the files a Go nsqd 1.3 leaves, written from the documented formats
    (tmp_path / "nsqd.dat").write_text(json.dumps({
        "topics": [{"name": "gt", "paused": False,
                    "channels": [{"name": "gc", "paused": True}]}],
        "version": "1.3.0"}, separators=(",", ":")))
    ids = [f"{i:016x}".encode() for i in (0xA1, 0xA2, 0xA3)]
    segment = b"".join(go_record(ids[i], 1_700_000_000_000_000_000 + i, 1, f"go{i}".encode())
                       for i in range(3))
    (tmp_path / "gt:gc.diskqueue.000000.dat").write_bytes(segment)
    (tmp_path / "gt:gc.diskqueue.meta.dat").write_text(f"3\n0,0\n0,{len(segment)}\n")
    server = nsqd_factory()
    t = stats(server, "gt")
    ch = t["channels"][0]
    assert (ch["channel_name"], ch["paused"], ch["depth"]) == ("gc", True, 3)
    server.post("/channel/unpause?topic=gt&channel=gc")
    _, msgs = consume_all(server, "gt", "gc", 3)
    assert [(m.id, m.timestamp, m.attempts, m.body) for m in msgs] == [
        (ids[i], 1_700_000_000_000_000_000 + i, 2, f"go{i}".encode()) for i in range(3)]


def test_what_nsqshm_leaves_is_an_nsqd_data_directory(nsqd_factory, tmp_path):
    server = nsqd_factory("--mem-queue-size=5")
    Conn(server).subscribe("t", "c").close()
    publish(server, "t", *[f"b{i}".encode() for i in range(12)])
    wait_for(lambda: stats(server, "t")["channels"][0]["depth"] == 12)
    assert server.stop() == 0
    meta = json.loads((tmp_path / "nsqd.dat").read_text())
    assert meta == {"topics": [{"name": "t", "paused": False,
                                "channels": [{"name": "c", "paused": False}]}],
                    "version": "1.3.0"}
    depth, read, write = (tmp_path / "t:c.diskqueue.meta.dat").read_text().splitlines()
    assert depth == "12" and read == "0,0"
    num, pos = map(int, write.split(","))
    data = (tmp_path / f"t:c.diskqueue.{num:06d}.dat").read_bytes()
    assert len(data) == pos  # truncated to its data
    bodies, off = [], 0
    while off < len(data):
        size = struct.unpack_from(">I", data, off)[0]
        bodies.append(data[off + 4 + 26:off + 4 + size])
        off += 4 + size
    assert sorted(bodies) == sorted(f"b{i}".encode() for i in range(12))


# 2 workers: a PUB taken by a worker that does not own the topic goes into the
# shared ring (OK), and only the owner meets the full disk (known limits)
@pytest.mark.workers(1)
def test_full_disk_fails_publishes_then_recovers(nsqd_factory, tmp_path):
    flag = tmp_path / "disk-full"
    server = nsqd_factory("--mem-queue-size=0", env={"NSQSHM_FAULT_ENOSPC": str(flag)})
    publish(server, "t", b"before")
    flag.write_text("")
    c = Conn(server)
    c.send(p.pub("t", b"during"))
    ftype, text = c.frame()
    assert ftype == 1 and text.startswith(b"E_PUB_FAILED PUB failed [Errno 28]")
    status, body = server.post("/pub?topic=t", b"http during")
    assert status == 500
    code, text = _get_now(server, "/ping")
    assert code == 500 and text.startswith(b"NOK - ")
    flag.unlink()
    publish(server, "t", b"after")
    assert _get_now(server, "/ping") == (200, b"OK")
    _, msgs = consume_all(server, "t", "c", 2)
    assert [m.body for m in msgs] == [b"before", b"after"]


def _get_now(server, path):
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(server.url(path), timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_unwritable_data_path_is_a_clear_start_up_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = subprocess.run([sys.executable, "-m", "nsqshm.cli", "start",
                          "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                          f"--data-path={blocker}/sub", "--shm-prefix=nsqshm-test-unwritable"],
                         capture_output=True, text=True, timeout=20)
    subprocess.run("rm -f /dev/shm/nsqshm-test-unwritable*", shell=True)
    assert out.returncode == 1
    fatal = [line for line in out.stderr.splitlines() if "FATAL" in line]
    assert len(fatal) == 1 and "failed to start nsqd" in fatal[0] and "Not a directory" in fatal[0]
