"""Multi-process tests of the ring: exactly-once under load, and SIGKILL at
random moments."""

import mmap
import multiprocessing
import os
import random
import signal
import struct
import time
import zlib

import numpy as np

from nsqshm.ring import Ring

PRODUCERS = 4
CONSUMERS = 4
TOTAL = 1_000_000
BATCH = 256


def _packed_batch(producer, start, count):
    """Records of varying size: [u32 producer][u32 seq] + filler, packed."""
    parts = []
    for seq in range(start, start + count):
        rec = struct.pack("<II", producer, seq) + b"x" * (seq % 57)
        parts.append(struct.pack("=I", len(rec)) + rec)
    return b"".join(parts)


def _producer(name, producer, count):
    ring = Ring.attach(name)
    seq = 0
    while seq < count:
        n = min(BATCH, count - seq)
        packed = memoryview(_packed_batch(producer, seq, n))
        while packed:
            done, used = ring.push_packed_wait(packed, timeout=30)
            assert done, "producer starved for 30 s"
            packed = packed[used:]
        seq += n
    ring.close()


def _consumer(name, out_path):
    ring = Ring.attach(name)
    buf = bytearray(1 << 20)
    got = []
    while True:
        n, nbytes = ring.pop_many_into_wait(buf, timeout=60)
        assert n, "consumer starved for 60 s"
        pos = 0
        markers = 0
        for _ in range(n):
            size = struct.unpack_from("=I", buf, pos)[0]
            if size == 0:  # end-of-stream marker from the test, one per consumer
                markers += 1
            else:
                producer, seq = struct.unpack_from("<II", buf, pos + 4)
                assert buf[pos + 12:pos + 4 + size] == b"x" * (seq % 57)
                got.append(producer << 32 | seq)
            pos += 4 + size
        if markers:
            for _ in range(markers - 1):  # a batch took another consumer's marker
                ring.push(b"")
            break
    np.array(got, dtype=np.uint64).tofile(out_path)
    ring.close()


