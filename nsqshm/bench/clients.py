"""Delivery with the clients people run (issue 20): FIN per write, REQ and
TOUCH mixes, large messages, and fairness between publishers and consumers.

go-nsq, pynsq and gnsq write and flush each FIN as its own command, so the
broker reads a few FINs per segment; the tcp suite's consumers send every
FIN of a chunk in one write.  Here consumers answer as those clients do
(loadgen.Pattern, one send() per command), against the raw-socket baseline
answered the same way in the same run:

- fin: publish then consume 200 B messages (bench_writer then bench_reader,
  RDY 2500), FIN per write: consume msg/s, server CPU per message, the
  ratio to the raw socket.
- mix: the same with 1 message in --mix-every REQ'd (no delay: it comes
  back) and 1 in --mix-every TOUCHed before its FIN (no baseline: it only
  counts FINs); against FIN only in the same run.
- sizes: 4 KiB to 64 KiB messages both ways, GB/s and the ratio to the raw
  socket.  Each server runs the phases several times on one topic and channel: the
  first pass (cold) is the first write to pages of the rings, which are
  sized to hold the whole backlog (the kernel allocates and zeroes a
  shared-memory page at its first touch, and maps it into each process
  that touches it: a third of the server's time at 64 KiB); more passes
  follow until the rings have gone round once (warm_passes), then the
  measured one (warm: the figures and targets), the steady state of a
  broker that has run for a while.
- fair: consumers drain a backlog alone, then while publishers send flat
  out into the same topic: the consumers' rate with publishers over alone.
- rdy1: fin with consumers at RDY 1 (go-nsq's and pynsq's default
  max_in_flight), against the raw socket at RDY 1: each message waits for
  the FIN of the one before, so the broker's work per FIN (and its
  wake-ups) is what is measured.

--before TREE runs the server of another source tree too (e.g. main's, the
previous build), each run right after the current one: before/after
figures back to back, the same load generator.
"""

import contextlib
import time
import uuid

from . import loadgen
from .common import CTX, medians, stop_all
from .server import MESSAGE_OVERHEAD, mem_queue_size, start_nsqshm
from .tcp import raw_baseline, spec_for

TITLE = "Delivery with the clients' patterns: FIN per write, large messages, fairness (issue 20)"
ISSUE = "20"
HELP = "consume with FIN per write, REQ/TOUCH mixes, 4-64 KiB messages, fairness (issue 20)"
TARGET_CPU_US, TARGET_RATIO, TARGET_GBPS, TARGET_FAIR = 1.0, 0.6, 1.0, 0.5
PARTS = ("fin", "mix", "sizes", "fair", "rdy1")
RDY1_MESSAGES = 200_000  # rdy1's backlog: at RDY 1 a consumer takes some 10 k msg/s


def add_arguments(ap):
    loadgen.add_load_arguments(ap, messages=1_000_000)
    ap.add_argument("--sizes", default="4096,16384,65536", help="large message sizes")
    ap.add_argument("--mix-every", type=int, default=10,
                    help="1 message in N REQ'd and 1 in N TOUCHed (mix)")
    ap.add_argument("--fair-seconds", type=float, default=3.0,
                    help="seconds of each fairness phase (alone, with publishers)")
    ap.add_argument("--gap-us", type=float, default=2.0,
                    help="FIN per write: at least this long between two sends of a consumer "
                         "(a client's work per message; 0: back to back)")
    ap.add_argument("--workers", type=int, default=0,
                    help="the servers' --workers (0: nsqshm's default, one per core)")
    ap.add_argument("--window-seconds", type=float, default=2.0,
                    help="fin: seconds of steady-state consumption measured per run")
    ap.add_argument("--parts", default=",".join(PARTS), help="which parts to run")
    ap.add_argument("--before", metavar="TREE",
                    help="also run the server of this source tree (built in place), each run "
                         "after the current one")




WORKERS = []  # --workers, when given


@contextlib.contextmanager
def broker(backlog, tree=None):
    target = start_nsqshm([f"--mem-queue-size={mem_queue_size(*backlog)}", *WORKERS], tree=tree)
    try:
        yield target
    finally:
        target.close()


def servers(a):
    return [("after", None)] + ([("before", a.before)] if a.before else [])


