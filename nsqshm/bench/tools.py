"""The load generator's modes on their own, with NSQ's bench tool flags:

    nsqshm bench writer [--topic sub_bench] [--size 200] [--batch-size 200] [--runfor 10s]
                        [--rate MSG/S] [--procs N]
    nsqshm bench reader [--topic sub_bench] [--channel ch] [--rdy 2500] [--runfor 10s]
    nsqshm bench fanout [--channels 4] [--runfor 10s] [--rate MSG/S]

Each prints bench_writer's / bench_reader's line (duration, MB/s, ops/s,
us/op) and, with --json, the figures.
"""

import argparse
import json
import os
import sys
import time

from nsqshm.flags import parse_duration

from . import loadgen
from .common import CTX, stop_all
from .server import server


def duration(text):
    """Go's durations ("10s", "1m30s") or plain seconds."""
    try:
        return float(text)
    except ValueError:
        try:
            return parse_duration(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None


def add_arguments(ap, name):
    ap.add_argument("--topic", default="sub_bench")
    ap.add_argument("--size", type=int, default=200, help="message size (bytes)")
    ap.add_argument("--runfor", type=duration, default=10.0, help="how long (10s, 1m, or seconds)")
    ap.add_argument("--procs", type=int, default=os.cpu_count(),
                    help="processes (default: the number of cores, as GOMAXPROCS)")
    ap.add_argument("--rdy", type=int, default=2500)
    ap.add_argument("--batch-size", dest="batch", type=int, default=200)
    ap.add_argument("--window", type=int, default=1,
                    help="MPUBs outstanding per process (bench_writer: 1)")
    ap.add_argument("--rate", type=float, default=0, help="msg/s in all, paced open-loop (0: flat out)")
    if name == "reader":
        ap.add_argument("--channel", default="ch")
    if name == "fanout":
        ap.add_argument("--channels", type=int, default=4)


def _line(kind, seconds, msgs, size):
    return (f"[{kind}] duration: {seconds:.3f}s - {msgs * size / seconds / 2**20:.3f}mb/s - "
            f"{msgs / seconds:.3f}ops/s - {seconds * 1e6 / max(1, msgs):.3f}us/op")


def writer(target, a):
    pout = loadgen.Shared(a.procs)
    ready, go = CTX.Event(), CTX.Event()
    a.rate = a.rate / a.procs
    pubs = [CTX.Process(target=loadgen.publisher, args=(target.tcp, a.topic, a, 0, ready, go, pout, i))
            for i in range(a.procs)]
    loadgen.launch([], pubs, ready)
    t0 = time.perf_counter()
    go.set()
    for x in pubs:
        x.join()
    seconds = time.perf_counter() - t0
    return {"msgs": sum(pout.msgs), "seconds": seconds, "client_cpu_s": sum(pout.cpu)}


def reader(target, a):
    cout = loadgen.Shared(a.procs)
    ready, go, stop = CTX.Event(), CTX.Event(), CTX.Event()
    cons = [CTX.Process(target=loadgen.consumer, args=(target.tcp, a.topic, a.channel, a.rdy,
                                                       ready, go, stop, cout, i))
            for i in range(a.procs)]
    loadgen.launch(cons, [], ready)
    t0 = time.perf_counter()
    go.set()
    time.sleep(a.runfor)
    msgs, seconds = sum(cout.msgs), time.perf_counter() - t0
    stop_all(cons, stop)
    return {"msgs": msgs, "seconds": seconds, "client_cpu_s": sum(cout.cpu)}


def main(a, progress):
    if a.command == "reader" and not a.nsqd_tcp_address:
        print("nsqshm bench reader: give --nsqd-tcp-address (a server with messages to read)",
              file=sys.stderr)
        return 2
    backlog = (int(min(a.runfor * 2e6, 2e7)), a.size) if a.command != "reader" else (0, a.size)
    with server(a, backlog=backlog) as target:
        print(f"{a.command} against {target.tcp[0]}:{target.tcp[1]}"
              + (" (nsqshm started for this run)" if target.started else ""), file=sys.stderr)
        if a.command == "fanout":
            spec = argparse.Namespace(**{**vars(a), "publishers": a.procs, "consumers": 1})
            res = loadgen.run_pubsub(target, spec, channels=a.channels)
            print(_line("bench_writer", res["seconds"], res["in_msgs_per_s"] * res["seconds"],
                        a.size))
            print(_line(f"bench_reader x{a.channels} channels", res["seconds"],
                        res["out_msgs_per_s"] * res["seconds"], a.size))
        else:
            res = (writer if a.command == "writer" else reader)(target, a)
            print(_line(f"bench_{a.command}", res["seconds"], res["msgs"], a.size))
            res["msgs_per_s"] = res["msgs"] / res["seconds"]
    if a.json:
        text = json.dumps({"mode": a.command, **res}, indent=2)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text)
    return 0
