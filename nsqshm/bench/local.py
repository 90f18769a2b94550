"""Local shared-memory clients (nsqshm.local, issue 9) against TCP, in one run.

The tcp suite's phases with the other transport: --procs producer processes
publish N messages with nsqshm.local.Producer.publish_buffer (batches of
--batch-size from one buffer), then --procs consumer processes take them
with Consumer.fetch and finish each batch at once; then the same N through
TCP (loadgen.run_phases, as many publishers and consumers).  A fresh
broker for each.  Then the same on a log topic of --log-partitions
partitions (each publish_buffer call into one partition's inbound ring, in
turn; the owners append them to the logs; once the logs hold them all, the
consumers read the partitions' logs themselves, by cursor: Consumer(direct=True),
the default on a standalone broker), against TCP MPUBs to a log topic and
against the classic topic's local figures of the same run.  Skipped until
nsqshm.local imports.
"""

import json
import time
import urllib.request
import uuid

import numpy as np

from . import loadgen
from .common import CTX, median, medians, stop_all
from .logtopic import create_log_topic
from .server import server, wait_local
from .tcp import spec_for

TITLE, ISSUE = "Local shared-memory clients (issue 9)", "9"
HELP = "local shared-memory producer/consumer vs TCP (issue 9)"


def add_arguments(ap):
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--batch-size", "--batch", dest="batch", type=int, default=10_000,
                    help="messages per publish_buffer / fetch")
    ap.add_argument("--procs", type=int, default=2, help="producer and consumer processes")
    ap.add_argument("--log-partitions", type=int, default=2,
                    help="the log topic's partitions (0: no log topic rows)")


def _producer(target, topic, count, size, batch, go, out, idx):
    from nsqshm.local import Producer

    data = b"l" * (size * batch)
    offsets = np.arange(batch, dtype=np.int64) * size
    lengths = np.full(batch, size, dtype=np.int64)
    with Producer(topic, data_path=target.data, shm_prefix=target.prefix) as prod:
        go.wait()
        t0 = time.process_time()
        done = 0
        while done < count:
            n = min(batch, count - done)
            prod.publish_buffer(data, offsets[:n], lengths[:n])
            done += n
            out.msgs[idx] = done
        out.cpu[idx] = time.process_time() - t0


def _consumer(target, topic, batch, ready, go, stop, out, idx, direct=True):
    from nsqshm.local import Consumer

    with Consumer(topic, "ch", data_path=target.data, shm_prefix=target.prefix,
                  max_in_flight=batch, direct=direct) as cons:
        ready.set()
        go.wait()
        t0 = time.process_time()
        while not stop.is_set():
            got = cons.fetch(batch, timeout=0.2)
            if got:
                got.finish()
                out.msgs[idx] += len(got)
        out.cpu[idx] = time.process_time() - t0


def _wait_appended(target, topic, total, timeout=60.0):
    """Until the log topic's partitions hold `total` messages."""
    host, port = target.http
    url = f"http://{host}:{port}/stats?format=json&include_clients=false&topic={topic}"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with urllib.request.urlopen(url, timeout=10) as resp:
            doc = json.loads(resp.read())
        held = sum(p["end_offset"] for t in doc.get("topics") or () if t["topic_name"] == topic
                   for p in t.get("partitions") or ())
        if held >= total:
            return
        time.sleep(0.02)
    raise RuntimeError(f"{topic}: the owners did not append {total} messages in {timeout:.0f}s")


