"""Publish and consume over TCP, with the server's CPU time per message.

    python -m bench.tcp [--messages N] [--size 200] [--batch 200] [--rdy 2500]
                        [--publishers 2] [--consumers 2] [--address HOST:PORT --pid PID]

Like NSQ's bench_writer then bench_reader: publishers send MPUB batches,
consumers subscribe at RDY 2500 and FIN every message.  The channel exists
before publishing, so the publish phase includes the topic-to-channel pump.
The server is `nsqshm start` on ephemeral ports unless --address (another
NSQ-compatible server; --pid lets its CPU be read) is given.

The load generator keeps Python off the per-message path: a publisher
resends one prebuilt MPUB command (the server assigns IDs), and a consumer
turns each chunk it receives into FIN lines in one C call
(nsqshm._core.wire.scan_deliveries).  The CPU the clients use is reported
too, so a client-bound figure is visible as such.
"""

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

from nsqshm._core.wire import scan_deliveries

from nsqshm import protocol as p

CTX = mp.get_context("fork")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def connect(address):
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(p.MAGIC_V2)
    return sock


def read_responses(sock, n, dec):
    """Read until at least n responses came; returns how many did."""
    got = 0
    while got < n:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        dec.feed(data)
        for ftype, payload in dec.frames():
            if ftype == p.FRAME_TYPE_ERROR:
                raise RuntimeError(payload.decode())
            if payload != p.HEARTBEAT:
                got += 1
    return got


def publisher(address, topic, count, size, batch, window, ready, go, cpu_out, idx, bodies=None):
    sock = connect(address)
    command = p.mpub(topic, bodies or [b"x" * size] * batch)
    dec = p.FrameDecoder()
    ready.wait()
    go.wait()
    t0 = os.times()
    batches = count // batch
    sent = 0
    outstanding = 0
    while sent < batches:
        k = min(window - outstanding, batches - sent)
        sock.sendall(command * k)
        sent += k
        outstanding += k
        outstanding -= read_responses(sock, 1, dec)
    if outstanding:
        read_responses(sock, outstanding, dec)
    t1 = os.times()
    cpu_out[idx] = (t1.user - t0.user) + (t1.system - t0.system)
    sock.close()


def consumer(address, topic, channel, rdy, ready, go, stop, counts, cpu_out, idx):
    sock = connect(address)
    sock.sendall(p.identify({"feature_negotiation": False}) + p.sub(topic, channel))
    dec = p.FrameDecoder()
    read_responses(sock, 2, dec)
    ready.wait()
    go.wait()
    t0 = os.times()
    sock.sendall(p.rdy(rdy))
    buf = bytearray()
    fins = bytearray()
    sock.settimeout(0.2)
    while not stop.is_set():
        try:
            data = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not data:
            break
        buf += data
        used, messages, _ = scan_deliveries(buf, fins)
        del buf[:used]
        if fins:
            sock.sendall(fins)
            del fins[:]
        counts[idx] += messages
    t1 = os.times()
    cpu_out[idx] = (t1.user - t0.user) + (t1.system - t0.system)
    sock.close()


# -- the raw-socket baseline: a server that only frames bytes --------------------------
#
# The same publishers and consumers against the least a server must do: an MPUB
# sink that skips each body and answers OK, and a source that streams prebuilt
# message frames in windows of RDY and reads back the FINs.  The ratio against
# it says how much of loopback TCP with this load generator nsqshm leaves unused.

OK_FRAME = struct.pack(">II", 6, 0) + b"OK"


def _raw_conn(conn, size, rdy, per_consumer):
    buf = bytearray()
    frame = struct.pack(">II", 4 + 26 + size, 2) + struct.pack(">QH", time.time_ns(), 1)

    def need(n):
        while len(buf) < n:
            data = conn.recv(1 << 20)
            if not data:
                raise EOFError
            buf.extend(data)

    try:
        need(4)
        del buf[:4]
        while True:
            while b"\n" not in buf:
                need(len(buf) + 1)
            i = buf.index(b"\n")
            verb = bytes(buf[:i]).split(b" ")[0]
            del buf[:i + 1]
            if verb in (b"MPUB", b"IDENTIFY", b"PUB"):
                need(4)
                n = struct.unpack(">I", buf[:4])[0]
                need(4 + n)
                del buf[:4 + n]
                conn.sendall(OK_FRAME)
            elif verb == b"SUB":
                conn.sendall(OK_FRAME)
            elif verb == b"RDY":
                window = b"".join(frame + f"{k:016x}".encode() + b"x" * size
                                  for k in range(rdy))
                sent = 0
                while sent < per_consumer:
                    k = min(rdy, per_consumer - sent)
                    conn.sendall(window if k == rdy else window[:k * (34 + size)])
                    sent += k
                    need(21 * k)  # the FINs for this window
                    del buf[:21 * k]
    except (EOFError, OSError):
        pass
    conn.close()


