"""Worker 0 watches the local clients' arenas (nsqshm.local, the Spark
source) and puts back the messages of a client that died.

Nothing polls.  inotify on /dev/shm tells when an arena of this broker's
prefix appears; a pidfd of its owner (os.pidfd_open) becomes readable when
that process exits; then recovery.recover_arena puts its LIVE and DEFERRED
messages back into their channels and removes it.  A Spark micro-batch's
arena is kept until its messages' due time first, for a restarted query to
adopt (nsqshm/spark/stream.py).  An arena whose owner
changes (a Spark driver taking its readers' batches, Arena.set_owner) is
watched again under the new owner.
"""

import ctypes
import errno
import os
import struct
import time

import gevent
import gevent.event
from gevent.hub import get_hub

from nsqshm._core.arena import Arena, ArenaError
from nsqshm._core.localbatch import arena_due
from nsqshm.nsqd.tracing.tracefiles import prune_local, trace_dir
from nsqshm.nsqd.workers import recovery
from nsqshm.nsqd.workers.waiting import wait_fd_or_event

IN_CREATE = 0x100
IN_MOVED_TO = 0x80
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name
TAGS = ("f.l", "f.s")


class LocalWatch:
    def __init__(self, nsqd):
        self.nsqd = nsqd
        self.prefixes = tuple(f"{nsqd.shm_prefix}.{tag}" for tag in TAGS)
        self.watched = {}  # arena name -> greenlet waiting for its owner to exit
        self.fd = -1
        self.greenlet = None
        self._never = gevent.event.Event()  # waits here end on the pidfd or the timeout

    def start(self):
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            self.nsqd.logf("warn", f"LOCAL: inotify unavailable ({os.strerror(ctypes.get_errno())}); "
                                   f"dead local clients are recovered at the next start")
            return
        if libc.inotify_add_watch(fd, b"/dev/shm", IN_CREATE | IN_MOVED_TO) < 0:
            os.close(fd)
            return
        self.fd = fd
        self.greenlet = gevent.spawn(self._loop)
        for name in self._existing():
            self.watch(name)
        self._prune_traces()

    def stop(self):
        if self.greenlet is not None:
            self.greenlet.kill(block=False)
        for g in list(self.watched.values()):
            g.kill(block=False)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _existing(self):
        names = []
        for prefix in self.prefixes:
            names += Arena.list(prefix)
        return names

    def _loop(self):
        hub = get_hub()
        while True:
            watcher = hub.loop.io(self.fd, 1)
            try:
                hub.wait(watcher)
            finally:
                watcher.close()
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                continue
            pos = 0
            while pos + EVENT.size <= len(data):
                _wd, _mask, _cookie, length = EVENT.unpack_from(data, pos)
                name = data[pos + EVENT.size:pos + EVENT.size + length].rstrip(b"\0").decode(
                    errors="replace")
                pos += EVENT.size + length
                if name.startswith(self.prefixes):
                    self.watch(name)

    def watch(self, name):
        if name not in self.watched:
            self.watched[name] = gevent.spawn(self._await_owner, name)

    def _await_owner(self, name):
        """Wait for the arena's owner to exit (following a change of owner),
        then recover it."""
        try:
            for _attempt in range(50):  # a fresh segment: its header comes right after
                try:
                    arena = Arena.attach(name)
                    break
                except (ArenaError, ValueError):
                    gevent.sleep(0.1)
                except OSError as err:
                    if err.errno == errno.ENOENT or "does not exist" in str(err):
                        return
                    gevent.sleep(0.1)
            else:
                return
            spark = name.startswith(f"{self.nsqd.shm_prefix}.f.s")
            try:
                while True:
                    pid = arena.owner_pid
                    if not arena.owner_alive():
                        if not spark:
                            break
                        # a Spark batch waits for its due time: a query restarted from
                        # its checkpoint meanwhile adopts it (nsqshm/spark/stream.py)
                        live, due = arena_due(arena)
                        wait = (due - time.time_ns()) / 1e9 if live else 0
                        if wait <= 0:
                            break
                        gevent.sleep(min(wait, 30.0))
                        continue
                    try:
                        pidfd = os.pidfd_open(pid)
                    except ProcessLookupError:
                        continue
                    try:
                        # readable when the process exits; re-check the owner now and then
                        # in case it was handed over (a Spark driver taking its batches)
                        wait_fd_or_event(pidfd, self._never, timeout=30.0)
                    finally:
                        os.close(pidfd)
                    if not os.path.exists(f"/dev/shm/{name}"):
                        return
            finally:
                arena.close()
            recovery.recover_arena(self.nsqd, name)
        except Exception as err:  # never let one client's arena stop the watch
            self.nsqd.logf("error", f"LOCAL: watching {name} failed - {err!r}")
        finally:
            self.watched.pop(name, None)
            self._prune_traces()

    def _prune_traces(self):
        """The trace logs of local processes that exited, kept within bounds
        (tracefiles.prune_local)."""
        try:
            prune_local(trace_dir(self.nsqd.data_path))
        except OSError as err:
            self.nsqd.logf("warn", f"LOCAL: pruning local trace logs failed - {err}")

