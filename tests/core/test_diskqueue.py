"""nsqshm._core.diskqueue: go-diskqueue's files and semantics, through mmap."""

import os
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest

from nsqshm._core.diskqueue import FAULT_ENV, DiskQueue, DiskQueueError


def msg(i, size=40):
    body = f"message-{i:06d}".encode()
    body += b"." * max(0, size - 26 - len(body))
    return struct.pack(">QH", i, 0) + f"{i:016x}".encode() + body


def pack(msgs):
    return b"".join(struct.pack("=I", len(m)) + m for m in msgs)


def unpack(buf, n, big_endian=False):
    out, pos = [], 0
    for _ in range(n):
        size = struct.unpack_from(">I" if big_endian else "=I", buf, pos)[0]
        out.append(bytes(buf[pos + 4:pos + 4 + size]))
        pos += 4 + size
    return out


def read_all(dq, batch=-1, big_endian=False, room=1 << 20):
    buf = bytearray(room)
    got = []
    while True:
        n, nbytes = dq.peek_into(buf, batch, big_endian=big_endian)
        if not n:
            return got
        records = unpack(buf, n, big_endian)
        assert nbytes == sum(4 + len(r) for r in records)
        got += records
        assert dq.advance(n) == n


# the two read paths: native sizes record by record (mmap), and the segment's
# own bytes in one piece (pread), which Ring.push_packed(big_endian=True) takes
PATHS = [pytest.param(False, id="native"), pytest.param(True, id="big-endian")]


def new(path, max_bytes=1000, logs=None, sync_every=1000):
    return DiskQueue("t", str(path), max_bytes, 26, 1 << 16, sync_every,
                     logf=(lambda lvl, m: logs.append((lvl, m))) if logs is not None else None)


def test_files_and_metadata_are_go_diskqueues(tmp_path):
    dq = new(tmp_path)
    msgs = [msg(i) for i in range(60)]  # 44 bytes each on disk: 22 per 1000-byte file
    assert dq.put_packed(pack(msgs)) == (60, len(pack(msgs)))
    dq.close()
    names = sorted(os.listdir(tmp_path))
    assert names == ["t.diskqueue.000000.dat", "t.diskqueue.000001.dat",
                     "t.diskqueue.000002.dat", "t.diskqueue.meta.dat"]
    assert (tmp_path / "t.diskqueue.meta.dat").read_text() == "60\n0,0\n2,704\n"
    first = (tmp_path / "t.diskqueue.000000.dat").read_bytes()
    assert len(first) == 22 * 44  # rolled before the record that would pass 1000 bytes
    assert first[:4] == struct.pack(">I", 40) and first[4:44] == msgs[0]
    assert os.path.getsize(tmp_path / "t.diskqueue.000002.dat") == 704  # truncated at close


@pytest.mark.parametrize("big_endian", PATHS)
@pytest.mark.parametrize("batch,room", [(7, 1 << 20), (-1, 1 << 20), (-1, 300)])
def test_roll_over_read_back_and_cleanup(tmp_path, big_endian, batch, room):
    dq = new(tmp_path)
    msgs = [msg(i, 26 + i % 50) for i in range(500)]
    dq.put_packed(pack(msgs))
    assert dq.depth == 500 and dq.write_file_num > 10
    assert read_all(dq, batch=batch, big_endian=big_endian, room=room) == msgs
    assert dq.depth == 0
    dq.sync()
    left = [n for n in os.listdir(tmp_path) if n.endswith(".dat") and "meta" not in n]
    assert left == [f"t.diskqueue.{dq.write_file_num:06d}.dat"]  # read files are deleted


def test_peek_does_not_consume_and_advance_is_partial(tmp_path):
    dq = new(tmp_path)
    dq.put_packed(pack([msg(i) for i in range(5)]))
    buf = bytearray(4096)
    assert dq.peek_into(buf, 3)[0] == 3
    assert dq.peek_into(buf, 3)[0] == 3  # still there
    assert dq.advance(2) == 2 and dq.depth == 3
    n, _ = dq.peek_into(buf)
    assert unpack(buf, n) == [msg(i) for i in range(2, 5)]


