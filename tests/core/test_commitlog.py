"""The commit log of a log topic's partition: records, segments, indexes,
recovery, retention, readers in other processes."""

import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pytest

from nsqshm._core.commitlog import (
    STATE_FILE,
    LogError,
    LogNotMade,
    LogReader,
    MessageNotFound,
    NotABoundary,
    OffsetOutOfRange,
    PartitionLog,
    copy_prefix,
    crc32c,
    crc32c_software,
    cut_log,
    make_log_anew,
    partition_dir,
    prepare_cut,
    segment_name,
    set_aside_logs,
    swap_in,
)

T0 = 1_700_000_000_000_000_000


def message(i, body_size=100, ts=None):
    """nsqd's encoding; the ID is the offset in hex, the body repeats it."""
    body = (f"{i}:".encode() * body_size)[:body_size]
    return struct.pack(">QH", T0 + i * 1000 if ts is None else ts, 1) + f"{i:016x}".encode() + body


def packed(msgs):
    return b"".join(struct.pack("=I", len(m)) + m for m in msgs)


def unpack(buf, nbytes):
    out, pos = [], 0
    while pos < nbytes:
        (size,) = struct.unpack_from("=I", buf, pos)
        out.append(bytes(buf[pos + 4:pos + 4 + size]))
        pos += 4 + size
    return out


def read_all(reader, start=None, chunk=1 << 20):
    buf = bytearray(chunk)
    off = reader.start_offset if start is None else start
    msgs = []
    while True:
        n, nbytes, off = reader.read_into(off, buf)
        if not n:
            return msgs
        msgs.extend(unpack(buf, nbytes))


@pytest.fixture
def logdir(tmp_path):
    return partition_dir(str(tmp_path), "t", 0)


def write(logdir, msgs, **kw):
    log = PartitionLog(logdir, **kw)
    log.append_packed(packed(msgs))
    return log


def test_crc32c_known_value_and_hardware_matches_table():
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c_software(b"123456789") == 0xE3069283
    rnd = random.Random(1)
    for n in list(range(0, 600)) + [1 << 16, (1 << 16) + 191]:   # every tail of 3 x 64-byte rounds
        data = rnd.randbytes(n)
        assert crc32c(data) == crc32c_software(data)
        assert crc32c(data, n * 7919) == crc32c_software(data, n * 7919)


def test_round_trip_is_byte_exact_and_records_are_as_drawn(logdir):
    msgs = [message(i, size) for i, size in enumerate([0, 1, 100, 5000, 3, 70000])]
    log = PartitionLog(logdir)
    assert log.append_packed(packed(msgs)) == (6, 0, len(packed(msgs)))
    assert log.append_packed(packed([message(6)])) == (1, 6, 4 + len(message(6)))
    reader = LogReader(logdir)
    assert read_all(reader) == msgs + [message(6)]
    raw = open(os.path.join(logdir, segment_name(0)), "rb").read()
    pos = 0
    for i, m in enumerate(msgs):
        size, crc, off = struct.unpack_from(">IIQ", raw, pos)
        assert (size, off) == (8 + len(m), i)
        assert crc == crc32c(raw[pos + 8:pos + 8 + size])
        assert raw[pos + 16:pos + 16 + len(m)] == m
        assert reader.virtual_offset_of(i) == pos
        pos += 8 + size
    assert (reader.start_offset, reader.end_offset) == (0, 7)
    log.close()


@pytest.mark.parametrize("max_records,max_bytes,buf_size,want", [
    (-1, -1, 1 << 20, 50),
    (7, -1, 1 << 20, 7),
    (-1, 3 * 130, 1 << 20, 3),        # 4 + 126 bytes a record
    (-1, -1, 130 * 5 + 129, 5),       # whole records only
    (-1, -1, 100, 0),
])
def test_read_into_limits(logdir, max_records, max_bytes, buf_size, want):
    msgs = [message(i) for i in range(50)]
    log = write(logdir, msgs)
    buf = bytearray(buf_size)
    n, nbytes, nxt = LogReader(logdir).read_into(0, buf, max_records, max_bytes)
    assert (n, nxt) == (want, want)
    assert unpack(buf, nbytes) == msgs[:want]
    log.close()