def run_local(target, messages, size, batch, procs, topic=None, direct=True):
    """topic: one made beforehand (a log topic), else a new classic topic.
    direct: a log topic's consumers read the logs themselves (else the ring)."""
    log = topic is not None
    topic = topic or f"local{uuid.uuid4().hex[:8]}"
    per = messages // procs
    total = per * procs
    pout, cout = loadgen.Shared(procs), loadgen.Shared(procs)
    ready = [CTX.Event() for _ in range(procs)]
    pub_go, go, stop = CTX.Event(), CTX.Event(), CTX.Event()
    cons = [CTX.Process(target=_consumer,
                        args=(target, topic, batch, ready[i], go, stop, cout, i, direct))
            for i in range(procs)]
    pubs = [CTX.Process(target=_producer, args=(target, topic, per, size, batch, pub_go, pout, i))
            for i in range(procs)]
    try:
        for x in cons:  # the channel exists before publishing, as in the tcp suite
            x.start()
        for e in ready:
            e.wait(30)
        for x in pubs:
            x.start()
        time.sleep(0.3)
        s0, t0 = target.cpu_seconds(), time.perf_counter()
        pub_go.set()
        loadgen.wait_for(pout.msgs, total, pubs, 60)
        t1 = time.perf_counter()
        time.sleep(0.2)  # the pump moves the tail into the channel
        if log:  # the owners append what the producers pushed: the consumers read the
            _wait_appended(target, topic, total)  # whole log, not the appends' pace
        s1, t1b = target.cpu_seconds(), time.perf_counter()
        go.set()
        loadgen.wait_for(cout.msgs, total, cons, 60)
        t2 = time.perf_counter()
        s2 = target.cpu_seconds()
    finally:
        stop_all(cons, stop)
        stop_all(pubs)
    res = {"messages": total, "in_msgs_per_s": total / (t1 - t0),
           "out_msgs_per_s": total / (t2 - t1b),
           "client_cpu_in_s": sum(pout.cpu), "client_cpu_out_s": sum(cout.cpu),
           "wall_in_s": t1 - t0, "wall_out_s": t2 - t1b}
    if s0 is not None:  # the broker's share: its pump still moves topic to channel
        res["server_cpu_us_per_msg_in"] = (s1 - s0) / total * 1e6
        res["server_cpu_us_per_msg_out"] = (s2 - s1) / total * 1e6
    return res


def run(ctx):
    a = ctx.args
    if a.nsqd_tcp_address:
        return {"skipped": "starts nsqshm itself (local clients attach to its shared memory)"}
    if ctx.quick:
        a.messages = min(a.messages, 200_000)
    a.window, a.rdy = 4, 2500
    tcp_spec = spec_for(a, publishers=a.procs, consumers=a.procs, batch=200)
    rows = []
    kinds = ("classic", "log") if a.log_partitions > 0 else ("classic",)
    with ctx.progress.task("local", (2 * len(kinds) + (len(kinds) > 1)) * ctx.runs()) as advance:
        for i in range(ctx.runs()):
            row = {}
            for kind in kinds:
                ctx.settle()
                with server(a, backlog=(a.messages, a.size)) as target:
                    wait_local(target)
                    topic = create_log_topic(target, a.log_partitions) if kind == "log" else None
                    local = run_local(target, a.messages, a.size, a.batch, a.procs, topic)
                advance()
                with server(a, backlog=(a.messages, a.size)) as target:
                    topic = create_log_topic(target, a.log_partitions) if kind == "log" else None
                    tcp = loadgen.run_phases(target, tcp_spec, topic=topic)
                advance()
                prefix = "" if kind == "classic" else "log_"
                row.update({f"{prefix}local": local, f"{prefix}tcp": tcp,
                            f"{prefix}ratio_in": local["in_msgs_per_s"] / tcp["in_msgs_per_s"],
                            f"{prefix}ratio_out": local["out_msgs_per_s"] / tcp["out_msgs_per_s"]})
                ctx.say(f"run {i + 1}, {kind} topic: local in "
                        f"{local['in_msgs_per_s'] / 1e6:6.2f} M msg/s, out "
                        f"{local['out_msgs_per_s'] / 1e6:6.2f} M msg/s; TCP in "
                        f"{tcp['in_msgs_per_s'] / 1e6:6.2f} M, out "
                        f"{tcp['out_msgs_per_s'] / 1e6:6.2f} M")
            if "log_local" in row:  # the same consumers through the ring the owners fill
                ctx.settle()
                with server(a, backlog=(a.messages, a.size)) as target:
                    wait_local(target)
                    ring = run_local(target, a.messages, a.size, a.batch, a.procs,
                                     create_log_topic(target, a.log_partitions), direct=False)
                advance()
                row["log_ring"] = ring
                row["log_direct_ring_out"] = (row["log_local"]["out_msgs_per_s"]
                                              / ring["out_msgs_per_s"])
                ctx.say(f"run {i + 1}, log topic, consumers through the ring: out "
                        f"{ring['out_msgs_per_s'] / 1e6:6.2f} M msg/s (by cursor: "
                        f"{row['log_direct_ring_out']:.2f}x)")
            if "log_local" in row:  # the log topic's local figures against the classic's
                row["log_classic_in"] = (row["log_local"]["in_msgs_per_s"]
                                         / row["local"]["in_msgs_per_s"])
                row["log_classic_out"] = (row["log_local"]["out_msgs_per_s"]
                                          / row["local"]["out_msgs_per_s"])
            rows.append(row)
    summary = {key: medians([r[key] for r in rows]) for key in rows[0]
               if isinstance(rows[0][key], dict)}
    summary.update({key: median([r[key] for r in rows]) for key in rows[0]
                    if not isinstance(rows[0][key], dict)})
    return {"params": {"messages": a.messages, "size": a.size, "batch": a.batch, "procs": a.procs,
                       "log_partitions": a.log_partitions},
            "runs": rows, "median": summary}


