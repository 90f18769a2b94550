"""Replicated publish (issue 17) against a standalone log topic, in the same run:

    nsqshm bench replication [--runs 3] [--seconds 3] [--size 200] [--batch 20]
                             [--connections 4,16] [--workers 1] [--out bench]
    python -m nsqshm.bench.replication ...   (the same, printed; --json)

Starts a real etcd (Debian's etcd-server) on 127.0.0.1, an nsqlookupd and three nsqd
in cluster mode on distinct loopback addresses (127.0.0.2-4, as three hosts without
network namespaces: needs no root), and one standalone nsqd.  For replicator 1, 2 and
3 it creates a one-partition topic through the nsqlookupd, finds its leader with
`/lookup?access=w` and publishes to it; then to a one-partition log topic of the
standalone nsqd.  Each case: N clients, each sending `MPUB <topic> 0` batches of
--batch messages one after the other (each waits for its OK) for --seconds, for each
N of --connections (4: a light load, where a batch's round trip to the followers sets
the rate; 16: more PUBs waiting together, so each replication frame carries more).
Prints msg/s and the p50/p99 latency of a batch (send to OK), with the ratios to
replicator 1 and to the standalone log topic, per load.
"""

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from nsqshm.consistence.etcd.session import EtcdSession
from nsqshm.consistence.topology import Topology

from .common import medians
from .server import LISTEN, start_nsqshm

