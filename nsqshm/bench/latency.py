"""End-to-end latency, publish to delivery, at fixed rates, open loop.

A publisher process sends on a schedule: message i is due at t0 + i / rate
(CLOCK_MONOTONIC, one clock for every process on the host), and its body
carries that *scheduled* time.  A consumer process reads the clock as each
chunk arrives; a message's latency is arrival - scheduled.  The publisher
never waits for the system before deciding when the next message is due:
when it falls behind (the server pushes back, the machine stalls it) the
messages due meanwhile leave late but keep their scheduled times, so a stall
shows in their latencies instead of being left out (no coordinated
omission).  The publisher's own lateness (send lag) is reported apart.

Baseline: the same publisher and consumer through a relay that turns each
PUB into a delivery at once (baseline.py): the floor of this generator,
loopback TCP and the scheduler, run alternately in the same program.
"""

import array
import contextlib
import ctypes
import math
import os
import select
import socket
import struct
import time
import uuid

from nsqshm import protocol as p

from . import baseline, loadgen
from .common import CTX, median, stop_all
from .server import Target, server

TITLE, ISSUE = "End-to-end latency at fixed rates (issue 10)", "10"
HELP = "end-to-end latency p50/p99/p99.9 at fixed rates, open loop (1k, 10k, 100k msg/s)"
NS = 1_000_000_000
QUANTILES = (50, 99, 99.9)
STAMP = struct.Struct("<qq")  # scheduled send time (monotonic ns), sequence number


# -- the schedule (pure; tests/bench/test_latency_math.py) ------------------------------

def scheduled_ns(t0, i, rate):
    """When message i is due."""
    return t0 + i * NS // rate


def due_count(t0, now, rate):
    """How many messages are due by `now`: those with scheduled_ns <= now."""
    if now < t0:
        return 0
    # i is due when i * NS // rate <= now - t0, i.e. i < (now - t0 + 1) * rate / NS
    return ((now - t0 + 1) * rate + NS - 1) // NS


def percentiles(samples, quantiles=QUANTILES):
    """Nearest-rank percentiles of ns samples, in us; plus max and count."""
    s = sorted(samples)
    if not s:
        return {"samples": 0}
    out = {}
    for q in quantiles:
        # the rank rounded first: 99.9 / 100 * 1000 is 999.0000000000001 in floats
        rank = math.ceil(round(q * len(s) / 100, 6))
        out[f"p{q:g}_us".replace(".", "")] = s[max(0, rank - 1)] / 1e3
    out["max_us"] = s[-1] / 1e3
    out["samples"] = len(s)
    return out


# -- processes ---------------------------------------------------------------------------

