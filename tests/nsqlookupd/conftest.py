"""Real `nsqshm lookupd` (and `nsqshm start`) processes on ephemeral 127.0.0.1 ports."""

import json
import socket
import struct

from tests.nsqd.conftest import (  # noqa: F401  (fixtures)
    Lookupd,
    lookupd,
    lookupd_factory,
    nsqd,
    nsqd_factory,
    nsqd_workers,
    wait_for,
)


class LookupConn:
    """A raw nsqlookupd TCP client: what nsqd sends, byte for byte."""

    def __init__(self, server, magic=b"  V1"):
        self.sock = socket.create_connection(server.tcp, timeout=5)
        if magic:
            self.sock.sendall(magic)

    def send(self, data):
        self.sock.sendall(data)

    def read_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError(f"closed after {buf!r}")
            buf += chunk
        return buf

    def raw_response(self):
        """The size prefix and the data, as sent."""
        head = self.read_exact(4)
        return head + self.read_exact(struct.unpack(">i", head)[0])

    def response(self):
        return self.raw_response()[4:]

    def command(self, line, body=None):
        data = line + b"\n"
        if body is not None:
            data += struct.pack(">i", len(body)) + body
        self.send(data)
        return self.response()

    def identify(self, **fields):
        info = {"broadcast_address": "node.example", "hostname": "nodehost", "tcp_port": 4150,
                "http_port": 4151, "version": "1.3.0"}
        info.update(fields)
        return json.loads(self.command(b"IDENTIFY", json.dumps(info).encode()))

    def is_closed(self, timeout=5):
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self):
        self.sock.close()
