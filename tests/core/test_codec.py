"""Byte-exact, table-driven tests of nsqshm._core.codec."""

import os
import struct
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
    import time

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