def test_four_producers_four_consumers_exactly_once(ring_name, tmp_path):
    ring = Ring.create(ring_name, capacity=1 << 18)  # small: full and wrap all the time
    ctx = multiprocessing.get_context("fork")
    consumers = [ctx.Process(target=_consumer, args=(ring_name, tmp_path / f"c{i}"))
                 for i in range(CONSUMERS)]
    producers = [ctx.Process(target=_producer, args=(ring_name, i, TOTAL // PRODUCERS))
                 for i in range(PRODUCERS)]
    for p in consumers + producers:
        p.start()
    for p in producers:
        p.join(300)
        assert p.exitcode == 0
    for _ in range(CONSUMERS):
        assert ring.push_wait(b"", timeout=30) == 0  # one end marker per consumer
    for p in consumers:
        p.join(300)
        assert p.exitcode == 0
    got = np.concatenate([np.fromfile(tmp_path / f"c{i}", dtype=np.uint64)
                          for i in range(CONSUMERS)])
    assert len(got) == TOTAL
    assert len(np.unique(got)) == TOTAL
    expected = np.array([p << 32 | s for p in range(PRODUCERS) for s in range(TOTAL // PRODUCERS)],
                        dtype=np.uint64)
    assert np.array_equal(np.sort(got), expected)
    s = ring.stats()
    assert s["push_records"] == s["pop_records"] >= TOTAL + CONSUMERS
    assert s["depth"] == 0 and s["used_bytes"] == 0
    ring.close()


# -- SIGKILL at random moments --------------------------------------------------------
#
# Producers stamp each record with (instance, seq, crc) and, after each push
# returns, write how many records are acknowledged into a shared ack array.
# Consumers pop straight into a zeroed log file they map, so even a consumer
# killed between its pop's commit and anything after it leaves its records
# in the log; a record half-copied when the consumer died fails its crc and
# marks the end of that log.  Afterwards every acknowledged record must be in
# a log or still in the ring.

LOG_SIZE = 32 << 20


def _record(instance, seq):
    body = struct.pack("<II", instance, seq) + bytes([seq & 0xFF]) * (seq % 40)
    return struct.pack("<I", zlib.crc32(body)) + body


def _kill_producer(name, instance, ack_path):
    ring = Ring.attach(name)
    fd = os.open(ack_path, os.O_RDWR)
    acks = mmap.mmap(fd, 0)
    seq = 0
    while True:
        n = random.randint(1, 64)
        recs = [_record(instance, s) for s in range(seq, seq + n)]
        pushed = ring.push_many(recs)
        if pushed < n and ring.push_wait(recs[pushed], timeout=0.05) == 0:
            pushed += 1  # full: waited for room for one more
        seq += pushed
        struct.pack_into("<Q", acks, 8 * instance, seq)


def _kill_consumer(name, log_path):
    ring = Ring.attach(name)
    fd = os.open(log_path, os.O_RDWR)
    log = mmap.mmap(fd, 0)
    view = memoryview(log)
    pos = 0
    while pos + 8192 < LOG_SIZE:
        _, nbytes = ring.pop_many_into_wait(view[pos:], max_records=random.randint(1, 64),
                                             timeout=0.05)
        pos += nbytes


def _parse_log(data, found):
    pos = 0
    while pos + 4 <= len(data):
        size = struct.unpack_from("=I", data, pos)[0]
        if size == 0 or pos + 4 + size > len(data):
            break
        rec = data[pos + 4:pos + 4 + size]
        crc, instance, seq = struct.unpack_from("<III", rec)
        if zlib.crc32(rec[4:]) != crc:
            break  # a record half-copied when its consumer died: the log ends here
        found[(instance, seq)] = found.get((instance, seq), 0) + 1
        pos += 4 + size


def test_sigkill_producers_and_consumers_at_random(ring_name, tmp_path):
    # pushes of a producer killed before its ack are not acknowledged; every
    # acknowledged record must survive any number of kills
    rounds = 16
    rng = random.Random(1234)
    ring = Ring.create(ring_name, capacity=1 << 15, max_record=256)
    ack_path = tmp_path / "acks"
    ack_path.write_bytes(b"\0" * 8 * 2 * rounds)
    logs = []
    ctx = multiprocessing.get_context("fork")
    instance = 0
    kills = 0
    for r in range(rounds):
        procs = []
        for _ in range(2):
            procs.append(ctx.Process(target=_kill_producer, args=(ring_name, instance, ack_path)))
            instance += 1
        for c in range(2):
            log = tmp_path / f"log{r}.{c}"
            with open(log, "wb") as f:
                f.truncate(LOG_SIZE)
            logs.append(log)
            procs.append(ctx.Process(target=_kill_consumer, args=(ring_name, log)))
        for p in procs:
            p.start()
        time.sleep(0.15)
        for p in rng.sample(procs, len(procs)):  # all die, in random order, at random moments
            time.sleep(rng.uniform(0, 0.02))
            os.kill(p.pid, signal.SIGKILL)
            kills += 1
        for p in procs:
            p.join(10)
            assert p.exitcode == -signal.SIGKILL
    # the ring still works: drain what is left, then a fresh push/pop
    found = {}
    for log in logs:
        _parse_log(log.read_bytes(), found)
    drained = ring.pop_many(10**7)
    for rec in drained:
        crc, inst, seq = struct.unpack_from("<III", rec)
        assert zlib.crc32(rec[4:]) == crc, "a committed record was corrupt"
        found[(inst, seq)] = found.get((inst, seq), 0) + 1
    acks = struct.unpack(f"<{2 * rounds}Q", ack_path.read_bytes())
    missing = [(i, s) for i in range(instance) for s in range(acks[i]) if (i, s) not in found]
    duplicates = sum(v - 1 for v in found.values())
    print(f"kills={kills} acknowledged={sum(acks)} delivered={len(found)} "
          f"duplicates={duplicates} recoveries={ring.stats()['recoveries']}")
    assert sum(acks) > 1000, "the producers made too little progress to test anything"
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
    assert ring.push(b"after the storm") == 0
    assert ring.pop() == b"after the storm"
    s = ring.stats()
    assert s["depth"] == 0 and s["used_bytes"] == 0
    assert s["push_records"] == s["pop_records"]
    ring.close()
