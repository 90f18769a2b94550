"""The server under test, one interface whichever it is: `nsqshm start` in a
temp dir on ephemeral ports, or any NSQ-compatible server already running
(--nsqd-tcp-address, e.g. a Go nsqd measured side by side).

Server CPU is read from /proc for the whole process tree (a supervisor and
its workers count together), when the pid is known."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

LISTEN = re.compile(r"(TCP|HTTP): listening on \[?([^\s\]]+?)\]?:(\d+)")
TICK = os.sysconf("SC_CLK_TCK")
MESSAGE_OVERHEAD = 26 + 8 + 4  # message header, ring record header, slack


class ServerRejected(RuntimeError):
    """`nsqshm start` exited before listening (exit 2: a flag it does not take)."""

    def __init__(self, returncode, output):
        lines = output.strip().splitlines() or ["(no output)"]
        # the first fatal line says why; the last one what happened then
        why = [x for x in lines if "FATAL" in x or "Error" in x][:1]
        super().__init__(f"nsqshm start exited with {returncode}: "
                         + " / ".join(dict.fromkeys([*why, lines[-1]])))
        self.returncode = returncode
        self.output = output


def parse_address(text):
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def _stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def descendants(pid):
    """Pids of every live process below pid."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(int(_stat(entry)[1]), []).append(int(entry))
            except (OSError, IndexError):
                pass  # exited while we looked
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def tree_cpu_seconds(pid):
    """CPU time of pid and its live descendants, plus the children each has
    reaped (cutime+cstime), so a worker that exited still counts.  Live
    processes are read in nanoseconds from their threads' schedstat (the
    10 ms ticks of utime+stime rounded a short phase to 0); ticks when a
    kernel has no schedstat."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        try:
            f = _stat(p)
        except OSError:
            continue
        total += (int(f[13]) + int(f[14])) / TICK
        ns = _schedstat_ns(p)
        total += ns / 1e9 if ns is not None else (int(f[11]) + int(f[12])) / TICK
    return total


def _schedstat_ns(pid):
    """Nanoseconds on CPU of every thread of pid, or None."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            if tid == str(pid):
                return None  # no schedstat here
    return total