def test_a_reader_of_a_state_not_committed_yet_is_told_it_is_not_made(logdir, tmp_path):
    """Another process may open the state between its writer's creation of the file
    (zeroed) and its first commit: LogNotMade, as for no file, not a layout error."""
    PartitionLog(logdir).close()
    size = os.path.getsize(os.path.join(logdir, STATE_FILE))
    made = tmp_path / "made.nsqlog"
    made.mkdir()
    state = bytearray(open(os.path.join(logdir, STATE_FILE), "rb").read())
    version_only = bytes(8) + state[8:]  # the first commit's stores: version, then magic
    magic_only = state[:8] + bytes(size - 8)
    for content in (b"", bytes(size), version_only, magic_only):  # (created, truncated)
        (made / STATE_FILE).write_bytes(content)
        with pytest.raises(LogNotMade):
            LogReader(str(made))
    state[:8] = b"\xff" * 8  # another layout (or garbage) is still a layout error
    (made / STATE_FILE).write_bytes(bytes(state))
    with pytest.raises(LogError, match="not a partition log state") as err:
        LogReader(str(made))
    assert not isinstance(err.value, LogNotMade)


def test_read_from_every_offset_and_out_of_range(logdir):
    msgs = [message(i, 50 + i % 300) for i in range(400)]
    log = write(logdir, msgs, segment_bytes=16384, index_interval=512)
    reader = LogReader(logdir)
    buf = bytearray(4096)
    for off in range(0, 400, 7):
        n, nbytes, nxt = reader.read_into(off, buf, 3)
        assert unpack(buf, nbytes) == msgs[off:off + 3] and nxt == off + n
    assert reader.read_into(400, buf) == (0, 0, 400)
    with pytest.raises(OffsetOutOfRange) as err:
        reader.read_into(401, buf)
    assert (err.value.start_offset, err.value.end_offset) == (0, 400)
    log.close()


def test_segments_roll_and_positions_add_up(logdir):
    msgs = [message(i, 200) for i in range(1000)]
    log = PartitionLog(logdir, segment_bytes=32768)
    for k in range(0, 1000, 100):
        log.append_packed(packed(msgs[k:k + 100]))
    reader = LogReader(logdir)
    segs = reader.segments()
    assert len(segs) == 1000 // (32768 // (16 + 226)) + 1
    virtual = 0
    for (base, bvirt, end, nbytes), nxt in zip(segs, segs[1:] + [None], strict=True):
        assert bvirt == virtual and nbytes <= 32768
        assert os.path.getsize(os.path.join(logdir, segment_name(base))) == nbytes
        virtual += nbytes
        if nxt:
            assert nxt[0] == end
    assert reader.virtual_end == virtual == 1000 * (16 + 226)
    assert read_all(reader) == msgs
    log.close()


@pytest.fixture
def indexed(logdir):
    """1000 messages of mixed sizes over several segments."""
    rnd = random.Random(5)
    msgs = [message(i, rnd.randrange(0, 2000)) for i in range(1000)]
    log = PartitionLog(logdir, segment_bytes=200_000, index_interval=1024)
    for k in range(0, 1000, 37):
        log.append_packed(packed(msgs[k:k + 37]))
    yield log, LogReader(logdir), msgs
    log.close()


def test_lookup_by_virtual_offset_and_not_a_boundary(indexed):
    log, reader, msgs = indexed
    assert len(reader.segments()) > 3
    for off in range(0, 1000, 13):
        pos = reader.virtual_offset_of(off)
        assert reader.find_by_virtual_offset(pos) == off
        for bad in (pos + 1, pos + 8, pos + 15):
            with pytest.raises(NotABoundary):
                reader.find_by_virtual_offset(bad)
    assert reader.find_by_virtual_offset(reader.virtual_end) == 1000
    with pytest.raises(OffsetOutOfRange):
        reader.find_by_virtual_offset(reader.virtual_end + 1)


def test_lookup_of_the_next_record_by_virtual_offset(indexed):
    """next_record: Youzan's SearchLogByMsgOffset, the first record at or after
    a byte (the last record of each segment included: its next is the next
    segment's first), the end past the log, no error."""
    log, reader, msgs = indexed
    for off in range(1000):
        pos = reader.virtual_offset_of(off)
        assert reader.find_by_virtual_offset(pos, next_record=True) == off
        assert reader.find_by_virtual_offset(pos + 1, next_record=True) == off + 1
        assert reader.find_by_virtual_offset(reader.virtual_offset_of(off + 1) - 1,
                                             next_record=True) == off + 1
    for beyond in (reader.virtual_end, reader.virtual_end + 1, 2**64 - 1):
        assert reader.find_by_virtual_offset(beyond, next_record=True) == 1000


def test_lookup_by_time(indexed):
    log, reader, msgs = indexed
    for off in [0, 1, 2, 99, 500, 998, 999]:
        assert reader.find_offset_by_time(T0 + off * 1000) == off
        assert reader.find_offset_by_time(T0 + off * 1000 - 1) == off
        assert reader.find_offset_by_time(T0 + off * 1000 + 1) == off + 1
    assert reader.find_offset_by_time(0) == 0
    assert reader.find_offset_by_time(T0 + 10**12) == 1000


