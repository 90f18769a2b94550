"""A worker's memory, dumped on SIGUSR2 (a debugging aid, off by default).

With NSQSHM_MEMORY_DUMP=<directory> in its environment, each worker dumps on
SIGUSR2, to <directory>/memory.w<index>.<pid>.<n>.txt:

- its memory from /proc (RssAnon: the heap; RssShmem: the rings' pages it
  touched, shared with the other workers; RssFile);
- how many topics, channels, clients and greenlets it has;
- the live objects by type (gc), the most numerous first, with the change
  since its previous dump;
- with tracemalloc on (PYTHONTRACEMALLOC=<frames>, Python's own variable),
  the allocation sites holding the most memory, and what grew most since
  the previous dump.

So a growth seen from outside (a soak, the fuzz) can be pinned to what
grows: `kill -USR2 <worker pid>` at two moments, then read the second file.
"""

import gc
import os
import signal
import time
import tracemalloc
from collections import Counter

from greenlet import greenlet

ENV = "NSQSHM_MEMORY_DUMP"
TOP = 40


class MemoryDump:
    def __init__(self, nsqd, directory):
        self.nsqd = nsqd
        self.directory = directory
        self.count = 0
        self.types = Counter()
        self.snapshot = None

    def write(self):
        self.count += 1
        path = os.path.join(self.directory,
                            f"memory.w{self.nsqd.index}.{os.getpid()}.{self.count}.txt")
        with open(path, "w") as f:
            f.write("\n".join(self.lines()) + "\n")
        self.nsqd.logf("info", f"memory dumped to {path}")

    def lines(self):
        nsqd = self.nsqd
        out = [f"worker {nsqd.index} pid {os.getpid()} at {time.time():.0f}"]
        with open(f"/proc/{os.getpid()}/status") as f:
            out += [line.rstrip() for line in f if line.startswith(("VmRSS", "Rss"))]
        channels = sum(len(t.channels) for t in nsqd.topics.values())
        out.append(f"topics {len(nsqd.topics)} channels {channels} clients {len(nsqd.clients)} "
                   f"scratch lent {nsqd.scratch.lent}")
        gc.collect()
        objects = gc.get_objects()
        types = Counter(type(o).__qualname__ for o in objects)
        out.append(f"greenlets {sum(1 for o in objects if isinstance(o, greenlet))}")
        del objects
        out.append(f"\n== objects by type ({sum(types.values())} tracked), change since dump "
                   f"{self.count - 1}")
        for name, n in types.most_common(TOP):
            out.append(f"{n:>10} {n - self.types.get(name, 0):>+10}  {name}")
        grown = sorted(types, key=lambda k: types[k] - self.types.get(k, 0), reverse=True)
        out.append("\n== most grown types")
        for name in grown[:TOP // 2]:
            out.append(f"{types[name]:>10} {types[name] - self.types.get(name, 0):>+10}  {name}")
        self.types = types
        if tracemalloc.is_tracing():
            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)])
            out.append(f"\n== allocations by site (traced {tracemalloc.get_traced_memory()[0]} B)")
            out += [str(s) for s in snap.statistics("lineno")[:TOP]]
            if self.snapshot is not None:
                out.append("\n== grown since the previous dump")
                out += [str(s) for s in snap.compare_to(self.snapshot, "lineno")[:TOP]]
            self.snapshot = snap
        return out


def install(nsqd):
    """Dump on SIGUSR2 when NSQSHM_MEMORY_DUMP names a directory (a worker,
    after gevent's patching: the handler runs in the loop, not in a signal)."""
    directory = os.environ.get(ENV)
    if not directory:
        return None
    import gevent

    dump = MemoryDump(nsqd, directory)

    def safe_write():
        try:
            dump.write()
        except Exception as err:  # a debugging aid never takes the worker down
            nsqd.logf("error", f"memory dump failed - {err!r}")

    gevent.signal_handler(signal.SIGUSR2, safe_write)
    return dump
