"""Rows/s into Spark (issue 9): the "nsqshm" data source reading through
shared memory, through TCP, and a Python data source over an in-memory list
(the ceiling), 100 B messages, local[2], in the same run.  Target: at least
2 M rows/s through shared memory.

Not written yet: nsqshm.spark does not exist.  When it does, run() should
publish N messages, read them with spark.read.format("nsqshm") (batch read,
shared memory, then TCP), count rows, and time each against the in-memory
source; report rows/s and the ratios.
"""

from .common import not_built

TITLE, ISSUE = "Spark (issue 9)", "9"
HELP = "rows/s into Spark via shared memory, TCP, in-memory ceiling (issue 9)"
TARGET_ROWS = 2_000_000


def add_arguments(ap):
    ap.add_argument("--messages", type=int, default=2_000_000)
    ap.add_argument("--size", type=int, default=100)


def run(ctx):
    missing = not_built("nsqshm.spark", ISSUE)
    if missing:
        return missing
    return {"skipped": "nsqshm.spark exists but this suite is not written yet "
                       "(nsqshm/bench/spark.py)"}


def render(res):
    return []
