"""Log topic against classic topic on one server, in the same run (issue 15):

    python -m nsqshm.bench.logtopic [--messages 200000] [--size 200] [--batch 200]
                                    [--workers 2] [--partitions 2] [--fanout 4]

Each case runs loadgen.run_phases (publish with MPUB, then consume with FIN)
on a classic topic and on a log topic of --partitions partitions: one
channel, then --fanout channels (every channel gets every message).  The
classic topic's memory holds the whole backlog (no disk queue); the log
topic writes its log (page cache).  Prints msg/s in and out and the ratios
log / classic.  Short runs only: a few seconds per case.
"""

import argparse
import json
import sys
import urllib.request
import uuid

from . import loadgen
from .server import mem_queue_size, start_nsqshm


def create_log_topic(target, partitions):
    name = f"blog{uuid.uuid4().hex[:8]}"
    host, port = target.http
    req = urllib.request.Request(
        f"http://{host}:{port}/topic/create?topic={name}&partition_num={partitions}", data=b"",
        method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()
    return name


def case(target, spec, channels, partitions):
    classic = loadgen.run_phases(target, spec, channels=channels)
    log = loadgen.run_phases(target, spec, channels=channels,
                             topic=create_log_topic(target, partitions))
    return {"channels": channels, "classic": classic, "log": log,
            "ratio_in": log["in_msgs_per_s"] / classic["in_msgs_per_s"],
            "ratio_out": log["out_msgs_per_s"] / classic["out_msgs_per_s"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--rdy", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--fanout", type=int, default=4)
    ap.add_argument("--server-arg", action="append", default=[],
                    help="a flag for the server (repeatable), e.g. --server-arg=--sync-every=100000")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    spec = argparse.Namespace(messages=args.messages, size=args.size, batch=args.batch,
                              window=args.window, rdy=args.rdy, publishers=1, consumers=1,
                              rate=0, runfor=0)
    target = start_nsqshm([f"--workers={args.workers}",
                           f"--mem-queue-size={mem_queue_size(args.messages, args.size)}",
                           *args.server_arg])
    try:
        results = [case(target, spec, 1, args.partitions),
                   case(target, spec, args.fanout, args.partitions)]
    finally:
        target.close()
    if args.json:
        json.dump(results, sys.stdout, indent=1, default=str)
        print()
        return 0
    print(f"{args.messages} messages of {args.size} B, MPUB {args.batch}, "
          f"{args.workers} workers, log topic of {args.partitions} partitions")
    for r in results:
        for kind in ("classic", "log"):
            x = r[kind]
            print(f"  {r['channels']} channel(s), {kind:7s}: publish {x['in_msgs_per_s'] / 1e3:8.1f}"
                  f" k msg/s, deliver {x['out_msgs_per_s'] / 1e3:8.1f} k msg/s")
        print(f"  {r['channels']} channel(s), log / classic: publish {r['ratio_in']:.2f}x, "
              f"deliver {r['ratio_out']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