def raw_server(listener, size, rdy, per_consumer):
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            _raw_conn(conn, size, rdy, per_consumer)
            os._exit(0)
        conn.close()


def start_raw_server(size, rdy, per_consumer):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    proc = CTX.Process(target=raw_server, args=(listener, size, rdy, per_consumer), daemon=True)
    proc.start()
    listener.close()
    return proc, ("127.0.0.1", port)


def start_server(extra):
    prefix = f"nsqshm-bench-{uuid.uuid4().hex[:8]}"
    data = tempfile.mkdtemp(prefix="nsqshm-bench-")
    cmd = [sys.executable, "-m", "nsqshm.cli", "start", "--tcp-address=127.0.0.1:0",
           "--http-address=127.0.0.1:0", f"--data-path={data}", f"--shm-prefix={prefix}", *extra]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    ports = {}
    while len(ports) < 2:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError("server did not start")
        m = re.search(r"(TCP|HTTP): listening on \S+:(\d+)", line)
        if m:
            ports[m.group(1)] = int(m.group(2))
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # never block its stderr
    return proc, ("127.0.0.1", ports["TCP"]), prefix, ports["HTTP"]


def channel_stats(http_port, topic):
    url = f"http://127.0.0.1:{http_port}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        stats = json.load(resp)
    return stats["topics"][0]["channels"][0]


def cleanup_server(proc, prefix):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    for entry in os.listdir("/dev/shm"):
        if entry.startswith(prefix):
            os.unlink(f"/dev/shm/{entry}")