def test_lookup_by_id(indexed):
    log, reader, msgs = indexed
    for off in list(range(0, 1000, 11)) + [999]:
        assert reader.find_by_id(f"{off:016x}".encode()) == off
    for missing in (b"ffffffffffffffff", b"0000000000000000"[:15] + b"/", b"00000000000003e8"):
        with pytest.raises(MessageNotFound):
            reader.find_by_id(missing)


def test_writer_is_exclusive(logdir):
    log = PartitionLog(logdir)
    with pytest.raises(LogError):
        PartitionLog(logdir)
    log.close()
    PartitionLog(logdir).close()


def test_reopen_continues_offsets(logdir):
    write(logdir, [message(i) for i in range(10)]).close()
    log = PartitionLog(logdir)
    assert log.append_packed(packed([message(10)]))[1] == 10
    assert read_all(log.reader) == [message(i) for i in range(11)]
    log.close()


def _last_record_start(path):
    raw = open(path, "rb").read()
    pos = last = 0
    while pos < len(raw):
        last = pos
        pos += 8 + struct.unpack_from(">I", raw, pos)[0]
    return last, len(raw)


def test_torn_tail_is_truncated_at_every_byte_of_the_last_record(logdir):
    msgs = [message(i, 40) for i in range(30)]
    write(logdir, msgs, index_interval=256).close()
    seg = os.path.join(logdir, segment_name(0))
    good = open(seg, "rb").read()
    last, size = _last_record_start(seg)
    logs = []
    for cut in range(last, size + 1):
        with open(seg, "wb") as f:
            f.write(good[:cut])
        log = PartitionLog(logdir, index_interval=256, logf=lambda lvl, m: logs.append(m))
        want = 30 if cut == size else 29
        assert log.end_offset == want, cut
        assert os.path.getsize(seg) == (size if cut == size else last)
        assert read_all(log.reader) == msgs[:want]
        log.append_packed(packed([message(want, 40)]))   # appends go on from there
        assert read_all(log.reader)[-1] == message(want, 40)
        log.close()
    assert any("torn tail truncated" in m for m in logs)


@pytest.mark.parametrize("where", [16, 20, 40, 60])
def test_bad_crc_truncates_at_the_last_good_record(logdir, where):
    msgs = [message(i, 40) for i in range(30)]
    write(logdir, msgs).close()
    seg = os.path.join(logdir, segment_name(0))
    last, size = _last_record_start(seg)
    with open(seg, "r+b") as f:
        f.seek(last + where)
        b = f.read(1)
        f.seek(last + where)
        f.write(bytes([b[0] ^ 0x40]))
    log = PartitionLog(logdir)
    assert log.end_offset == 29 and os.path.getsize(seg) == last
    assert read_all(log.reader) == msgs[:29]
    log.close()


@pytest.mark.parametrize("corrupt", [False, True])
def test_a_scan_across_many_chunks_indexes_all_and_stops_at_a_bad_record(logdir, corrupt):
    """Recovery of an active segment with no index scans it in chunks of a few MiB
    (crcs checked without the GIL, _verify_run, then indexed): every record of a
    14 MiB segment is found and indexed again, and a bad crc past the third chunk
    truncates exactly there."""
    msgs = [message(i, 2000) for i in range(7000)]
    write(logdir, msgs, segment_bytes=64 << 20).close()
    seg = os.path.join(logdir, segment_name(0))
    for ext in (".index", ".timeindex"):
        os.unlink(seg[:-4] + ext)
    want = 7000
    if corrupt:
        want = 5000
        with open(seg, "r+b") as f:
            pos = 0
            for _ in range(want):  # [u32 BE size][u32 crc][u64 offset][message]
                f.seek(pos)
                pos += 8 + struct.unpack(">I", f.read(4))[0]
            f.seek(pos + 40)
            b = f.read(1)
            f.seek(pos + 40)
            f.write(bytes([b[0] ^ 1]))
    log = PartitionLog(logdir, segment_bytes=64 << 20)
    assert log.end_offset == want
    assert read_all(log.reader) == msgs[:want]
    assert read_all(log.reader, start=want - 3) == msgs[want - 3:want]  # (found by the index)
    assert os.path.getsize(seg[:-4] + ".index") > 1024
    log.close()


