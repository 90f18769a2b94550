"""Consume throughput over TLS, snappy and deflate against plain TCP, in one run.

    nsqshm bench transport [--messages N] [--size 200] [--runs 3]
                           [--transports plain,tls,snappy,deflate,tls+snappy,tls+deflate]

The tcp suite's load (publishers send prebuilt MPUBs, consumers at RDY 2500
FIN everything) with consumers that negotiate a transport in IDENTIFY as a
client library does: TLS (the handshake, then the OK frame over it), snappy
(golang/snappy framing) or deflate (raw DEFLATE at level 6), alone or TLS
plus one of them.  The consumers decode in C (nsqshm._core.snappy, zlib,
OpenSSL), so the server is what is measured.  Publishing stays plain.

Message bodies are text that compresses about as JSON logs do (words from a
small vocabulary and numbers), a different body per message of a batch.
The transports of a round run back to back on fresh servers; ratios are
against plain TCP of the same round, medians over the rounds.
"""

import json
import random
import shutil
import ssl
import struct
import subprocess
import tempfile
import zlib

from nsqshm import protocol as p
from nsqshm._core.snappy import FrameDecoder, FrameEncoder

from . import loadgen
from .common import median
from .server import server
from .tcp import spec_for

TITLE, ISSUE = "Transports: TLS, snappy, deflate (issue 4)", "4"
HELP = "consume over TLS, snappy, deflate against plain TCP (issue 4)"
ALL = "plain,tls,snappy,deflate,tls+snappy,tls+deflate"
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


def negotiate(transport):
    """An opener for loadgen.consumer: connect, IDENTIFY and upgrade as a client does."""

    def opener(address):
        conn = loadgen.Conn(loadgen.connect(address))
        features = set(transport.split("+")) - {"plain"}
        conn.send(p.identify({"feature_negotiation": True, "tls_v1": "tls" in features,
                              "snappy": "snappy" in features, "deflate": "deflate" in features,
                              "deflate_level": 6}))
        size = struct.unpack(">I", conn.read_exact(4))[0]
        reply = json.loads(conn.read_exact(size)[4:])
        for f in features:
            if not reply.get({"tls": "tls_v1"}.get(f, f)):
                raise RuntimeError(f"the server did not negotiate {f}: {reply}")
        if "tls" in features:
            # the handshake and the cipher are what cost; checking our own throwaway
            # certificate (or an external server's) is not what is measured
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            conn.sock = ctx.wrap_socket(conn.sock, server_hostname="127.0.0.1")
            if conn.read_exact(10) != b"\x00\x00\x00\x06\x00\x00\x00\x00OK":
                raise RuntimeError("no OK after the TLS handshake")
        if "snappy" in features:
            enc, dec = FrameEncoder(), FrameDecoder()
            conn.encode, conn.decode = enc.encode, dec.decode
        elif "deflate" in features:
            c = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
            d = zlib.decompressobj(-zlib.MAX_WBITS)
            conn.encode = lambda data: c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
            conn.decode = d.decompress
        if "snappy" in features or "deflate" in features:
            conn.read_frames(1)  # the OK after the codec upgrade
        return conn

    return opener


def add_arguments(ap):
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch-size", "--batch", dest="batch", type=int, default=200)
    ap.add_argument("--window", type=int, default=4, help="MPUBs outstanding per publisher")
    ap.add_argument("--rdy", type=int, default=2500)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--transports", default=ALL)


def _certs():
    """A throwaway self-signed certificate (openssl); None without openssl."""
    d = tempfile.mkdtemp(prefix="nsqshm-bench-certs-")
    try:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                        "-keyout", f"{d}/server.key", "-out", f"{d}/server.pem"],
                       check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return d


