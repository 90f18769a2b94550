"""Seeded HTTP requests for the fuzzer, to every endpoint of nsqd, nsqlookupd
and nsqadmin, as raw bytes (so that malformed ones can be sent): a request
from the endpoint table with odd names, parameters and bodies, sizes around
--max-msg-size and --max-body-size, then header and byte mutations.

Nothing here changes what the run depends on: no PUT /config value is ever
valid (log levels and lookupd addresses stay), and the witness topics of the
runner are never named."""

import struct
from urllib.parse import quote

from .v2_inputs import BAD_NAMES, NAMES, tag

NSQD = [
    ("GET", "/ping"), ("GET", "/info"), ("GET", "/stats"), ("GET", "/stats?format=json"),
    ("GET", "/stats?format=json&topic={t}&channel={c}&include_clients=false"),
    ("GET", "/stats?format=text&topic={t}"), ("POST", "/pub?topic={t}"),
    ("POST", "/pub?topic={t}&defer={n}"), ("POST", "/mpub?topic={t}"),
    ("POST", "/mpub?topic={t}&binary=true"), ("POST", "/topic/create?topic={t}"),
    ("POST", "/topic/delete?topic={t}"), ("POST", "/topic/empty?topic={t}"),
    ("POST", "/topic/pause?topic={t}"), ("POST", "/topic/unpause?topic={t}"),
    ("POST", "/channel/create?topic={t}&channel={c}"),
    ("POST", "/channel/delete?topic={t}&channel={c}"),
    ("POST", "/channel/empty?topic={t}&channel={c}"),
    ("POST", "/channel/pause?topic={t}&channel={c}"),
    ("POST", "/channel/unpause?topic={t}&channel={c}"),
    ("GET", "/config/nsqlookupd_tcp_addresses"), ("GET", "/config/log_level"),
    ("PUT", "/config/log_level"), ("PUT", "/config/nsqlookupd_tcp_addresses"),
    ("GET", "/config/{t}"), ("GET", "/debug/nsqshm/worker"), ("GET", "/metrics"),
    ("GET", "/"), ("GET", "/{t}"),
]
LOOKUPD = [
    ("GET", "/ping"), ("GET", "/info"), ("GET", "/debug"), ("GET", "/lookup?topic={t}"),
    ("GET", "/topics"), ("GET", "/channels?topic={t}"), ("GET", "/nodes"),
    ("POST", "/topic/create?topic={t}"), ("POST", "/topic/delete?topic={t}"),
    ("POST", "/channel/create?topic={t}&channel={c}"),
    ("POST", "/channel/delete?topic={t}&channel={c}"),
    ("POST", "/topic/tombstone?topic={t}&node={node}"), ("GET", "/{t}"),
]
ADMIN = [
    ("GET", "/"), ("GET", "/ping"), ("GET", "/topics"), ("GET", "/topics/{t}"),
    ("GET", "/topics/{t}/{c}"), ("GET", "/nodes"), ("GET", "/nodes/{node}"), ("GET", "/counter"),
    ("GET", "/lookup"), ("GET", "/api/topics"), ("GET", "/api/topics/{t}"),
    ("GET", "/api/topics/{t}/{c}"), ("GET", "/api/nodes"), ("GET", "/api/nodes/{node}"),
    ("GET", "/api/counter"), ("GET", "/api/graphite?metric=x&target=y&range=1h"),
    ("POST", "/api/topics"), ("POST", "/api/topics/{t}"), ("POST", "/api/topics/{t}/{c}"),
    ("DELETE", "/api/topics/{t}"), ("DELETE", "/api/topics/{t}/{c}"),
    ("DELETE", "/api/nodes/{node}"), ("GET", "/config/{t}"), ("PUT", "/config/nsqlookupd_http_addresses"),
    ("GET", "/static/{t}"), ("GET", "/fonts/{t}"), ("GET", "/render?target=x"),
]
METHODS = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "get", "BREW", ""]
ADMIN_BODIES = [b'{"action": "pause"}', b'{"action": "unpause"}', b'{"action": "empty"}',
                b'{"action": "x"}', b'{"topic": "fz1", "channel": "c", "action": "create"}', b"{",
                b"[]", b"null", b'{"action": 1}']
