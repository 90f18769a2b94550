"""Throughput against the number of workers (`nsqshm start --workers N`),
and the cost of the cross-worker hop (issue 6).

The tcp suite's publish-then-consume load against nsqshm started with
--workers 1, 2, ...; server CPU is the whole process tree's.  Until the
workers mode exists this suite says so and measures nothing: it probes
`--workers 2` first, and needs the flag accepted (not exit 2) *and* the
broker to run as more than one process (the flag is parsed, and ignored,
by the single-process broker).
"""

import json
import time
import urllib.request
import uuid

from nsqshm import protocol as p

from . import latency, loadgen
from .common import median, medians
from .server import ServerRejected, mem_queue_size, start_nsqshm
from .tcp import spec_for

TITLE, ISSUE = "Workers (issue 6)", "6"
HELP = "throughput with --workers 1, 2 (ratio) and the cross-worker hop (issue 6)"


def add_arguments(ap):
    ap.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    loadgen.add_load_arguments(ap, messages=1_000_000)


def available(probe=2, extra=(), wait=5.0):
    """None when `nsqshm start --workers probe` runs probe workers, else why not."""
    try:
        target = start_nsqshm([f"--workers={probe}", *extra])
    except ServerRejected as err:
        if err.returncode == 2:
            return "the server does not take --workers"
        return f"nsqshm start --workers {probe} failed: {err}"
    try:
        deadline = time.monotonic() + wait  # workers may be forked after the listen lines
        while target.processes() < 1 + probe and time.monotonic() < deadline:
            time.sleep(0.1)
        n = target.processes()
    finally:
        target.close()
    if n < 1 + probe:
        return (f"--workers {probe} is accepted but the broker runs as {n} process(es): "
                "it does not run workers")
    return None


