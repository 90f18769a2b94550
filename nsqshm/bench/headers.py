"""What Youzan's message headers cost (issue 16): publish then consume on
one server, cases taking turns (which goes first alternates):

    plain     a classic topic, MPUB, a consumer without extend_support
    headers   an ext topic, MPUB_EXT with 100 B of JSON headers per message,
              a consumer with extend_support (the frames carry the headers)
    stripped  the same ext topic and messages, a consumer without
              extend_support (the headers cut out of each frame, in C)
    filter    the ext topic, a consumer whose ext_filter matches 1 message
              in 10 (the other 9 confirmed for the channel in C)
    traced    a classic topic with tracing on (POST /message/trace/enable):
              every PUB, delivery and FIN appended to the trace log

The load is this module's own (one connection publishing MPUB batches, then
one consuming at RDY 1000 with a FIN per message: Python on the client
side, the same for every case), so the figures are the ratios to "plain"
in the same run, not absolute rates.  Throughput counts messages published
(in) and messages the channel got rid of (out: delivered or filtered).
"""

import json
import socket
import struct
import time
import urllib.request
import uuid

from nsqshm import protocol as p

from .common import medians
from .server import mem_queue_size, post, start_nsqshm

ONE_SERVER = True  # one broker for every run (the cases take turns on it)
TITLE, ISSUE = "Message headers: 100 B of headers against none; a filter (issue 16)", "16"
HELP = ("throughput with 100 B of Youzan ext headers, stripped, filtered, traced, against plain "
        "(issue 16)")
CASES = ("plain", "headers", "stripped", "filter", "traced")
PLAIN = ("plain", "traced")  # MPUB to a classic topic
BATCH = 100
BODY = 100
HEADERS = 100


def add_arguments(ap):
    ap.add_argument("--messages", type=int, default=200_000)


def _headers(i):
    """100 bytes of JSON; "g" is "hit" for 1 message in 10."""
    head = b'{"g":"%s","pad":"' % (b"hit" if i % 10 == 0 else b"miss")
    return head + b"x" * (HEADERS - len(head) - 2) + b'"}'


def _batch(topic, case, first):
    bodies = [b"%0*d" % (BODY, first + k) for k in range(BATCH)]
    if case in PLAIN:
        return p.mpub(topic, bodies)
    parts = [struct.pack(">I", BATCH)]
    for k, body in enumerate(bodies):
        block = struct.pack(">H", HEADERS) + _headers(first + k) + body
        parts.append(struct.pack(">I", len(block)) + block)
    data = b"".join(parts)
    return b"MPUB_EXT %s\n" % topic.encode() + struct.pack(">I", len(data)) + data


class _Conn:
    def __init__(self, target):
        self.sock = socket.create_connection(target.tcp, timeout=30)
        self.sock.sendall(p.MAGIC_V2)
        self.dec = p.FrameDecoder()

    def frames(self):
        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionError("closed")
        self.dec.feed(data)
        return self.dec.frames()

    def responses(self):
        """The response frames of one read (heartbeats answered): how many."""
        got = 0
        for kind, data in self.frames():
            if kind == p.FRAME_TYPE_RESPONSE and data == b"_heartbeat_":
                self.sock.sendall(p.nop())
            elif kind == p.FRAME_TYPE_RESPONSE:
                got += 1
            else:
                raise RuntimeError(data)
        return got


def _publish(target, topic, case, n):
    c = _Conn(target)
    t0 = time.perf_counter()
    window = 8  # batches in flight
    sent = acked = 0
    while acked < n // BATCH:
        while sent < n // BATCH and sent - acked < window:
            c.sock.sendall(_batch(topic, case, sent * BATCH))
            sent += 1
        acked += c.responses()
    took = time.perf_counter() - t0
    c.sock.close()
    return n / took


def _consume(target, topic, case, n):
    c = _Conn(target)
    # a short output buffer timeout: a filtered stream fills the buffer slowly, and the
    # last messages would wait the default 250 ms
    ident = {"feature_negotiation": True, "extend_support": case == "headers",
             "output_buffer_timeout": 25}
    if case == "filter":
        ident["ext_filter"] = {"type": 1, "filter_ext_key": "g", "filter_data": "hit"}
    c.sock.sendall(p.identify(ident) + p.sub(topic, "ch0"))
    answered = 0
    while answered < 2:
        answered += c.responses()
    want = n // 10 if case == "filter" else n
    t0 = time.perf_counter()
    c.sock.sendall(p.rdy(1000))
    got, last_id = 0, None
    while got < want:
        fins = []
        for kind, data in c.frames():
            if kind == p.FRAME_TYPE_MESSAGE:
                last_id = data[10:26]
                fins.append(p.fin(last_id))
                got += 1
            elif data == b"_heartbeat_":
                fins.append(p.nop())
        if fins:
            c.sock.sendall(b"".join(fins))
    took = time.perf_counter() - t0
    c.sock.close()
    return n / took, last_id