def _consume_line(label, r):
    cpu = r.get("server_cpu_us_per_msg_out")
    return (f"{label}: out {r['out_msgs_per_s'] / 1e3:8.1f} k msg/s ({r['out_MB_per_s']:7.1f} MB/s)"
            f", in {r['in_msgs_per_s'] / 1e3:8.1f} k msg/s ({r['in_MB_per_s']:7.1f} MB/s)"
            + (f"; server CPU {cpu:.2f} us/msg out, "
               f"{r['server_cpu_us_per_msg_in']:.2f} in" if cpu is not None else ""))


def fpw(a, **more):
    return loadgen.Pattern(fin_per_write=True, gap_us=a.gap_us, **more)


def run_fin(ctx, a, label="fin", spec=None):
    """Per run: the raw socket, then each server, consuming a backlog at
    steady state (loadgen.run_consume_window); medians and ratios.  spec:
    the load (spec_for(a) when None)."""
    spec = spec or spec_for(a)
    pattern = fpw(a)
    rows = {name: [] for name, _ in servers(a)}
    raws = []
    for i in range(ctx.runs()):
        ctx.settle()
        raws.append(loadgen.run_consume_window(None, spec, pattern, a.window_seconds, raw=True))
        ctx.say(f"{label} run {i + 1} raw socket: out {raws[-1]['out_msgs_per_s'] / 1e3:8.1f} k msg/s")
        for name, tree in servers(a):
            with broker((spec.messages, spec.size), tree) as target:
                r = loadgen.run_consume_window(target, spec, pattern, a.window_seconds)
            r["ratio_out"] = r["out_msgs_per_s"] / raws[-1]["out_msgs_per_s"]
            rows[name].append(r)
            ctx.say(f"{label} run {i + 1} {name}: out {r['out_msgs_per_s'] / 1e3:8.1f} k msg/s; "
                    f"server CPU {r.get('server_cpu_us_per_msg_out', 0):.2f} us/msg; of raw "
                    f"socket {r['ratio_out']:.2f}")
    return {"pattern": pattern.name, "size": spec.size, "messages": spec.messages,
            "rdy": spec.rdy, "seconds": a.window_seconds, "raw": medians(raws),
            **{name: medians(rs) for name, rs in rows.items()},
            "runs": rows, "raw_runs": raws}


def _summary(rows):
    keep = ("in_msgs_per_s", "out_msgs_per_s", "in_MB_per_s", "out_MB_per_s",
            "server_cpu_us_per_msg_in", "server_cpu_us_per_msg_out", "ratio_in", "ratio_out",
            "cold_in_MB_per_s", "cold_out_MB_per_s")
    m = medians(rows)
    return {k: m.get(k) for k in keep}


def raw_baseline_with(spec, pattern):
    try:
        return loadgen.run_phases(None, spec, raw=True, pattern=pattern)
    except RuntimeError:
        return raw_baseline(spec)  # (retried and noted there, batched answers)


def run_mix(ctx, a):
    """FIN only against the REQ and TOUCH mix, alternately on each server,
    at steady state on a backlog (as fin)."""
    spec = spec_for(a)
    only, mix = fpw(a), fpw(a, req_every=a.mix_every, touch_every=a.mix_every)
    rows = {(name, p.name): [] for name, _ in servers(a) for p in (only, mix)}
    for i in range(ctx.runs()):
        ctx.settle()
        for name, tree in servers(a):
            for pattern in (only, mix):
                with broker((spec.messages, spec.size), tree) as target:
                    r = loadgen.run_consume_window(target, spec, pattern, a.window_seconds)
                rows[(name, pattern.name)].append(r)
                ctx.say(f"mix run {i + 1} {name} [{pattern.name}]: out "
                        f"{r['out_msgs_per_s'] / 1e3:8.1f} k msg/s finished; server CPU "
                        f"{r.get('server_cpu_us_per_msg_out', 0):.2f} us/msg")
    return {"mix_every": a.mix_every, "seconds": a.window_seconds,
            "rows": [{"server": name, "pattern": pname, **medians(rs)}
                     for (name, pname), rs in rows.items()]}


