"""What delivery policies cost when configured but not triggered (issue 18).

One server, a warm-up round, then two cases taking turns (which goes first
alternates), ctx.runs() rounds each: publish then consume (the tcp suite's
load, loadgen.run_phases) on a topic without any policy, and on a topic
whose topic and channel have every policy set, none of which a message
reaches (consumers FIN everything at once): a time to live of an hour on
both, max attempts 5 with a dead-letter topic (also for expired messages),
and bounds on both (max_depth 2**30 and max_bytes 2**45; reject on the
topic, drop-oldest on the channel).  The time to live is checked on every delivery
(InFlight.deliver), the bounds once per MPUB and per batch the pump stores,
max attempts only on REQ and timeouts (none here).  The figure is the ratio
of the medians, policies / none; the target is >= 0.95.  Also the ratio of
the server's CPU time per message (none / policies: >= 0.95 when the
policies cost at most about 5 % more), which a busy shared machine disturbs
less than wall clock throughput.  A message's own time to live (HTTP
/pub?ttl=) is not in this load, whose publishes are TCP MPUBs: unused, it
costs deliver() one bit test per message.
"""

import contextlib
import uuid

from . import loadgen
from .common import medians
from .server import mem_queue_size, post, start_nsqshm
from .tcp import spec_for

TITLE, ISSUE = "Delivery policies configured, not triggered (issue 18)", "18"
HELP = "throughput with every delivery policy set but not triggered, against none (issue 18)"
TARGET = 0.95
CASES = ("none", "policies")
NEVER_FULL = 1 << 30  # a bound no run reaches
NEVER_FULL_BYTES = 1 << 45


def add_arguments(ap):
    loadgen.add_load_arguments(ap, messages=300_000)


def prepare(target, case):
    """A fresh topic with channel ch0, with every policy set for "policies"."""
    topic = f"bench{uuid.uuid4().hex[:8]}"
    post(target, f"/topic/create?topic={topic}")
    post(target, f"/channel/create?topic={topic}&channel=ch0")
    if case == "policies":
        post(target, f"/topic/policy?topic={topic}&ttl=3600000&max_depth={NEVER_FULL}"
                      f"&max_bytes={NEVER_FULL_BYTES}")
        post(target, f"/channel/policy?topic={topic}&channel=ch0&ttl=3600000&max_attempts=5"
                      f"&dead_letter_expired=true&max_depth={NEVER_FULL}"
                      f"&max_bytes={NEVER_FULL_BYTES}&overflow=drop-oldest")
    return topic


def drop(target, topic):
    """Free a round's rings (a started server keeps its topics otherwise)."""
    for name in (topic, f"{topic}.ch0.dead"):
        with contextlib.suppress(OSError):
            post(target, f"/topic/delete?topic={name}")


def run(ctx):
    a = ctx.args
    if a.nsqd_tcp_address:
        return {"skipped": "starts nsqshm itself (policies are nsqshm's); not for an external "
                           "server"}
    if ctx.quick:
        a.messages = min(a.messages, 100_000)
    spec = spec_for(a)
    runs = {case: [] for case in CASES}
    target = start_nsqshm([f"--mem-queue-size={mem_queue_size(a.messages, a.size)}"])
    try:
        topic = prepare(target, "none")  # a warm-up round, not counted
        try:
            loadgen.run_phases(target, spec, topic=topic)
        finally:
            drop(target, topic)
        with ctx.progress.task("policies", len(CASES) * ctx.runs()) as advance:
            for k in range(ctx.runs()):
                # alternate which case goes first: a drift of the machine hits both
                for case in CASES if k % 2 == 0 else CASES[::-1]:
                    ctx.settle()
                    topic = prepare(target, case)
                    try:
                        runs[case].append(loadgen.run_phases(target, spec, topic=topic))
                    finally:
                        drop(target, topic)
                    advance()
    finally:
        target.close()
    rows = []
    for case in CASES:
        m = medians(runs[case])
        rows.append({"case": case, "runs": runs[case], "median": m})
        ctx.say(f"{case:>9}: in {m['in_msgs_per_s'] / 1e3:8.1f} k msg/s, "
                f"out {m['out_msgs_per_s'] / 1e3:8.1f} k msg/s")
    base, pol = rows[0]["median"], rows[1]["median"]
    ratio = {way: pol[f"{way}_msgs_per_s"] / base[f"{way}_msgs_per_s"] for way in ("in", "out")}
    ctx.say(f"policies / none: in {ratio['in']:.3f}, out {ratio['out']:.3f} "
            f"(target >= {TARGET})")
    cpu = {way: base[key] / pol[key] for way in ("in", "out")
           if (key := f"server_cpu_us_per_msg_{way}") in base and pol.get(key)}
    if cpu:
        ctx.say(f"server CPU per message, none / policies: in {cpu['in']:.3f}, "
                f"out {cpu['out']:.3f}")
    return {"params": vars(spec), "cases": rows, "ratio": ratio, "cpu_ratio": cpu}


def render(res):
    out = ["| case | in msg/s | out msg/s | server CPU us/msg in | out |",
           "|---|---:|---:|---:|---:|"]
    for r in res["cases"]:
        m = r["median"]
        out.append(f"| {r['case']} | {m['in_msgs_per_s'] / 1e3:,.0f} k | "
                   f"{m['out_msgs_per_s'] / 1e3:,.0f} k | "
                   f"{m.get('server_cpu_us_per_msg_in', 0):.2f} | "
                   f"{m.get('server_cpu_us_per_msg_out', 0):.2f} |")
    out += ["", f"Throughput, policies / none: in {res['ratio']['in']:.3f}, "
                f"out {res['ratio']['out']:.3f}."]
    cpu = res.get("cpu_ratio")
    if cpu:
        out += [f"Server CPU per message, none / policies: in {cpu['in']:.3f}, "
                f"out {cpu['out']:.3f}."]
    return out


def targets(res):
    r = res["ratio"]
    rows = [("18", "throughput, every policy set but not triggered / none (in, out)",
             f">= {TARGET}", f"{r['in']:.3f} / {r['out']:.3f}",
             r["in"] >= TARGET and r["out"] >= TARGET)]
    cpu = res.get("cpu_ratio")
    if cpu:
        rows.append(("18", "server CPU per message, none / policies set (in, out)",
                     f">= {TARGET}", f"{cpu['in']:.3f} / {cpu['out']:.3f}",
                     cpu["in"] >= TARGET and cpu["out"] >= TARGET))
    return rows
