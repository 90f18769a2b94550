"""`nsqshm bench`: one entry to every benchmark.

    nsqshm bench SUITE [flags]      ring tcp latency disk transport workers local spark policies headers logtopic ordered clients commitlog putback
    nsqshm bench all [--out bench]  every suite; with --out, bench/results/*.json,
                                    bench/RESULTS.md and bench/plots/*.png
    nsqshm bench writer|reader|fanout [flags]   the load generator alone
    nsqshm bench report --out bench             RESULTS.md and plots from saved JSON

The server is started per run (`nsqshm start` in a temp dir) unless
--nsqd-tcp-address points at one already running (e.g. a Go nsqd).
"""

import argparse
import json
import os
import sys
import time
import traceback

from . import NO_SERVER, SUITES, TOOLS, load
from .common import Context, cpu_ticks, machine, median, steal_share
from .progress import make as make_progress
from .server import RETRIED

EXIT_FAILED = 1


def _common():
    ap = argparse.ArgumentParser(add_help=False)
    g = ap.add_argument_group("common")
    g.add_argument("--nsqd-tcp-address", "--address", metavar="HOST:PORT",
                   help="an NSQ-compatible server already running (default: start nsqshm)")
    g.add_argument("--nsqd-http-address", metavar="HOST:PORT",
                   help="its HTTP address, for /stats checks and topic clean-up")
    g.add_argument("--nsqd-pid", "--pid", type=int, help="its pid, to read its CPU time")
    g.add_argument("--quick", action="store_true", help="a short smoke run")
    g.add_argument("--runs", type=int, help="runs per figure, medians reported (default 3; 1 quick)")
    g.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="write the results as JSON to PATH, or to stdout without one")
    g.add_argument("--out", metavar="DIR", help="write DIR/results/SUITE.json and regenerate "
                   "DIR/RESULTS.md and DIR/plots/ from every result there")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.add_argument("--quiet-wait", type=float, default=0, metavar="SECONDS",
                   help="before each run, wait up to this long for the machine to be quiet")
    g.add_argument("--quiet-below", type=float, default=0.15, metavar="SHARE",
                   help="quiet: at most this share of all cores busy without us (0.15)")
    return ap


def build_parser():
    common = _common()
    ap = argparse.ArgumentParser(prog="nsqshm bench", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    sub = ap.add_subparsers(dest="command", metavar="SUITE", required=True)
    parsers = {}
    for name in SUITES:
        module = load(name)
        parsers[name] = sub.add_parser(name, parents=[common], help=module.HELP,
                                       description=module.__doc__)
        module.add_arguments(parsers[name])
    a = sub.add_parser("all", parents=[common], help="every suite in turn")
    a.add_argument("--suites", default=",".join(SUITES), help="which suites, comma-separated")
    from . import report, tools

    for name, help_text in TOOLS.items():
        p = sub.add_parser(name, parents=[common], help=help_text, description=help_text)
        (report.add_arguments if name == "report" else tools.add_arguments)(p, name)
    return ap, parsers


def describe_server(args, module=None):
    """The server line of a suite's results; ONE_SERVER: a suite that starts one
    broker for all its runs."""
    if not args.nsqd_tcp_address:
        if getattr(module, "ONE_SERVER", False):
            return {"kind": "nsqshm start, one for all the runs (127.0.0.1, temp dir)"}
        return {"kind": "nsqshm start, a fresh one per run (127.0.0.1, temp dir)"}
    info = {"kind": "external", "tcp": args.nsqd_tcp_address}
    if args.nsqd_http_address:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://{args.nsqd_http_address}/info", timeout=5) as r:
                body = json.load(r)
            info["info"] = body.get("data", body)
        except (OSError, ValueError) as err:
            info["info_error"] = str(err)
    return info


def run_suite(name, args, progress, command, json_stdout):
    ctx = Context(args, progress, json_to_stdout=json_stdout)
    module = load(name)
    ctx.say(f"== {name}: {module.HELP}")
    started, ticks, t0 = machine(), cpu_ticks(), time.monotonic()
    del RETRIED[:]
    res = module.run(ctx)
    if RETRIED:
        res["retried"] = list(RETRIED)
        ctx.say(f"{name}: {len(RETRIED)} step(s) failed and were run again: {RETRIED[0]}")
    started["steal_share"] = steal_share(ticks, cpu_ticks())
    if ctx.busy:  # how busy others kept the machine just before each run
        started["busy_before_runs"] = {"median": median(ctx.busy), "max": max(ctx.busy),
                                       "runs": len(ctx.busy)}
    res = {"suite": name, "command": command, "machine": started, "quick": ctx.quick,
           "server": describe_server(args, module) if getattr(module, "SERVER", True)
           else NO_SERVER,
           **res, "seconds": round(time.monotonic() - t0, 1),
           "loadavg_after": os.getloadavg()[0]}
    if "skipped" in res:
        ctx.say(f"{name}: skipped: {res['skipped']}")
    return res


def _write_json(path, data):
    if path == "-":
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    ap, parsers = build_parser()
    args = ap.parse_args(argv)
    command = "nsqshm bench " + " ".join(argv)
    from . import report, tools

    if args.command == "report":
        return report.main(args)
    if args.command in TOOLS:
        return tools.main(args, make_progress(not args.no_progress))
    if args.command == "all":
        names = [n.strip() for n in args.suites.split(",") if n.strip()]
        unknown = set(names) - set(SUITES)
        if unknown:
            ap.error(f"unknown suites: {', '.join(sorted(unknown))}")
    else:
        names = [args.command]
    json_stdout = args.json == "-"
    results, failed = {}, []
    with make_progress(not args.no_progress) as progress:
        for name in names:
            sargs = args
            if args.command == "all":  # the suite's defaults, and the common flags given
                sargs = parsers[name].parse_args([])
                for key in vars(_common().parse_args([])):
                    setattr(sargs, key, getattr(args, key))
            try:
                results[name] = run_suite(name, sargs, progress, command, json_stdout)
            except Exception as exc:
                if args.command != "all":
                    raise
                traceback.print_exc()
                failed.append(name)
                results[name] = {"suite": name, "command": command, "machine": machine(),
                                 "error": repr(exc)}
            if args.out:  # a failure too: older figures would pass for this run's
                _write_json(os.path.join(args.out, "results", f"{name}.json"), results[name])
    if args.json:
        _write_json(args.json, results if args.command == "all" else results[names[0]])
    if args.out:
        written = report.write(args.out)
        print(f"wrote {', '.join(written)}", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