def take(dq, n):
    buf = bytearray(1 << 16)
    got, _ = dq.peek_into(buf, n)
    assert dq.advance(got) == got
    return unpack(buf, got)


def test_restart_keeps_the_backlog(tmp_path):
    dq = new(tmp_path)
    msgs = [msg(i) for i in range(100)]
    dq.put_packed(pack(msgs))
    assert take(dq, 10) == msgs[:10]
    dq.close()
    again = new(tmp_path)
    assert again.depth == 90
    assert read_all(again) == msgs[10:]


@pytest.mark.parametrize("big_endian", PATHS)
def test_corrupt_middle_segment_is_set_aside(tmp_path, big_endian):
    logs = []
    dq = new(tmp_path, logs=logs)
    msgs = [msg(i) for i in range(66)]  # 3 files of 22
    dq.put_packed(pack(msgs))
    dq.close()
    middle = tmp_path / "t.diskqueue.000001.dat"
    data = bytearray(middle.read_bytes())
    data[44 * 5:44 * 5 + 4] = struct.pack(">I", 0x7FFFFFF0)  # 6th record's size
    middle.write_bytes(data)
    dq = new(tmp_path, logs=logs)
    got = read_all(dq, big_endian=big_endian)
    assert got == msgs[:27] + msgs[44:]  # the middle file from its bad 6th record on is skipped
    assert (tmp_path / "t.diskqueue.000001.dat.bad").exists()
    assert any("invalid message read size" in m for _, m in logs)
    assert any(".bad" in m for _, m in logs)


@pytest.mark.parametrize("big_endian", PATHS)
def test_truncated_segment_is_set_aside(tmp_path, big_endian):
    logs = []
    dq = new(tmp_path, logs=logs)
    dq.put_packed(pack([msg(i) for i in range(44)]))
    dq.close()
    first = tmp_path / "t.diskqueue.000000.dat"
    first.write_bytes(first.read_bytes()[:100])  # cut mid-record
    dq = new(tmp_path, logs=logs)
    got = read_all(dq, big_endian=big_endian)
    assert got[:2] == [msg(0), msg(1)] and got[2:] == [msg(i) for i in range(22, 44)]
    assert (tmp_path / "t.diskqueue.000000.dat.bad").exists()


@pytest.mark.parametrize("size", [25, (1 << 16) + 1])
def test_write_size_limits(tmp_path, size):
    dq = new(tmp_path)
    with pytest.raises(ValueError, match="invalid message write size"):
        dq.put_packed(pack([b"x" * size]))
    assert dq.depth == 0


@pytest.mark.parametrize("big_endian", PATHS)
def test_takeover_of_files_written_by_go(tmp_path, big_endian):
    # what a Go nsqd leaves: two finished segments and a current one, and the metadata
    msgs = [msg(i) for i in range(30)]
    for num, chunk in enumerate([msgs[:10], msgs[10:20], msgs[20:]]):
        (tmp_path / f"t.diskqueue.{num:06d}.dat").write_bytes(
            b"".join(struct.pack(">I", len(m)) + m for m in chunk))
    (tmp_path / "t.diskqueue.meta.dat").write_text(f"27\n0,{44 * 3}\n2,{44 * 10}\n")
    dq = new(tmp_path, max_bytes=100 * 1024 * 1024)
    assert dq.depth == 27
    assert read_all(dq, big_endian=big_endian) == msgs[3:]