def render(res):
    p, m = res["params"], res["median"]
    out = [f"{p['messages']:,} messages of {p['size']} B: {p['procs']} producer processes "
           f"(publish_buffer of {p['batch']:,}), then {p['procs']} consumer processes (fetch of "
           f"up to {p['batch']:,}, each batch finished at once); the same through TCP (MPUB of "
           f"200, RDY 2500), alternating; medians of {len(res['runs'])} runs, and of each "
           "run's ratio local / TCP (the runs pair up).", "",
           "| | local shared memory | TCP | local / TCP |", "|---|---:|---:|---:|"]
    for way, name in (("in", "publish, msg/s"), ("out", "consume, msg/s")):
        out.append(f"| {name} | {m['local'][f'{way}_msgs_per_s'] / 1e6:.2f} M | "
                   f"{m['tcp'][f'{way}_msgs_per_s'] / 1e6:.2f} M | {m[f'ratio_{way}']:.1f}x |")
    out += _cpu_rows(m["local"], m["tcp"], "| |")
    if "log_local" not in m:
        return out
    out += ["", f"A log topic of {p.get('log_partitions')} partitions, the same run: each "
            "publish_buffer call goes into one partition's inbound ring (in turn), the owners "
            "append to the logs; once the logs hold them all, the consumers read the partitions' "
            "logs themselves by cursor (Consumer's default on a standalone broker). "
            "Against TCP MPUBs to a log topic, and against the classic topic's local figures "
            "above.", "",
            "| log topic | local shared memory | TCP | local / TCP | local: log / classic |",
            "|---|---:|---:|---:|---:|"]
    for way, name in (("in", "publish, msg/s"), ("out", "consume, msg/s")):
        out.append(f"| {name} | {m['log_local'][f'{way}_msgs_per_s'] / 1e6:.2f} M | "
                   f"{m['log_tcp'][f'{way}_msgs_per_s'] / 1e6:.2f} M | "
                   f"{m[f'log_ratio_{way}']:.1f}x | {m[f'log_classic_{way}']:.2f} |")
    out += _cpu_rows(m["log_local"], m["log_tcp"], "| | |")
    if "log_ring" in m:
        out += ["", "The same consumers through the ring the owners fill from the logs "
                "(`Consumer(direct=False)`, as before they read the logs themselves), a fresh "
                "broker in the same run:", "",
                "| log topic, consume | by cursor (above) | through the ring | by cursor / ring |",
                "|---|---:|---:|---:|",
                f"| msg/s | {m['log_local']['out_msgs_per_s'] / 1e6:.2f} M | "
                f"{m['log_ring']['out_msgs_per_s'] / 1e6:.2f} M | "
                f"{m['log_direct_ring_out']:.2f}x |"]
        if "server_cpu_us_per_msg_out" in m["log_ring"] and \
                "server_cpu_us_per_msg_out" in m["log_local"]:
            out.append(f"| broker CPU per message | "
                       f"{m['log_local']['server_cpu_us_per_msg_out']:.2f} us | "
                       f"{m['log_ring']['server_cpu_us_per_msg_out']:.2f} us | |")
    return out


def _cpu_rows(local, tcp, tail):
    """The broker's CPU per message, each way, where both runs measured it."""
    rows = []
    for way in ("in", "out"):
        key = f"server_cpu_us_per_msg_{way}"
        if key in local and key in tcp:
            rows.append(f"| broker CPU per message {way} | {local[key]:.2f} us | "
                        f"{tcp[key]:.2f} us {tail}")
    return rows
