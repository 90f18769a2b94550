"""Byte-exact, table-driven tests of nsqshm._core.codec."""

import os
import stat
import struct
import time
import uuid

import pytest

from nsqshm._core import codec

MESSAGES = [
    # (id, timestamp ns, attempts, body, expected bytes)
    (b"0123456789abcdef", 0, 0, b"",
     b"\0" * 8 + b"\0\0" + b"0123456789abcdef"),
    (b"0123456789abcdef", 1, 1, b"x",
     b"\0\0\0\0\0\0\0\x01" + b"\0\x01" + b"0123456789abcdef" + b"x"),
    (b"06a2a7f0e5c1d000", 1_700_000_000_123_456_789, 65535, b"hello",
     struct.pack(">QH", 1_700_000_000_123_456_789, 65535) + b"06a2a7f0e5c1d000" + b"hello"),
    (b"ffffffffffffffff", 2**64 - 1, 258, bytes(range(256)),
     b"\xff" * 8 + b"\x01\x02" + b"f" * 16 + bytes(range(256))),
]


@pytest.mark.parametrize("msg_id,ts,attempts,body,expected", MESSAGES)
def test_encode_message(msg_id, ts, attempts, body, expected):
    assert codec.encode_message(msg_id, ts, attempts, body) == expected


@pytest.mark.parametrize("msg_id,ts,attempts,body,expected", MESSAGES)
def test_decode_message(msg_id, ts, attempts, body, expected):
    assert codec.decode_message(expected) == (msg_id, ts, attempts, body)
    assert codec.decode_message(memoryview(bytearray(expected))) == (msg_id, ts, attempts, body)


@pytest.mark.parametrize("bad_id", [b"", b"short", b"0123456789abcdef0"])
def test_encode_rejects_bad_ids(bad_id):
    with pytest.raises(ValueError, match="16 bytes"):
        codec.encode_message(bad_id, 0, 0, b"")


@pytest.mark.parametrize("size", [0, 1, 25])
def test_decode_rejects_short_messages(size):
    with pytest.raises(ValueError, match="shorter than its 26-byte header"):
        codec.decode_message(b"\0" * size)


FRAMES = [
    (0, b"OK", b"\0\0\0\x06\0\0\0\0OK"),
    (0, b"_heartbeat_", b"\0\0\0\x0f\0\0\0\0_heartbeat_"),
    (1, b"E_INVALID invalid command", b"\0\0\0\x1d\0\0\0\x01E_INVALID invalid command"),
    (2, b"", b"\0\0\0\x04\0\0\0\x02"),
]


@pytest.mark.parametrize("ftype,data,expected", FRAMES)
def test_frames_round_trip(ftype, data, expected):
    assert codec.encode_frame(ftype, data) == expected
    assert codec.decode_frame(expected + b"trailing") == (ftype, data, len(expected))


@pytest.mark.parametrize("partial", [b"", b"\0\0\0", b"\0\0\0\x06\0\0\0\0O"])
def test_decode_frame_incomplete(partial):
    assert codec.decode_frame(partial) is None


def test_decode_frame_bad_size():
    with pytest.raises(ValueError, match="frame size 3"):
        codec.decode_frame(b"\0\0\0\x03\0\0\0\0")


@pytest.mark.parametrize("value,hex_id", [(0, b"0" * 16), (1, b"0000000000000001"),
                                          (0x0123456789ABCDEF, b"0123456789abcdef"),
                                          (2**64 - 1, b"f" * 16)])
def test_ids_are_lowercase_hex_like_nsqd(value, hex_id):
    assert codec.int_to_id(value) == hex_id
    assert codec.id_to_int(hex_id) == value


@pytest.fixture
def id_name():
    name = f"nsqshm-test-ids-{uuid.uuid4().hex[:10]}"
    yield name
    codec.IdGenerator.unlink(name)


def test_id_generator_is_time_based_and_shared(id_name):
    a = codec.IdGenerator.open(id_name)
    b = codec.IdGenerator.open(id_name)  # a second handle, as another process would have
    ids = [a.next_id() for _ in range(5000)] + [b.next_id() for _ in range(5000)]
    assert len(set(ids)) == 10000
    assert all(len(i) == 16 and i == i.lower() for i in ids)
    first_ms = (codec.id_to_int(ids[0]) >> 22) + codec.NSQD_EPOCH_MS
    assert abs(first_ms - time.time() * 1000) < 60_000
    buf = bytearray(16 * 100)
    a.fill(buf, 100)
    batch = {bytes(buf[i:i + 16]) for i in range(0, len(buf), 16)}
    assert len(batch) == 100 and not batch & set(ids)
    with pytest.raises(ValueError, match="cannot hold"):
        a.fill(bytearray(10), 1)
    a.close()
    b.close()


