"""Disk spill: the disk queue's write and read rates against a raw
sequential write and read of the same bytes, in the same run.

    python -m bench.disk [--messages N] [--size 200] [--batch 1000] [--dir PATH]

Writes N messages (NSQ encoding, `size`-byte bodies) through
DiskQueue.put_packed in batches, then reads them back with
peek_into(big_endian=True) and advance, as the broker refills a ring from
disk (fully read segments deleted on a worker thread, as the broker does),
each phase ending in a sync (fsync + metadata); the
baseline writes the same bytes (the same [4-byte size][message] records)
to one file with os.write in 1 MiB chunks and fsync, then reads it back
with os.readv into a buffer.  Both read from the page cache, as the
broker would right after a spill.  Medians of --runs.
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import statistics
import struct
import tempfile
import time

from nsqshm._core.diskqueue import DiskQueue


def records(n, size):
    body = b"b" * size
    one = [struct.pack("=I", 26 + size) + struct.pack(">QH", time.time_ns(), 0)
           + f"{i:016x}".encode() + body for i in range(n)]
    return b"".join(one)


def run_queue(path, packed, batch_bytes, n, size, max_bytes, remover):
    # read segments are deleted on another thread, as the broker does (backend.remove_later)
    dq = DiskQueue("bench", path, max_bytes, 26, 26 + size, 1 << 62,
                   remove=lambda p: remover.submit(os.unlink, p))
    view = memoryview(packed)
    t0 = time.perf_counter()
    pos = 0
    while pos < len(view):
        _, used = dq.put_packed(view[pos:pos + batch_bytes])
        pos += used
    dq.sync()
    t1 = time.perf_counter()
    buf = bytearray(1 << 20)  # the broker's scratch size, and the baseline's read chunk
    got = 0
    while True:
        # as the broker reads a spill back into a ring: the segment bytes, one copy
        k, _ = dq.peek_into(buf, -1, big_endian=True)
        if not k:
            break
        dq.advance(k)
        got += k
    dq.sync()
    t2 = time.perf_counter()
    assert got == n, (got, n)
    dq.close()
    return t1 - t0, t2 - t1


def run_raw(path, packed, chunk):
    name = os.path.join(path, "raw.dat")
    view = memoryview(packed)
    t0 = time.perf_counter()
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for pos in range(0, len(view), chunk):
        os.write(fd, view[pos:pos + chunk])
    os.fsync(fd)
    os.close(fd)
    t1 = time.perf_counter()
    fd = os.open(name, os.O_RDONLY)
    buf = bytearray(chunk)
    total = 0
    while True:
        k = os.readv(fd, [buf])
        if not k:
            break
        total += k
    os.close(fd)
    t2 = time.perf_counter()
    assert total == len(packed)
    os.unlink(name)
    return t1 - t0, t2 - t1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1000, help="messages per put_packed")
    ap.add_argument("--max-bytes-per-file", type=int, default=100 * 1024 * 1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    packed = records(args.messages, args.size)
    record = 4 + 26 + args.size
    mb = len(packed) / 1e6
    rows = []
    for i in range(args.runs):
        base = tempfile.mkdtemp(prefix="nsqshm-bench-disk-", dir=args.dir)
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as remover:
                qw, qr = run_queue(base, packed, args.batch * record, args.messages, args.size,
                                   args.max_bytes_per_file, remover)
            rw, rr = run_raw(base, packed, 1 << 20)
        finally:
            shutil.rmtree(base)
        row = {"queue_write_msgs_per_s": args.messages / qw, "queue_read_msgs_per_s": args.messages / qr,
               "raw_write_msgs_per_s": args.messages / rw, "raw_read_msgs_per_s": args.messages / rr,
               "queue_write_MB_per_s": mb / qw, "queue_read_MB_per_s": mb / qr,
               "raw_write_MB_per_s": mb / rw, "raw_read_MB_per_s": mb / rr}
        row["write_ratio"] = rw / qw
        row["read_ratio"] = rr / qr
        rows.append(row)
        print(f"run {i + 1}: write {row['queue_write_MB_per_s']:7.0f} MB/s "
              f"({row['queue_write_msgs_per_s'] / 1e6:5.2f} M msg/s) vs raw "
              f"{row['raw_write_MB_per_s']:7.0f} MB/s = {row['write_ratio']:.2f}; "
              f"read {row['queue_read_MB_per_s']:7.0f} MB/s "
              f"({row['queue_read_msgs_per_s'] / 1e6:5.2f} M msg/s) vs raw "
              f"{row['raw_read_MB_per_s']:7.0f} MB/s = {row['read_ratio']:.2f}", flush=True)
    median = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print("median: " + ", ".join(f"{k}={v:.2f}" for k, v in median.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": rows, "median": median}, f, indent=2)
    return median


if __name__ == "__main__":
    main()