def test_disk_full_is_an_error_and_recovers(tmp_path, monkeypatch):
    flag = tmp_path / "full"
    monkeypatch.setenv(FAULT_ENV, str(flag))
    (tmp_path / "q").mkdir()
    dq = new(tmp_path / "q", max_bytes=8 << 20)
    dq.put_packed(pack([msg(0)]))
    dq.sync()
    flag.write_text("")
    # the first segment's reserved chunk still has room; fill it past the chunk
    with pytest.raises(DiskQueueError) as info:
        for _ in range(200):
            dq.put_packed(pack([msg(1, 60000)]))
    assert info.value.errno == 28
    depth = dq.depth
    flag.unlink()
    assert dq.put_packed(pack([msg(2)])) == (1, 44)
    assert dq.depth == depth + 1
    got = read_all(dq)
    assert got[0] == msg(0) and got[-1] == msg(2) and len(got) == depth + 1


# run inside a mount namespace of its own, on a 1 MiB tmpfs at argv[1]: a
# queue with a record, the filesystem filled, then sync() -- which must fail
# with ENOSPC and leave no temporary metadata file behind
FULL_DISK_SYNC = textwrap.dedent("""
    import errno, os, struct, sys
    from nsqshm._core.diskqueue import DiskQueue
    path = sys.argv[1]
    dq = DiskQueue("t", path, 1 << 20, 26, 1 << 16, 1000)
    m = struct.pack(">QH", 1, 0) + b"0" * 16 + b"body"
    dq.put_packed(struct.pack("=I", len(m)) + m)
    with open(os.path.join(path, "filler"), "wb", buffering=0) as f:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\\0" * chunk)
            except OSError as err:
                assert err.errno == errno.ENOSPC, err
    failed = 0
    for _ in range(5):  # every attempt of a syncer that retries
        try:
            dq.sync()
        except OSError as err:
            assert err.errno == errno.ENOSPC, err
            failed += 1
    print(failed, sorted(os.listdir(path)))
""")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="mounting a tmpfs in a mount namespace needs root and unshare")
def test_a_metadata_write_that_fails_on_a_full_disk_leaves_no_temporary_file(tmp_path):
    mount = 'mount -t tmpfs -o size=1m,mode=0700 nsqshm-test "$0" && exec "$@"'
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", mount,
                          str(tmp_path), sys.executable, "-c", FULL_DISK_SYNC, str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    failed, files = out.stdout.split(" ", 1)
    assert failed == "5"  # the disk really was full for the metadata
    assert files.strip() == str(["filler", "t.diskqueue.000000.dat"])


def test_empty_and_delete(tmp_path):
    dq = new(tmp_path)
    dq.put_packed(pack([msg(i) for i in range(50)]))
    dq.empty()
    assert dq.depth == 0 and read_all(dq) == []
    dq.put_packed(pack([msg(7)]))
    assert read_all(dq) == [msg(7)]
    dq.delete()
    assert not [n for n in os.listdir(tmp_path) if n.startswith("t.diskqueue")]


def test_names_cannot_escape_the_data_path(tmp_path):
    with pytest.raises(ValueError):
        DiskQueue("../x", str(tmp_path), 1000, 26, 100, 1)


KILLED_WRITER = """
import os, sys
sys.path.insert(0, {tests!r})
from tests.core.test_diskqueue import msg, new, pack
dq = new({path!r}, sync_every=1000)
dq.put_packed(pack([msg(i) for i in range(5)]))
dq.sync()
dq.put_packed(pack([msg(i) for i in range(5, 60)]))  # rolls over; metadata not synced
os._exit(9)  # as a SIGKILL: no close, no metadata
"""


def test_records_written_after_the_last_sync_survive_a_kill(tmp_path):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", KILLED_WRITER.format(tests=root, path=str(tmp_path))],
                   check=False, cwd=root)
    assert (tmp_path / "t.diskqueue.meta.dat").read_text() == "5\n0,0\n0,220\n"
    logs = []
    again = new(tmp_path, logs=logs)
    assert again.depth == 60
    assert read_all(again) == [msg(i) for i in range(60)]
    assert any("recovered 55 messages" in m for _, m in logs)
    # a torn tail (a size with too few bytes after it) is left to be overwritten
    again.put_packed(pack([msg(60)]))
    again.close()


