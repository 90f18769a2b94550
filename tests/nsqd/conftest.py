"""A real `nsqshm start` process on ephemeral 127.0.0.1 ports, per test.

Worker counts: a server has one worker unless its test asks for more.  A
test module that sets WORKER_COUNTS = (1, 2) runs each of its tests that
starts a server (through nsqd_factory, nsqd, or the nsqd_workers fixture of
its own module-scoped servers) once per count, ids `w1` and `w2`: what one
nsqd does, the broker does whichever worker takes a connection.  A test that
is about one worker says so with @pytest.mark.workers(1).
"""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pytest

LISTEN = re.compile(r"(TCP|HTTP): listening on (\S+):(\d+)")


class Server:
    def __init__(self, args, data_path, env=None, prefix=None, workers=1, wrap=()):
        self.prefix = prefix or f"nsqshm-test-{uuid.uuid4().hex[:10]}"
        self.data_path = data_path
        if not any(a.startswith(("--workers", "-workers")) for a in args):
            args = [f"--workers={workers}", *args]
        self.workers = workers
        for a in args:
            if a.startswith(("--workers=", "-workers=")):
                self.workers = int(a.partition("=")[2])
        # wrap: a command that execs the rest (e.g. unshare: a mount namespace)
        cmd = [*wrap, sys.executable, "-m", "nsqshm.cli", "start", "--tcp-address=127.0.0.1:0",
               "--http-address=127.0.0.1:0", f"--data-path={data_path}",
               f"--shm-prefix={self.prefix}", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines = []
        self.ports = {}
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = LISTEN.search(line)
                if m:
                    self.ports[m.group(1)] = int(m.group(3))
                    if len(self.ports) == 2:
                        ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(20) or len(self.ports) < 2:
            self.stop()
            raise RuntimeError("nsqshm start did not come up:\n" + "".join(self.lines))
        self.tcp_port = self.ports["TCP"]
        self.http_port = self.ports["HTTP"]
        self.tcp = ("127.0.0.1", self.tcp_port)
        self.http = f"http://127.0.0.1:{self.http_port}"

    def url(self, path):
        return self.http + path

    def get(self, path):
        with urllib.request.urlopen(self.url(path), timeout=10) as resp:
            return resp.status, resp.read()

    def post(self, path, body=b""):
        req = urllib.request.Request(self.url(path), data=body, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def stop(self, sig=signal.SIGTERM, timeout=10):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def cleanup(self):
        self.stop()
        for entry in os.listdir("/dev/shm"):
            if entry.startswith(self.prefix):
                try:
                    os.unlink(f"/dev/shm/{entry}")
                except FileNotFoundError:
                    pass


def pytest_generate_tests(metafunc):
    """WORKER_COUNTS of the module, or the test's own workers mark."""
    if "nsqd_workers" not in metafunc.fixturenames:
        return
    mark = metafunc.definition.get_closest_marker("workers")
    counts = mark.args if mark is not None else getattr(metafunc.module, "WORKER_COUNTS", None)
    if counts:
        metafunc.parametrize("nsqd_workers", counts, indirect=True, scope="module",
                             ids=[f"w{n}" for n in counts])


@pytest.fixture(scope="module")
def nsqd_workers(request):
    """How many workers the servers of this test run (see the module docstring)."""
    return getattr(request, "param", 1)


class Spares:
    """Servers started ahead, for the tests that start one with the same flags as
    an earlier test did: a start costs ~0.5 s of the run's wall time (imports,
    fork), and most tests start one.  Spares start in threads while tests run; one
    is handed out only to a test that would start exactly that server (same flags
    and worker count, its own temporary data path, shm prefix and the environment
    as it is) -- so the test sees the server it asked for, started a moment
    earlier.  Flags are pre-started once seen twice (a one-off start is not
    wasted), DEPTH ahead; spares of at most KEYS flag sets are kept."""

    DEPTH = 2
    KEYS = 2

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.seen = {}  # key -> requests so far
        self.ready = {}  # key -> [(thread, box)]: box["server"] or box["error"]
        self.hits = self.misses = 0
        self.waited = 0.0

    def take(self, args, workers):
        key = (tuple(args), workers)
        self.seen[key] = self.seen.get(key, 0) + 1
        queue = self.ready.pop(key, [])
        server = None
        if queue:
            thread, box = queue.pop(0)
            t0 = time.monotonic()
            thread.join()
            self.waited += time.monotonic() - t0
            server = box.get("server")
            self.hits += 1
        else:
            self.misses += 1
        if self.seen[key] >= 2 and self.DEPTH > 0:
            while len(self.ready) >= self.KEYS:  # the flags seen longest ago go
                self._drop(self.ready.pop(next(iter(self.ready))))
            while len(queue) < self.DEPTH:
                queue.append(self._start(key))
            self.ready[key] = queue  # (re-inserted: the most recent last)
        else:
            self._drop(queue)
        return server

    def _start(self, key):
        box = {}
        data_path = str(self.tmp_path_factory.mktemp("spare"))

        def run():
            try:
                box["server"] = Server(list(key[0]), data_path, workers=key[1])
            except RuntimeError as err:  # the test then starts its own (and sees why)
                box["error"] = err

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread, box

    @staticmethod
    def _drop(queue):
        for thread, box in queue:
            thread.join()
            if box.get("server") is not None:
                box["server"].cleanup()

    def close(self):
        if os.environ.get("NSQSHM_TEST_SPARES_REPORT"):
            print(f"\nspares: {self.hits} taken (waited {self.waited:.1f}s), "
                  f"{self.misses} started on demand")
        for queue in self.ready.values():
            self._drop(queue)
        self.ready.clear()


# a test that asks for these itself may look at the data path or change the
# environment before it starts a server: it gets a server started then, not a spare
NOT_FOR_SPARES = frozenset({"tmp_path", "tmp_path_factory", "monkeypatch"})


@pytest.fixture
def nsqd_factory(request, tmp_path, nsqd_workers, nsqd_spares):
    servers = []
    spares_ok = not NOT_FOR_SPARES & set(request.node._fixtureinfo.argnames)

    def start(*args, data_path=None, env=None, prefix=None, wrap=()):
        server = None
        if spares_ok and data_path is None and env is None and prefix is None and not wrap:
            server = nsqd_spares.take(args, nsqd_workers)
        if server is None:
            server = Server(list(args), str(data_path or tmp_path), env=env, prefix=prefix,
                            workers=nsqd_workers, wrap=wrap)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.cleanup()


@pytest.fixture
def nsqd(nsqd_factory):
    return nsqd_factory()


def http_on_worker(server, index, tries=200):
    """A kept-alive HTTP connection that landed on worker `index` (the kernel
    spreads new connections over the workers' listeners)."""
    for _ in range(tries):
        conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
        conn.request("GET", "/debug/nsqshm/worker")
        info = json.loads(conn.getresponse().read())
        if info["index"] == index:
            return conn
        conn.close()
    raise AssertionError(f"no HTTP connection landed on worker {index} in {tries} tries")


def http_on_each_worker(server):
    """{index: kept-alive HTTP connection} for every worker of server."""
    return {index: http_on_worker(server, index) for index in range(server.workers)}


def http_call(conn, method, path, body=None):
    """(status, body) of one request on a kept-alive connection."""
    conn.request(method, path, body=body)
    resp = conn.getresponse()
    return resp.status, resp.read()


def wait_for(predicate, timeout=10.0, interval=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


class Lookupd:
    """A real `nsqshm lookupd` process; ports 0 pick free ones (read back from
    its "listening on" lines).  restart() comes back on the same ports."""

    def __init__(self, args=(), tcp_port=0, http_port=0):
        self.args = list(args)
        self.lines = []
        cmd = [sys.executable, "-m", "nsqshm.cli", "lookupd",
               f"--tcp-address=127.0.0.1:{tcp_port}", f"--http-address=127.0.0.1:{http_port}",
               "--broadcast-address=127.0.0.1", *self.args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.ports = {}
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = LISTEN.search(line)
                if m:
                    self.ports[m.group(1)] = int(m.group(3))
                    if len(self.ports) == 2:
                        ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(20) or len(self.ports) < 2:
            self.stop()
            raise RuntimeError("nsqshm lookupd did not come up:\n" + "".join(self.lines))
        self.tcp_port = self.ports["TCP"]
        self.http_port = self.ports["HTTP"]
        self.tcp = ("127.0.0.1", self.tcp_port)
        self.tcp_address = f"127.0.0.1:{self.tcp_port}"
        self.http_address = f"127.0.0.1:{self.http_port}"
        self.http = f"http://{self.http_address}"

    def get_json(self, path):
        import json

        with urllib.request.urlopen(self.http + path, timeout=10) as resp:
            return json.loads(resp.read())

    def post(self, path):
        req = urllib.request.Request(self.http + path, data=b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def producers(self, topic):
        """(broadcast_address, tcp_port) of the active producers of topic."""
        from urllib.parse import quote

        try:
            doc = self.get_json(f"/lookup?topic={quote(topic, safe='')}")
        except urllib.error.HTTPError:
            return []
        return sorted((p["broadcast_address"], p["tcp_port"]) for p in doc["producers"])

    def stop(self, sig=signal.SIGTERM, timeout=10):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def restart(self):
        """Stop, then start again on the same ports (a new, empty registration DB)."""
        self.stop()
        return Lookupd(self.args, self.tcp_port, self.http_port)


@pytest.fixture
def lookupd_factory():
    started = []

    def start(*args):
        lookupd = Lookupd(args)
        started.append(lookupd)
        return lookupd

    start.started = started
    yield start
    for lookupd in started:
        lookupd.stop()


@pytest.fixture
def lookupd(lookupd_factory):
    return lookupd_factory()
