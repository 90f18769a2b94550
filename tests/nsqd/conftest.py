"""A real `nsqshm start` process on ephemeral 127.0.0.1 ports, per test."""

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
    def __init__(self, args, data_path, env=None, prefix=None, wrap=()):
        self.prefix = prefix or f"nsqshm-test-{uuid.uuid4().hex[:10]}"
        self.data_path = data_path
        if not any(a.startswith(("--workers", "-workers")) for a in args):
            args = ["--workers=1", *args]  # one worker unless a test asks for more
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


@pytest.fixture
def nsqd_factory(tmp_path):
    servers = []

    def start(*args, data_path=None, env=None, prefix=None, wrap=()):
        server = Server(list(args), str(data_path or tmp_path), env=env, prefix=prefix,
                        wrap=wrap)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.cleanup()


@pytest.fixture
def nsqd(nsqd_factory):
    return nsqd_factory()


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
