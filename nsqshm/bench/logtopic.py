"""Log topic against classic topic on one server, in the same run (issue 15):

    nsqshm bench logtopic [--messages 200000] [--size 200] [--batch 200]
                          [--workers 2] [--partitions 2] [--fanout 4]
    python -m nsqshm.bench.logtopic ...   (the same, printed)

Each case runs loadgen.run_phases (publish with MPUB, then consume with FIN)
on a classic topic and on a log topic of --partitions partitions: one
channel, then --fanout channels (every channel gets every message), the two
kinds taking turns (which goes first alternates) for ctx.runs() rounds.  The
classic topic's memory holds the whole backlog (no disk queue); the log
topic writes its log (page cache).  A last case runs the fan-out again on a
server with the broker's default memory (--mem-queue-size 10000, nsqd's):
there the classic topic's channels spill the backlog to their disk queues,
one copy per channel, as they do for a user who runs the defaults.  Figures: msg/s in and out and their
ratios log / classic (medians); and the server's CPU time per delivered
message (publish and delivery), classic / log, which a busy shared machine
disturbs far less than wall-clock rates (>1: the log topic costs less); and
msg/s delivered over both phases (every channel's deliveries over the time
from the first publish to the last FIN, less the fixed pause between the
phases): a classic topic copies each message into every channel when it is
published, a log topic never, so this is where fan-out shows.
Short runs only: a few seconds per case.
"""

import argparse
import json
import sys
import urllib.request
import uuid

from . import loadgen
from .common import medians
from .server import mem_queue_size, start_nsqshm

TITLE, ISSUE = "Log topics against classic topics (issue 15)", "15"
HELP = "log topic vs classic topic: publish, deliver, fan-out (issue 15)"
KINDS = ("classic", "log")
TARGET_PUBLISH = 1.0    # log / classic, publish with one channel
TARGET_FANOUT = 3.0     # log / classic, msg/s delivered with --fanout channels
WHOLE = "whole backlog"                 # --mem-queue-size holds every message published
DEFAULTS = "default (--mem-queue-size 10000)"   # the broker's: classic channels spill


def add_arguments(ap):
    loadgen.add_load_arguments(ap, messages=200_000)
    ap.set_defaults(rdy=200, publishers=1, consumers=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--fanout", type=int, default=4)
    ap.add_argument("--output-buffer-timeout", type=int, default=25, metavar="MS",
                    help="the consumers' IDENTIFY output_buffer_timeout (nsqd's minimum, 25: "
                         "the default 250 ms held a run's last partial batch for up to "
                         "250 ms, a large and random part of a short run; -1: no buffering)")
    ap.add_argument("--no-defaults-case", dest="defaults_case", action="store_false",
                    help="skip the fan-out case on a server with the broker's default memory")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="a flag for the server (repeatable), e.g. --server-arg=--sync-every=100000")


