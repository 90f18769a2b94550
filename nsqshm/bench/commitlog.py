"""The commit log of a log topic's partition against raw file I/O, in one run.

    nsqshm bench commitlog [--append N] [--read N] [--runs 5] [--dir PATH]
    python -m nsqshm.bench.commitlog (the same, printed)

Append: N messages of 200-byte bodies (nsqd's encoding, 226 bytes) through
PartitionLog.append_packed in batches of 200 messages and of 1 MiB, against
os.write of the same packed bytes to one file in the same batch sizes.  No
fsync on either side (sync_every and sync_timeout off): both measure the
page cache, as the broker's default --sync-every does between syncs.

Read (issue 15's replay): a log of --read messages (10 M by default, in 100
MiB segments) read
from the earliest offset with LogReader.read_into into a 1 MiB buffer (a
fresh reader per run, as a new consumer: its mappings are made on the
way), against a sequential readinto of the same segment files into a
1 MiB buffer.  Both from the page cache.  Medians of --runs.

Cut (issue 17: a replica's log cut where it diverged, ReplicaHost.truncate_log):
a log of one --cut-mb segment cut at 90 % by commitlog.prepare_cut on the gevent
hub's threadpool, as a worker does it, while a greenlet sleeps 1 ms at a time:
how late its wake-ups come (p99, max) is how long the worker's loop could not
run, against the same greenlet while the pool only sleeps.
"""

import argparse
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time

import gevent

from nsqshm._core.commitlog import LogReader, PartitionLog, partition_dir, prepare_cut

TITLE = "The commit log against raw file I/O: append, and replay from the earliest (issue 15)"
ISSUE = "15"
HELP = "a log partition's append and replay against os.write and a sequential read (issue 15)"
SERVER = False  # files in a temp dir, no broker
BODY = 200
TARGET_READ_RATIO = 0.6   # issue 15: replay at >= 60 % of a raw sequential read


def add_arguments(ap):
    ap.add_argument("--append", type=int, default=500_000, help="messages per append run")
    ap.add_argument("--read", type=int, default=10_000_000,
                    help="messages in the log replayed (issue 15: 10 M)")
    ap.add_argument("--cut-mb", type=int, default=256,
                    help="the segment a cut copies and recovers (0: no cut measured)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")


def packed_batch(count, first=0):
    """`count` packed ring records [u32 native size][message]."""
    out = []
    ts = time.time_ns()
    for i in range(first, first + count):
        m = struct.pack(">QH", ts + i, 0) + f"{i:016x}".encode() + b"b" * BODY
        out.append(struct.pack("=I", len(m)) + m)
    return b"".join(out)


