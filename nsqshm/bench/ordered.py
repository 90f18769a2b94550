"""Ordered consumption of a log topic (issue 15): one message of each partition
out at a time, the next only after its FIN, so a partition's rate is one
round trip (FIN, the owner's feeder pushing the next message, the delivery)
per message.  On one broker, each case reading its own copy of the same log
(N messages of 100 B over --partitions partitions, published first), cases
taking turns (which goes first alternates):

    local     nsqshm.local's Consumer(ordered=True): the FIN marks the cursor in
              shared memory and nudges the ordered lane, whose owner's feeder
              pushes the next message
    tcp       Youzan's SUB_ORDERED over TCP (RDY 100, a FIN per message, one
              connection; Python on the client side)
    plain     nsqshm.local's plain Consumer of the same log: the ceiling
              without the order (it reads the logs itself, batches of 1,000)

The figures are messages consumed per second; the ratios are to tcp (the
other way to consume in order) in the same run.
"""

import socket
import time
import uuid

from nsqshm import protocol as p

from .common import median, medians
from .server import mem_queue_size, post, start_nsqshm, wait_local

ONE_SERVER = True  # one broker for every run (the cases take turns on it)
TITLE, ISSUE = "Ordered consumption: local against SUB_ORDERED (issue 15)", "15"
HELP = "ordered consumption of a log topic, nsqshm.local against TCP SUB_ORDERED (issue 15)"
CASES = ("local", "tcp", "plain")
BODY = 100
BATCH = 1000


def add_arguments(ap):
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2, help="the broker's workers")


def _log(target, partitions, n):
    """A new log topic holding n messages, spread over its partitions (its
    first channel starts at the log start)."""
    topic = f"bo{uuid.uuid4().hex[:8]}"
    post(target, f"/topic/create?topic={topic}&partition_num={partitions}")
    per = n // partitions
    for part in range(partitions):
        for first in range(0, per, BATCH):
            bodies = [b"%0*d" % (BODY, first + k) for k in range(min(BATCH, per - first))]
            post(target, f"/mpub?topic={topic}&partition={part}", b"\n".join(bodies))
    return topic, per * partitions


def _local(target, topic, n, ordered):
    from nsqshm.local import Consumer

    with Consumer(topic, "c", shm_prefix=target.prefix, ordered=ordered,
                  max_in_flight=BATCH) as c:
        got = 0
        t0 = time.perf_counter()
        while got < n:
            batch = c.fetch(BATCH, timeout=5)
            if not batch:
                raise RuntimeError(f"{topic}: {got} of {n} consumed, then nothing for 5 s")
            if ordered and len(batch) > c.partition_count:
                raise RuntimeError(f"{len(batch)} messages out at once from an ordered channel")
            got += len(batch)
            batch.finish()
        return n / (time.perf_counter() - t0)


def _tcp(target, topic, n):
    sock = socket.create_connection(target.tcp, timeout=30)
    dec = p.FrameDecoder()
    sock.sendall(p.MAGIC_V2 + b"SUB_ORDERED %s c\n" % topic.encode())
    got = 0
    t0 = None
    while got < n:
        data = sock.recv(1 << 16)
        if not data:
            raise ConnectionError("closed")
        dec.feed(data)
        out = []
        for kind, frame in dec.frames():
            if kind == p.FRAME_TYPE_MESSAGE:
                out.append(p.fin(frame[10:26]))
                got += 1
            elif frame == b"_heartbeat_":
                out.append(p.nop())
            elif frame == b"OK" and t0 is None:
                t0 = time.perf_counter()
                out.append(p.rdy(100))
            elif kind == p.FRAME_TYPE_ERROR:
                raise RuntimeError(frame)
        if out:
            sock.sendall(b"".join(out))
    took = time.perf_counter() - t0
    sock.close()
    return n / took


def _round(target, case, partitions, n):
    topic, n = _log(target, partitions, n)
    try:
        s0 = target.cpu_seconds()
        if case == "tcp":
            rate = _tcp(target, topic, n)
        else:
            rate = _local(target, topic, n, case == "local")
        s1 = target.cpu_seconds()
        res = {"msgs_per_s": rate}
        if s0 is not None:
            res["server_cpu_us_per_msg"] = (s1 - s0) / n * 1e6
        return res
    finally:
        post(target, f"/topic/delete?topic={topic}")


def run(ctx):
    a = ctx.args
    if a.nsqd_tcp_address:
        return {"skipped": "starts nsqshm itself (local clients attach to its shared memory)"}
    n = min(a.messages, 4_000) if ctx.quick else a.messages
    runs = {case: [] for case in CASES}
    target = start_nsqshm([f"--workers={a.workers}",
                           f"--mem-queue-size={mem_queue_size(n, BODY)}"])
    try:
        wait_local(target)
        with ctx.progress.task("ordered", len(CASES) * ctx.runs()) as advance:
            for k in range(ctx.runs()):
                for case in CASES if k % 2 == 0 else CASES[::-1]:
                    ctx.settle()
                    runs[case].append(_round(target, case, a.partitions, n))
                    advance()
                ctx.say(f"run {k + 1}: " + ", ".join(
                    f"{case} {runs[case][-1]['msgs_per_s'] / 1e3:,.1f} k msg/s" for case in CASES))
    finally:
        target.close()
    ratios = {case: median([r["msgs_per_s"] / t["msgs_per_s"]
                            for r, t in zip(runs[case], runs["tcp"], strict=True)])
              for case in CASES}
    return {"params": {"messages": n, "partitions": a.partitions, "workers": a.workers},
            "runs": runs, "median": {case: medians(runs[case]) for case in CASES},
            "ratio_to_tcp": ratios}


def render(res):
    p_, m, r = res["params"], res["median"], res["ratio_to_tcp"]
    out = [f"{p_['messages']:,} messages of {BODY} B on a log topic of {p_['partitions']} "
           f"partitions, a broker of {p_['workers']} workers; each case reads its own copy of "
           f"the log; medians of {len(res['runs']['tcp'])} runs, cases taking turns, and of "
           "each run's ratio to tcp.", "",
           "| case | msg/s | broker CPU per message | / tcp |", "|---|---:|---:|---:|"]
    names = {"local": "local `Consumer(ordered=True)`", "tcp": "TCP `SUB_ORDERED`",
             "plain": "local plain `Consumer` (no order: the ceiling)"}
    for case in CASES:
        cpu = m[case].get("server_cpu_us_per_msg")
        out.append(f"| {names[case]} | {m[case]['msgs_per_s'] / 1e3:,.1f} k | "
                   f"{'' if cpu is None else f'{cpu:.1f} us'} | {r[case]:.2f}x |")
    return out