def _http(target, path, method="GET"):
    req = urllib.request.Request(f"http://{target.http[0]}:{target.http[1]}{path}", method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def topic_owner(target, topic, tries=50):
    """The index of the worker that owns topic: ask /debug/nsqshm/worker until the owner
    answers (each request lands on a worker the kernel picks)."""
    for _ in range(tries):
        w = _http(target, "/debug/nsqshm/worker")
        if topic in w["owned_topics"]:
            return w["index"]
    return None


def _worker_of(target, topic, port):
    """Which worker holds the connection from local port `port` (/stats tags
    clients with nsqshm_worker when there are several)."""
    stats = _http(target, f"/stats?format=json&topic={topic}")
    clients = list(stats.get("producers") or [])
    for t in stats.get("topics") or []:
        for ch in t.get("channels") or []:
            clients += ch.get("clients") or []
    for c in clients:
        if c.get("remote_address", "").rpartition(":")[2] == str(port):
            return c.get("nsqshm_worker")
    return None


def pinned(target, worker, topic, subscribe, tries=60):
    """A connection that landed on `worker`: publishers PUB once to a probe
    topic (a producer shows in /stats), consumers SUB to topic, channel ch."""
    for _ in range(tries):
        sock = loadgen.connect(target.tcp)
        conn = loadgen.Conn(sock)
        if subscribe:
            conn.send(p.sub(topic, "ch"))
        else:
            conn.send(p.pub(topic + "_probe", b"probe"))
        conn.read_frames(1)
        if _worker_of(target, topic if subscribe else topic + "_probe",
                      sock.getsockname()[1]) == worker:
            return sock
        sock.close()
    raise RuntimeError(f"no connection landed on worker {worker} in {tries} tries")


CASES = (("publish and consume on the owner", "owner", "owner"),
         ("publish on the other worker", "other", "owner"),
         ("consume on the other worker", "owner", "other"),
         ("both on the other worker", "other", "other"))


def cross_worker_hop(ctx, a, rate=2000, seconds=3.0):
    """End-to-end latency at `rate` with the publisher and the consumer
    connected to the topic's owner (no hop) or to the other worker: PUB on a
    worker that does not own the topic goes into the shared topic ring and
    the owner's pump is woken; a consumer on the other worker is woken by the
    channel ring.  The cases take turns, ctx.runs() rounds, after a warm-up;
    medians per case.  The p50 difference is the hop's cost."""
    target = start_nsqshm(["--workers=2",
                           f"--mem-queue-size={mem_queue_size(int(rate * seconds), a.size)}"])
    runs = {case: [] for case, _, _ in CASES}
    try:
        topic = f"hop{uuid.uuid4().hex[:8]}"
        _http(target, f"/topic/create?topic={topic}", "POST")
        _http(target, f"/channel/create?topic={topic}&channel=ch", "POST")
        owner = topic_owner(target, topic)
        if owner is None:
            return {"skipped": "no worker said it owns the topic (/debug/nsqshm/worker)"}
        where = {"owner": owner, "other": 1 - owner}

        def one(pw, cw, secs):
            sub = pinned(target, cw, topic, subscribe=True)
            pub = pinned(target, pw, topic, subscribe=False)
            return latency.measure(target, rate, secs, a.size, a.rdy, 0.5, 100.0, topic=topic,
                                   pub_sock=pub, sub_sock=sub)

        one(owner, owner, 1.0)  # warm-up, not recorded
        for _ in range(ctx.runs()):
            for case, pw, cw in CASES:
                ctx.settle()
                runs[case].append(one(where[pw], where[cw], seconds))
    finally:
        target.close()
    rows = []
    for case, pw, cw in CASES:
        m = {k: median([r[k] for r in runs[case]]) for k in ("p50_us", "p99_us", "p999_us")}
        rows.append({"case": case, "publish_on": pw, "consume_on": cw, "runs": runs[case], **m})
    for r in rows:
        r["p50_added_us"] = r["p50_us"] - rows[0]["p50_us"]
        ctx.say(f"hop: {r['case']:>34}: p50 {r['p50_us']:7.0f} us ({r['p50_added_us']:+.0f}), "
                f"p99 {r['p99_us']:7.0f} us")
    return {"rate": rate, "seconds": seconds, "owner": owner, "cases": rows}


def run(ctx):
    a = ctx.args
    if a.nsqd_tcp_address:
        return {"skipped": "starts nsqshm itself (with --workers N); not for an external server"}
    why = available()
    if why:
        return {"skipped": why}
    if ctx.quick:
        a.messages = min(a.messages, 100_000)
    counts = [int(x) for x in a.workers.split(",") if x.strip()]
    spec = spec_for(a)
    rows = []
    with ctx.progress.task("workers", len(counts) * ctx.runs()) as advance:
        for n in counts:
            runs = []
            for _ in range(ctx.runs()):
                ctx.settle()
                target = start_nsqshm([f"--workers={n}",
                                       f"--mem-queue-size={mem_queue_size(a.messages, a.size)}"])
                try:
                    runs.append(loadgen.run_phases(target, spec))
                finally:
                    target.close()
                advance()
            m = medians(runs)
            rows.append({"workers": n, "runs": runs, "median": m})
            ctx.say(f"--workers {n}: in {m['in_msgs_per_s'] / 1e3:8.1f} k msg/s, "
                    f"out {m['out_msgs_per_s'] / 1e3:8.1f} k msg/s")
    base = rows[0]["median"]
    for r in rows:
        for way in ("in", "out"):
            r[f"ratio_{way}_vs_{counts[0]}"] = r["median"][f"{way}_msgs_per_s"] / base[f"{way}_msgs_per_s"]
    hop = cross_worker_hop(ctx, a) if 2 in counts else {"skipped": "needs --workers 2"}
    return {"params": vars(spec), "workers": rows, "cross_worker_hop": hop}


def render(res):
    first = res["workers"][0]["workers"]
    out = ["| workers | in msg/s | out msg/s | server CPU us/msg in | out | in / "
           f"{first} worker | out / {first} worker |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["workers"]:
        m = r["median"]
        out.append(f"| {r['workers']} | {m['in_msgs_per_s'] / 1e3:,.0f} k | "
                   f"{m['out_msgs_per_s'] / 1e3:,.0f} k | "
                   f"{m.get('server_cpu_us_per_msg_in', 0):.2f} | "
                   f"{m.get('server_cpu_us_per_msg_out', 0):.2f} | "
                   f"{r[f'ratio_in_vs_{first}']:.2f} | {r[f'ratio_out_vs_{first}']:.2f} |")
    hop = res.get("cross_worker_hop", {})
    if "skipped" in hop:
        out += ["", f"Cross-worker hop: not measured: {hop['skipped']}."]
    elif hop:
        n = len(hop["cases"][0].get("runs", [])) or 1
        out += ["", f"Cross-worker hop, --workers 2: end-to-end latency at {hop['rate']:,} msg/s "
                f"(open loop, as the latency suite, {hop['seconds']:.0f} s; the cases take turns, "
                f"medians of {n}) with each connection pinned to a worker (reconnecting until "
                "/stats shows it on the wanted one):", "",
                "| case | p50 | p99 | p99.9 | p50 added |", "|---|---:|---:|---:|---:|"]
        for r in hop["cases"]:
            out.append(f"| {r['case']} | {r['p50_us']:,.0f} us | {r['p99_us']:,.0f} us | "
                       f"{r['p999_us']:,.0f} us | {r['p50_added_us']:+,.0f} us |")
    return out


def targets(res):
    rows = []
    for r in res["workers"]:
        m = r["median"]
        if r["workers"] == 1:  # issue 3's per-message CPU target is for one worker
            for way in ("in", "out"):
                v = m.get(f"server_cpu_us_per_msg_{way}")
                if v is not None:
                    rows.append(("3", f"server CPU per message {way}, --workers 1", "<= 2.0 us",
                                 f"{v:.2f} us", v <= 2.0))
        rows.append(("6", f"publish / consume with --workers {r['workers']}", ">= 650 k / 600 k",
                     f"{m['in_msgs_per_s'] / 1e3:,.0f} k / {m['out_msgs_per_s'] / 1e3:,.0f} k",
                     m["in_msgs_per_s"] >= 650e3 and m["out_msgs_per_s"] >= 600e3))
    return rows