def batches_for(n, batch_bytes):
    """A batch of about batch_bytes (whole records) and how many to append for n messages."""
    per = max(1, batch_bytes // (4 + 26 + BODY))
    return packed_batch(per), per, max(1, n // per)


def time_append(root, batch, calls):
    path = partition_dir(root, "bench", 0)
    log = PartitionLog(path, sync_every=1 << 62, sync_timeout=-1)
    t0 = time.perf_counter()
    for _ in range(calls):
        log.append_packed(batch)
    t = time.perf_counter() - t0
    log.close()
    shutil.rmtree(path)
    return t


def time_raw_write(root, batch, calls):
    path = os.path.join(root, "raw.dat")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    t0 = time.perf_counter()
    for _ in range(calls):
        os.write(fd, batch)
    t = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    return t


def time_read(path):
    reader = LogReader(path)
    buf = bytearray(1 << 20)
    off, total = reader.start_offset, 0
    t0 = time.perf_counter()
    while True:
        n, _, off = reader.read_into(off, buf)
        if not n:
            break
        total += n
    t = time.perf_counter() - t0
    reader.close()
    return t, total


def time_raw_read(files):
    buf = bytearray(1 << 20)
    total = 0
    t0 = time.perf_counter()
    for name in files:
        with open(name, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                total += n
    return time.perf_counter() - t0, total


def loop_lateness(work, tick=0.001):
    """Run work() on the hub's threadpool while a greenlet sleeps `tick` at a
    time: (seconds work took, p99 and max lateness of the wake-ups in ms)."""
    late = []
    running = [True]

    def ticker():
        while running[0]:
            t = time.perf_counter()
            gevent.sleep(tick)
            late.append(time.perf_counter() - t - tick)

    g = gevent.spawn(ticker)
    gevent.sleep(0)
    t0 = time.perf_counter()
    gevent.get_hub().threadpool.apply(work)
    took = time.perf_counter() - t0
    running[0] = False
    g.join()
    late.sort()
    return took, late[int(len(late) * 0.99)] * 1e3, late[-1] * 1e3


def measure_cut(root, mb, runs, settle, say):
    """A cut at 90 % of a log of one `mb` MiB segment, on the hub's pool."""
    path = partition_dir(root, "cut", 0)
    log = PartitionLog(path, sync_every=1 << 62, sync_timeout=-1, segment_bytes=(mb + 16) << 20)
    batch, per, calls = batches_for((mb << 20) // (4 + 26 + BODY), 1 << 20)
    for k in range(calls):
        log.append_packed(batch if k else packed_batch(per))
    settings = {"segment_bytes": log.segment_bytes, "max_msg_size": log.max_msg_size,
                "sync_every": log.sync_every, "sync_timeout": log.sync_timeout}
    end = log.end_offset
    keep = end * 9 // 10
    log.close()

    def cut():
        shutil.rmtree(prepare_cut(path, keep, **settings))

    settle()
    idle = [loop_lateness(lambda: time.sleep(0.3)) for _ in range(runs)]
    cuts = [loop_lateness(cut) for _ in range(runs)]
    shutil.rmtree(path)
    res = {"segment_mb": mb, "messages": end, "keep": keep,
           "cut_s": statistics.median(c[0] for c in cuts),
           "cut_p99_ms": statistics.median(c[1] for c in cuts),
           "cut_max_ms": statistics.median(c[2] for c in cuts),
           "idle_p99_ms": statistics.median(c[1] for c in idle),
           "idle_max_ms": statistics.median(c[2] for c in idle)}
    say(f"cut of a {mb} MiB segment at 90 % on the hub's pool: {res['cut_s']:.2f} s; the "
        f"loop's lateness p99 {res['cut_p99_ms']:.2f} ms, max {res['cut_max_ms']:.2f} ms "
        f"(idle: {res['idle_p99_ms']:.2f} / {res['idle_max_ms']:.2f} ms)")
    return res


def measure(args, runs, settle=lambda: None, say=print):
    """Append in two batch sizes, then the replay; each against raw I/O."""
    root = tempfile.mkdtemp(prefix="nsqshm-bench-log-", dir=args.dir)
    res = {"params": {"body": BODY, "append": args.append, "read": args.read, "runs": runs},
           "append": []}
    try:
        for label, nbytes in (("200 msgs", 200 * (4 + 26 + BODY)), ("1 MiB", 1 << 20)):
            batch, per, calls = batches_for(args.append, nbytes)
            n = per * calls
            settle()
            log_t = statistics.median(time_append(root, batch, calls) for _ in range(runs))
            raw_t = statistics.median(time_raw_write(root, batch, calls) for _ in range(runs))
            row = {"batch": label, "messages": n, "log_msgs_per_s": n / log_t,
                   "log_MB_per_s": n * len(batch) / per / log_t / 1e6,
                   "raw_msgs_per_s": n / raw_t, "ratio": raw_t / log_t}
            res["append"].append(row)
            say(f"append, batches of {label:>8}: log {row['log_msgs_per_s'] / 1e6:6.2f} M msg/s "
                f"({row['log_MB_per_s']:6.0f} MB/s in), raw write "
                f"{row['raw_msgs_per_s'] / 1e6:6.2f} M msg/s: ratio {row['ratio']:.2f}")
        # the log to replay
        path = partition_dir(root, "read", 0)
        log = PartitionLog(path, sync_every=1 << 62, sync_timeout=-1)
        batch, per, calls = batches_for(args.read, 1 << 20)
        for k in range(calls):
            log.append_packed(packed_batch(per, k * per) if k < 2 else batch)
        n = log.end_offset
        log.close()
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".log"))
        size = sum(os.path.getsize(f) for f in files)
        settle()
        time_raw_read(files)  # both read from the page cache
        reads = [time_read(path) for _ in range(runs)]
        assert all(total == n for _, total in reads)
        log_t = statistics.median(t for t, _ in reads)
        raw_t = statistics.median(time_raw_read(files)[0] for _ in range(runs))
        res["read"] = {"messages": n, "bytes": size, "segments": len(files),
                       "log_msgs_per_s": n / log_t, "log_GB_per_s": size / log_t / 1e9,
                       "raw_GB_per_s": size / raw_t / 1e9, "ratio": raw_t / log_t}
        r = res["read"]
        say(f"read {n} msgs ({size / 1e6:.0f} MB, {len(files)} segments) from the earliest: "
            f"log {r['log_msgs_per_s'] / 1e6:6.2f} M msg/s ({r['log_GB_per_s']:5.2f} GB/s), "
            f"raw read {r['raw_GB_per_s']:5.2f} GB/s: ratio {r['ratio']:.2f}")
        shutil.rmtree(path)
        if getattr(args, "cut_mb", 0):
            res["cut"] = measure_cut(root, args.cut_mb, runs, settle, say)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return res


def run(ctx):
    a = ctx.args
    if ctx.quick:
        a.append, a.read = min(a.append, 100_000), min(a.read, 500_000)
        a.cut_mb = min(a.cut_mb, 32)
    return measure(a, ctx.runs(default=5), ctx.settle, ctx.say)


def render(res):
    p, r = res["params"], res["read"]
    out = [f"{p['body']}-byte bodies (nsqd's encoding, {p['body'] + 26} bytes); no fsync on "
           "either side (the page cache, as the broker's default --sync-every between syncs); "
           f"medians of {p['runs']} runs.", "",
           "| | log | raw file I/O | log / raw |", "|---|---:|---:|---:|"]
    for row in res["append"]:
        out.append(f"| append, batches of {row['batch']} | {row['log_msgs_per_s'] / 1e6:.2f} M "
                   f"msg/s ({row['log_MB_per_s']:,.0f} MB/s in) | "
                   f"{row['raw_msgs_per_s'] / 1e6:.2f} M msg/s | {row['ratio']:.2f} |")
    out.append(f"| replay {r['messages']:,} messages ({r['bytes'] / 1e6:,.0f} MB, "
               f"{r['segments']} segments) from the earliest offset | "
               f"{r['log_msgs_per_s'] / 1e6:.2f} M msg/s ({r['log_GB_per_s']:.2f} GB/s) | "
               f"{r['raw_GB_per_s']:.2f} GB/s | {r['ratio']:.2f} |")
    out += ["", "Append MB/s counts the bytes handed in (the packed messages, 4 + "
                f"{p['body'] + 26} bytes each), not the 16 more per record the log writes "
                "(size, CRC, offset).",
            "", "Replay: LogReader.read_into (whole records into a 1 MiB buffer, a fresh reader "
                "per run, its mappings made on the way) against a sequential readinto of the "
                "same segment files into a 1 MiB buffer; both from the page cache."]
    c = res.get("cut")
    if c:
        out += ["", "**A cut on the hub's pool (issue 17).** A log of one segment of "
                    f"{c['segment_mb']} MiB ({c['messages']:,} messages) cut at msg offset "
                    f"{c['keep']:,} (90 %) by `prepare_cut` on the gevent hub's threadpool, as "
                    "ReplicaHost.truncate_log does it, while a greenlet sleeps 1 ms at a time; "
                    "its wake-ups' lateness is how long the worker's loop could not run.", "",
                "| | takes | loop lateness p99 | max |", "|---|---:|---:|---:|",
                f"| pool idle (sleeps 0.3 s) | | {c['idle_p99_ms']:.2f} ms | "
                f"{c['idle_max_ms']:.2f} ms |",
                f"| cut | {c['cut_s']:.2f} s | {c['cut_p99_ms']:.2f} ms | "
                f"{c['cut_max_ms']:.2f} ms |"]
    return out


def targets(res):
    r = res["read"]
    return [("15", f"replay of {r['messages'] / 1e6:.0f} M messages from the earliest, of a "
                   "raw sequential read", f">= {TARGET_READ_RATIO}", f"{r['ratio']:.2f}",
             r["ratio"] >= TARGET_READ_RATIO)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    if not args.json:  # (stdout is the JSON document alone)
        print(f"commit log vs raw file I/O: {BODY}-byte bodies, medians of {args.runs} runs")
    res = measure(args, args.runs, say=(lambda _: None) if args.json else print)
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