def create_log_topic(target, partitions):
    name = f"blog{uuid.uuid4().hex[:8]}"
    host, port = target.http
    req = urllib.request.Request(
        f"http://{host}:{port}/topic/create?topic={name}&partition_num={partitions}", data=b"",
        method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()
    return name


def _cpu_per_delivered(r):
    """Server CPU seconds of both phases per message delivered (µs)."""
    if "server_cpu_in_s" not in r:
        return None
    out = r["messages"] * r["channels"]
    return (r["server_cpu_in_s"] + r["server_cpu_out_s"]) / out * 1e6


def case(target, spec, channels, partitions, rounds, settle=lambda: None, opener=None):
    runs = {kind: [] for kind in KINDS}
    for k in range(rounds):
        for kind in KINDS if k % 2 == 0 else KINDS[::-1]:
            settle()
            topic = create_log_topic(target, partitions) if kind == "log" else None
            r = loadgen.run_phases(target, spec, channels=channels, topic=topic, opener=opener)
            r["both_msgs_per_s"] = r["messages"] * r["channels"] / (r["wall_in_s"] + r["wall_out_s"])
            per = _cpu_per_delivered(r)
            if per is not None:
                r["server_cpu_us_per_delivered"] = per
            runs[kind].append(r)
    classic, log = medians(runs["classic"]), medians(runs["log"])
    res = {"channels": channels, "classic": classic, "log": log, "runs": runs,
           "ratio_in": log["in_msgs_per_s"] / classic["in_msgs_per_s"],
           "ratio_out": log["out_msgs_per_s"] / classic["out_msgs_per_s"],
           "ratio_both": log["both_msgs_per_s"] / classic["both_msgs_per_s"]}
    if classic.get("server_cpu_us_per_delivered") and log.get("server_cpu_us_per_delivered"):
        res["cpu_ratio"] = (classic["server_cpu_us_per_delivered"]
                            / log["server_cpu_us_per_delivered"])
    return res


def measure(args, rounds, settle=lambda: None):
    spec = argparse.Namespace(messages=args.messages, size=args.size, batch=args.batch,
                              window=args.window, rdy=args.rdy, publishers=args.publishers,
                              consumers=args.consumers, rate=0, runfor=0)
    target = start_nsqshm([f"--workers={args.workers}",
                           f"--mem-queue-size={mem_queue_size(args.messages, args.size)}",
                           *args.server_arg])
    opener = loadgen.opener_with(output_buffer_timeout=args.output_buffer_timeout)
    try:
        cases = [case(target, spec, 1, args.partitions, rounds, settle, opener),
                 case(target, spec, args.fanout, args.partitions, rounds, settle, opener)]
    finally:
        target.close()
    for c in cases:
        c["memory"] = WHOLE
    if args.defaults_case:
        target = start_nsqshm([f"--workers={args.workers}", *args.server_arg])
        try:
            cases.append({**case(target, spec, args.fanout, args.partitions, rounds, settle,
                                 opener), "memory": DEFAULTS})
        finally:
            target.close()
    return {"params": {**vars(spec), "workers": args.workers, "partitions": args.partitions,
                       "fanout": args.fanout, "rounds": rounds,
                       "output_buffer_timeout": args.output_buffer_timeout}, "cases": cases}


def _label(r):
    """'4 channel(s)', and for the broker-defaults case what its memory is."""
    memory = " (default memory)" if r.get("memory") == DEFAULTS else ""
    return f"{r['channels']} channel(s){memory}"


def lines(res):
    p = res["params"]
    out = [f"{p['messages']} messages of {p['size']} B, MPUB {p['batch']}, {p['workers']} workers, "
           f"log topic of {p['partitions']} partitions, consumers at RDY {p['rdy']} with "
           f"output_buffer_timeout {p.get('output_buffer_timeout', 250)} ms, "
           f"median of {p['rounds']} round(s)"]
    for r in res["cases"]:
        for kind in KINDS:
            x = r[kind]
            cpu = x.get("server_cpu_us_per_delivered")
            out.append(f"  {_label(r)}, {kind:7s}: publish "
                       f"{x['in_msgs_per_s'] / 1e3:8.1f} k msg/s, deliver "
                       f"{x['out_msgs_per_s'] / 1e3:8.1f} k msg/s, both phases "
                       f"{x['both_msgs_per_s'] / 1e3:8.1f} k msg/s delivered"
                       + (f", server CPU {cpu:.2f} us per delivered msg" if cpu else ""))
        out.append(f"  {_label(r)}, log / classic: publish {r['ratio_in']:.2f}x, "
                   f"deliver {r['ratio_out']:.2f}x, both phases {r['ratio_both']:.2f}x"
                   + (f"; server CPU per delivered msg, classic / log {r['cpu_ratio']:.2f}x"
                      if "cpu_ratio" in r else ""))
    return out


def run(ctx):
    a = ctx.args
    if getattr(a, "nsqd_tcp_address", None):
        return {"skipped": "starts nsqshm itself (log topics are nsqshm's)"}
    if ctx.quick:
        a.messages = min(a.messages, 100_000)
    res = measure(a, ctx.runs(), ctx.settle)
    for line in lines(res):
        ctx.say(line)
    return res


def render(res):
    out = [lines(res)[0] + ".", "",
           "| channels | memory | kind | publish msg/s | deliver msg/s | both phases, msg/s delivered "
           "| server CPU us per delivered msg |",
           "|---:|---|---|---:|---:|---:|---:|"]
    for r in res["cases"]:
        for kind in KINDS:
            x = r[kind]
            out.append(f"| {r['channels']} | {r.get('memory', WHOLE)} | {kind} | "
                       f"{x['in_msgs_per_s'] / 1e3:,.0f} k | "
                       f"{x['out_msgs_per_s'] / 1e3:,.0f} k | "
                       f"{x['both_msgs_per_s'] / 1e3:,.0f} k | "
                       f"{x.get('server_cpu_us_per_delivered', 0):.2f} |")
    out.append("")
    for r in res["cases"]:
        out.append(f"{_label(r)}, log / classic: publish {r['ratio_in']:.2f}x, "
                   f"deliver {r['ratio_out']:.2f}x, both phases {r['ratio_both']:.2f}x"
                   + (f", server CPU per delivered message classic / log {r['cpu_ratio']:.2f}x."
                      if "cpu_ratio" in r else "."))
    return out


def targets(res):
    one, fan, *defaults = res["cases"]
    rows = [("15", "publish, one channel, log / classic", f">= {TARGET_PUBLISH}",
             f"{one['ratio_in']:.2f}", one["ratio_in"] >= TARGET_PUBLISH),
            ("15", f"fan-out to {fan['channels']} channels, msg/s delivered, log / classic "
                   "(the classic topic's memory holds the backlog)",
             f">= {TARGET_FANOUT}", f"{fan['ratio_out']:.2f}", fan["ratio_out"] >= TARGET_FANOUT)]
    for d in defaults:
        rows.append(("15", f"fan-out to {d['channels']} channels, msg/s delivered, log / classic "
                           "(the broker's default memory: classic channels spill to disk)",
                     f">= {TARGET_FANOUT}", f"{d['ratio_out']:.2f}",
                     d["ratio_out"] >= TARGET_FANOUT))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--runs", type=int, default=1, help="rounds per case (medians)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    res = measure(args, args.runs)
    if args.json:
        json.dump(res, sys.stdout, indent=1, default=str)
        print()
        return 0
    print("\n".join(lines(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