def run(args, raw=False, consumer_fn=None, server_args=(), bodies=None):
    """One run.  bench.transport passes consumers that upgrade their
    connection (consumer_fn), the server's TLS flags and message bodies."""
    consumer_fn = consumer_fn or consumer
    proc = raw_proc = None
    http_port = args.http_port
    per = args.messages // args.publishers // args.batch * args.batch
    if raw:
        raw_proc, address = start_raw_server(args.size, args.rdy,
                                             per * args.publishers // args.consumers)
        pid = http_port = None
    elif args.address:
        host, port = args.address.rsplit(":", 1)
        address, pid = (host, int(port)), args.pid
    else:
        # room for the whole backlog in memory: the disk queue is not in this measurement
        need = args.messages * (args.size + 34) // 512 * 2
        proc, address, prefix, http_port = start_server([f"--mem-queue-size={need}",
                                                          *server_args])
        pid = proc.pid
    topic = f"bench{uuid.uuid4().hex[:6]}"
    ready, go, stop = CTX.Event(), CTX.Event(), CTX.Event()
    counts = CTX.RawArray("Q", args.consumers)
    ccpu = CTX.RawArray("d", args.consumers)
    pcpu = CTX.RawArray("d", args.publishers)
    cons = [CTX.Process(target=consumer_fn, args=(address, topic, "ch", args.rdy, ready, go,
                                                  stop, counts, ccpu, i))
            for i in range(args.consumers)]
    for c in cons:  # subscribe (creates the channel) but hold RDY until the read phase
        c.start()
    time.sleep(0.5)
    total = per * args.publishers
    pub_go = CTX.Event()
    pubs = [CTX.Process(target=publisher, args=(address, topic, per, args.size, args.batch,
                                                args.window, ready, pub_go, pcpu, i, bodies))
            for i in range(args.publishers)]
    for x in pubs:
        x.start()
    ready.set()
    time.sleep(0.5)
    s0 = cpu_seconds(pid) if pid else None
    t0 = time.perf_counter()
    pub_go.set()
    for x in pubs:
        x.join()
    t1 = time.perf_counter()
    time.sleep(0.2)  # let the pump finish moving the tail into the channel
    s1 = cpu_seconds(pid) if pid else None
    go.set()
    while sum(counts) < total:
        if not any(c.is_alive() for c in cons):
            raise RuntimeError(f"every consumer exited after {sum(counts)} of {total} messages")
        time.sleep(0.001)
    t2 = time.perf_counter()
    s2 = cpu_seconds(pid) if pid else None
    finished = None
    if http_port:  # every message FINished: nothing left in flight, nothing requeued
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ch = channel_stats(http_port, topic)
            if ch["in_flight_count"] == 0 and ch["depth"] == 0:
                break
            time.sleep(0.01)
        finished = {k: ch[k] for k in ("message_count", "in_flight_count", "depth",
                                       "requeue_count", "timeout_count")}
    stop.set()
    for c in cons:
        c.join(5)
    if proc is not None:
        cleanup_server(proc, prefix)
    if raw_proc is not None:
        raw_proc.kill()
        raw_proc.join()
    res = {
        "messages": total, "size": args.size, "batch": args.batch, "rdy": args.rdy,
        "publishers": args.publishers, "consumers": args.consumers,
        "in_msgs_per_s": total / (t1 - t0), "out_msgs_per_s": total / (t2 - t1),
        "client_cpu_in_s": sum(pcpu), "client_cpu_out_s": sum(ccpu),
        "wall_in_s": t1 - t0, "wall_out_s": t2 - t1, "channel_after": finished,
    }
    if pid:
        res["server_cpu_us_per_msg_in"] = (s1 - s0) / total * 1e6
        res["server_cpu_us_per_msg_out"] = (s2 - s1) / total * 1e6
        res["server_cpu_in_s"] = s1 - s0
        res["server_cpu_out_s"] = s2 - s1
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch", type=int, default=200, help="messages per MPUB")
    ap.add_argument("--window", type=int, default=4, help="MPUBs outstanding per publisher")
    ap.add_argument("--rdy", type=int, default=2500)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="runs; medians are reported")
    ap.add_argument("--address", help="an already running server HOST:PORT")
    ap.add_argument("--pid", type=int, help="its pid, to read its CPU time")
    ap.add_argument("--http-port", type=int, help="its HTTP port, to check /stats afterwards")
    ap.add_argument("--no-baseline", action="store_true", help="skip the raw-socket baseline")
    ap.add_argument("--json", help="write the runs and medians here")
    args = ap.parse_args(argv)
    runs, raws = [], []
    for i in range(args.runs):
        if not args.no_baseline and not args.address:
            raws.append(run(args, raw=True))
            print(f"raw-socket baseline {i + 1}: in {raws[-1]['in_msgs_per_s'] / 1e3:7.1f} k msg/s,"
                  f" out {raws[-1]['out_msgs_per_s'] / 1e3:7.1f} k msg/s", flush=True)
        r = run(args)
        runs.append(r)
        line = (f"run {i + 1}: in {r['in_msgs_per_s'] / 1e3:7.1f} k msg/s, "
                f"out {r['out_msgs_per_s'] / 1e3:7.1f} k msg/s")
        if "server_cpu_us_per_msg_in" in r:
            line += (f"; server CPU {r['server_cpu_us_per_msg_in']:.2f} us/msg in, "
                     f"{r['server_cpu_us_per_msg_out']:.2f} us/msg out")
        line += (f"; client CPU {r['client_cpu_in_s']:.2f} s in / {r['wall_in_s']:.2f} s wall, "
                 f"{r['client_cpu_out_s']:.2f} s out / {r['wall_out_s']:.2f} s wall")
        print(line, flush=True)

    def median(rows, key):
        values = sorted(r[key] for r in rows if key in r)
        return values[len(values) // 2] if values else None

    summary = {k: median(runs, k) for k in runs[0] if isinstance(runs[0][k], float)}
    if raws:
        for way in ("in", "out"):
            summary[f"raw_{way}_msgs_per_s"] = median(raws, f"{way}_msgs_per_s")
            summary[f"ratio_{way}_vs_raw_socket"] = (summary[f"{way}_msgs_per_s"]
                                                   / summary[f"raw_{way}_msgs_per_s"])
    print("median: " + ", ".join(f"{k}={v:.3f}" for k, v in summary.items() if v is not None))
    print(f"channel after the last run: {runs[-1]['channel_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "raw_socket": raws, "median": summary},
                      f, indent=2)
    return summary


if __name__ == "__main__":
    main()