def _trace_of(target, topic, msg_id):
    """The traced case's proof that tracing was on: the last message's events
    (its FIN is applied after the consumer's last send: waited for)."""
    host, port = target.http
    events = []
    for _ in range(100):
        url = f"http://{host}:{port}/message/trace?topic={topic}&id={msg_id.decode()}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            events = [e["event"] for e in json.loads(resp.read())["events"]]
        if events[-1:] == ["FIN"]:
            return events
        time.sleep(0.05)
    raise RuntimeError(f"the traced case recorded {events} for its last message")


def _round(target, case, n):
    topic = f"hb{uuid.uuid4().hex[:8]}"
    ext = "" if case in PLAIN else "&ext=true"
    post(target, f"/topic/create?topic={topic}{ext}")
    post(target, f"/channel/create?topic={topic}&channel=ch0")
    if case == "traced":
        post(target, f"/message/trace/enable?topic={topic}")
    try:
        s0 = target.cpu_seconds()
        res = {"in_msgs_per_s": _publish(target, topic, case, n)}
        s1 = target.cpu_seconds()
        res["out_msgs_per_s"], last_id = _consume(target, topic, case, n)
        s2 = target.cpu_seconds()
        if case == "traced":
            res["trace_of_last"] = _trace_of(target, topic, last_id)
        if s0 is not None:  # the server's CPU per message: what a busy machine disturbs less
            res["server_cpu_us_per_msg_in"] = (s1 - s0) / n * 1e6
            res["server_cpu_us_per_msg_out"] = (s2 - s1) / n * 1e6
        return res
    finally:
        post(target, f"/topic/delete?topic={topic}")


def run(ctx):
    a = ctx.args
    if a.nsqd_tcp_address:
        return {"skipped": "starts nsqshm itself (ext topics are Youzan's)"}
    n = min(a.messages, 50_000) if ctx.quick else a.messages
    n -= n % BATCH
    runs = {case: [] for case in CASES}
    target = start_nsqshm([f"--mem-queue-size={mem_queue_size(n, BODY + HEADERS + 3)}"])
    try:
        _round(target, "plain", n // 4)  # warm-up, not counted
        for k in range(ctx.runs()):
            for case in CASES if k % 2 == 0 else CASES[::-1]:
                ctx.settle()
                runs[case].append(_round(target, case, n))
    finally:
        target.close()
    rows = []
    for case in CASES:
        m = medians(runs[case])
        rows.append({"case": case, "runs": runs[case], "median": m})
        ctx.say(f"{case:>9}: in {m['in_msgs_per_s'] / 1e3:8.1f} k msg/s, "
                f"out {m['out_msgs_per_s'] / 1e3:8.1f} k msg/s; server CPU "
                f"{m.get('server_cpu_us_per_msg_in', 0):.2f} us/msg in, "
                f"{m.get('server_cpu_us_per_msg_out', 0):.2f} out")
    base = rows[0]["median"]
    ratio = {r["case"]: {way: r["median"][f"{way}_msgs_per_s"] / base[f"{way}_msgs_per_s"]
                         for way in ("in", "out")} for r in rows[1:]}
    for r in rows[1:]:
        case, q, m = r["case"], ratio[r["case"]], r["median"]
        cpu = {way: base[key] / m[key] for way in ("in", "out")
               if (key := f"server_cpu_us_per_msg_{way}") in base and m.get(key)}
        r["cpu_ratio"] = cpu  # plain's CPU per message / this case's: 1 = costs nothing more
        ctx.say(f"{case} / plain: throughput in {q['in']:.3f}, out {q['out']:.3f}; "
                + (f"server CPU per message (plain / {case}) in {cpu['in']:.3f}, "
                   f"out {cpu['out']:.3f}" if cpu else ""))
    return {"params": {"messages": n, "body": BODY, "headers": HEADERS, "batch": BATCH},
            "cases": rows, "ratio": ratio}


def render(res):
    out = ["| case | in msg/s | out msg/s | in / plain | out / plain "
           "| server CPU µs/msg in | out |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in res["cases"]:
        m = r["median"]
        q = res["ratio"].get(r["case"], {"in": 1.0, "out": 1.0})
        cpu = [f"{m[k]:.2f}" if (k := f"server_cpu_us_per_msg_{way}") in m else ""
               for way in ("in", "out")]
        out.append(f"| {r['case']} | {m['in_msgs_per_s'] / 1e3:,.0f} k | "
                   f"{m['out_msgs_per_s'] / 1e3:,.0f} k | {q['in']:.3f} | {q['out']:.3f} | "
                   f"{cpu[0]} | {cpu[1]} |")
    traced = [run.get("trace_of_last") for r in res["cases"] if r["case"] == "traced"
              for run in r["runs"]]
    if traced and all(traced):
        out += ["", f"Traced: in each of the {len(traced)} runs the last message's history "
                    f"was {', '.join(traced[0])} (GET /message/trace)."]
    out += ["", "Load: one Python publisher (MPUB / MPUB_EXT of 100), one Python consumer "
                "(RDY 1000, FIN each); ratios to plain in the same run.",
            "", "```", json.dumps(res["params"]), "```"]
    return out
