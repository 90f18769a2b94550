"""Disk spill: the disk queue's write and read rates against a raw
sequential write and read of the same bytes, in the same run.

    nsqshm bench disk [--messages N] [--size 200] [--batch-size 1000] [--dir PATH]

Writes N messages (NSQ encoding, `size`-byte bodies) through
DiskQueue.put_packed in batches, then reads them back with
peek_into(big_endian=True) and advance, as the broker refills a ring from
disk (fully read segments deleted on a worker thread at nice 19, as the
broker does),
each phase ending in a sync (fsync + metadata); the
baseline writes the same bytes (the same [4-byte size][message] records)
to one file with os.write in 1 MiB chunks and fsync, then reads it back
with os.readv into a buffer.  Both read from the page cache, as the
broker would right after a spill.  Medians of --runs.
"""

import concurrent.futures
import os
import shutil
import struct
import tempfile
import time

from nsqshm._core.diskqueue import DiskQueue
from nsqshm.nsqd.backend import lower_priority

from .common import medians

TITLE, ISSUE = "Disk spill (issue 5)", "5"
HELP = "disk queue write and read (spill) vs raw file write and read (issue 5)"
TARGET_RATIO = 0.6  # issue 5: at least 60 % of raw


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


def add_arguments(ap):
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch-size", "--batch", dest="batch", type=int, default=1000,
                    help="messages per put_packed")
    ap.add_argument("--max-bytes-per-file", type=int, default=100 * 1024 * 1024)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")


def run(ctx):
    a = ctx.args
    if ctx.quick:
        a.messages = min(a.messages, 100_000)
    packed = records(a.messages, a.size)
    record = 4 + 26 + a.size
    mb = len(packed) / 1e6
    rows = []
    with ctx.progress.task("disk", ctx.runs()) as advance:
        for i in range(ctx.runs()):
            ctx.settle()
            base = tempfile.mkdtemp(prefix="nsqshm-bench-disk-", dir=a.dir)
            try:
                # at nice 19, as the broker's remover (backend.remove_later)
                with concurrent.futures.ThreadPoolExecutor(1, initializer=lower_priority) \
                        as remover:
                    qw, qr = run_queue(base, packed, a.batch * record, a.messages, a.size,
                                       a.max_bytes_per_file, remover)
                rw, rr = run_raw(base, packed, 1 << 20)
            finally:
                shutil.rmtree(base)
            n = a.messages
            row = {"queue_write_msgs_per_s": n / qw, "queue_read_msgs_per_s": n / qr,
                   "raw_write_msgs_per_s": n / rw, "raw_read_msgs_per_s": n / rr,
                   "queue_write_MB_per_s": mb / qw, "queue_read_MB_per_s": mb / qr,
                   "raw_write_MB_per_s": mb / rw, "raw_read_MB_per_s": mb / rr,
                   "write_ratio": rw / qw, "read_ratio": rr / qr}
            rows.append(row)
            ctx.say(f"run {i + 1}: write {row['queue_write_MB_per_s']:7.0f} MB/s "
                    f"({row['queue_write_msgs_per_s'] / 1e6:5.2f} M msg/s) vs raw "
                    f"{row['raw_write_MB_per_s']:7.0f} MB/s = {row['write_ratio']:.2f}; "
                    f"read {row['queue_read_MB_per_s']:7.0f} MB/s "
                    f"({row['queue_read_msgs_per_s'] / 1e6:5.2f} M msg/s) vs raw "
                    f"{row['raw_read_MB_per_s']:7.0f} MB/s = {row['read_ratio']:.2f}")
            advance()
    median = medians(rows)
    ctx.say("median: " + ", ".join(f"{k}={v:.2f}" for k, v in median.items()))
    return {"params": {"messages": a.messages, "size": a.size, "batch": a.batch,
                       "max_bytes_per_file": a.max_bytes_per_file, "dir": a.dir or "(temp dir)"},
            "runs": rows, "median": median}


def render(res):
    p, runs, m = res["params"], res["runs"], res["median"]
    out = [f"{p['messages']:,} messages of {p['size']} B ({p['size'] + 30} bytes on disk each), "
           f"written through DiskQueue.put_packed in batches of {p['batch']}, then read back as "
           "the broker refills a ring; each phase ends in a sync. Baseline in the same run: the "
           "same bytes with os.write in 1 MiB chunks + fsync, read back with readv. "
           f"Segments of {p['max_bytes_per_file'] >> 20} MiB.", "",
           "| | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | **median** |",
           "|---|" + "---:|" * (len(runs) + 1)]
    for key, name, fmt in (
            ("queue_write_MB_per_s", "disk queue write, MB/s", "{:,.0f}"),
            ("queue_write_msgs_per_s", "disk queue write, M msg/s", None),
            ("raw_write_MB_per_s", "raw write + fsync, MB/s", "{:,.0f}"),
            ("write_ratio", "write ratio", "{:.2f}"),
            ("queue_read_MB_per_s", "disk queue read, MB/s", "{:,.0f}"),
            ("queue_read_msgs_per_s", "disk queue read, M msg/s", None),
            ("raw_read_MB_per_s", "raw read (page cache), MB/s", "{:,.0f}"),
            ("read_ratio", "read ratio", "{:.2f}")):
        f = (lambda v: f"{v / 1e6:.2f}") if fmt is None else fmt.format
        out.append(f"| {name} | " + " | ".join(f(r[key]) for r in runs) + f" | **{f(m[key])}** |")
    return out


def targets(res):
    m = res["median"]
    return [("5", f"disk spill {way}, of raw {way}", ">= 0.60", f"{m[f'{way}_ratio']:.3f}",
             m[f"{way}_ratio"] >= TARGET_RATIO) for way in ("write", "read")]