def warm_passes(messages, size):
    """Passes of a backlog until every page of the broker's rings has been
    written once: a ring is the power of two at or above --mem-queue-size *
    512 bytes (nsqd.ring_capacity), and bench.server.mem_queue_size sizes
    that to the backlog."""
    need = mem_queue_size(messages, size) * 512
    cap = 4096
    while cap < need:
        cap <<= 1
    return -(-cap // (messages * (size + MESSAGE_OVERHEAD)))


def run_sizes(ctx, a):
    out = []
    for size in [int(x) for x in a.sizes.split(",") if x.strip()]:
        budget = (32 << 20) if ctx.quick else (128 << 20)
        messages = max(1_000, min(a.messages, budget // size))
        batch = max(1, min(a.batch, (4 << 20) // (size + 4)))
        spec = spec_for(a, size=size, batch=batch, messages=messages)
        raws, rows = [], {name: [] for name, _ in servers(a)}
        for _ in range(ctx.runs()):
            ctx.settle()
            raws.append(raw_baseline_with(spec, fpw(a)))
            for name, tree in servers(a):
                with broker((spec.messages, size), tree) as target:
                    topic = f"bench{uuid.uuid4().hex[:8]}"
                    cold = loadgen.run_phases(target, spec, pattern=fpw(a), topic=topic,
                                              keep_topic=True)
                    for _ in range(warm_passes(spec.messages, size) - 1):
                        loadgen.run_phases(target, spec, pattern=fpw(a), topic=topic,
                                           keep_topic=True)
                    r = loadgen.run_phases(target, spec, pattern=fpw(a), topic=topic)
                for k in ("in_MB_per_s", "out_MB_per_s"):
                    r["cold_" + k] = cold[k]
                r["ratio_out"] = r["out_msgs_per_s"] / raws[-1]["out_msgs_per_s"]
                r["ratio_in"] = r["in_msgs_per_s"] / raws[-1]["in_msgs_per_s"]
                rows[name].append(r)
        raw = medians(raws)
        row = {"size": size, "messages": messages, "batch": batch,
               "raw_in_GB_per_s": raw["in_MB_per_s"] / 1e3,
               "raw_out_GB_per_s": raw["out_MB_per_s"] / 1e3}
        for name, rs in rows.items():
            m = _summary(rs)
            row[name] = {"in_GB_per_s": m["in_MB_per_s"] / 1e3,
                         "out_GB_per_s": m["out_MB_per_s"] / 1e3,
                         "cold_in_GB_per_s": m["cold_in_MB_per_s"] / 1e3,
                         "cold_out_GB_per_s": m["cold_out_MB_per_s"] / 1e3,
                         "ratio_in": m["ratio_in"], "ratio_out": m["ratio_out"]}
            ctx.say(f"size {size:>6} B {name}: in {row[name]['in_GB_per_s']:.2f} GB/s "
                    f"({m['ratio_in']:.2f} of raw {row['raw_in_GB_per_s']:.2f}), out "
                    f"{row[name]['out_GB_per_s']:.2f} GB/s ({m['ratio_out']:.2f} of raw "
                    f"{row['raw_out_GB_per_s']:.2f}); cold rings: in "
                    f"{row[name]['cold_in_GB_per_s']:.2f}, out {row[name]['cold_out_GB_per_s']:.2f}")
        out.append(row)
    return out


def fairness(target, spec, seconds, pattern):
    """Consumers drain a backlog for `seconds` alone, then for `seconds`
    while spec.publishers publish flat out into the same topic: their
    finished msg/s in each phase (the first 0.5 s of each left out)."""
    topic = f"bench{uuid.uuid4().hex[:8]}"
    ready, fill_go, go, pub_go, stop = (CTX.Event(), CTX.Event(), CTX.Event(), CTX.Event(),
                                        CTX.Event())
    cout, pout = loadgen.Shared(spec.consumers), loadgen.Shared(spec.publishers)
    fill = loadgen.Shared(spec.publishers)
    per = spec.messages // spec.publishers // spec.batch * spec.batch
    cons = [CTX.Process(target=loadgen.consumer, args=(target.tcp, topic, "ch0", spec.rdy, ready,
                                                       go, stop, cout, i, None, pattern))
            for i in range(spec.consumers)]
    fills = [CTX.Process(target=loadgen.publisher, args=(target.tcp, topic, spec, per, ready,
                                                          fill_go, fill, i))
             for i in range(spec.publishers)]
    flat = type(spec)(**{**vars(spec), "runfor": seconds + 1.0, "rate": 0})
    pubs = [CTX.Process(target=loadgen.publisher, args=(target.tcp, topic, flat, 0, ready, pub_go,
                                                         pout, i))
            for i in range(spec.publishers)]
    rates = {}
    try:
        loadgen.launch(cons, fills + pubs, ready)
        fill_go.set()  # the backlog first; the consumers send RDY at go
        loadgen.wait_for(fill.msgs, per * spec.publishers, fills, 60)
        go.set()
        backlog = per * spec.publishers
        for phase in ("alone", "with_publishers"):
            if phase == "with_publishers":
                pub_go.set()
            time.sleep(0.5)
            t0, c0, p0 = time.perf_counter(), sum(cout.msgs), sum(pout.msgs)
            # alone: until the backlog is 90 % done at most (an empty queue is no measure)
            while time.perf_counter() - t0 < seconds and (
                    phase != "alone" or sum(cout.msgs) < 0.9 * backlog):
                time.sleep(0.005)
            t1, c1, p1 = time.perf_counter(), sum(cout.msgs), sum(pout.msgs)
            rates[phase] = (c1 - c0) / (t1 - t0)
            rates[f"{phase}_publish"] = (p1 - p0) / (t1 - t0)
    finally:
        stop_all(cons, stop)
        stop_all(pubs + fills)
    target.delete_topic(topic)
    return rates


def run_fair(ctx, a):
    # a backlog the consumers cannot drain alone in a phase
    spec = spec_for(a, messages=1_000_000)
    rows = {name: [] for name, _ in servers(a)}
    for _ in range(ctx.runs()):
        ctx.settle()
        for name, tree in servers(a):
            # memory for the backlog and a while of flat-out publishing; past it, the disk
            with broker((1_500_000, spec.size), tree) as target:
                r = fairness(target, spec, a.fair_seconds, fpw(a))
            r["ratio"] = r["with_publishers"] / r["alone"] if r["alone"] else None
            rows[name].append(r)
            ctx.say(f"fair {name}: consumers alone {r['alone'] / 1e3:8.1f} k msg/s, with "
                    f"publishers flat out {r['with_publishers'] / 1e3:8.1f} k msg/s (publishing "
                    f"{r['with_publishers_publish'] / 1e3:8.1f} k msg/s): {r['ratio']:.2f}")
    return {name: {**medians(rs), "runs": rs} for name, rs in rows.items()}


def run(ctx):
    a = ctx.args
    if getattr(a, "nsqd_tcp_address", None):
        return {"skipped": "starts nsqshm itself (a server per run, and --before's)"}
    if ctx.quick:
        a.messages = min(a.messages, 100_000)
        a.fair_seconds = min(a.fair_seconds, 1.5)
    parts = [x for x in a.parts.split(",") if x]
    WORKERS[:] = [f"--workers={a.workers}"] if a.workers else []
    res = {"params": {"messages": a.messages, "size": a.size, "batch": a.batch, "rdy": a.rdy,
                      "publishers": a.publishers, "consumers": a.consumers,
                      "before": a.before, "parts": parts, "gap_us": a.gap_us,
                      "workers": a.workers or "default"}}
    with ctx.progress.task("clients", len(parts)) as advance:
        if "fin" in parts:
            res["fin"] = run_fin(ctx, a)
            advance()
        if "mix" in parts:
            res["mix"] = run_mix(ctx, a)
            advance()
        if "sizes" in parts:
            res["sizes"] = run_sizes(ctx, a)
            advance()
        if "fair" in parts:
            res["fair"] = run_fair(ctx, a)
            advance()
        if "rdy1" in parts:
            spec = spec_for(a, rdy=1, messages=min(a.messages, RDY1_MESSAGES))
            res["fin_variants"] = [{"label": "RDY 1", **run_fin(ctx, a, "rdy1", spec)}]
            advance()
    return res


def _k(v):
    return f"{v / 1e3:,.0f} k" if v is not None else "-"


def _f(v, unit=""):
    return f"{v:.2f}{unit}" if v is not None else "-"


def render(res):
    p = res["params"]
    names = ["after"] + (["before"] if p.get("before") else [])
    out = [f"Consumers answer as go-nsq, pynsq and gnsq do (one send per FIN); {p['publishers']} "
           f"publishers (MPUB of {p['batch']}), {p['consumers']} consumers at RDY {p['rdy']}; "
           "medians; \"before\" is the previous build's server "
           f"({p.get('before') or 'not run'}), run right after each \"after\" run."]
    for f in [res[k] for k in ("fin",) if k in res] + res.get("fin_variants", []):
        out += ["", (f"{f['label']}: " if f.get("label") else "")
                + f"{f['pattern']}, {f['size']} B, RDY {f.get('rdy', p['rdy'])}, a backlog of "
                f"{f['messages']:,} consumed at steady state ({f['seconds']:g} s measured per "
                "run):", "",
                "| server | consume msg/s | raw socket | ratio | server CPU us/msg |",
                "|---|---:|---:|---:|---:|"]
        for name in names:
            m = f[name]
            out.append(f"| {name} | {_k(m['out_msgs_per_s'])} | {_k(f['raw']['out_msgs_per_s'])} "
                       f"| {_f(m['ratio_out'])} | {_f(m.get('server_cpu_us_per_msg_out'))} |")
    if "mix" in res:
        how = ("a backlog consumed at steady state" if "seconds" in res["mix"]
               else "whole publish and consume phases")
        out += ["", f"REQ and TOUCH mix (1 in {res['mix']['mix_every']} each; FIN per write; "
                f"{how}):", "",
                "| server | answers | consume msg/s (finished) | server CPU us per finished msg |",
                "|---|---|---:|---:|"]
        for r in res["mix"]["rows"]:
            out.append(f"| {r['server']} | {r['pattern']} | {_k(r['out_msgs_per_s'])} | "
                       f"{_f(r.get('server_cpu_us_per_msg_out'))} |")
    if "sizes" in res:
        out += ["", "Large messages (FIN per write), GB/s, warm rings (the last of several "
                "passes on one topic, once its rings have gone round; cold: the first pass, "
                "every ring page touched for the first time):", "",
                "| size | server | in GB/s | in / raw | out GB/s | out / raw | raw in | raw out "
                "| cold in | cold out |",
                "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in res["sizes"]:
            for name in names:
                m = r[name]
                out.append(f"| {r['size']:,} B | {name} | {_f(m['in_GB_per_s'])} | "
                           f"{_f(m['ratio_in'])} | {_f(m['out_GB_per_s'])} | {_f(m['ratio_out'])} "
                           f"| {_f(r['raw_in_GB_per_s'])} | {_f(r['raw_out_GB_per_s'])} "
                           f"| {_f(m.get('cold_in_GB_per_s'))} | {_f(m.get('cold_out_GB_per_s'))} |")
    if "fair" in res:
        out += ["", "Fairness: consumers' msg/s draining a backlog alone, then with publishers "
                "flat out into the same topic:", "",
                "| server | alone | with publishers | publishing meanwhile | ratio |",
                "|---|---:|---:|---:|---:|"]
        for name in names:
            m = res["fair"][name]
            out.append(f"| {name} | {_k(m['alone'])} | {_k(m['with_publishers'])} | "
                       f"{_k(m['with_publishers_publish'])} | {_f(m['ratio'])} |")
    return out


def targets(res):
    rows = []
    if "fin" in res:
        m = res["fin"]["after"]
        cpu, ratio = m.get("server_cpu_us_per_msg_out"), m["ratio_out"]
        rows += [("20", "FIN per write 200 B: server CPU per message out",
                  f"<= {TARGET_CPU_US} us", _f(cpu, " us"),
                  cpu is not None and cpu <= TARGET_CPU_US),
                 ("20", "FIN per write 200 B: consume, of the raw socket", f">= {TARGET_RATIO}",
                  _f(ratio), ratio is not None and ratio >= TARGET_RATIO)]
    for r in res.get("sizes", []):
        m = r["after"]
        for way in ("in", "out"):
            gbps, ratio = m[f"{way}_GB_per_s"], m[f"ratio_{way}"]
            rows.append(("20", f"{r['size']:,} B {way}: GB/s, of the raw socket",
                         f">= {TARGET_GBPS} GB/s, >= {TARGET_RATIO}",
                         f"{_f(gbps)} GB/s, {_f(ratio)}",
                         gbps >= TARGET_GBPS and ratio >= TARGET_RATIO))
    if "fair" in res:
        ratio = res["fair"]["after"].get("ratio")
        rows.append(("20", "consumers with publishers flat out, of alone", f">= {TARGET_FAIR}",
                     _f(ratio), ratio is not None and ratio >= TARGET_FAIR))
    return rows

