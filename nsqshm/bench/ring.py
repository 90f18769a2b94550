"""Ring throughput and wake-up latency across processes, against
multiprocessing.Queue and faster-fifo run in the same program.

    nsqshm bench ring [--quick] [--seconds S] [--windows N] [--only throughput|latency]

Throughput: producers push until told to stop; the parent samples how many
records the consumers have taken over a measurement window after a warm-up.
"single" pushes and pops one record per call; "batched" moves a batch per
call (the ring: push_packed / pop_many_into, one lock round per batch; both
queues: one pickled list per put and per get, like for like: faster-fifo's
put_many/get_many would pickle each record on its own).  Latency: a
consumer sleeps on an empty queue; the producer stamps CLOCK_MONOTONIC into a record and pushes it; the consumer reads the
clock when it runs again.  Medians of repeated windows are reported.
"""

import os
import queue as queue_mod
import statistics
import struct
import time
import uuid

from nsqshm.ring import Ring

from .common import CTX, stop_all

TITLE, ISSUE = "Ring (issue 2)", "2"
HELP = "shared-memory ring vs faster-fifo and multiprocessing.Queue (issue 2)"
SIZES = [100, 1024, 65536]
TOPOLOGIES = [(1, 1), (2, 2)]
RING_CAPACITY = 8 << 20
# how both queues move a batch (recorded in the results): one pickled list
QUEUE_BATCHED = "list"