def test_id_generator_unique_across_processes_and_forks(id_name, tmp_path):
    gen = codec.IdGenerator.open(id_name)
    gen.next_id()  # the parent holds a reserved block; a fork must not reuse it
    pids = []
    for k in range(4):
        pid = os.fork()
        if pid == 0:
            g = gen if k % 2 else codec.IdGenerator.open(id_name)
            with open(tmp_path / f"ids{k}", "wb") as f:
                f.write(b"".join(g.next_id() for _ in range(10000)))
            os._exit(0)
        pids.append(pid)
    mine = b"".join(gen.next_id() for _ in range(10000))
    for pid in pids:
        os.waitpid(pid, 0)
    blobs = [mine] + [(tmp_path / f"ids{k}").read_bytes() for k in range(4)]
    ids = [blob[i:i + 16] for blob in blobs for i in range(0, len(blob), 16)]
    assert len(ids) == 50000 and len(set(ids)) == 50000


def test_id_segment_of_wrong_size(id_name):
    import posix_ipc

    shm = posix_ipc.SharedMemory("/" + id_name, posix_ipc.O_CREX, mode=0o600, size=100)
    shm.close_fd()
    with pytest.raises(ValueError, match="expected 4096"):
        codec.IdGenerator.open(id_name)


# -- node IDs and restarts (issue 14): nsqd's guid layout ------------------------------

def node_of(msg_id):
    return (codec.id_to_int(msg_id) >> 12) & 0x3FF


def ids_of(blob):
    return [blob[i:i + 16] for i in range(0, len(blob), 16)]


def draw(gen, count):
    buf = bytearray(16 * count)
    gen.fill(buf, count)
    return bytes(buf)