@pytest.mark.parametrize("batch", [7, -1])
def test_runs_of_one_size_stop_at_max_records_and_at_a_change(tmp_path, batch):
    # the big-endian walk strides over records of one size; it must stop at
    # max_records, at a record of another size, and at a corrupt size
    dq = new(tmp_path, max_bytes=1 << 20)
    msgs = [msg(i, 40 if i % 100 < 60 else 41) for i in range(1000)]
    dq.put_packed(pack(msgs))
    buf = bytearray(1 << 20)
    n, _ = dq.peek_into(buf, batch, big_endian=True)
    assert n == (7 if batch == 7 else 1000)
    assert unpack(buf, n, True) == msgs[:n]
    assert read_all(dq, batch=batch, big_endian=True) == msgs
    dq.close()


def test_a_read_only_sync_rewrites_the_metadata_in_place(tmp_path):
    dq = new(tmp_path, max_bytes=1 << 20)
    msgs = [msg(i) for i in range(100)]
    dq.put_packed(pack(msgs))
    dq.sync()  # writes moved: a new file, fsynced and renamed over the old
    meta = tmp_path / "t.diskqueue.meta.dat"
    inode = os.stat(meta).st_ino
    assert meta.read_text() == f"100\n0,0\n0,{100 * 44}\n"
    assert take(dq, 95) == msgs[:95]
    dq.sync()  # only the read position moved: the same file, overwritten
    assert os.stat(meta).st_ino == inode
    # padded to the old length with newlines, which go-diskqueue's Fscanf ignores
    assert meta.read_text() == f"5\n0,{95 * 44}\n0,{100 * 44}\n".ljust(len("100\n0,0\n0,4400\n"),
                                                                      "\n")
    again = new(tmp_path, max_bytes=1 << 20)
    assert again.depth == 5 and read_all(again) == msgs[95:]
    again.put_packed(pack([msg(100)]))
    again.sync()
    assert os.stat(meta).st_ino != inode


@pytest.mark.parametrize("damage", ["empty", "missing", "garbage"])
def test_lost_metadata_is_rebuilt_from_the_segments(tmp_path, damage):
    # a host crash can leave a metadata file that was replaced without fsync
    # empty: every message in the segments is served again, none lost
    logs = []
    dq = new(tmp_path, logs=logs)
    msgs = [msg(i) for i in range(66)]  # 3 files of 22
    dq.put_packed(pack(msgs))
    assert take(dq, 30) == msgs[:30]  # the first file read and deleted, 8 of the second
    dq.close()
    meta = tmp_path / "t.diskqueue.meta.dat"
    if damage == "missing":
        meta.unlink()
    else:
        meta.write_bytes(b"" if damage == "empty" else b"\x00\x00\x00")
    again = new(tmp_path, logs=logs)
    assert again.depth == 44
    assert read_all(again) == msgs[22:]  # the second file again, from its start
    assert any("reading the segments again from 000001" in m for _, m in logs)
    again.put_packed(pack([msg(66)]))
    assert read_all(again) == [msg(66)]


def test_a_new_queue_without_segments_starts_empty(tmp_path):
    logs = []
    dq = new(tmp_path, logs=logs)
    assert dq.depth == 0 and not logs


@pytest.mark.parametrize("exact", [True, False], ids=["peeked", "walked"])
def test_a_remove_that_lets_another_reader_in_repeats_and_skips_nothing(tmp_path, exact):
    # the broker's remove() hands the file to a thread; had it yielded to another
    # greenlet reading the same queue mid-advance, that reader saw a stale position
    got = []
    inside = []

    def remove(path):
        os.unlink(path)
        if not inside:  # another greenlet gets in, once per removal
            inside.append(path)
            got.extend(take(dq, 5))
            inside.clear()

    dq = DiskQueue("t", str(tmp_path), 1000, 26, 1 << 16, 1000, remove=remove)
    msgs = [msg(i) for i in range(200)]  # 22 to a file
    dq.put_packed(pack(msgs))
    buf = bytearray(1 << 16)
    while True:
        n, _ = dq.peek_into(buf, 9)
        if not n:
            break
        keep = n if exact else max(1, n - 1)  # walked: the last one peeked is read again
        got.extend(unpack(buf, n)[:keep])
        assert dq.advance(keep) == keep
    assert sorted(got) == msgs
    assert dq.depth == 0


