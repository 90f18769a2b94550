"""Local shared-memory clients (nsqshm.local, issue 9): publish into a
topic's ring and consume a channel's ring of a broker on the same host,
against the same load over TCP in the same run.

Not written yet: nsqshm.local does not exist.  When it does, run() should
start nsqshm (server.server), publish N messages of 100 B with
nsqshm.local.Producer (batch API) and consume them with
nsqshm.local.Consumer (batch views, finish a batch at once), then the same
through loadgen.run_phases over TCP, and report msg/s both ways and the
ratio.
"""

from .common import not_built

TITLE, ISSUE = "Local shared-memory clients (issue 9)", "9"
HELP = "local shared-memory producer/consumer vs TCP (issue 9)"


def add_arguments(ap):
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--size", type=int, default=100)


def run(ctx):
    missing = not_built("nsqshm.local", ISSUE)
    if missing:
        return missing
    return {"skipped": "nsqshm.local exists but this suite is not written yet "
                       "(nsqshm/bench/local.py)"}


def render(res):
    return []