BAD_CONFIG = [b"", b"x", b"[", b'["::::"', b"\xff", b'{"a": 1}', b'"verbose"', b"-1"]


def name(rng, names=NAMES):
    """(name as it goes in a URL, the name) of a topic or channel."""
    r = rng.random()
    if r < 0.7:
        raw = rng.choice(names)
        return quote(raw, safe=""), raw
    if r < 0.9:
        raw = rng.choice(BAD_NAMES)
        return quote(raw, safe=""), raw
    return rng.choice(["%zz", "%", "a%00b", "..%2f..%2fetc", "a+b", "a b", "\u00e9", "a&b=c"]), None


class HttpGenerator:
    def __init__(self, limits, names=NAMES):
        self.limits = limits
        self.names = names
        self.nonce = 0

    def body(self, rng, path, method, topic):
        m = self.limits.msg
        if "/mpub" in path and "binary" in path:
            n = rng.randrange(1, 5)
            payload = b"".join(struct.pack(">i", s) + b"x" * s
                               for s in (rng.choice([1, m, 10]) for _ in range(n)))
            return struct.pack(">i", n) + payload
        if "/mpub" in path:
            return b"\n".join(b"m" * rng.choice([1, 10, m, m + 1]) for _ in range(rng.randrange(1, 4)))
        if "/pub" in path:
            self.nonce += 1
            size = rng.choice([0, 1, m, m + 1, None])
            body = tag(topic or b"?", self.nonce)  # a subscriber of topic may get it
            return body if size is None else (body * (size // len(body) + 1))[:size]
        if path.startswith("/config"):
            return rng.choice(BAD_CONFIG)
        if method in ("POST", "DELETE") and path.startswith("/api"):
            return rng.choice(ADMIN_BODIES)
        return b""

    def request(self, rng, table, node):
        method, path = rng.choice(table)
        topic, raw_topic = name(rng, self.names)
        path = path.format(t=topic, c=name(rng, self.names)[0],
                           n=rng.choice([0, 1, 3600000, 3600001, -1, "x"]),
                           node=node if rng.random() < 0.7 else name(rng, self.names)[0])
        if rng.random() < 0.05:
            method = rng.choice(METHODS)
        body = self.body(rng, path, method, raw_topic)
        headers = [b"Host: 127.0.0.1", b"Connection: close"]
        length = len(body)
        short = False
        r = rng.random()
        if r < 0.03:  # announce more than is sent: a short body, then the half-close
            length = rng.choice([len(body) + 1, self.limits.msg + 1, self.limits.body + 1])
            short = True
        elif r < 0.05:
            length = rng.choice([-1, "x", "1 1", ""])
        if body or method in ("POST", "PUT") or r < 0.05:
            headers.append(b"Content-Length: " + str(length).encode())
        r = rng.random()
        if r < 0.02:
            headers.append(b"Content-Length: " + str(len(body) + 1).encode())
        elif r < 0.04:
            headers.append(b"Transfer-Encoding: chunked")
            short = True  # never a valid chunked body (no last chunk): reading it fails
        elif r < 0.05:
            headers.append(b"X-Long: " + b"a" * rng.choice([1000, 8000, 70000]))
        elif r < 0.06:
            headers.append(b"Accept: application/vnd.nsq; version=1.0")
        version = b" HTTP/1.1" if rng.random() > 0.01 else rng.choice([b"", b" HTTP/9.9", b" HTTP/1.0"])
        head = method.encode() + b" " + path.encode("utf-8", "surrogateescape") + version
        data = head + b"\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body
        mutated = rng.random() < 0.03
        if mutated:
            data = self.mutate(rng, data)
        # short: reading the body fails (shorter than announced, not chunked as
        # announced, or a mutation touched the request)
        return data, method, path, short or mutated

    @staticmethod
    def mutate(rng, data):
        data = bytearray(data)
        for _ in range(rng.randrange(1, 3)):
            pos = rng.randrange(len(data))
            op = rng.randrange(3)
            if op == 0:
                data[pos] = rng.randrange(256)
            elif op == 1:
                data[pos:pos] = rng.choice([b"\r\n", b"\n", b" ", b"\x00", b":"])
            else:
                del data[pos:pos + rng.randrange(1, 8)]
        return bytes(data)
