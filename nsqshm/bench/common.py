"""What every suite shares: the run context, medians, the machine's description."""

import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import time

# fork: the load generator's processes inherit prebuilt commands and shared counters
CTX = mp.get_context("fork")


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def medians(rows):
    """Per key, the median of the numeric values of a list of dicts."""
    keys = [k for k, v in rows[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return {k: median([r.get(k) for r in rows]) for k in keys}


def _first(path, prefix):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def git_revision():
    if os.environ.get("NSQSHM_BENCH_REVISION"):  # a copy of the tree without .git
        return os.environ["NSQSHM_BENCH_REVISION"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, text=True,
                             capture_output=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               text=True, capture_output=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (rev + ("+dirty" if dirty else "")) if rev else None


def machine():
    """Enough to tell two runs' machines apart, and how busy this one was."""
    mem = _first("/proc/meminfo", "MemTotal")
    return {
        "cpu": _first("/proc/cpuinfo", "model name") or platform.processor(),
        "cpus": os.cpu_count(),
        "mem_gib": round(int(mem.split()[0]) / 2**20, 1) if mem else None,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "revision": git_revision(),
        "loadavg": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def stop_all(procs, stop=None):
    """Set stop (an Event), then join each process, killing it after 5 s."""
    if stop is not None:
        stop.set()
    for x in procs:
        x.join(5)
        if x.exitcode is None:
            x.kill()
            x.join()


def cpu_ticks():
    """The machine's CPU time counters (/proc/stat: user ... steal)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def steal_share(before, after):
    """The share of CPU time the hypervisor took for other guests in between."""
    d = [b - a for a, b in zip(before, after, strict=True)]
    return d[7] / sum(d) if sum(d) else 0.0


def busy_share(seconds=0.3):
    """The share of all cores busy (steal included) over `seconds`, with this
    program idle: what others are doing to the machine right now."""
    before = cpu_ticks()
    time.sleep(seconds)
    d = [b - a for a, b in zip(before, cpu_ticks(), strict=True)]
    return 1 - (d[3] + d[4]) / sum(d) if sum(d) else 0.0


class Context:
    """A suite's run: its arguments, where it prints, its progress bars.

    say() prints a result line: to stdout, or to stderr when the JSON goes to
    stdout; through the progress display when one is live, so lines do not
    tear the bars."""

    def __init__(self, args, progress, json_to_stdout=False):
        self.args = args
        self.progress = progress
        self.stream = sys.stderr if json_to_stdout else sys.stdout
        self.busy = []  # the machine's busy share before each run (settle)

    @property
    def quick(self):
        return bool(getattr(self.args, "quick", False))

    def runs(self, default=3):
        runs = getattr(self.args, "runs", None)
        return runs if runs else (1 if self.quick else default)

    def say(self, text=""):
        self.progress.say(text, self.stream)

    def settle(self):
        """Before a run: how busy the machine is without us; with --quiet-wait,
        wait up to that many seconds for it to drop below --quiet-below."""
        wait = getattr(self.args, "quiet_wait", 0) or 0
        deadline = time.monotonic() + wait
        busy = busy_share()
        while busy > getattr(self.args, "quiet_below", 0.15) and time.monotonic() < deadline:
            busy = busy_share(1.0)
        self.busy.append(busy)
        return busy
