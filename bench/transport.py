"""Consume throughput over TLS, snappy and deflate against plain TCP, in one run.

    python -m bench.transport [--messages N] [--size 200] [--runs 3]
                              [--transports plain,tls,snappy,deflate,tls+snappy]

bench.tcp's load (publishers send prebuilt MPUBs, consumers at RDY 2500 FIN
everything) with consumers that negotiate a transport in IDENTIFY as a
client library does: TLS (the handshake, then the OK frame over it), snappy
(golang/snappy framing) or deflate (raw DEFLATE at level 6), alone or TLS
plus one of them.  The consumers decode in C (nsqshm._core.snappy, zlib,
OpenSSL) and find the messages with nsqshm._core.wire.scan_deliveries, so
the server is what is measured.  Publishing stays plain.

Message bodies are text that compresses about as JSON logs do (words from a
small vocabulary and numbers), a different body per message of a batch.
The transports of a round run back to back on fresh servers; ratios are
against plain TCP of the same round, medians over the rounds.
"""

import argparse
import json
import os
import random
import ssl
import struct
import tempfile
import time
import zlib

from nsqshm._core.snappy import FrameDecoder, FrameEncoder
from nsqshm._core.wire import scan_deliveries

from nsqshm import protocol as p

from . import tcp

WORDS = (b"user id name status ok error request response time ms path api v1 items count "
         b"true false null region eu us host web db cache hit miss level info warn").split()


def make_bodies(n, size, seed=1):
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        while sum(len(x) + 1 for x in parts) < size:
            parts.append(rnd.choice(WORDS) if rnd.random() < 0.7
                         else str(rnd.randrange(10 ** rnd.randrange(1, 8))).encode())
        out.append(b" ".join(parts)[:size])
    return out


class Transport:
    """The client side of a negotiated connection: send() encodes, decode()
    turns what arrives into plain frames."""

    def __init__(self, sock):
        self.sock = sock
        self.encode = self.decode = None

    def send(self, data):
        self.sock.sendall(self.encode(data) if self.encode else data)

    def read_exact(self, n):
        buf = b""
        while len(buf) < n:
            data = self.sock.recv(n - len(buf))
            if not data:
                raise ConnectionError("closed")
            buf += data
        return buf

    def read_frames(self, pending, want):
        """Read until `want` whole frames are in pending+received; returns the rest."""
        buf = bytearray(pending)
        while True:
            pos, frames = 0, 0
            while len(buf) - pos >= 4:
                size = struct.unpack(">I", buf[pos:pos + 4])[0]
                if len(buf) - pos - 4 < size:
                    break
                if buf[pos + 4:pos + 8] == b"\x00\x00\x00\x01":
                    raise RuntimeError(bytes(buf[pos + 8:pos + 4 + size]).decode())
                pos += 4 + size
                frames += 1
            if frames >= want:
                return bytes(buf[pos:])
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed")
            buf += self.decode(data) if self.decode else data


def negotiate(address, transport, ca_file):
    """Connect, IDENTIFY and upgrade as a client does; a Transport."""
    sock = tcp.connect(address)
    t = Transport(sock)
    features = set(transport.split("+")) - {"plain"}
    sock.sendall(p.identify({"feature_negotiation": True, "tls_v1": "tls" in features,
                             "snappy": "snappy" in features, "deflate": "deflate" in features,
                             "deflate_level": 6}))
    size = struct.unpack(">I", t.read_exact(4))[0]
    reply = json.loads(t.read_exact(size)[4:])
    for f in features:
        assert reply[{"tls": "tls_v1"}.get(f, f)], (f, reply)
    if "tls" in features:
        ctx = ssl.create_default_context(cafile=ca_file)
        t.sock = ctx.wrap_socket(sock, server_hostname="127.0.0.1")
        assert t.read_exact(10) == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    if "snappy" in features:
        enc, dec = FrameEncoder(), FrameDecoder()
        t.encode, t.decode = enc.encode, dec.decode
    elif "deflate" in features:
        c = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
        d = zlib.decompressobj(-zlib.MAX_WBITS)
        t.encode = lambda data: c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
        t.decode = d.decompress
    pending = b""
    if "snappy" in features or "deflate" in features:
        pending = t.read_frames(b"", 1)  # the OK after the codec upgrade
    return t, pending