def run(ctx):
    a = ctx.args
    if ctx.quick:
        a.messages = min(a.messages, 100_000)
    transports = ["plain"] + [t for t in a.transports.split(",") if t and t != "plain"]
    certs = None if a.nsqd_tcp_address else _certs()
    if not certs and not a.nsqd_tcp_address:
        ctx.say("openssl failed to make a certificate: TLS skipped")
        transports = [t for t in transports if "tls" not in t]
    tls_flags = [f"--tls-cert={certs}/server.pem", f"--tls-key={certs}/server.key",
                 "--https-address="] if certs else []
    bodies = make_bodies(a.batch, a.size)
    ratio = len(zlib.compress(b"".join(bodies), 6)) / len(b"".join(bodies))
    spec = spec_for(a)
    rounds = []
    try:
        with ctx.progress.task("transport", ctx.runs() * len(transports)) as advance:
            for i in range(ctx.runs()):
                row = {}
                for transport in transports:
                    ctx.settle()
                    opener = negotiate(transport)
                    extra = tls_flags if "tls" in transport else ()
                    with server(a, extra=extra, backlog=(spec.messages, spec.size)) as target:
                        r = loadgen.run_phases(target, spec, opener=opener, bodies=bodies)
                    row[transport] = r
                    cpu = r.get("server_cpu_us_per_msg_out")
                    ctx.say(f"round {i + 1} {transport:>11}: out {r['out_msgs_per_s'] / 1e3:7.1f} k "
                            f"msg/s, server CPU {cpu if cpu is None else round(cpu, 2)} us/msg out, "
                            f"{r['wire_bytes_per_msg']:.1f} wire bytes/msg, consumer CPU "
                            f"{r['client_cpu_out_s']:.2f} s / {r['wall_out_s']:.2f} s wall")
                    advance()
                rounds.append(row)
    finally:
        if certs:
            shutil.rmtree(certs, ignore_errors=True)
    summary = {}
    for t in transports:
        rows = [r[t] for r in rounds]
        summary[t] = {
            "out_msgs_per_s": median([r["out_msgs_per_s"] for r in rows]),
            "server_cpu_us_per_msg_out": median([r.get("server_cpu_us_per_msg_out") for r in rows]),
            "wire_bytes_per_msg": median([r["wire_bytes_per_msg"] for r in rows]),
            "ratio_vs_plain": median([r[t]["out_msgs_per_s"] / r["plain"]["out_msgs_per_s"]
                                      for r in rounds]),
        }
        if summary[t]["server_cpu_us_per_msg_out"] is not None:
            summary[t]["cpu_ratio_vs_plain"] = median(
                [r[t]["server_cpu_us_per_msg_out"] / r["plain"]["server_cpu_us_per_msg_out"]
                 for r in rounds])
        ctx.say(f"median {t:>11}: {summary[t]['out_msgs_per_s'] / 1e3:7.1f} k msg/s out "
                f"({summary[t]['ratio_vs_plain']:.2f} of plain)")
    return {"params": {**vars(spec), "transports": transports, "deflate6_ratio": ratio},
            "rounds": rounds, "median": summary}


def render(res):
    p = res["params"]
    out = [f"{p['messages']:,} messages of {p['size']} B of log-like text (deflate -6 alone: "
           f"{p['deflate6_ratio']:.2f} of the size), published plain, consumed by "
           f"{p['consumers']} consumers at RDY {p['rdy']} over the transport; a fresh server per "
           f"transport, the transports of a round back to back; medians of {len(res['rounds'])} "
           "rounds, ratios against plain TCP of the same round.", "",
           "| transport | consume k msg/s | of plain | server CPU us/msg | x plain | wire bytes/msg |",
           "|---|---:|---:|---:|---:|---:|"]
    for t, m in res["median"].items():
        cpu = m.get("server_cpu_us_per_msg_out")
        out.append(f"| {t} | {m['out_msgs_per_s'] / 1e3:,.1f} | {m['ratio_vs_plain']:.2f} | "
                   + (f"{cpu:.2f} | {m['cpu_ratio_vs_plain']:.2f} | " if cpu is not None
                      else "- | - | ") + f"{m['wire_bytes_per_msg']:.1f} |")
    return out
