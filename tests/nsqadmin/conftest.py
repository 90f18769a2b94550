"""Real `nsqshm admin` processes (and the nsqd/nsqlookupd they look at) on
ephemeral 127.0.0.1 ports."""

import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.nsqd.conftest import (  # noqa: F401  (fixtures)
    Lookupd,
    Server,
    lookupd,
    lookupd_factory,
    nsqd_factory,
    nsqd_workers,
    wait_for,
)

HTTP_LISTEN = re.compile(r"HTTP: listening on (\S+):(\d+)")
ARTIFACTS = os.path.join(os.path.dirname(__file__), "artifacts")


class Admin:
    """A real `nsqshm admin --http-address=127.0.0.1:0 ...`; its port is read
    back from its "HTTP: listening on" line."""

    def __init__(self, args, timeout=20):
        cmd = [sys.executable, "-m", "nsqshm.cli", "admin", "--http-address=127.0.0.1:0", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.port = None
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = HTTP_LISTEN.search(line)
                if m:
                    self.port = int(m.group(2))
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or self.port is None:
            self.stop()
            raise RuntimeError("nsqshm admin did not come up:\n" + "".join(self.lines))
        self.base = f"http://127.0.0.1:{self.port}"

    def url(self, path):
        return self.base + path

    def request(self, method, path, body=None, headers=None):
        """(status, headers, body bytes) whatever the status."""
        data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(self.url(path), data=data, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers, err.read()

    def get(self, path, headers=None):
        return self.request("GET", path, headers=headers)

    def json(self, method, path, body=None, headers=None):
        """(status, decoded JSON body)."""
        status, _, data = self.request(method, path, body, headers)
        return status, json.loads(data)

    stop = Server.stop  # SIGTERM, then SIGKILL after timeout; the exit code


@pytest.fixture
def admin_factory():
    started = []

    def start(*args):
        admin = Admin(list(args))
        started.append(admin)
        return admin

    yield start
    for admin in started:
        admin.stop()


def nsqd_json(server, path):
    status, body = server.get(path)
    assert status == 200, body
    return json.loads(body)


def nsqd_stats(server, topic=None):
    path = "/stats?format=json"
    if topic:
        path += f"&topic={topic}"
    return nsqd_json(server, path)


def channel_of(server, topic, channel):
    """A channel's entry in nsqd's /stats, or None."""
    for t in nsqd_stats(server, topic)["topics"] or ():
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c
    return None


def topic_of(server, topic):
    for t in nsqd_stats(server)["topics"] or ():
        if t["topic_name"] == topic:
            return t
    return None


class Cluster:
    """nsqlookupd with two nsqshm nsqd registered to it (one for the session:
    every test uses its own topic names)."""

    def __init__(self, tmp_path_factory):
        self.lookupd = Lookupd()
        self.nodes = []
        for i in range(2):
            path = tmp_path_factory.mktemp(f"nsqd{i}")
            self.nodes.append(Server([f"--lookupd-tcp-address={self.lookupd.tcp_address}",
                                      "--broadcast-address=127.0.0.1",
                                      "--e2e-processing-latency-percentile=0.99,0.5"],
                                     str(path)))
        self.addrs = [f"127.0.0.1:{n.http_port}" for n in self.nodes]

    def make_topic(self, topic, channel=None, nodes=None, messages=1):
        """Publish to topic on every node (and create channel first) and wait for
        lookupd to know each node produces it."""
        nodes = self.nodes if nodes is None else nodes
        for n in nodes:
            if channel:
                n.post(f"/topic/create?topic={topic}")
                assert n.post(f"/channel/create?topic={topic}&channel={channel}")[0] == 200
            for i in range(messages):
                assert n.post(f"/pub?topic={topic}", f"m{i}".encode())[0] == 200
        assert wait_for(lambda: len(self.lookupd.producers(topic)) == len(nodes)), topic

    def close(self):
        for n in self.nodes:
            n.cleanup()
        self.lookupd.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory)
    yield c
    c.close()


class StubHTTP:
    """A small HTTP server standing in for something nsqadmin talks to (the
    notification endpoint, graphite, a Go nsqd, a lookupd): answer(method, path)
    gives (content type, JSON-able document), or (content type, raw bytes,
    status); every request is kept in .requests as (method, path, headers, body)."""

    def __init__(self, answer):
        requests = self.requests = []

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                requests.append((self.command, self.path, self.headers, body))
                ctype, doc, *status = answer(self.command, self.path)
                data = doc if status else json.dumps(doc).encode()
                self.send_response(status[0] if status else 200)
                self.send_header("Content-Type", ctype)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _serve

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.addr = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    """The notification webhook's endpoint: .url, and .requests as POSTed."""
    r = StubHTTP(lambda method, path: ("application/json", {}))
    r.url = f"http://{r.addr}/notify"
    yield r
    r.close()