def transport_consumer(transport, ca_file, wire_out):
    """A bench.tcp consumer whose connection is upgraded to `transport`;
    wire_out[idx] gets the bytes received on the socket."""

    def consumer(address, topic, channel, rdy, ready, go, stop, counts, cpu_out, idx):
        t, pending = negotiate(address, transport, ca_file)
        t.send(p.sub(topic, channel))
        pending = t.read_frames(pending, 1)
        ready.wait()
        go.wait()
        t0 = os.times()
        t.send(p.rdy(rdy))
        buf = bytearray(pending)
        fins = bytearray()
        sock, decode = t.sock, t.decode
        sock.settimeout(0.2)
        wire = 0
        while not stop.is_set():
            try:
                data = sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not data:
                break
            wire += len(data)
            buf += decode(data) if decode else data
            used, messages, _ = scan_deliveries(buf, fins)
            del buf[:used]
            if fins:
                t.send(fins)
                del fins[:]
            counts[idx] += messages
        t1 = os.times()
        cpu_out[idx] = (t1.user - t0.user) + (t1.system - t0.system)
        wire_out[idx] = wire
        t.sock.close()

    return consumer


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch", type=int, default=200, help="messages per MPUB")
    ap.add_argument("--window", type=int, default=4, help="MPUBs outstanding per publisher")
    ap.add_argument("--rdy", type=int, default=2500)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3, help="rounds; medians are reported")
    ap.add_argument("--transports", default="plain,tls,snappy,deflate,tls+snappy")
    ap.add_argument("--json", help="write the runs and medians here")
    args = ap.parse_args(argv)
    args.address = None
    args.http_port = None
    transports = args.transports.split(",")
    if "plain" not in transports:
        transports.insert(0, "plain")

    from tests.nsqd.certs import make_certs

    certs = make_certs(tempfile.mkdtemp(prefix="nsqshm-bench-certs-"))
    tls_flags = [f"--tls-cert={certs['server']}.pem", f"--tls-key={certs['server']}.key",
                 "--https-address="]
    bodies = make_bodies(args.batch, args.size)
    ratio = len(zlib.compress(b"".join(bodies), 6)) / len(b"".join(bodies))
    print(f"{args.messages} messages of {args.size} bytes (deflate -6 alone: "
          f"{ratio:.2f} of the size), {args.consumers} consumers at RDY {args.rdy}", flush=True)
    rounds = []
    for i in range(args.runs):
        row = {}
        for transport in transports:
            wire = tcp.CTX.RawArray("Q", args.consumers)
            consumer = transport_consumer(transport, certs["ca"] + ".pem", wire)
            r = tcp.run(args, consumer_fn=consumer, bodies=bodies,
                        server_args=tls_flags if "tls" in transport else ())
            r["wire_bytes_per_msg"] = sum(wire) / r["messages"]
            row[transport] = r
            print(f"round {i + 1} {transport:>11}: out {r['out_msgs_per_s'] / 1e3:7.1f} k msg/s, "
                  f"server CPU {r['server_cpu_us_per_msg_out']:.2f} us/msg out, "
                  f"{r['wire_bytes_per_msg']:.1f} wire bytes/msg, "
                  f"consumer CPU {r['client_cpu_out_s']:.2f} s / {r['wall_out_s']:.2f} s wall",
                  flush=True)
        rounds.append(row)
        time.sleep(0.2)

    def median(values):
        values = sorted(values)
        return values[len(values) // 2]

    summary = {}
    for transport in transports:
        rows = [r[transport] for r in rounds]
        summary[transport] = {
            "out_msgs_per_s": median(r["out_msgs_per_s"] for r in rows),
            "server_cpu_us_per_msg_out": median(r["server_cpu_us_per_msg_out"] for r in rows),
            "wire_bytes_per_msg": median(r["wire_bytes_per_msg"] for r in rows),
            "ratio_vs_plain": median(r[transport]["out_msgs_per_s"] / r["plain"]["out_msgs_per_s"]
                                     for r in rounds),
            "cpu_ratio_vs_plain": median(r[transport]["server_cpu_us_per_msg_out"]
                                         / r["plain"]["server_cpu_us_per_msg_out"]
                                         for r in rounds),
        }
    print("median:")
    for transport, m in summary.items():
        print(f"  {transport:>11}: {m['out_msgs_per_s'] / 1e3:7.1f} k msg/s out "
              f"({m['ratio_vs_plain']:.2f} of plain), server CPU "
              f"{m['server_cpu_us_per_msg_out']:.2f} us/msg ({m['cpu_ratio_vs_plain']:.2f}x), "
              f"{m['wire_bytes_per_msg']:.1f} wire bytes/msg")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rounds": rounds, "median": summary}, f, indent=2)
    return summary


if __name__ == "__main__":
    main()