def test_the_first_sync_after_a_recovered_tail_is_durable(tmp_path):
    # records taken back at open were never fsynced by the killed writer: the
    # next sync must fsync and replace the metadata, not overwrite it in place
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-c", KILLED_WRITER.format(tests=root, path=str(tmp_path))],
                   check=False, cwd=root)
    meta = tmp_path / "t.diskqueue.meta.dat"
    inode = os.stat(meta).st_ino
    again = new(tmp_path)
    assert again.depth == 60
    again.sync()
    assert os.stat(meta).st_ino != inode  # a new file, fsynced and renamed
    assert meta.read_text() == f"60\n0,0\n{again.write_file_num},{again.write_pos}\n"


@pytest.mark.parametrize("name", [".", "..", "...", "t#ephemeral", "T" * 64, "..:..",
                                  ".:.", "t:c#ephemeral", "a.diskqueue.000000"])
def test_every_name_nsqd_accepts_is_a_file_in_the_data_path(tmp_path, name):
    data = tmp_path / "data"
    data.mkdir()
    dq = DiskQueue(name, str(data), 1000, 26, 100, 1)
    dq.put_packed(pack([msg(1)]))
    dq.close()
    assert sorted(os.listdir(data)) == [f"{name}.diskqueue.000000.dat",
                                        f"{name}.diskqueue.meta.dat"]  # Go nsqd's names
    again = DiskQueue(name, str(data), 1000, 26, 100, 1)
    assert read_all(again) == [msg(1)]
    again.close()


@pytest.mark.parametrize("name", ["", "a/b", "/", "a\0b", "T" * 65, "a:b:c", "é", "a b",
                                  "a:", ":a", "#ephemeral", "x" * 55 + "#ephemeral"])
def test_names_nsqd_refuses_never_reach_a_path(tmp_path, name):
    with pytest.raises(ValueError, match="invalid disk queue name"):
        DiskQueue(name, str(tmp_path), 1000, 26, 100, 1)
    assert os.listdir(tmp_path) == []


def test_a_queue_that_fails_to_open_closes_no_descriptor_of_the_process(tmp_path):
    """issue 21.1: __init__ raised before the write descriptor was -1 and
    __dealloc__ closed descriptor 0 -- by then a client's socket."""
    import gc

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.dup2(r, 0)
            before = os.fstat(0)
            for bad in ("a/b", ""):
                try:
                    DiskQueue(bad, str(tmp_path), 1000, 26, 100, 1)
                except ValueError:
                    pass
            try:  # raises later in __init__: no such data path
                DiskQueue("t", str(tmp_path / "missing"), 1000, 26, 100, 1)
            except OSError:
                pass
            gc.collect()
            after = os.fstat(0)
            status = 0 if (before.st_ino, before.st_dev) == (after.st_ino, after.st_dev) else 2
        except OSError:
            status = 3  # fd 0 was closed
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    os.close(r)
    os.close(w)
    assert os.WEXITSTATUS(status) == 0


@pytest.mark.parametrize("name, ok", [("t@w1", True), ("..@w12", True), ("t@w", False),
                                      ("t@x1", False), ("t@w1:c", False), ("@w1", False),
                                      ("t@w1/x", False), ("t@w12345", False)])
def test_overflow_queue_names_are_a_topic_and_a_worker_index(name, ok):
    from nsqshm._core.diskqueue import validate_name

    if ok:
        validate_name(name)
    else:
        with pytest.raises(ValueError):
            validate_name(name)
