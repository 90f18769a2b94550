"""Throughput against the number of workers (`nsqshm start --workers N`),
and the cost of the cross-worker hop (issue 6).

The tcp suite's publish-then-consume load against nsqshm started with
--workers 1, 2, ...; server CPU is the whole process tree's.  Until the
workers mode exists this suite says so and measures nothing: it probes
`--workers 2` first, and needs the flag accepted (not exit 2) *and* the
broker to run as more than one process (the flag is parsed, and ignored,
by the single-process broker).
"""

import time

from . import loadgen
from .common import medians
from .server import ServerRejected, mem_queue_size, start_nsqshm
from .tcp import spec_for

TITLE, ISSUE = "Workers (issue 6)", "6"
HELP = "throughput with --workers 1, 2 (ratio) and the cross-worker hop (issue 6)"


def add_arguments(ap):
    ap.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch-size", "--batch", dest="batch", type=int, default=200)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--rdy", type=int, default=2500)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2)


def available(probe=2, extra=(), wait=5.0):
    """None when `nsqshm start --workers probe` runs probe workers, else why not."""
    try:
        target = start_nsqshm([f"--workers={probe}", *extra])
    except ServerRejected as err:
        if err.returncode == 2:
            return "nsqshm start does not take --workers yet (issue 6)"
        return f"nsqshm start --workers {probe} failed: {err}"
    try:
        deadline = time.monotonic() + wait  # workers may be forked after the listen lines
        while target.processes() < 1 + probe and time.monotonic() < deadline:
            time.sleep(0.1)
        n = target.processes()
    finally:
        target.close()
    if n < 1 + probe:
        return (f"--workers {probe} is accepted but the broker runs as {n} process(es): "
                "the workers mode is not built yet (issue 6)")
    return None


def cross_worker_hop(ctx):
    """Publishing through one worker and consuming through another against
    both on the same worker needs a client to reach a chosen worker; with
    SO_REUSEPORT the kernel picks.  Filled in once the broker exposes which
    worker a connection landed on (e.g. in /stats clients)."""
    return {"skipped": "needs a way to reach a given worker (not exposed yet)"}


def run(ctx):
    a = ctx.args
    if a.nsqd_tcp_address:
        return {"skipped": "starts nsqshm itself with --workers N; not for an external server"}
    why = available()
    if why:
        return {"skipped": why}
    if ctx.quick:
        a.messages = min(a.messages, 100_000)
    counts = [int(x) for x in a.workers.split(",") if x.strip()]
    spec = spec_for(a)
    rows = []
    with ctx.progress.task("workers", len(counts) * ctx.runs()) as advance:
        for n in counts:
            runs = []
            for _ in range(ctx.runs()):
                ctx.settle()
                target = start_nsqshm([f"--workers={n}",
                                       f"--mem-queue-size={mem_queue_size(a.messages, a.size)}"])
                try:
                    runs.append(loadgen.run_phases(target, spec))
                finally:
                    target.close()
                advance()
            m = medians(runs)
            rows.append({"workers": n, "runs": runs, "median": m})
            ctx.say(f"--workers {n}: in {m['in_msgs_per_s'] / 1e3:8.1f} k msg/s, "
                    f"out {m['out_msgs_per_s'] / 1e3:8.1f} k msg/s")
    base = rows[0]["median"]
    for r in rows:
        for way in ("in", "out"):
            r[f"ratio_{way}_vs_{counts[0]}"] = r["median"][f"{way}_msgs_per_s"] / base[f"{way}_msgs_per_s"]
    return {"params": vars(spec), "workers": rows, "cross_worker_hop": cross_worker_hop(ctx)}


def render(res):
    first = res["workers"][0]["workers"]
    out = ["| workers | in msg/s | out msg/s | server CPU us/msg in | out | in / "
           f"{first} worker | out / {first} worker |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["workers"]:
        m = r["median"]
        out.append(f"| {r['workers']} | {m['in_msgs_per_s'] / 1e3:,.0f} k | "
                   f"{m['out_msgs_per_s'] / 1e3:,.0f} k | "
                   f"{m.get('server_cpu_us_per_msg_in', 0):.2f} | "
                   f"{m.get('server_cpu_us_per_msg_out', 0):.2f} | "
                   f"{r[f'ratio_in_vs_{first}']:.2f} | {r[f'ratio_out_vs_{first}']:.2f} |")
    hop = res.get("cross_worker_hop", {})
    if "skipped" in hop:
        out += ["", f"Cross-worker hop: not measured: {hop['skipped']}."]
    return out


def targets(res):
    rows = []
    for r in res["workers"]:
        m = r["median"]
        rows.append(("6", f"publish / consume with --workers {r['workers']}", ">= 650 k / 600 k",
                     f"{m['in_msgs_per_s'] / 1e3:,.0f} k / {m['out_msgs_per_s'] / 1e3:,.0f} k",
                     m["in_msgs_per_s"] >= 650e3 and m["out_msgs_per_s"] >= 600e3))
    return rows