def batch_for(size):
    return max(1, min(256, (256 << 10) // size))


# -- workers -------------------------------------------------------------------------

def ring_producer(name, size, batched, stop, ready):
    ring = Ring.attach(name)
    rec = b"p" * size
    n = batch_for(size)
    packed = memoryview((struct.pack("=I", size) + rec) * n)
    ready.wait()
    if batched:
        while not stop.is_set():
            view = packed
            while view:
                done, used = ring.push_packed_wait(view, timeout=0.1)
                if not done and stop.is_set():
                    return
                view = view[used:]
    else:
        push = ring.push
        while not stop.is_set():
            for _ in range(1000):
                if push(rec) and ring.push_wait(rec, timeout=0.1) and stop.is_set():
                    return


def ring_consumer(name, size, batched, stop, ready, counts, idx):
    ring = Ring.attach(name)
    buf = bytearray(max(4 << 20, 4 * (size + 4) * batch_for(size)))
    ready.wait()
    if batched:
        while not stop.is_set():
            n, _ = ring.pop_many_into_wait(buf, timeout=0.1)
            counts[idx] += n
    else:
        pop_into = ring.pop_into
        while not stop.is_set():
            got = 0
            for _ in range(1000):
                if pop_into(buf) < 0:
                    if ring.pop_wait(timeout=0.1) is None:
                        break
                got += 1
            counts[idx] += got


def queue_producer(q, size, batched, stop, ready):
    rec = b"p" * size
    n = batch_for(size)
    # distinct objects: pickle would otherwise send one repeated object once
    batch = [i.to_bytes(4, "little") + rec[4:] for i in range(n)]
    ready.wait()
    while not stop.is_set():
        try:
            if batched:  # one pickled list per put, for both queues
                q.put(batch, timeout=0.1)
            else:
                for _ in range(100):
                    q.put(rec, timeout=0.1)
        except (queue_mod.Full, Exception) as exc:
            if not isinstance(exc, queue_mod.Full) and type(exc).__name__ != "Full":
                raise


def queue_consumer(q, batched, stop, ready, counts, idx):
    ready.wait()
    while not stop.is_set():
        try:
            if batched:
                counts[idx] += len(q.get(timeout=0.1))
            else:
                q.get(timeout=0.1)
                counts[idx] += 1
        except queue_mod.Empty:
            pass
        except Exception as exc:
            if type(exc).__name__ != "Empty":
                raise


def make_queue(kind, size):
    if kind == "faster-fifo":
        from faster_fifo import Queue

        return Queue(max_size_bytes=RING_CAPACITY)
    return CTX.Queue(maxsize=max(8, RING_CAPACITY // max(size, 1) // 64))


# -- throughput ------------------------------------------------------------------------

def run_throughput(impl, size, producers, consumers, batched, seconds, windows):
    stop, ready = CTX.Event(), CTX.Event()
    counts = CTX.RawArray("Q", consumers)
    name = f"nsqshm-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    procs = []
    ring = None
    if impl == "nsqshm-ring":
        ring = Ring.create(name, RING_CAPACITY)
        for _ in range(producers):
            procs.append(CTX.Process(target=ring_producer, args=(name, size, batched, stop, ready)))
        for i in range(consumers):
            procs.append(CTX.Process(target=ring_consumer,
                                     args=(name, size, batched, stop, ready, counts, i)))
    else:
        q = make_queue(impl, size)
        for _ in range(producers):
            procs.append(CTX.Process(target=queue_producer,
                                     args=(q, size, batched, stop, ready)))
        for i in range(consumers):
            procs.append(CTX.Process(target=queue_consumer,
                                     args=(q, batched, stop, ready, counts, i)))
    for p in procs:
        p.start()
    time.sleep(0.3)
    ready.set()
    time.sleep(0.3)  # warm-up
    rates = []
    for _ in range(windows):
        c0, t0 = sum(counts), time.perf_counter()
        time.sleep(seconds)
        c1, t1 = sum(counts), time.perf_counter()
        rates.append((c1 - c0) / (t1 - t0))
    stop_all(procs, stop)
    if ring is not None:
        ring.close()
        Ring.unlink_segment(name)
    return statistics.median(rates)


# -- latency -------------------------------------------------------------------------

def ring_latency_consumer(name, n, out):
    ring = Ring.attach(name)
    lat = []
    for _ in range(n):
        rec = ring.pop_wait(timeout=5)
        now = time.monotonic_ns()
        if rec is None:
            break
        lat.append(now - struct.unpack("<Q", rec[:8])[0])
    out.put(lat)


def queue_latency_consumer(q, n, out):
    lat = []
    for _ in range(n):
        rec = q.get(timeout=5)
        lat.append(time.monotonic_ns() - struct.unpack("<Q", rec[:8])[0])
    out.put(lat)


def run_latency(impl, n, gap):
    out = CTX.Queue()
    name = f"nsqshm-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if impl == "nsqshm-ring":
        ring = Ring.create(name, 1 << 20)
        p = CTX.Process(target=ring_latency_consumer, args=(name, n, out))
        push = ring.push
    else:
        q = make_queue(impl, 100)
        p = CTX.Process(target=queue_latency_consumer, args=(q, n, out))
        push = q.put
    p.start()
    time.sleep(0.5)
    pad = b"l" * 92
    for _ in range(n):
        time.sleep(gap)  # the consumer is asleep again by now
        push(struct.pack("<Q", time.monotonic_ns()) + pad)
    lat = out.get(timeout=30)
    p.join(5)
    if impl == "nsqshm-ring":
        ring.close()
        Ring.unlink_segment(name)
    lat.sort()
    return {"p50_us": lat[len(lat) // 2] / 1000, "p99_us": lat[int(len(lat) * 0.99)] / 1000,
            "samples": len(lat)}


# -- first touch ---------------------------------------------------------------------
#
# The broker sizes a queue's ring for its whole --mem-queue-size, so a backlog
# lands on shared-memory pages never written before: each first write to a
# page faults and the kernel zeroes it.  This measures what that costs
# against a ring small enough to stay warm, pushing the same batches.

def run_first_touch(total=256 << 20, size=4096):
    rec = struct.pack("=I", size + 26) + b"t" * (size + 26)
    batch = memoryview(rec * max(1, (800 << 10) // len(rec)))
    out = {}
    for label, cap in (("fresh", 2 * total), ("warm", 16 << 20)):
        name = f"nsqshm-bench-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        ring = Ring.create(name, cap, max_record=1 << 20)
        buf = bytearray(4 << 20)
        try:
            n, t0 = 0, time.perf_counter()
            while n < total:
                ring.push_packed(batch)
                if label == "warm":  # keep it from filling: the pages are reused
                    ring.pop_many_into(buf)
                n += len(batch)
            out[f"{label}_GB_per_s"] = n / (time.perf_counter() - t0) / 1e9
        finally:
            ring.close()
            Ring.unlink_segment(name)
    out["bytes"], out["record"] = total, size
    return out


# -- the suite -------------------------------------------------------------------------

TARGET_100B_BATCHED, TARGET_64K_GBPS, TARGET_WAKE_P50_US = 10e6, 5.0, 50.0  # issue 2


def add_arguments(ap):
    ap.add_argument("--seconds", type=float, default=0.5, help="length of one window")
    ap.add_argument("--windows", type=int, default=5, help="windows per figure (median)")
    ap.add_argument("--only", choices=["throughput", "latency"])


def _impls(ctx):
    impls = ["nsqshm-ring", "faster-fifo", "multiprocessing.Queue"]
    try:
        import faster_fifo  # noqa: F401
    except ImportError:
        impls.remove("faster-fifo")
        ctx.say("faster-fifo not installed: that baseline is skipped")
    return impls


def run(ctx):
    a = ctx.args
    if ctx.quick:
        a.seconds, a.windows = 0.3, 1
    impls = _impls(ctx)
    results = {"params": {"seconds": a.seconds, "windows": a.windows,
                          "ring_capacity": RING_CAPACITY, "queue_batched": QUEUE_BATCHED},
               "impls": impls, "throughput": [], "latency": []}
    rows = [(s, pc, b) for s in SIZES for pc in TOPOLOGIES for b in (False, True)]
    if a.only != "latency":
        ctx.say("throughput, msgs/s (GB/s); median of windows")
        with ctx.progress.task("ring throughput", len(rows) * len(impls)) as advance:
            for size, (producers, consumers), batched in rows:
                row = {"size": size, "producers": producers, "consumers": consumers,
                       "mode": "batched" if batched else "single"}
                ctx.settle()
                for impl in impls:
                    row[impl] = run_throughput(impl, size, producers, consumers, batched,
                                               a.seconds, a.windows)
                    advance()
                for impl in impls[1:]:
                    row[f"ratio_vs_{impl}"] = row["nsqshm-ring"] / max(row[impl], 1e-9)
                results["throughput"].append(row)
                cells = " ".join(f"{row[i] / 1e6:9.3f}M ({row[i] * size / 1e9:6.2f}GB/s)"
                                 for i in impls)
                ratios = " ".join(f"x{row[f'ratio_vs_{i}']:.1f} vs {i}" for i in impls[1:])
                ctx.say(f"{size:>6} {producers}x{consumers:<2} {row['mode']:>8} {cells}   {ratios}")
    if a.only != "latency":
        ft = results["first_touch"] = run_first_touch(32 << 20 if ctx.quick else 256 << 20)
        ctx.say(f"pushing {ft['bytes'] >> 20} MiB of {ft['record']} B records: into fresh pages "
                f"{ft['fresh_GB_per_s']:.2f} GB/s, into a warm ring {ft['warm_GB_per_s']:.2f} GB/s")
    if a.only != "throughput":
        n = 300 if ctx.quick else 2000
        ctx.say(f"wake-up latency, commit to consumer running ({n} samples, consumer asleep)")
        with ctx.progress.task("ring wake-up", len(impls)) as advance:
            for impl in impls:
                lat = run_latency(impl, n, 0.001)
                lat["impl"] = impl
                results["latency"].append(lat)
                ctx.say(f"  {impl:>22}: p50 {lat['p50_us']:7.1f} us   p99 {lat['p99_us']:7.1f} us")
                advance()
    return results


def _rate(v, size):
    gbps = v * size / 1e9
    return f"{v / 1e6:.3g} M/s ({gbps:.2f} GB/s)" if size >= 1000 else f"{v / 1e6:.3g} M/s"


def render(res):
    impls = res["impls"]
    p = res["params"]
    queues = ("multiprocessing.Queue and faster-fifo: one pickled list per put and per get"
              if p.get("queue_batched") == QUEUE_BATCHED else  # results of before the change
              "multiprocessing.Queue: a list per put; faster-fifo: put_many/get_many")
    out = [f"Producers and consumers are separate processes (fork); medians of {p['windows']} "
           f"windows of {p['seconds']} s. \"single\" = one record per call; \"batched\" = one call "
           f"per batch (the ring: push_packed/pop_many_into; {queues}), 256 records or 256 KiB. "
           f"Ring capacity {p['ring_capacity'] >> 20} MiB.", ""]
    if res["throughput"]:
        out += ["| size | P x C | mode | " + " | ".join(impls) + " | "
                + " | ".join(f"ring / {i}" for i in impls[1:]) + " |",
                "|---:|:---:|:---:|" + "---:|" * (2 * len(impls) - 1)]
        for r in res["throughput"]:
            size = r["size"]
            label = f"{size >> 10} KiB" if size >= 1024 else f"{size} B"
            out.append(f"| {label} | {r['producers']}x{r['consumers']} | {r['mode']} | "
                       + " | ".join(_rate(r[i], size) for i in impls) + " | "
                       + " | ".join(f"{r[f'ratio_vs_{i}']:.1f}x" for i in impls[1:]) + " |")
    ft = res.get("first_touch")
    if ft:
        out += ["", f"First touch: pushing {ft['bytes'] >> 20} MiB of {ft['record']} B records "
                f"(batches of ~800 KiB, one process) into a ring's never-written pages: "
                f"{ft['fresh_GB_per_s']:.2f} GB/s; into a 16 MiB ring that stays warm: "
                f"{ft['warm_GB_per_s']:.2f} GB/s. A broker's backlog lands on fresh pages."]
    if res["latency"]:
        n = res["latency"][0]["samples"]
        out += ["", f"Wake-up latency, from just before the push (commit) to the sleeping consumer "
                f"running again, {n} samples:", "", "| | p50 | p99 |", "|---|---:|---:|"]
        for lat in res["latency"]:
            out.append(f"| {lat['impl']} | {lat['p50_us']:.1f} us | {lat['p99_us']:.1f} us |")
    return out


def targets(res):
    rows = []
    for r in res["throughput"]:
        one = (r["producers"], r["consumers"]) == (1, 1) and r["mode"] == "batched"
        if one and r["size"] == 100:
            v = r["nsqshm-ring"]
            rows.append(("2", "ring, 100 B batched 1P1C", ">= 10 M msg/s", f"{v / 1e6:.1f} M msg/s",
                         v >= TARGET_100B_BATCHED))
        if one and r["size"] == 65536:
            v = r["nsqshm-ring"] * 65536 / 1e9
            rows.append(("2", "ring, 64 KiB records 1P1C batched", ">= 5 GB/s", f"{v:.1f} GB/s",
                         v >= TARGET_64K_GBPS))
    for lat in res["latency"]:
        if lat["impl"] == "nsqshm-ring":
            rows.append(("2", "ring wake-up, commit to consumer running, p50", "<= 50 us",
                         f"{lat['p50_us']:.1f} us", lat["p50_us"] <= TARGET_WAKE_P50_US))
    return rows