def _fine_timers():
    """1 us timer slack instead of 50: sleeps end when asked, so the publisher's
    own lateness stays small at 1 k msg/s."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK


def publisher(address, topic, rate, count, size, t0, tick_ns, mpub, pipe):
    """Every message due, in one write, at most once per tick: at 100 k msg/s
    a send per message would take a core from the server; the wait for the
    tick is in the measured latency like any other.  With mpub, the messages
    of one write go as one MPUB (a batching producer) instead of a PUB each."""
    _fine_timers()
    # a connected socket is used as it is (the workers suite pins it to a worker)
    sock = address if isinstance(address, socket.socket) else loadgen.connect(address)
    pub = b"PUB " + topic.encode() + b"\n" + struct.pack(">I", size)
    size_prefix = struct.pack(">I", size)
    pad = b"p" * (size - STAMP.size)
    dec = p.FrameDecoder()
    lag = array.array("q")
    sent = acked = not_before = 0
    c0 = os.times()
    while sent < count:
        now = time.monotonic_ns()
        due = min(count, due_count(t0, now, rate))
        if due > sent and now >= not_before:
            parts = []
            for i in range(sent, due):
                sched = scheduled_ns(t0, i, rate)
                parts.append(STAMP.pack(sched, i) + pad)
                lag.append(now - sched)
            if mpub and len(parts) > 1:
                body = struct.pack(">I", len(parts)) + b"".join(size_prefix + x for x in parts)
                sock.sendall(b"MPUB " + topic.encode() + b"\n" + struct.pack(">I", len(body))
                             + body)
                acked += len(parts) - 1  # one response for the lot
            else:
                sock.sendall(b"".join(pub + x for x in parts))
            sent, not_before = due, now + tick_ns
        else:  # until the next one is due, or a response comes in
            wake = max(scheduled_ns(t0, sent, rate), not_before)
            select.select([sock], [], [], max(0, wake - now) / NS)
        acked += _drain(sock, dec, block=False)
    sock.settimeout(30)
    while acked < sent:
        acked += _drain(sock, dec, block=True)
    c1 = os.times()
    pipe.send({"lag": lag.tobytes(), "cpu": c1.user - c0.user + c1.system - c0.system})
    sock.close()


def _drain(sock, dec, block):
    try:
        data = sock.recv(1 << 16, 0 if block else socket.MSG_DONTWAIT)
    except BlockingIOError:
        return 0
    if not data:
        raise ConnectionError("server closed the connection")
    dec.feed(data)
    got = 0
    for ftype, payload in dec.frames():
        if ftype == p.FRAME_TYPE_ERROR:
            raise RuntimeError(payload.decode())
        got += payload != p.HEARTBEAT
    return got


def consumer(address, topic, rdy, count, ready, stop, pipe):
    """address: where to connect and SUB, or a socket already subscribed."""
    _fine_timers()
    if isinstance(address, socket.socket):
        conn = loadgen.Conn(address)
        conn.send(p.rdy(rdy))
    else:
        conn = loadgen.open_plain(address)
        conn.send(p.sub(topic, "ch") + p.rdy(rdy))
        conn.read_frames(1)
    ready.set()
    sock = conn.sock
    sock.settimeout(0.2)
    lat, seqs = array.array("q"), array.array("q")
    buf, fins = bytearray(conn.pending), bytearray()
    c0 = os.times()
    unpack_size, unpack_stamp = struct.Struct(">II").unpack_from, STAMP.unpack_from
    while len(lat) < count and not stop.is_set():
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            continue
        now = time.monotonic_ns()  # every message in this chunk had arrived by now
        if not data:
            break
        buf += data
        pos, n = 0, len(buf)
        while n - pos >= 8:
            size, ftype = unpack_size(buf, pos)
            if n - pos - 4 < size:
                break
            if ftype == p.FRAME_TYPE_MESSAGE:
                sched, seq = unpack_stamp(buf, pos + 34)
                lat.append(now - sched)
                seqs.append(seq)
                fins += b"FIN " + buf[pos + 18:pos + 34] + b"\n"
            elif buf[pos + 8:pos + 4 + size] == p.HEARTBEAT:
                fins += b"NOP\n"
            pos += 4 + size
        del buf[:pos]
        if fins:
            sock.sendall(fins)
            del fins[:]
    c1 = os.times()
    pipe.send({"lat": lat.tobytes(), "seqs": seqs.tobytes(),
               "cpu": c1.user - c0.user + c1.system - c0.system})
    sock.close()


def _unpack(data):
    a = array.array("q")
    a.frombytes(data)
    return a


def measure(target, rate, seconds, size, rdy, warmup, tick_us, mpub=False, topic=None,
            pub_sock=None, sub_sock=None):
    """One open-loop run at `rate`; percentiles of the messages due after warmup.
    pub_sock / sub_sock: connections to use (the second already subscribed
    to topic, channel "ch") instead of new ones."""
    count = int(rate * seconds)
    topic = topic or f"lat{uuid.uuid4().hex[:8]}"
    ready, stop = CTX.Event(), CTX.Event()
    crecv, csend = CTX.Pipe(False)
    precv, psend = CTX.Pipe(False)
    cons = CTX.Process(target=consumer, args=(sub_sock or target.tcp, topic, rdy, count, ready,
                                              stop, csend))
    cons.start()
    if sub_sock:
        sub_sock.close()  # the child has its own copy
    if not ready.wait(20):
        cons.kill()
        raise RuntimeError("the latency consumer did not subscribe")
    t0 = time.monotonic_ns() + NS // 5
    pub = CTX.Process(target=publisher, args=(pub_sock or target.tcp, topic, rate, count, size, t0,
                                                     int(tick_us * 1000), mpub, psend))
    s0 = target.cpu_seconds()
    pub.start()
    if pub_sock:
        pub_sock.close()
    try:
        sent = precv.recv() if precv.poll(seconds + 60) else None
        if sent is None:
            raise RuntimeError(f"the publisher did not finish at {rate} msg/s")
        if not crecv.poll(30):  # the tail still in flight; then report what arrived
            stop.set()
        got = crecv.recv() if crecv.poll(10) else None
        if got is None:
            raise RuntimeError("the latency consumer did not report")
    finally:
        stop_all([pub, cons], stop)
    wall = (time.monotonic_ns() - t0) / NS
    s1 = target.cpu_seconds()
    if not pub_sock:
        target.delete_topic(topic)
    lat, seqs, lag = _unpack(got["lat"]), _unpack(got["seqs"]), _unpack(sent["lag"])
    skip = int(rate * warmup)
    res = percentiles([v for v, s in zip(lat, seqs, strict=True) if s >= skip])
    res["rate"] = rate
    res["sent"] = count
    res["missing"] = count - len(set(seqs))
    res["duplicates"] = len(seqs) - len(set(seqs))
    res.update({f"send_lag_{k}": v for k, v in percentiles(lag[skip:]).items()
                if k.endswith("_us")})
    res["publisher_cpu_share"] = sent["cpu"] / seconds
    res["consumer_cpu_share"] = got["cpu"] / seconds
    if s0 is not None:
        res["server_cpu_share"] = (s1 - s0) / wall
        res["server_cpu_us_per_msg"] = (s1 - s0) / count * 1e6
    return res


# -- the suite -------------------------------------------------------------------------

def add_arguments(ap):
    ap.add_argument("--rates", default="1000,10000,100000", help="msg/s, comma-separated")
    ap.add_argument("--publish", default="pub,mpub",
                    help="pub: a PUB per message; mpub: what is due at a tick as one MPUB")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of a run at each rate")
    ap.add_argument("--min-samples", type=int, default=5_000,
                    help="lengthen low-rate runs to this many messages (for p99.9)")
    ap.add_argument("--warmup", type=float, default=0.5,
                    help="seconds of each run left out of the percentiles")
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--rdy", type=int, default=2500)
    ap.add_argument("--tick-us", type=float, default=100.0,
                    help="the publisher writes at most once per tick (what is due by then)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the relay baseline")


def timer_overshoot(n=1000, period_ns=1_000_000):
    """How late a 1 ms sleep ends on this machine: the scheduling floor under
    every figure here."""
    _fine_timers()
    late = []
    for _ in range(n):
        due = time.monotonic_ns() + period_ns
        select.select([], [], [], period_ns / NS)
        late.append(time.monotonic_ns() - due)
    return percentiles(late)


def _say(ctx, label, r):
    ctx.say(f"{label}: p50 {r['p50_us']:8.1f} us  p99 {r['p99_us']:8.1f} us  "
            f"p99.9 {r['p999_us']:8.1f} us  max {r['max_us']:8.1f} us  "
            f"({r['samples']} samples, {r['missing']} missing; send lag p50/p99 "
            f"{r['send_lag_p50_us']:.0f}/{r['send_lag_p99_us']:.0f} us)")


def _one(ctx, a, mode, rate, seconds, relay):
    ctx.settle()
    mpub = mode == "mpub"
    if relay:
        proc, address = baseline.start_relay()
        try:
            return measure(Target(address), rate, seconds, a.size, a.rdy, a.warmup, a.tick_us,
                           mpub)
        finally:
            proc.kill()
            proc.join()
    with server(a, backlog=(int(rate * seconds), a.size)) as target:
        return measure(target, rate, seconds, a.size, a.rdy, a.warmup, a.tick_us, mpub)


def run(ctx):
    a = ctx.args
    if ctx.quick:
        a.seconds, a.min_samples, a.warmup = min(a.seconds, 1.0), 0, min(a.warmup, 0.2)
    rates = [int(x) for x in a.rates.split(",") if x.strip()]
    modes = [m for m in a.publish.split(",") if m in ("pub", "mpub")]
    sides = ["server"] + ([] if a.no_baseline else ["relay"])
    rows = []
    overshoot = timer_overshoot(200 if ctx.quick else 1000)
    ctx.say(f"1 ms sleep ends late by: p50 {overshoot['p50_us']:.0f} us, p99 "
            f"{overshoot['p99_us']:.0f} us, p99.9 {overshoot['p999_us']:.0f} us (this machine)")
    with ctx.progress.task("latency", len(modes) * len(rates) * ctx.runs() * len(sides)) as adv:
        for mode in modes:
            for rate in rates:
                seconds = max(a.seconds, a.min_samples / rate + a.warmup)
                row = {"mode": mode, "rate": rate, "seconds": seconds}
                for side in sides:
                    runs = row[f"{side}_runs"] = []
                    for i in range(ctx.runs()):
                        runs.append(_one(ctx, a, mode, rate, seconds, side == "relay"))
                        _say(ctx, f"{mode:>4} {rate:>7} msg/s {side:>6} {i + 1}", runs[-1])
                        adv()
                    row[side] = {k: median([r[k] for r in runs]) for k in runs[0]}
                rows.append(row)
    return {"params": {"rates": rates, "modes": modes, "seconds": a.seconds,
                       "min_samples": a.min_samples, "warmup": a.warmup, "size": a.size,
                       "rdy": a.rdy, "tick_us": a.tick_us, "quantiles": list(QUANTILES)},
            "timer_overshoot": overshoot, "rates": rows}


def _us(d, k):
    v = (d or {}).get(k)
    return "-" if v is None else (f"{v / 1e3:,.1f} ms" if v >= 10_000 else f"{v:,.0f} us")


def render(res):
    p, t = res["params"], res["timer_overshoot"]
    runs = len(res["rates"][0]["server_runs"]) if res["rates"] else 0
    out = [f"Open loop: message i is due at t0 + i/rate and carries that time; latency = arrival "
           "at the consumer - scheduled time, so a stall of the publisher, the server or the "
           "machine counts against every message due during it. pub: a PUB per message; mpub: "
           f"the messages due at a tick ({p['tick_us']:.0f} us at most) as one MPUB. "
           f"{p['size']} B messages, one consumer at RDY {p['rdy']}; the first {p['warmup']} s of "
           f"a run left out; medians over {runs} runs of each run's percentiles. Relay: the same "
           "generator through a server that forwards each message at once (the floor). "
           f"On this machine a 1 ms sleep ends late by {_us(t, 'p50_us')} (p50), "
           f"{_us(t, 'p99_us')} (p99), {_us(t, 'p999_us')} (p99.9).", "",
           "![latency against rate](plots/latency_vs_rate.png)", "",
           "| publish | rate | samples | p50 | p99 | p99.9 | max | relay p50 | relay p99 "
           "| relay p99.9 | send lag p99 | server CPU, cores | us/msg | missing |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in res["rates"]:
        m, r = row["server"], row.get("relay")
        cpu = m.get("server_cpu_share")
        # CPU per message: measured, or from the share over the run (older results)
        per = m.get("server_cpu_us_per_msg") or (cpu * 1e6 / row["rate"] if cpu else None)
        out.append(f"| {row['mode']} | {row['rate']:,}/s | {m['samples']:,.0f} | "
                   f"{_us(m, 'p50_us')} | {_us(m, 'p99_us')} | {_us(m, 'p999_us')} | "
                   f"{_us(m, 'max_us')} | {_us(r, 'p50_us')} | {_us(r, 'p99_us')} | "
                   f"{_us(r, 'p999_us')} | {_us(m, 'send_lag_p99_us')} | "
                   + (f"{cpu:.2f} | {per:,.1f} |" if cpu is not None else "- | - |")
                   + f" {sum(x['missing'] for x in row['server_runs'])} |")
    return out
