"""bench/RESULTS.md and bench/plots/*.png, generated from bench/results/*.json.

Every figure in RESULTS.md comes from the JSON; what a person wrote about
the figures (what limits them, history) lives in bench/notes/SUITE.md and
is included under the suite's section.
"""

import json
import os
import sys

from . import NO_SERVER, SUITES, load

PLOTS = ("throughput_vs_size.png", "throughput_vs_workers.png", "latency_vs_rate.png")


def add_arguments(ap, name):
    pass


def load_results(out):
    results = {}
    for name in SUITES:
        path = os.path.join(out, "results", f"{name}.json")
        if os.path.exists(path):
            with open(path) as f:
                results[name] = json.load(f)
    return results


# -- plots -----------------------------------------------------------------------------

def _figure():
    import matplotlib

    matplotlib.use("Agg")  # no display; set before pyplot is imported
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, axes, path, title):
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def plot_sizes(res, path):
    plt = _figure()
    rows = res.get("sizes") or []
    if not rows:
        return False
    sizes = [r["size"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for way, color in (("in", "tab:blue"), ("out", "tab:orange")):
        label = "publish" if way == "in" else "consume"
        ax1.plot(sizes, [r[f"{way}_msgs_per_s"] for r in rows], "o-", color=color, label=label)
        ax2.plot(sizes, [r[f"{way}_MB_per_s"] for r in rows], "o-", color=color, label=label)
        if f"raw_{way}_msgs_per_s" in rows[0]:
            raw = [r[f"raw_{way}_msgs_per_s"] for r in rows]
            ax1.plot(sizes, raw, "--", color=color, alpha=0.5, label=f"{label}, raw socket")
            ax2.plot(sizes, [v * s / 1e6 for v, s in zip(raw, sizes, strict=True)], "--",
                     color=color, alpha=0.5, label=f"{label}, raw socket")
    for ax, unit in ((ax1, "messages/s"), (ax2, "MB/s of bodies")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size, bytes")
        ax.set_ylabel(unit)
    return _save(plt, fig, (ax1, ax2), path, "TCP throughput against message size")


def plot_workers(res, path):
    rows = res.get("workers") or []
    if not rows:
        return False
    plt = _figure()
    fig, ax = plt.subplots(figsize=(6, 4))
    n = [r["workers"] for r in rows]
    for way, label in (("in", "publish"), ("out", "consume")):
        ax.plot(n, [r["median"][f"{way}_msgs_per_s"] for r in rows], "o-", label=label)
    ax.set_xticks(n)
    ax.set_xlabel("--workers")
    ax.set_ylabel("messages/s")
    ax.set_ylim(bottom=0)
    return _save(plt, fig, (ax,), path, "TCP throughput against workers")


def plot_latency(res, path):
    rows = res.get("rates") or []
    if not rows:
        return False
    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"p50_us": "tab:green", "p99_us": "tab:orange", "p999_us": "tab:red"}
    for mode, style in (("pub", "o-"), ("mpub", "s--")):
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        rates = [r["rate"] for r in mine]
        for key, color in colors.items():
            ax.plot(rates, [r["server"][key] for r in mine], style, color=color,
                    label=f"{mode} {key[:-3].replace('p999', 'p99.9')}")
        if mode == "pub" and all(r.get("relay") for r in mine):
            ax.plot(rates, [r["relay"]["p99_us"] for r in mine], ":", color="grey",
                    label="relay (floor) p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rate, messages/s (open loop)")
    ax.set_ylabel("publish to delivery, us")
    return _save(plt, fig, (ax,), path, "End-to-end latency against rate")


# -- RESULTS.md --------------------------------------------------------------------------

def _machine(m):
    mem = f", {m['mem_gib']} GiB" if m.get("mem_gib") else ""
    return (f"{m.get('cpus')} cores ({m.get('cpu')}){mem}, Linux {m.get('kernel')}, "
            f"Python {m.get('python')}, nsqshm {m.get('revision')}")


def _targets(results):
    rows = []
    for name, res in results.items():
        module = load(name)
        if "skipped" in res:
            rows.append((getattr(module, "ISSUE", "-"), module.HELP, "-",
                         f"not measured: {res['skipped']}", None))
        elif hasattr(module, "targets") and "error" not in res:
            rows += module.targets(res)
    if not rows:
        return []
    out = ["| issue | figure | target | measured | |", "|---|---|---|---|:---:|"]
    for issue, figure, target, measured, met in rows:
        mark = {True: "met", False: "**not met**", None: "-"}[met]
        out.append(f"| {issue} | {figure} | {target} | {measured} | {mark} |")
    return out


def markdown(results, out, plots):
    first = next(iter(results.values()))
    commands = list(dict.fromkeys(r["command"] for r in results.values()))
    lines = ["# Benchmark results", "",
             "Generated by `nsqshm bench` from bench/results/*.json; do not edit by hand (notes "
             "on the figures live in bench/notes/). Medians of several runs unless said "
             "otherwise; ratios are against baselines run in the same program.", "",
             f"Machine: {_machine(first['machine'])}. Shared and noisy: the load average and "
             "the hypervisor's steal time are given with each suite.", "",
             "Command" + ("s" if len(commands) > 1 else "") + ":", ""]
    lines += [f"    {c}" for c in commands]
    targets = _targets(results)
    if targets:
        lines += ["", "## Targets from the issues", ""] + targets
    for name, res in results.items():
        module = load(name)
        lines += ["", f"## {getattr(module, 'TITLE', name)}", ""]
        if "error" in res:
            lines.append(f"Failed: {res['error']}")
            continue
        m = res["machine"]
        busy = m.get("busy_before_runs")
        lines.append(f"`{res['command']}`: {m['date']}, {res.get('seconds')} s, load average "
                     f"{m['loadavg']:.2f} at the start, steal {m.get('steal_share', 0):.1%} during "
                     "it" + (f", others kept {busy['median']:.0%} (median; max {busy['max']:.0%}) "
                             "of the cores busy just before a run" if busy else "")
                     + f"; server: {_server_kind(module, res)}"
                     + (" (quick run)" if res.get("quick") else "") + ".")
        lines.append("")
        if "skipped" in res:
            lines.append(f"Not measured: {res['skipped']}.")
        else:
            lines += module.render(res)
        for failure in res.get("server_start_failures", []):  # results of older runs
            lines += ["", f"A server start failed and was retried: {failure}"]
        for failure in res.get("retried", []):
            lines += ["", f"Failed and run again: {failure}"]
        note = os.path.join(out, "notes", f"{name}.md")
        if os.path.exists(note):
            with open(note) as f:
                lines += ["", f.read().strip()]
    missing = [p for p in PLOTS if p not in plots]
    if missing:
        lines += ["", "Plots not drawn (no data): " + ", ".join(missing) + "."]
    return "\n".join(lines) + "\n"


def write(out):
    """Regenerate DIR/RESULTS.md and DIR/plots/ from DIR/results/; the paths written."""
    results = load_results(out)
    if not results:
        raise SystemExit(f"no results in {os.path.join(out, 'results')}")
    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    drawn = []
    for plot, suite, fn in ((PLOTS[0], "tcp", plot_sizes), (PLOTS[1], "workers", plot_workers),
                            (PLOTS[2], "latency", plot_latency)):
        res = results.get(suite)
        path = os.path.join(out, "plots", plot)
        if res and "skipped" not in res and "error" not in res and fn(res, path):
            drawn.append(plot)
        elif os.path.exists(path):
            os.unlink(path)  # a plot of older results would contradict the text
    path = os.path.join(out, "RESULTS.md")
    with open(path, "w") as f:
        f.write(markdown(results, out, drawn))
    return [path] + [os.path.join(out, "plots", p) for p in drawn]


def main(args):
    written = write(args.out or "bench")
    print("wrote " + ", ".join(written), file=sys.stderr)
    return 0


def _server_kind(module, res):
    # a suite without a server (SERVER = False) says so, in runs saved before
    # the flag existed too
    return res["server"]["kind"] if getattr(module, "SERVER", True) else NO_SERVER["kind"]
