"""Disk spill: the disk queue's write and read rates against a raw
sequential write and read of the same bytes, in the same run.

    nsqshm bench disk [--messages N] [--size 200] [--batch-size N] [--small-batch 1000]

Writes N messages (NSQ encoding, `size`-byte bodies) through
DiskQueue.put_packed in batches, then reads them back with
peek_into(big_endian=True) and advance, as the broker refills a ring from
disk (fully read segments deleted on a worker thread at nice 19, as the
broker does), each phase ending in a sync; the baseline writes the same
bytes (the same [4-byte size][message] records) to one file with os.write
in 1 MiB chunks and fsync, then reads it back with os.readv into a 1 MiB
buffer.  Both read from the page cache, as the broker would right after a
spill.  Medians of --runs.

Batches.  The broker spills what its topic and channel pumps hold, up to
its 1 MiB scratch buffer per put_packed, so the main figures (and the
target) use batches of 1 MiB (--batch-size defaults to as many messages).
A second pass writes batches of --small-batch messages, with a second raw
baseline written in those same chunks: since Linux 6.x ext4 caches a file
in folios as large as the writes that made it, and reading 4-32 KiB folios
back costs about a third more than 1 MiB ones, whoever writes the bytes.
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


def run_raw(path, packed, chunk, read_chunk=1 << 20):
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
    buf = bytearray(read_chunk)
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
    ap.add_argument("--batch-size", "--batch", dest="batch", type=int, default=None,
                    help="messages per put_packed (default: 1 MiB of them, the broker's "
                         "spill buffer)")
    ap.add_argument("--small-batch", type=int, default=1000,
                    help="messages per put_packed in the second pass (0: none)")
    ap.add_argument("--max-bytes-per-file", type=int, default=100 * 1024 * 1024)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")


def one_run(a, packed, record, batch, raw_chunk):
    """(queue write s, queue read s, raw write s, raw read s) of one pass."""
    base = tempfile.mkdtemp(prefix="nsqshm-bench-disk-", dir=a.dir)
    try:
        # at nice 19, as the broker's remover (backend.remove_later)
        with concurrent.futures.ThreadPoolExecutor(1, initializer=lower_priority) as remover:
            qw, qr = run_queue(base, packed, batch * record, a.messages, a.size,
                               a.max_bytes_per_file, remover)
        rw, rr = run_raw(base, packed, raw_chunk)
    finally:
        shutil.rmtree(base)
    return qw, qr, rw, rr


def run(ctx):
    a = ctx.args
    if ctx.quick:
        a.messages = min(a.messages, 100_000)
    packed = records(a.messages, a.size)
    record = 4 + 26 + a.size
    a.batch = a.batch or max(1, (1 << 20) // record)
    mb = len(packed) / 1e6
    n = a.messages
    rows = []
    with ctx.progress.task("disk", ctx.runs()) as advance:
        for i in range(ctx.runs()):
            ctx.settle()
            qw, qr, rw, rr = one_run(a, packed, record, a.batch, 1 << 20)
            row = {"queue_write_msgs_per_s": n / qw, "queue_read_msgs_per_s": n / qr,
                   "raw_write_msgs_per_s": n / rw, "raw_read_msgs_per_s": n / rr,
                   "queue_write_MB_per_s": mb / qw, "queue_read_MB_per_s": mb / qr,
                   "raw_write_MB_per_s": mb / rw, "raw_read_MB_per_s": mb / rr,
                   "write_ratio": rw / qw, "read_ratio": rr / qr}
            if a.small_batch:
                # small batches; raw written in 1 MiB chunks and in the same small ones
                sw, sr, _, _ = one_run(a, packed, record, a.small_batch, 1 << 20)
                _, _, cw, cr = one_run(a, packed, record, a.small_batch,
                                       a.small_batch * record)
                row.update({"small_queue_write_MB_per_s": mb / sw,
                            "small_queue_read_MB_per_s": mb / sr,
                            "small_raw_write_MB_per_s": mb / cw,
                            "small_raw_read_MB_per_s": mb / cr,
                            "small_write_ratio": rw / sw, "small_read_ratio": rr / sr,
                            "small_write_ratio_same_chunks": cw / sw,
                            "small_read_ratio_same_chunks": cr / sr})
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
                       "small_batch": a.small_batch,
                       "max_bytes_per_file": a.max_bytes_per_file, "dir": a.dir or "(temp dir)"},
            "runs": rows, "median": median}


def render(res):
    p, runs, m = res["params"], res["runs"], res["median"]
    out = [f"{p['messages']:,} messages of {p['size']} B ({p['size'] + 30} bytes on disk each), "
           f"written through DiskQueue.put_packed in batches of {p['batch']:,} (1 MiB, the "
           "broker's spill buffer), then read back as the broker refills a ring; each phase "
           "ends in a sync. Baseline in the same run: the same bytes with os.write in 1 MiB "
           "chunks + fsync, read back with readv. "
           f"Segments of {p['max_bytes_per_file'] >> 20} MiB.", ""]
    rows = [("queue_write_MB_per_s", "disk queue write, MB/s", "{:,.0f}"),
            ("queue_write_msgs_per_s", "disk queue write, M msg/s", None),
            ("raw_write_MB_per_s", "raw write + fsync, MB/s", "{:,.0f}"),
            ("write_ratio", "write ratio", "{:.2f}"),
            ("queue_read_MB_per_s", "disk queue read, MB/s", "{:,.0f}"),
            ("queue_read_msgs_per_s", "disk queue read, M msg/s", None),
            ("raw_read_MB_per_s", "raw read (page cache), MB/s", "{:,.0f}"),
            ("read_ratio", "read ratio", "{:.2f}")]
    out += _table(runs, m, rows)
    if p.get("small_batch") and "small_read_ratio" in m:
        out += ["", f"Batches of {p['small_batch']:,} messages, against the same raw baseline "
                "(1 MiB chunks) and against a raw file written in the same small chunks "
                "(the page cache's folios are as large as the writes; see the notes):", ""]
        out += _table(runs, m, [
            ("small_queue_write_MB_per_s", "disk queue write, MB/s", "{:,.0f}"),
            ("small_write_ratio", "write ratio (raw in 1 MiB chunks)", "{:.2f}"),
            ("small_raw_write_MB_per_s", "raw write in the same chunks, MB/s", "{:,.0f}"),
            ("small_write_ratio_same_chunks", "write ratio (raw in the same chunks)", "{:.2f}"),
            ("small_queue_read_MB_per_s", "disk queue read, MB/s", "{:,.0f}"),
            ("small_read_ratio", "read ratio (raw in 1 MiB chunks)", "{:.2f}"),
            ("small_raw_read_MB_per_s", "raw read of the file written in the same chunks, MB/s",
             "{:,.0f}"),
            ("small_read_ratio_same_chunks", "read ratio (raw in the same chunks)", "{:.2f}")])
    return out


def _table(runs, m, rows):
    out = ["| | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " | **median** |",
           "|---|" + "---:|" * (len(runs) + 1)]
    for key, name, fmt in rows:
        f = (lambda v: f"{v / 1e6:.2f}") if fmt is None else fmt.format
        out.append(f"| {name} | " + " | ".join(f(r[key]) for r in runs) + f" | **{f(m[key])}** |")
    return out


def targets(res):
    m = res["median"]
    return [("5", f"disk spill {way}, of raw {way}", ">= 0.60", f"{m[f'{way}_ratio']:.3f}",
             m[f"{way}_ratio"] >= TARGET_RATIO) for way in ("write", "read")]
