"""Message tracing for local consumers (docs/headers.md, Tracing).

A local Consumer delivers, finishes, requeues and times out messages in its
own process, so it records those events itself while tracing is on for its
topic or channel (POST /message/trace/enable): in a log of its process
beside the workers' (<data-path>/nsqshm.trace/l<pid>.events and .streams,
nsqshm/nsqd/tracing/tracefiles.py), written in C by the same TraceWriter, which the
broker's GET /message/trace reads with the workers' logs (the client is
"shm:<pid>", as in /stats).  The switches are the broker's switches.json,
looked at again at most every SWITCH_CHECK seconds.  The files are made
only when something is traced; the broker removes the logs of exited
processes past tracefiles.LOCAL_KEEP_BYTES, oldest first.
"""

import fcntl
import logging
import os
import threading
import time

from nsqshm._core.tracelog import EVENT_CODES, TraceWriter
from nsqshm.nsqd.tracing.tracefiles import (
    LOCAL,
    LOCAL_MAX_LOG_BYTES,
    append_stream,
    read_streams,
    read_switches,
    switches_mtime,
    trace_dir,
)

SWITCH_CHECK = 0.5  # seconds between looks at the switches file
log = logging.getLogger("nsqshm.local")
FIN, REQ, TOUCH, TIMEOUT = (EVENT_CODES[e] for e in ("FIN", "REQ", "TOUCH", "TIMEOUT"))

_lock = threading.Lock()
_logs = {}  # (pid, data path) -> LocalTrace


def for_broker(broker):
    """This process's trace log for `broker` (a forked child gets its own)."""
    key = (os.getpid(), broker.info.get("data_path") or "")
    with _lock:
        log = _logs.get(key)
        if log is None:
            log = _logs[key] = LocalTrace(key[1])
        return log


class LocalTrace:
    def __init__(self, data_path):
        self.directory = trace_dir(data_path) if data_path else None
        self.pid = os.getpid()
        self.writer = None
        self._refs = {}
        self._lock = threading.Lock()
        self._on = set()
        self._mtime = -1
        self._checked = 0.0
        self._failed = False
        self._lock_fd = -1

    def traced(self, topic, channel):
        """Tracing is on for the channel or its topic (the broker's switches)."""
        if self.directory is None:
            return False
        now = time.monotonic()
        if now - self._checked >= SWITCH_CHECK:
            self._checked = now
            mtime = switches_mtime(self.directory)
            if mtime != self._mtime:
                self._mtime = mtime
                self._on = read_switches(self.directory)
        on = self._on
        return bool(on) and ((topic, "") in on or (topic, channel) in on)

    def stream(self, topic, channel):
        """(writer, this log's number for the channel), the files made on first use;
        None when they cannot be (a full or read-only disk): logged once, and the
        consumer goes on untraced."""
        try:
            return self._stream(topic, channel)
        except OSError as err:
            if not self._failed:
                self._failed = True
                log.warning("nsqshm.local: tracing %s:%s failed, going on untraced - %s",
                            topic, channel, err)
            return None

    def _stream(self, topic, channel):
        with self._lock:
            if self.writer is None:
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
                base = os.path.join(self.directory, f"{LOCAL}{self.pid}")
                streams = f"{base}.streams"
                # held while this process lives: worker 0's pruning skips a log whose
                # table it cannot lock (tracefiles.prune_local)
                fd = os.open(streams, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(fd, fcntl.LOCK_SH)
                self._lock_fd, self._streams = fd, streams
                self._refs = {key: ref for ref, key in read_streams(streams).items()}
                self.writer = TraceWriter(os.fsencode(f"{base}.events"), LOCAL_MAX_LOG_BYTES)
            key = (topic, channel)
            ref = self._refs.get(key)
            if ref is None:
                ref = len(self._refs) + 1
                append_stream(self._streams, ref, topic, channel)
                self._refs[key] = ref
            return self.writer, ref
