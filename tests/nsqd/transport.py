"""Helpers for the transport tests (TLS, snappy, deflate, AUTH, sample rate):
a raw connection whose transport can be upgraded as a client does it, the
real client libraries run with options, an auth server.  Their fixtures are
in transport_fixtures.py (pytest_plugins of the test modules)."""

import json
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import snappy  # python-snappy, as pynsq and gnsq use it

from nsqshm import protocol as p
from tests.nsqd.conftest import wait_for

HERE = os.path.dirname(__file__)
HTTPS_LISTEN = re.compile(r"HTTPS: listening on (\S+):(\d+)")


def tls_args(certs, *extra):
    return (f"--tls-cert={certs['server']}.pem", f"--tls-key={certs['server']}.key",
            "--https-address=127.0.0.1:0", *extra)


def https_port(server):
    def find():
        for line in server.lines:
            m = HTTPS_LISTEN.search(line)
            if m:
                return int(m.group(2))
        return None
    port = wait_for(find, timeout=5)
    assert port, "".join(server.lines)
    return port


def client_context(certs, cert=None, maximum=None):
    ctx = ssl.create_default_context(cafile=certs["ca"] + ".pem")
    if cert:
        ctx.load_cert_chain(certs[cert] + ".pem", certs[cert] + ".key")
    if maximum:
        ctx.maximum_version = maximum
    return ctx


class Conn:
    """A raw V2 connection whose transport upgrades as a client's does."""

    def __init__(self, server, magic=p.MAGIC_V2):
        self.sock = socket.create_connection(server.tcp, timeout=10)
        self.raw = self.sock
        self.dec = p.FrameDecoder()
        self.compressor = self.decompressor = None
        self.wire_in = 0  # bytes received on the socket (after TLS)
        if magic:
            self.sock.sendall(magic)

    # -- transport --------------------------------------------------------------------

    def start_tls(self, ctx):
        self.sock = ctx.wrap_socket(self.sock, server_hostname="127.0.0.1")
        return self

    def start_snappy(self):
        c = snappy.StreamCompressor()
        self.compressor = c.add_chunk
        self.decompressor = snappy.StreamDecompressor().decompress
        return self

    def start_deflate(self, level=6):
        c = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        d = zlib.decompressobj(-zlib.MAX_WBITS)
        self.compressor = lambda data: c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)
        self.decompressor = d.decompress
        return self

    def send(self, data):
        if self.compressor is not None:
            data = self.compressor(data)
        self.sock.sendall(data)
        return self

    def recv_raw(self, timeout=10):
        self.sock.settimeout(timeout)
        data = self.sock.recv(1 << 20)
        self.wire_in += len(data)
        return data

    # -- frames -----------------------------------------------------------------------

    def frames(self, n=1, timeout=10, skip_heartbeats=True):
        out = []
        deadline = time.monotonic() + timeout
        while True:
            for f in self.dec.frames():
                if skip_heartbeats and f == (p.FRAME_TYPE_RESPONSE, p.HEARTBEAT):
                    continue
                out.append(f)
            if len(out) >= n:
                return out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"got {out}")
            data = self.recv_raw(remaining)
            if not data:
                raise ConnectionError(f"closed after {out}")
            if self.decompressor is not None:
                data = self.decompressor(data)
            self.dec.feed(data)

    def frame(self, timeout=10):
        return self.frames(1, timeout)[0]

    def messages(self, n, timeout=10):
        frames = self.frames(n, timeout)
        assert all(t == p.FRAME_TYPE_MESSAGE for t, _ in frames), frames
        return [p.decode_message(d) for _, d in frames]

    def closed(self, timeout=5):
        """True once the server closed the connection (frames read meanwhile are kept)."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                data = self.recv_raw(max(0.01, deadline - time.monotonic()))
                if not data:
                    return True
                if self.decompressor is not None:
                    data = self.decompressor(data)
                self.dec.feed(data)
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
            return True
        except TimeoutError:
            return False
        return False

    def read_exact(self, n, timeout=10):
        """n bytes straight from the socket (nothing more is consumed)."""
        self.sock.settimeout(timeout)
        buf = b""
        while len(buf) < n:
            data = self.sock.recv(n - len(buf))
            if not data:
                raise ConnectionError(f"closed after {buf!r}")
            buf += data
        return buf

    def raw_frame(self):
        """One frame read exactly from the socket, past any transport codec:
        what follows it (an upgraded stream) stays unread."""
        size = struct.unpack(">I", self.read_exact(4))[0]
        data = self.read_exact(size)
        return struct.unpack(">I", data[:4])[0], data[4:]

    def identify(self, **data):
        """IDENTIFY with feature negotiation; returns the decoded JSON reply."""
        data.setdefault("feature_negotiation", True)
        self.send(p.identify(data))
        ftype, payload = self.raw_frame()
        assert ftype == p.FRAME_TYPE_RESPONSE, payload
        return json.loads(payload)

    def ok(self):
        assert self.frame() == (p.FRAME_TYPE_RESPONSE, b"OK")
        return self

    def close(self):
        self.sock.close()


def publish(server, topic, *bodies):
    c = Conn(server)
    for body in bodies:
        c.send(p.pub(topic, body))
    assert c.frames(len(bodies)) == [(0, b"OK")] * len(bodies)
    c.close()


def mpublish(server, topic, bodies, batch=500):
    c = Conn(server)
    k = 0
    for i in range(0, len(bodies), batch):
        c.send(p.mpub(topic, bodies[i:i + batch]))
        k += 1
    assert c.frames(k) == [(0, b"OK")] * k
    c.close()


def run_client(library, scenario, server, topic, n=20, opts=None, timeout=60):
    """A tests/nsqd/clients scenario with NSQ_CLIENT_OPTS; its JSON result."""
    script = os.path.join(HERE, "clients", f"{library}_client.py")
    env = {**os.environ, "NSQ_CLIENT_OPTS": json.dumps(opts or {})}
    out = subprocess.run([sys.executable, script, scenario, f"127.0.0.1:{server.tcp_port}", topic,
                          str(n)], capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def stats(server, topic=None):
    path = "/stats?format=json" + (f"&topic={topic}" if topic else "")
    status, body = server.get(path)
    assert status == 200
    return json.loads(body)


def tcp_clients(server):
    """Every client in /stats (producers of topics and consumers of channels)."""
    s = stats(server)
    out = list(s.get("producers") or [])
    for t in s["topics"]:
        for c in t["channels"]:
            out.extend(c["clients"])
    return out


# -- an auth server ------------------------------------------------------------------


class AuthServer:
    """nsqd's auth protocol: answers /auth from `self.answers[secret]`
    ((status, JSON-able body)), recording every request."""

    def __init__(self):
        self.answers = {}
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query,
                                                      keep_blank_values=True).items()}
                if method == "POST":
                    query = {k: v[0] for k, v in json.loads(body).items()}
                outer.requests.append({"method": method, "path": parts.path, "query": query,
                                       "body": body, "headers": dict(self.headers)})
                status, answer = outer.answers.get(query.get("secret"), (403, {"message": "no"}))
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer("GET")

            def do_POST(self):
                self._answer("POST")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def allow(self, secret, authorizations, ttl=3600, identity="someone",
              identity_url="https://example.invalid/someone"):
        self.answers[secret] = (200, {"ttl": ttl, "identity": identity,
                                      "identity_url": identity_url,
                                      "authorizations": authorizations})

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def frame_bytes(ftype, data):
    return struct.pack(">II", len(data) + 4, ftype) + data