@pytest.mark.parametrize("lose", [".index", ".timeindex", "both-active", "state"])
def test_missing_indexes_and_state_are_rebuilt(logdir, lose):
    rnd = random.Random(2)
    msgs = [message(i, rnd.randrange(10, 900)) for i in range(600)]
    write(logdir, msgs, segment_bytes=65536, index_interval=512).close()
    bases = sorted(int(n[:20]) for n in os.listdir(logdir) if n.endswith(".log"))
    victims = {".index": [(bases[1], ".index")], ".timeindex": [(bases[0], ".timeindex")],
               "both-active": [(bases[-1], ".index"), (bases[-1], ".timeindex")],
               "state": []}[lose]
    for base, ext in victims:
        os.unlink(os.path.join(logdir, f"{base:020d}{ext}"))
    if lose == "state":
        os.unlink(os.path.join(logdir, "state"))
    log = PartitionLog(logdir, segment_bytes=65536, index_interval=512)
    reader = log.reader
    assert (reader.start_offset, reader.end_offset) == (0, 600)
    assert read_all(reader) == msgs
    for off in range(0, 600, 17):
        assert reader.find_by_id(f"{off:016x}".encode()) == off
        assert reader.find_offset_by_time(T0 + off * 1000) == off
        assert reader.find_by_virtual_offset(reader.virtual_offset_of(off)) == off
    log.close()


def test_index_entries_are_sparse(logdir):
    write(logdir, [message(i, 200) for i in range(2000)], index_interval=4096).close()
    raw = open(os.path.join(logdir, segment_name(0)[:-4] + ".index"), "rb").read()[32:]
    entries = [struct.unpack_from(">II", raw, k) for k in range(0, len(raw), 8)]
    positions = [0] + [pos for _, pos in entries]
    gaps = [b - a for a, b in zip(positions, positions[1:], strict=False)]
    assert len(entries) > 100 and all(4096 <= g < 4096 + 242 for g in gaps)
    assert all(pos == rel * 242 for rel, pos in entries)   # 16 + 26 + 200 a record


def test_retention_deletes_old_segments_and_a_reader_behind_gets_a_status(logdir):
    msgs = [message(i, 200) for i in range(1000)]
    log = PartitionLog(logdir, segment_bytes=32768)
    log.append_packed(packed(msgs))
    reader = LogReader(logdir)
    buf = bytearray(4096)
    assert reader.read_into(0, buf, 2)[0] == 2      # maps the first segment
    segs = reader.segments()
    removed = log.apply_retention(max_bytes=3 * 32768)
    assert [r[0] for r in removed] == [s[0] for s in segs[:len(removed)]]
    assert all(not os.path.exists(os.path.join(logdir, segment_name(b))) for b, _, _ in removed)
    start = removed[-1][1]
    with pytest.raises(OffsetOutOfRange) as err:
        reader.read_into(2, buf)
    assert err.value.start_offset == start == reader.start_offset
    assert "before log start" in str(err.value)
    assert read_all(reader) == msgs[start:]
    assert reader.find_offset_by_time(0) == start
    assert reader.find_by_virtual_offset(0, next_record=True) == start  # (Youzan's search)
    with pytest.raises(OffsetOutOfRange):
        reader.find_by_virtual_offset(0)
    assert reader.virtual_end - reader.start_virtual <= 3 * 32768
    # by age: every finished segment is older than 0 s; the active one stays
    removed = log.apply_retention(max_age_s=0)
    assert removed and reader.start_offset == reader.segments()[0][0] == reader.segments()[-1][0]
    assert log.apply_retention(max_age_s=0) == []
    log.close()
    log = PartitionLog(logdir, segment_bytes=32768)   # reopened: start kept
    assert log.start_offset == reader.start_offset and log.end_offset == 1000
    log.close()


def test_retention_keeps_every_segment_holding_an_offset_from_keep_from_on(logdir):
    msgs = [message(i, 200) for i in range(1000)]
    log = PartitionLog(logdir, segment_bytes=32768)
    log.append_packed(packed(msgs))
    segs = log.reader.segments()
    keep_from = segs[3][0] + 1  # (in the fourth segment)
    removed = log.apply_retention(max_bytes=32768, keep_from=keep_from)
    assert [r[0] for r in removed] == [s[0] for s in segs[:3]]
    assert log.start_offset == segs[3][0] < keep_from
    assert log.apply_retention(max_bytes=32768, keep_from=segs[4][0]) == [
        (segs[3][0], segs[4][0], segs[3][3])]  # (its end at keep_from: it goes)
    log.close()