class Target:
    def __init__(self, tcp, http=None, pid=None, proc=None, prefix=None, data=None):
        self.tcp, self.http, self.pid = tcp, http, pid
        self.proc, self.prefix, self.data = proc, prefix, data
        self.lines = []

    @property
    def started(self):
        return self.proc is not None

    def cpu_seconds(self):
        return tree_cpu_seconds(self.pid) if self.pid else None

    def processes(self):
        return 1 + len(descendants(self.pid)) if self.pid else None

    def _get(self, path):
        host, port = self.http
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as resp:
            return resp.read()

    def channel(self, topic, channel):
        """The channel's /stats entry, or None without an HTTP address."""
        if not self.http:
            return None
        stats = json.loads(self._get(f"/stats?format=json&topic={topic}"))
        stats = stats.get("data", stats)  # nsqd before 1.0 wrapped it in "data"
        for t in stats.get("topics") or []:
            for ch in t.get("channels") or []:
                if t["topic_name"] == topic and ch["channel_name"] == channel:
                    return ch
        return None

    def settled(self, topic, channel, timeout=10):
        """Wait for nothing in flight and nothing queued; the channel's counters."""
        if not self.http:
            return None
        deadline = time.monotonic() + timeout
        while True:
            ch = self.channel(topic, channel) or {}
            if (ch.get("in_flight_count") == 0 and ch.get("depth") == 0) \
                    or time.monotonic() > deadline:
                return {k: ch.get(k) for k in ("message_count", "in_flight_count", "depth",
                                               "requeue_count", "timeout_count")}
            time.sleep(0.01)

    def delete_topic(self, topic):
        """Free a finished run's topic on a long-lived server."""
        if self.http and not self.started:
            host, port = self.http
            req = urllib.request.Request(f"http://{host}:{port}/topic/delete?topic={topic}",
                                         method="POST")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(req, timeout=10).close()

    def close(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for entry in os.listdir("/dev/shm"):
            if entry.startswith(self.prefix):
                with contextlib.suppress(OSError):
                    os.unlink(f"/dev/shm/{entry}")
        shutil.rmtree(self.data, ignore_errors=True)
        self.proc = None


RETRIED = []  # what failed and was run again during a suite: its JSON and RESULTS.md say so


def start_nsqshm(extra=(), timeout=30, retries=1, tree=None):
    """`nsqshm start` on 127.0.0.1 ephemeral ports in a fresh temp dir; a
    start that fails other than on its flags (exit 2) is retried, and noted
    in RETRIED.  tree: run the nsqshm of that source tree (its PYTHONPATH;
    built in place), e.g. the previous build for before/after figures."""
    for attempt in range(retries + 1):
        try:
            return _start(extra, timeout, tree)
        except (ServerRejected, RuntimeError) as err:
            if getattr(err, "returncode", None) == 2 or attempt == retries:
                raise
            RETRIED.append(f"a server start: {err}")


def _start(extra, timeout, tree=None):
    prefix = f"nsqshm-bench-{uuid.uuid4().hex[:8]}"
    data = tempfile.mkdtemp(prefix="nsqshm-bench-")
    cmd = [sys.executable, "-m", "nsqshm.cli", "start", "--tcp-address=127.0.0.1:0",
           "--http-address=127.0.0.1:0", f"--data-path={data}", f"--shm-prefix={prefix}", *extra]
    env = None if tree is None else {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env, cwd=tree)
    target = Target(None, proc=proc, pid=proc.pid, prefix=prefix, data=data)
    ports, ready = {}, threading.Event()

    def read():  # keeps reading for the server's life: a full stderr pipe would block it
        for line in proc.stderr:
            target.lines.append(line)
            m = LISTEN.search(line)
            if m and m.group(1) not in ports:
                ports[m.group(1)] = (m.group(2), int(m.group(3)))
                if len(ports) == 2:
                    ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(timeout)
    if len(ports) < 2:
        try:
            rc = proc.wait(1)
        except subprocess.TimeoutExpired:
            rc = None
        target.close()
        if rc is not None:
            raise ServerRejected(rc, "".join(target.lines))
        raise RuntimeError("nsqshm start did not come up:\n" + "".join(target.lines))
    target.tcp, target.http = ports["TCP"], ports["HTTP"]
    return target


def post(target, path, data=b"", timeout=30):
    """POST to the target's HTTP API; the answer's body."""
    host, port = target.http
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=data, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.read()


def wait_local(target, timeout=10):
    """Until the broker's instance file is in /dev/shm: how local clients
    (nsqshm.local) find it; it may come a moment after the listen lines."""
    deadline = time.monotonic() + timeout
    path = f"/dev/shm/{target.prefix}.instance"
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    return os.path.exists(path)


def mem_queue_size(messages, size):
    """--mem-queue-size that holds a whole backlog in memory: the count, and
    ring bytes (the broker gives a queue 512 bytes per unit)."""
    return max(messages, messages * (size + MESSAGE_OVERHEAD) // 512) + 1024


@contextlib.contextmanager
def server(args, extra=(), backlog=(0, 200)):
    """The server a run uses: the one at --nsqd-tcp-address, else a fresh
    nsqshm whose memory holds `backlog` (messages, size) without spilling to disk."""
    if getattr(args, "nsqd_tcp_address", None):
        http = args.nsqd_http_address
        yield Target(parse_address(args.nsqd_tcp_address), parse_address(http) if http else None,
                     pid=args.nsqd_pid)
        return
    flags = [f"--mem-queue-size={mem_queue_size(*backlog)}"] if backlog[0] else []
    target = start_nsqshm([*flags, *extra])
    try:
        yield target
    finally:
        target.close()
