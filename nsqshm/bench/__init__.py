"""The benchmark harness behind `nsqshm bench` (docs/bench.md).

One module per suite.  A suite module has

    TITLE, ISSUE            its RESULTS.md heading, the issue whose targets it checks
    HELP                    one line for `nsqshm bench --help`
    add_arguments(parser)   its own flags (the common ones are in main.py)
    run(ctx) -> dict        runs it; the dict is the suite's JSON (bench/results/NAME.json);
                            {"skipped": reason} when it cannot run here
    render(result) -> list  markdown lines for bench/RESULTS.md
    targets(result) -> list optional: (issue, figure, target, measured, met) rows
    SERVER = False          optional: the suite starts no broker (RESULTS.md says so)
    ONE_SERVER = True       optional: it starts one broker for all its runs

so a later suite (the workers mode, local shared-memory clients, Spark) is
filled in by editing its module only.
"""

# name -> module, in the order `nsqshm bench all` runs them
SUITES = {
    "ring": "nsqshm.bench.ring",
    "tcp": "nsqshm.bench.tcp",
    "latency": "nsqshm.bench.latency",
    "disk": "nsqshm.bench.disk",
    "transport": "nsqshm.bench.transport",
    "workers": "nsqshm.bench.workers",
    "local": "nsqshm.bench.local",
    "spark": "nsqshm.bench.spark",
    "policies": "nsqshm.bench.policies",
    "clients": "nsqshm.bench.clients",
    "headers": "nsqshm.bench.headers",
    "logtopic": "nsqshm.bench.logtopic",
    "ordered": "nsqshm.bench.ordered",
    "commitlog": "nsqshm.bench.commitlog",
    "putback": "nsqshm.bench.putback",
    "replication": "nsqshm.bench.replication",
}

# the server line of a suite with SERVER = False
NO_SERVER = {"kind": "none (the suite measures files or shared memory in its own process)"}

# the load generator's modes, after NSQ's bench_writer / bench_reader / pubsub
TOOLS = {
    "writer": "publish MPUB batches for --runfor (NSQ's bench_writer)",
    "reader": "consume and FIN at --rdy for --runfor (NSQ's bench_reader)",
    "fanout": "publish while consumers on --channels channels each get every message",
    "report": "regenerate RESULTS.md and the plots from saved JSON (--out DIR)",
}


def load(name):
    import importlib

    return importlib.import_module(SUITES[name])