def test_a_log_made_at_a_start_copies_another_from_there_at_the_same_positions(tmp_path):
    """A replica copying a leader's log after retention removed its beginning: the
    copy begins at the leader's start, and every message has the same msg offset and
    virtual offset on both (a position means one message on every replica)."""
    msgs = [message(i, 200) for i in range(1000)]
    leader = PartitionLog(partition_dir(str(tmp_path / "a"), "t", 0), segment_bytes=32768)
    leader.append_packed(packed(msgs))
    leader.apply_retention(max_bytes=3 * 32768)
    start, start_virtual = leader.start_offset, leader.start_virtual
    assert start > 0 and start_virtual > 0
    copy_dir = partition_dir(str(tmp_path / "b"), "t", 0)
    copy = PartitionLog(copy_dir, segment_bytes=32768, start_at=(start, start_virtual))
    assert (copy.start_offset, copy.start_virtual, copy.end_offset) == \
        (start, start_virtual, start)
    buf, off = bytearray(1 << 20), start
    while off < leader.end_offset:
        n, nbytes, off = leader.reader.read_into(off, buf)
        copy.append_packed(memoryview(buf)[:nbytes])
    assert read_all(copy.reader) == msgs[start:]
    for offset in (start, start + 1, (start + 999) // 2, 999):
        v = leader.reader.virtual_offset_of(offset)
        assert copy.reader.virtual_offset_of(offset) == v
        assert copy.reader.find_by_virtual_offset(v) == offset
    assert copy.virtual_end == leader.virtual_end
    copy.close()
    # reopened: where it starts is kept (start_at is for a log with nothing yet)
    copy = PartitionLog(copy_dir, segment_bytes=32768, start_at=(0, 0))
    assert (copy.start_offset, copy.end_offset) == (start, 1000)
    copy.close()
    leader.close()


@pytest.mark.parametrize("keep", ["start+1", "mid-segment", "segment boundary", "end"])
def test_a_prefix_copy_keeps_what_is_below_at_the_same_positions_and_links_whole_segments(
        tmp_path, keep):
    """A replica's log cut where it diverged: the messages below `keep` at their msg
    and virtual offsets, the segments before the last one shared (hard links), and
    the cut log goes on at `keep`."""
    msgs = [message(i, 200) for i in range(1000)]
    src = partition_dir(str(tmp_path / "a"), "t", 0)
    log = PartitionLog(src, segment_bytes=32768)
    log.append_packed(packed(msgs))
    log.apply_retention(max_bytes=5 * 32768)  # (a log that no longer starts at 0)
    segs = log.reader.segments()
    start = log.start_offset
    keep = {"start+1": start + 1, "mid-segment": segs[2][0] + 7,
            "segment boundary": segs[3][0], "end": 1000}[keep]
    virtuals = [log.reader.virtual_offset_of(o) for o in range(start, keep + 1)]
    log.close()
    (tmp_path / "b").mkdir()
    dst = partition_dir(str(tmp_path / "b"), "t", 0)
    copy_prefix(src, dst, keep)
    cut = PartitionLog(dst, segment_bytes=32768)
    assert (cut.start_offset, cut.end_offset) == (start, keep)
    assert read_all(cut.reader) == msgs[start:keep]
    assert [cut.reader.virtual_offset_of(o) for o in range(start, keep + 1)] == virtuals
    shared = [b for b, _, _, _ in cut.reader.segments()[:-1]]
    for base in shared:  # linked, not copied
        assert os.stat(os.path.join(dst, segment_name(base))).st_ino == \
            os.stat(os.path.join(src, segment_name(base))).st_ino
    assert len(shared) == len([s for s in segs if s[0] < keep]) - 1
    assert cut.append_packed(packed([message(keep, 200)]))[1] == keep
    assert read_all(cut.reader, keep) == [message(keep, 200)]
    cut.close()
    src_log = PartitionLog(src, segment_bytes=32768)  # the source is untouched
    assert read_all(src_log.reader) == msgs[start:]
    src_log.close()


@pytest.mark.parametrize("crash", [None, "after the copy", "between the renames",
                                   "after the renames"])
def test_a_cut_log_goes_on_at_the_cut_and_a_cut_interrupted_is_finished(logdir, crash):
    msgs = [message(i, 200) for i in range(400)]
    write(logdir, msgs, segment_bytes=32768).close()
    with open(os.path.join(logdir, "c.cursor"), "wb") as f:  # a channel's checkpoint
        f.write(b"checkpoint")
    cut, gone = logdir + ".cut", logdir + ".gone1-1"
    if crash is None:
        gone = cut_log(logdir, 250, segment_bytes=32768)
    else:  # the steps of cut_log, up to where the process died
        copy_prefix(logdir, cut, 250)
        PartitionLog(cut, segment_bytes=32768).close()
        os.link(os.path.join(logdir, "c.cursor"), os.path.join(cut, "c.cursor"))
        if crash != "after the copy":
            os.rename(logdir, gone)
        if crash == "after the renames":
            os.rename(cut, logdir)
    log = PartitionLog(logdir, segment_bytes=32768)
    want = 400 if crash == "after the copy" else 250  # (a copy not swapped in: no cut)
    assert (log.start_offset, log.end_offset) == (0, want)
    assert read_all(log.reader) == msgs[:want]
    assert not os.path.exists(cut)
    assert open(os.path.join(logdir, "c.cursor"), "rb").read() == b"checkpoint"
    # the old log set aside, for its owner to remove (not on the way of the open)
    assert set_aside_logs(logdir) == ([] if crash == "after the copy" else [gone])
    log.close()


@pytest.mark.parametrize("log_there", [True, False])
def test_a_cut_being_prepared_is_never_taken_by_the_next_open(logdir, log_there):
    """prepare_cut makes the cut log as <log>.cutting (on a thread): if its process
    dies, or the topic is deleted meanwhile (and made again), the next open removes
    it, keeps the log it has (no cut), or makes a new empty one -- never the copy of
    a deleted topic's log."""
    msgs = [message(i, 200) for i in range(400)]
    write(logdir, msgs, segment_bytes=32768).close()
    cutting = prepare_cut(logdir, 250, segment_bytes=32768)
    assert cutting == logdir + ".cutting" and os.path.isdir(cutting)
    if not log_there:  # the topic deleted under the cut
        shutil.rmtree(logdir)
    log = PartitionLog(logdir, segment_bytes=32768)
    assert (log.start_offset, log.end_offset) == ((0, 400) if log_there else (0, 0))
    assert not os.path.exists(cutting) and not os.path.exists(logdir + ".cut")
    log.close()


def test_swap_in_takes_a_prepared_cut(logdir):
    msgs = [message(i, 200) for i in range(400)]
    write(logdir, msgs, segment_bytes=32768).close()
    gone = swap_in(logdir, prepare_cut(logdir, 250, segment_bytes=32768))
    log = PartitionLog(logdir, segment_bytes=32768)
    assert (log.end_offset, read_all(log.reader)) == (250, msgs[:250])
    assert set_aside_logs(logdir) == [gone]
    assert not os.path.exists(logdir + ".cutting") and not os.path.exists(logdir + ".cut")
    log.close()


def test_a_log_made_anew_begins_at_a_start_and_keeps_the_others_files(logdir):
    write(logdir, [message(i) for i in range(10)]).close()
    with open(os.path.join(logdir, "c.cursor"), "wb") as f:
        f.write(b"checkpoint")
    gone = make_log_anew(logdir, 7, 700)
    assert set_aside_logs(logdir) == [gone]
    assert open(os.path.join(logdir, "c.cursor"), "rb").read() == b"checkpoint"
    log = PartitionLog(logdir)
    assert (log.start_offset, log.start_virtual, log.end_offset) == (7, 700, 7)
    log.close()
    assert read_all(LogReader(gone)) == [message(i) for i in range(10)]  # intact


def test_only_this_logs_set_aside_copies_are_its_own(tmp_path):
    """(A topic may be named like a set-aside log: "t-0.nsqlog.gone" is a topic
    whose partition 0 is "t-0.nsqlog.gone-0.nsqlog".)"""
    path = partition_dir(str(tmp_path), "t", 0)
    for name in ("t-0.nsqlog.gone12-34", "t-0.nsqlog.gone-0.nsqlog", "t-0.nsqlog.gone1-2x"):
        os.mkdir(tmp_path / name)
    assert set_aside_logs(path) == [str(tmp_path / "t-0.nsqlog.gone12-34")]


def test_a_prefix_copy_outside_the_log_is_refused(logdir, tmp_path):
    write(logdir, [message(i) for i in range(10)]).close()
    for keep in (0, 11):
        with pytest.raises(LogError, match="cannot keep below"):
            copy_prefix(logdir, str(tmp_path / f"cut{keep}"), keep)
        assert not os.path.exists(tmp_path / f"cut{keep}")


@pytest.mark.parametrize("topic,want", [
    (".", ".-0.nsqlog"), ("..", "..-0.nsqlog"), ("a" * 64, "a" * 64 + "-0.nsqlog"),
    ("t#ephemeral", "t#ephemeral-0.nsqlog"),
])
def test_names_map_to_one_safe_directory(tmp_path, topic, want):
    path = partition_dir(str(tmp_path), topic, 0)
    assert os.path.dirname(path) == str(tmp_path) and os.path.basename(path) == want
    log = PartitionLog(path)
    assert os.path.isdir(path) and os.path.dirname(os.path.realpath(path)) == str(tmp_path)
    log.close()


@pytest.mark.parametrize("topic,partition", [
    ("", 0), ("a" * 65, 0), ("a/b", 0), ("a b", 0), ("#ephemeral", 0), ("é", 0),
    ("../x", 0), ("t", -1), ("t", 1024),
])
def test_bad_names_are_refused(tmp_path, topic, partition):
    with pytest.raises(ValueError):
        partition_dir(str(tmp_path), topic, partition)


WRITER = textwrap.dedent("""
    import os, struct, sys
    from nsqshm._core.commitlog import PartitionLog
    path = sys.argv[1]
    log = PartitionLog(path, segment_bytes=1 << 16, sync_every=1 << 40, sync_timeout=-1)
    i = log.end_offset
    out = os.fdopen(1, "w", buffering=1)
    while True:
        msgs = []
        for k in range(i, i + 50):
            m = struct.pack(">QH", k, 0) + f"{k:016x}".encode() + str(k).encode() * 20
            msgs.append(struct.pack("=I", len(m)) + m)
        n, first, _ = log.append_packed(b"".join(msgs))
        i += n
        out.write(f"{i}\\n")
""")


def _check_sequence(reader):
    buf = bytearray(1 << 20)
    off, count = reader.start_offset, 0
    while True:
        n, nbytes, off2 = reader.read_into(off, buf, verify=True)
        if not n:
            return count
        for m in unpack(buf, nbytes):
            ts, = struct.unpack_from(">Q", m)
            assert m == struct.pack(">QH", ts, 0) + f"{ts:016x}".encode() + str(ts).encode() * 20
            assert ts == off
            off += 1
            count += 1
        assert off == off2


def test_writer_killed_mid_append_loses_nothing_committed(logdir):
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, logdir], stdout=subprocess.PIPE,
                                text=True)
        acked = 0
        deadline = time.monotonic() + random.uniform(0.2, 0.5)
        while time.monotonic() < deadline:
            acked = int(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        log = PartitionLog(logdir, segment_bytes=1 << 16)
        assert log.end_offset >= acked
        assert _check_sequence(log.reader) == log.end_offset
        log.close()


READER = textwrap.dedent("""
    import sys
    from nsqshm._core.commitlog import LogReader
    r = LogReader(sys.argv[1])
    buf = bytearray(1 << 20)
    print(r.end_offset, r.read_into(0, buf)[0], r.virtual_end)
""")


def test_a_reader_in_another_process_sees_only_committed_records(logdir):
    msgs = [message(i) for i in range(10)]
    log = write(logdir, msgs)
    seg = os.path.join(logdir, segment_name(0))
    end = os.path.getsize(seg)
    # bytes of a valid record in the file but not committed (a pwrite before its commit)
    rec = message(10)
    body = struct.pack(">Q", 10) + rec
    with open(seg, "ab") as f:
        f.write(struct.pack(">II", len(body), crc32c(body)) + body)
    out = subprocess.run([sys.executable, "-c", READER, logdir], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["10", "10", str(end)]
    os.truncate(seg, end)
    log.append_packed(packed([message(10)]))
    out = subprocess.run([sys.executable, "-c", READER, logdir], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[:2] == ["11", "11"]
    log.close()


def test_a_reader_tails_a_writer_in_another_process(logdir):
    PartitionLog(logdir).close()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, logdir], stdout=subprocess.PIPE,
                            text=True)
    try:
        reader = LogReader(logdir)
        buf = bytearray(1 << 16)
        off = 0
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline or off < 2000:
            n, nbytes, nxt = reader.read_into(off, buf, verify=True)
            for m in unpack(buf, nbytes):
                assert struct.unpack_from(">Q", m)[0] == off
                off += 1
            assert off == nxt
            assert time.monotonic() < deadline + 10
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("sync_every,sync_timeout,synced", [
    (1 << 40, -1, 0),       # no policy: nothing fsynced until sync()
    (100, -1, 100),         # every 100 messages
    (1 << 40, 0, 150),      # a timeout of 0: every append
])
def test_sync_policy(logdir, sync_every, sync_timeout, synced):
    log = PartitionLog(logdir, segment_bytes=8192, sync_every=sync_every,
                       sync_timeout=sync_timeout)
    reader = LogReader(logdir)
    for k in range(0, 150, 50):
        log.append_packed(packed([message(i) for i in range(k, k + 50)]))
    assert reader.synced_offset == synced
    log.sync()
    assert reader.synced_offset == 150 and not log.needs_sync
    log.close()


def test_append_stamps_position_ids_in_the_log(logdir):
    """A log topic's partition: each message's ID becomes (partition << 48) |
    offset in 16 hex digits, in the log and under its crc; the rest is as sent."""
    log = PartitionLog(logdir)
    msgs = [message(i + 100) for i in range(5)]
    log.append_packed(packed(msgs[:2]), 7)
    log.append_packed(packed(msgs[2:]), 7)
    got = read_all(LogReader(logdir))
    assert [m[10:26] for m in got] == [b"%016x" % ((7 << 48) | i) for i in range(5)]
    assert [m[:10] + m[26:] for m in got] == [m[:10] + m[26:] for m in msgs]
    raw = open(os.path.join(logdir, segment_name(0)), "rb").read()
    size, crc = struct.unpack_from(">II", raw, 0)
    assert crc == crc32c(raw[8:8 + size])
    with pytest.raises(ValueError):
        log.append_packed(packed(msgs), 1 << 16)
    log.close()


def _exported(cols):
    n, values, offsets, ids, ts, attempts = cols.export()[:6]
    return n, bytes(values), bytes(offsets), bytes(ids), bytes(ts), bytes(attempts)


def test_columns_take_messages_in_place_as_read_into_copies_them(logdir):
    """Columns.add_log (LogReader.records: each message where it lies in the
    mmap'd segment) builds the same columns as read_into then add_records,
    across segment boundaries, from any offset, up to max_records."""
    from nsqshm._core.localbatch import Columns

    msgs = [message(i, body_size=50 + i % 90) for i in range(700)]
    log = PartitionLog(logdir, segment_bytes=16384)
    for k in range(0, len(msgs), 50):
        log.append_packed(packed(msgs[k:k + 50]))
    reader = LogReader(logdir)
    buf = bytearray(1 << 20)
    for start, limit in ((0, -1), (0, 700), (1, 333), (137, 1), (699, 10), (250, 5000)):
        direct = Columns()
        n, nxt = direct.add_log(reader, start, limit, True)
        copied = Columns()
        m, nbytes, after = reader.read_into(start, buf, limit)
        copied.add_records(buf, m, True)
        want = len(msgs) - start if limit < 0 else min(limit, len(msgs) - start)
        assert (n, nxt) == (m, after) == (want, start + want)
        assert _exported(direct) == _exported(copied)
    assert Columns().add_log(reader, 700, 10) == (0, 700)  # at the end: nothing
    with pytest.raises(OffsetOutOfRange):
        Columns().add_log(reader, 701, 10)
    reader.close()
    log.close()


def test_columns_from_the_log_stop_at_their_byte_budget(logdir):
    """add_log takes no more than max_bytes of messages (Arrow's offsets are
    32-bit; a task's memory is bounded), but always a first one however
    large, and the next call goes on from the message it left."""
    from nsqshm._core.localbatch import LOG_BATCH_BYTES, Columns

    msgs = [message(i, body_size=1000) for i in range(40)]
    size = len(msgs[0])
    log = write(logdir, msgs)
    reader = LogReader(logdir)
    offset, taken = 0, []
    while offset < len(msgs):
        cols = Columns()
        n, offset = cols.add_log(reader, offset, 1000, False, 10 * size + size // 2)
        taken.append(n)
        assert cols.export()[0] == n
    assert taken == [10, 10, 10, 10]
    cols = Columns()
    assert cols.add_log(reader, 5, 1000, False, 1) == (1, 6)  # one, past the budget
    assert bytes(cols.export()[1]) == msgs[5][26:]
    assert Columns().add_log(reader, 0, 1000) == (40, 40)  # the default: 16 MiB
    assert LOG_BATCH_BYTES == 16 << 20
    reader.close()
    log.close()


def test_columns_from_a_damaged_record_fail(logdir):
    from nsqshm._core.commitlog import LogCorruptError
    from nsqshm._core.localbatch import Columns

    log = write(logdir, [message(i) for i in range(10)])
    log.close()
    seg = os.path.join(logdir, segment_name(0))
    record = 16 + len(message(0))
    with open(seg, "r+b") as f:  # record 3's msg offset, as if it were another's
        f.seek(3 * record + 8)
        f.write(struct.pack(">Q", 99))
    reader = LogReader(logdir)
    cols = Columns()
    assert cols.add_log(reader, 0, 3) == (3, 3)
    with pytest.raises(LogCorruptError, match="record 3 at"):
        cols.add_log(reader, 3, 5)
    reader.close()