def test_two_brokers_with_different_node_ids_never_issue_the_same_id(tmp_path):
    """500 000 IDs from each of two generators (two brokers' segments, in two
    processes at once, the same milliseconds): no repeat, each its node."""
    names = [f"nsqshm-test-ids-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    pids = []
    try:
        for k, (name, node) in enumerate(zip(names, (1, 2), strict=True)):
            pid = os.fork()
            if pid == 0:
                gen = codec.IdGenerator.open(name, node_id=node,
                                             lease_path=str(tmp_path / f"lease{k}"))
                (tmp_path / f"ids{k}").write_bytes(draw(gen, 500_000))
                os._exit(0)
            pids.append(pid)
        for pid in pids:
            assert os.waitpid(pid, 0)[1] == 0
        first, second = (ids_of((tmp_path / f"ids{k}").read_bytes()) for k in range(2))
    finally:
        for name in names:
            codec.IdGenerator.unlink(name)
    assert len(first) == len(second) == 500_000
    assert len(set(first) | set(second)) == 1_000_000
    assert {node_of(i) for i in first} == {1} and {node_of(i) for i in second} == {2}
    # nsqd's layout: the top 42 bits are milliseconds since its epoch
    ms = (codec.id_to_int(first[0]) >> 22) + codec.NSQD_EPOCH_MS
    assert abs(ms - time.time() * 1000) < 60_000


def test_a_restarted_broker_never_repeats_an_id(id_name, tmp_path):
    """Across a restart with its segment gone (a reboot: the lease in the
    data path is all that is left) and one with it kept.  Drawn fast enough
    that the clock runs ahead of the wall clock (4096 IDs per ms), so a
    restart that started at the wall clock repeats IDs -- checked first."""
    lease = str(tmp_path / codec.LEASE_FILE)
    gen = codec.IdGenerator.open(id_name, node_id=5, lease_path=lease)
    issued = []
    for _ in range(10):  # until its clock is ahead of the wall clock (a slow machine: more)
        issued += ids_of(draw(gen, 1_000_000))
        ahead_ms = ((codec.id_to_int(issued[-1]) >> 22) + codec.NSQD_EPOCH_MS
                    - time.time() * 1000)
        if ahead_ms > 50:
            break
    gen.close()
    assert codec.IdGenerator.unlink(id_name)
    bare = codec.IdGenerator.open(id_name, node_id=5)  # no lease: starts at the wall clock
    early = ids_of(draw(bare, 1000))
    bare.close()
    codec.IdGenerator.unlink(id_name)
    assert set(early) & set(issued)
    gen = codec.IdGenerator.open(id_name, node_id=5, lease_path=lease)  # segment gone
    after = ids_of(draw(gen, 500_000))
    gen.close()
    gen = codec.IdGenerator.open(id_name, node_id=5, lease_path=lease)  # segment kept
    later = ids_of(draw(gen, 500_000))
    gen.close()
    every = issued + after + later
    assert len(set(every)) == len(every) == len(issued) + 1_000_000
    value = codec.id_to_int
    assert min(map(value, after)) > max(map(value, issued))
    assert min(map(value, later)) > max(map(value, after))
    assert {node_of(i) for i in every} == {5}


def test_ids_carry_the_node_id_each_process_reads_from_the_segment(id_name):
    gen = codec.IdGenerator.open(id_name, node_id=1023)
    other = codec.IdGenerator.open(id_name)  # a local producer: the broker's node ID
    assert other.node_id == 1023
    assert {node_of(other.next_id()) for _ in range(10)} == {1023}
    assert {node_of(gen.next_id()) for _ in range(10)} == {1023}
    with pytest.raises(ValueError, match="node ID"):
        codec.IdGenerator.open(id_name, node_id=1024)
    gen.close()
    other.close()


def test_the_lease_is_written_ahead_and_a_bad_lease_file_is_refused(id_name, tmp_path):
    lease = tmp_path / codec.LEASE_FILE
    gen = codec.IdGenerator.open(id_name, lease_path=str(lease))
    value = int(lease.read_text())
    assert value == gen.lease
    first = codec.id_to_int(gen.next_id())
    assert (first >> 22) << 12 < value  # the lease covers what was issued
    assert stat.S_IMODE(os.stat(lease).st_mode) == 0o600
    gen.close()
    codec.IdGenerator.unlink(id_name)
    lease.write_text("garbage\n")
    with pytest.raises(ValueError, match="not a lease"):
        codec.IdGenerator.open(id_name, lease_path=str(lease))


def v1_segment(name, ahead_ms):
    """An ID segment as the build before node IDs left it in /dev/shm: magic,
    version 1, and at offset 64 a counter of (ms << 22) + n."""
    counter = (int(time.time() * 1000) + ahead_ms - codec.NSQD_EPOCH_MS) << 22
    page = bytearray(4096)
    page[0:8] = b"nsqshmID"
    page[8:12] = (1).to_bytes(4, "little")
    page[64:72] = counter.to_bytes(8, "little")
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.write(fd, page)
    os.close(fd)
    return counter


def test_an_older_builds_segment_is_replaced_by_the_broker_past_its_ids(id_name, tmp_path):
    counter = v1_segment(id_name, ahead_ms=5000)
    with pytest.raises(ValueError, match="version 2"):  # a local client: not its to replace
        codec.IdGenerator.open(id_name)
    lease = str(tmp_path / codec.LEASE_FILE)
    pids = []
    for k in range(3):  # the workers of a broker, starting together
        pid = os.fork()
        if pid == 0:
            gen = codec.IdGenerator.open(id_name, node_id=9, lease_path=lease)
            (tmp_path / f"ids{k}").write_bytes(draw(gen, 100_000))
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    ids = [i for k in range(3) for i in ids_of((tmp_path / f"ids{k}").read_bytes())]
    assert len(set(ids)) == 300_000
    assert min(codec.id_to_int(i) >> 22 for i in ids) > counter >> 22
    assert codec.IdGenerator.open(id_name).node_id == 9


def test_the_lease_is_written_once_a_minute_of_clock_not_per_block(id_name, tmp_path):
    """Drawing 45 s worth of the ID clock (4096 IDs a ms) crosses the point
    where the lease is moved on: one write, not one file access per block."""
    lease = tmp_path / codec.LEASE_FILE
    gen = codec.IdGenerator.open(id_name, lease_path=str(lease))
    first = gen.lease
    buf = bytearray(16 * 1_000_000)

    def syscalls():
        with open("/proc/self/io") as f:
            fields = dict(line.split(": ") for line in f.read().splitlines())
        return int(fields["syscr"]) + int(fields["syscw"])

    before = syscalls()
    for _ in range(45 * 4096 // 1000):  # 184 M IDs
        gen.fill(buf, 1_000_000)
    used = syscalls() - before - 2  # the two reads of /proc/self/io
    assert gen.lease > first and int(lease.read_text()) == gen.lease
    assert used < 20, f"{used} read/write system calls for the lease"
    assert (codec.id_to_int(bytes(buf[-16:])) >> 22) << 12 < gen.lease
    gen.close()