TITLE, ISSUE = "Replicated publish: replicator 1, 2 and 3 (issue 17)", "17"
HELP = "replicated log topics: publish msg/s, p50/p99 with replicator 1, 2, 3 (issue 17)"
RPC_PORT = 4250
ETCD = shutil.which("etcd")


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_etcd(data):
    client, peer = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([ETCD, "--name", "bench", "--data-dir", os.path.join(data, "etcd"),
                             "--listen-client-urls", client, "--advertise-client-urls", client,
                             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                             "--initial-cluster", f"bench={peer}",
                             "--log-outputs", os.path.join(data, "etcd.log"), "--logger", "zap"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 20
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(client + "/health", timeout=0.5) as resp:
                if json.loads(resp.read()).get("health") == "true":
                    return proc, client.removeprefix("http://")
        except (OSError, ValueError):
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("etcd did not come up")


def start_lookupd(extra):
    proc = subprocess.Popen([sys.executable, "-m", "nsqshm.cli", "lookupd",
                             "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                             "--broadcast-address=127.0.0.1", *extra],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    ports = {}
    for line in proc.stderr:
        m = LISTEN.search(line)
        if m:
            ports[m.group(1)] = int(m.group(3))
            if len(ports) == 2:
                break
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, f"http://127.0.0.1:{ports['HTTP']}"


def post(url):
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def create_replicated(lookupd, topic, replicator, timeout=20):
    end = time.monotonic() + timeout
    while True:  # until the nodes are registered
        status, body = post(f"{lookupd}/topic/create?topic={topic}&partition_num=1"
                            f"&replicator={replicator}")
        if status == 200:
            break
        if time.monotonic() > end:
            raise RuntimeError(f"topic create: {status} {body!r}")
        time.sleep(0.2)
    while time.monotonic() < end:  # until it has a leader
        with urllib.request.urlopen(f"{lookupd}/lookup?topic={topic}&access=w", timeout=5) as r:
            leader = json.loads(r.read())["partitions"].get("0")
        if leader:
            return leader["broadcast_address"], leader["tcp_port"]
        time.sleep(0.1)
    raise RuntimeError(f"{topic}: no leader")


def mpub_frame(topic, batch, size):
    body = b"x" * size
    msgs = struct.pack(">I", batch) + (struct.pack(">I", size) + body) * batch
    return b"MPUB %s 0\n" % topic.encode() + struct.pack(">I", len(msgs)) + msgs


def load(address, topic, args, connections):
    """`connections` clients for --seconds: (msg/s, latencies of every batch)."""
    frame = mpub_frame(topic, args.batch, args.size)
    latencies, counts, errors = [], [], []
    start_at = time.monotonic() + 0.2
    stop_at = start_at + args.seconds

    def client():
        sock = socket.create_connection(address, timeout=30)
        sock.sendall(b"  V2")
        mine, n = [], 0
        while time.monotonic() < start_at:
            time.sleep(0.001)
        while time.monotonic() < stop_at:
            t = time.perf_counter()
            sock.sendall(frame)
            head = _recv(sock, 8)
            size, kind = struct.unpack(">ii", head)
            data = _recv(sock, size - 4)
            if kind != 0 or data != b"OK":
                errors.append(data)
                break
            mine.append(time.perf_counter() - t)
            n += args.batch
        sock.close()
        latencies.extend(mine)
        counts.append(n)

    threads = [threading.Thread(target=client) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{topic}: {errors[0]!r}")
    return sum(counts) / args.seconds, sorted(latencies)


def _recv(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def pct(sorted_values, q):
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def add_arguments(ap):
    ap.add_argument("--seconds", type=float, default=3.0, help="each case's length")
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch", type=int, default=20, help="messages per MPUB")
    ap.add_argument("--connections", type=_loads, default=[4, 16],
                    help="comma-separated numbers of publishing connections, a load each")
    ap.add_argument("--workers", type=int, default=1, help="workers per nsqd")


def _loads(text):
    try:
        loads = [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not loads or min(loads) < 1:
        raise argparse.ArgumentTypeError(f"each load needs a connection or more: {text!r}")
    return loads


def measure(args):
    """One round: the standalone log topic, then replicator 1, 2 and 3, each on a
    fresh cluster's topic, each at every load: {"<connections>": {case: row}}."""
    data = tempfile.mkdtemp(prefix="nsqshm-bench-repl-")
    procs, targets = [], []
    try:
        etcd, endpoint = start_etcd(data)
        procs.append(etcd)
        cluster = [f"--cluster-leadership-addresses={endpoint}", "--cluster-lease-ttl=6s"]
        lookupd, lookupd_http = start_lookupd(cluster)
        procs.append(lookupd)
        for i in range(3):
            ip = f"127.0.0.{2 + i}"
            targets.append(start_nsqshm([f"--workers={args.workers}", f"--tcp-address={ip}:0",
                                         f"--http-address={ip}:0", f"--broadcast-address={ip}",
                                         f"--rpc-port={RPC_PORT}", *cluster]))
        standalone = start_nsqshm([f"--workers={args.workers}"])
        targets.append(standalone)
        host, port = standalone.http
        status, body = post(f"http://{host}:{port}/topic/create?topic=solo&partition_num=1")
        if status != 200:
            raise RuntimeError(f"standalone log topic: {status} {body!r}")
        results = {c: {"standalone": load(standalone.tcp, "solo", args, c)}
                   for c in args.connections}
        isr_sizes = {c: {} for c in args.connections}
        for r in (1, 2, 3):
            leader = create_replicated(lookupd_http, f"rep{r}", r)
            for c in args.connections:
                results[c][f"replicator {r}"] = load(leader, f"rep{r}", args, c)
                # a follower dropped from the ISR meanwhile: the figure would then not
                # be of replicated publishing any more (printed, so a reader sees it)
                isr_sizes[c][f"replicator {r}"] = isr_size(endpoint, f"rep{r}")
    finally:
        for t in targets:
            t.close()
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(data, ignore_errors=True)
    return {str(c): _rows(cases, isr_sizes[c]) for c, cases in results.items()}


def isr_size(endpoint, topic):
    """The ISR size of topic-0 in etcd.  A session per read: the load's threads
    block this process's gevent hub, which would keep a longer one's lease alive."""
    session = EtcdSession(endpoint, ttl=10).start()
    try:
        return len(Topology(session, "nsq-test-cluster").partition(topic, 0).replicas.isr)
    finally:
        session.close()


def _rows(results, isr_sizes):
    base, one = results["standalone"][0], results["replicator 1"][0]
    return {name: {"msgs_per_s": rate, "p50_ms": pct(lat, 0.5) * 1e3,
                   "p99_ms": pct(lat, 0.99) * 1e3, "ratio_to_replicator_1": rate / one,
                   "ratio_to_standalone": rate / base, "isr_at_end": isr_sizes.get(name, 1)}
            for name, (rate, lat) in results.items()}


def combine(rounds):
    """Per load and case, the medians of the rounds (ratios: the median of each
    round's own); the ISR at the end: the smallest seen."""
    out = {}
    for c in rounds[0]:
        out[c] = {}
        for name in rounds[0][c]:
            rows = [r[c][name] for r in rounds]
            out[c][name] = {**medians(rows), "isr_at_end": min(r["isr_at_end"] for r in rows)}
    return out


def _params(a, rounds):
    return {"batch": a.batch, "size": a.size, "connections": a.connections,
            "seconds": a.seconds, "workers": a.workers, "rounds": rounds}


def _loads_of(res):
    """{"<connections>": cases}; a result recorded before the loads (one, "cases")
    reads as that one load."""
    return res.get("loads") or {str(res["params"]["connections"]): res["cases"]}


def lines(res):
    p = res["params"]
    out = [f"MPUB of {p['batch']} x {p['size']} B, {p['seconds']:g} s each, "
           f"{p['workers']} worker(s) per nsqd, one partition, "
           f"median of {p['rounds']} round(s)"]
    for c, cases in _loads_of(res).items():
        out.append(f"  {c + ' connections':14s} {'msg/s':>10s} {'p50 batch':>10s} {'p99 batch':>10s} "
                   f"{'/ repl. 1':>9s} {'/ standalone':>12s} {'ISR at end':>10s}")
        for name, row in cases.items():
            out.append(f"  {name:14s} {row['msgs_per_s']:10.0f} {row['p50_ms']:8.2f}ms "
                       f"{row['p99_ms']:8.2f}ms {row['ratio_to_replicator_1']:9.2f} "
                       f"{row['ratio_to_standalone']:12.2f} {row['isr_at_end']:10d}")
    return out


def run(ctx):
    a = ctx.args
    if ETCD is None:
        return {"skipped": "etcd is not installed (scripts/setup.sh installs etcd-server)"}
    if getattr(a, "nsqd_tcp_address", None):
        return {"skipped": "starts its own cluster of nsqshm nodes"}
    rounds = []
    for _ in range(ctx.runs()):
        ctx.settle()
        rounds.append(measure(a))
    res = {"params": _params(a, len(rounds)), "loads": combine(rounds), "rounds": rounds,
           "server": {"kind": "three nsqshm nodes in cluster mode (127.0.0.2-4, a real etcd, "
                              "an nsqlookupd) and a standalone nsqshm, fresh per round"}}
    for line in lines(res):
        ctx.say(line)
    return res


def render(res):
    p = res["params"]
    out = [f"MPUB batches of {p['batch']} x {p['size']} B, each connection sending one after "
           f"the other (each waits for its OK), {p['seconds']:g} s per case and load, to a "
           f"one-partition topic's leader; three nsqd in cluster mode on 127.0.0.2-4 with a "
           f"real etcd, {p['workers']} worker(s) each; medians of {p['rounds']} round(s), "
           f"each on a fresh cluster."]
    short = set()
    for c, cases in _loads_of(res).items():
        out += ["", f"{c} connections:", "",
                "| | msg/s | p50 batch | p99 batch | / replicator 1 | / standalone | ISR at end |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        for name, row in cases.items():
            out.append(f"| {name} | {row['msgs_per_s']:,.0f} | {row['p50_ms']:.2f} ms | "
                       f"{row['p99_ms']:.2f} ms | {row['ratio_to_replicator_1']:.2f} | "
                       f"{row['ratio_to_standalone']:.2f} | "
                       f"{row['isr_at_end'] if name != 'standalone' else ''} |")
        short |= {f"replicator {r}" for r in (2, 3)
                  if cases[f"replicator {r}"]["isr_at_end"] < r}
    out += ["", "The ISR column is the smallest seen at the end of a round: "
            + ("every follower stayed in it, so every figure is of replicated publishing."
               if not short else f"a follower left it in {', '.join(sorted(short))}: that "
               f"figure is partly of publishing no longer replicated to it.")]
    return out


def targets(res):
    """Issue 17 names no target: the ratios to replicator 1, shown in the tables."""
    rows = []
    for c, cases in _loads_of(res).items():
        for r in (2, 3):
            row = cases[f"replicator {r}"]
            rows.append(("17", f"publish msg/s, replicator {r} / replicator 1, {c} connections "
                               f"(p99 batch)", "-",
                         f"{row['ratio_to_replicator_1']:.2f} ({row['p99_ms']:.2f} ms)", None))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if ETCD is None:
        print("etcd is not installed (scripts/setup.sh installs Debian's etcd-server)")
        return 1
    rounds = [measure(args) for _ in range(args.runs)]
    res = {"params": _params(args, len(rounds)), "loads": combine(rounds)}
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
        return 0
    print("\n".join(lines(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
