"""nsqd's HTTP API against a real `nsqshm start` process (nsqd 1.3's http.go,
internal/http_api): status codes, exact bodies and headers, check order,
routing (404/405/redirects/OPTIONS) and the effects seen through /stats
and a raw TCP consumer."""

import http.client
import json
import socket
import struct
import time

import pytest

from tests.nsqd.conftest import Server, http_call, http_on_each_worker, http_on_worker, wait_for

WORKER_COUNTS = (1, 2)  # every test on one worker and on two (conftest.py)

V1 = "nsq; version=1.0"
JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"


# ---------------------------------------------------------------------------
# helpers (also used by test_stats.py)


def request(server, method, path, body=None, headers=None, chunked=False):
    """(status, {lowercased header: value}, body) without following redirects."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        if chunked:
            conn.putrequest(method, path)
            for k, v in (headers or {}).items():
                conn.putheader(k, v)
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            for i in range(0, len(body), 7):
                part = body[i:i + 7]
                conn.send(b"%x\r\n%s\r\n" % (len(part), part))
            conn.send(b"0\r\n\r\n")
        else:
            conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def err(text):
    return json.dumps({"message": text}, separators=(",", ":")).encode()


def stats(server, query=""):
    status, headers, body = request(server, "GET", "/stats?format=json" + query)
    assert status == 200, body
    return json.loads(body)


def topic_stats(server, name):
    for t in stats(server)["topics"]:
        if t["topic_name"] == name:
            return t
    return None


def channel_stats(server, topic, channel):
    t = topic_stats(server, topic)
    for c in (t or {}).get("channels", ()):
        if c["channel_name"] == channel:
            return c
    return None


def mpub_body(messages):
    out = struct.pack(">I", len(messages))
    for m in messages:
        out += struct.pack(">I", len(m)) + m
    return out


class TCP:
    """A raw nsqd V2 connection."""

    def __init__(self, server):
        self.sock = socket.create_connection(server.tcp, timeout=10)
        self.sock.sendall(b"  V2")
        self.buf = b""

    def send(self, line, body=None):
        data = line + b"\n"
        if body is not None:
            data += struct.pack(">I", len(body)) + body
        self.sock.sendall(data)

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def frame(self):
        """(frame type, data), skipping heartbeats."""
        while True:
            size, ftype = struct.unpack(">II", self._read(8))
            data = self._read(size - 4)
            if (ftype, data) != (0, b"_heartbeat_"):
                return ftype, data

    def expect_ok(self):
        assert self.frame() == (0, b"OK")

    def identify(self, **fields):
        self.send(b"IDENTIFY", json.dumps(fields).encode())
        self.expect_ok()

    def sub(self, topic, channel):
        self.send(b"SUB %s %s" % (topic.encode(), channel.encode()))
        self.expect_ok()

    def pub(self, topic, body):
        self.send(b"PUB " + topic.encode(), body)
        self.expect_ok()

    def message(self):
        """(id, attempts, body) of the next message."""
        ftype, data = self.frame()
        assert ftype == 2, (ftype, data)
        _ts, attempts = struct.unpack(">QH", data[:10])
        return data[10:26], attempts, data[26:]

    def close(self):
        self.sock.close()


# ---------------------------------------------------------------------------
# fixtures: one server for the module (topics are named per test), plus
# servers with special flags from nsqd_factory


@pytest.fixture(scope="module")
def shared(tmp_path_factory, nsqd_workers):
    server = Server([], str(tmp_path_factory.mktemp("http")), workers=nsqd_workers)
    yield server
    server.cleanup()


@pytest.fixture
def srv(shared):
    return shared


@pytest.fixture(scope="module")
def small(tmp_path_factory, nsqd_workers):
    """--max-msg-size=10 --max-body-size=100, and other non-default limits."""
    server = Server(["--max-msg-size=10", "--max-body-size=100", "--max-req-timeout=10s",
                     "--broadcast-address=bcast.example", "--max-heartbeat-interval=30s",
                     "--max-output-buffer-size=1000", "--max-output-buffer-timeout=5s",
                     "--max-deflate-level=3", "--e2e-processing-latency-percentile=1.0,0.99"],
                    str(tmp_path_factory.mktemp("small")), workers=nsqd_workers)
    yield server
    server.cleanup()


# ---------------------------------------------------------------------------
# /ping, /info


def test_ping(srv):
    status, headers, body = request(srv, "GET", "/ping")
    assert (status, body) == (200, b"OK")
    assert headers["content-type"] == TEXT_TYPE
    assert "x-nsq-content-type" not in headers  # PlainText, not V1


def test_info(srv):
    status, headers, body = request(srv, "GET", "/info")
    assert status == 200
    assert headers["content-type"] == JSON_TYPE
    assert headers["x-nsq-content-type"] == V1
    info = json.loads(body)
    assert list(info) == ["version", "broadcast_address", "hostname", "http_port", "tcp_port",
                          "start_time", "max_heartbeat_interval", "max_output_buffer_size",
                          "max_output_buffer_timeout", "max_deflate_level"]
    host = socket.gethostname()
    assert info["version"] == "1.3.0"
    assert info["broadcast_address"] == host
    assert info["hostname"] == host
    assert info["http_port"] == srv.http_port
    assert info["tcp_port"] == srv.tcp_port
    assert abs(info["start_time"] - time.time()) < 600
    assert info["max_heartbeat_interval"] == 60_000_000_000
    assert info["max_output_buffer_size"] == 65536
    assert info["max_output_buffer_timeout"] == 30_000_000_000
    assert info["max_deflate_level"] == 6
    assert body.startswith(b'{"version":"1.3.0","broadcast_address":')  # compact


def test_info_reflects_flags(small):
    info = json.loads(request(small, "GET", "/info")[2])
    assert info["broadcast_address"] == "bcast.example"
    assert info["max_heartbeat_interval"] == 30_000_000_000
    assert info["max_output_buffer_size"] == 1000
    assert info["max_output_buffer_timeout"] == 5_000_000_000
    assert info["max_deflate_level"] == 3


# ---------------------------------------------------------------------------
# /pub


def test_pub(srv):
    status, headers, body = request(srv, "POST", "/pub?topic=pub_ok", b"hello")
    assert (status, body) == (200, b"OK")
    assert headers["x-nsq-content-type"] == V1
    assert headers["content-type"] == TEXT_TYPE
    t = topic_stats(srv, "pub_ok")
    assert (t["depth"], t["message_count"], t["message_bytes"]) == (1, 1, 5)


@pytest.mark.parametrize("path,body,status,message", [
    ("/pub?topic=t", b"", 400, "MSG_EMPTY"),
    ("/pub", b"", 400, "MSG_EMPTY"),  # the body is checked before the topic
    ("/pub?topic=bad!name", b"", 400, "MSG_EMPTY"),
    ("/pub", b"x", 400, "MISSING_ARG_TOPIC"),
    ("/pub?topics=t", b"x", 400, "MISSING_ARG_TOPIC"),
    ("/pub?topic=", b"x", 400, "INVALID_TOPIC"),
    ("/pub?topic=bad!name", b"x", 400, "INVALID_TOPIC"),
    ("/pub?topic=a%23b", b"x", 400, "INVALID_TOPIC"),
    ("/pub?topic=" + "a" * 65, b"x", 400, "INVALID_TOPIC"),
    ("/pub?topic=t%zz", b"x", 400, "INVALID_REQUEST"),
    ("/pub?topic=t;x=1", b"x", 400, "INVALID_REQUEST"),
    ("/pub?topic=pub_err&defer=abc", b"x", 400, "INVALID_DEFER"),
    ("/pub?topic=pub_err&defer=", b"x", 400, "INVALID_DEFER"),
    ("/pub?topic=pub_err&defer=1.5", b"x", 400, "INVALID_DEFER"),
    ("/pub?topic=pub_err&defer=-1", b"x", 400, "INVALID_DEFER"),
    ("/pub?topic=pub_err&defer=3600001", b"x", 400, "INVALID_DEFER"),
    ("/pub?topic=pub_err&defer=99999999999999999999", b"x", 400, "INVALID_DEFER"),
])
def test_pub_errors(srv, path, body, status, message):
    got_status, headers, got = request(srv, "POST", path, body)
    assert (got_status, got) == (status, err(message))
    assert headers["content-type"] == JSON_TYPE
    assert headers["x-nsq-content-type"] == V1


def test_pub_checks_body_before_creating_topic(srv):
    request(srv, "POST", "/pub?topic=pub_never", b"")
    assert topic_stats(srv, "pub_never") is None
    # a bad defer is found after the topic was made (getTopicFromQuery first)
    request(srv, "POST", "/pub?topic=pub_made&defer=x", b"x")
    assert topic_stats(srv, "pub_made")["depth"] == 0


def test_pub_query_decoding(srv):
    status, _, body = request(srv, "POST", "/pub?x=1&&topic=pub%2Ddec&topic=other", b"m")
    assert (status, body) == (200, b"OK")  # the first value wins; %2D is '-'
    assert topic_stats(srv, "pub-dec")["message_count"] == 1
    assert topic_stats(srv, "other") is None


def test_pub_plus_decodes_to_space(srv):
    status, _, body = request(srv, "POST", "/pub?topic=a+b", b"m")
    assert (status, body) == (400, err("INVALID_TOPIC"))


def test_pub_defer_accepts_sign_and_bounds(small):
    # --max-req-timeout=10s
    assert request(small, "POST", "/pub?topic=dpub&defer=10000", b"x")[0] == 200
    assert request(small, "POST", "/pub?topic=dpub&defer=%2B5", b"x")[0] == 200
    assert request(small, "POST", "/pub?topic=dpub&defer=10001", b"x")[2] == err("INVALID_DEFER")
    # time.Duration(ms) * time.Millisecond wraps around like Go's int64
    assert request(small, "POST", "/pub?topic=dpub&defer=9223372036854775807",
                   b"x")[2] == err("INVALID_DEFER")
    assert request(small, "POST", "/pub?topic=dpub&defer=288230376151711744",
                   b"x")[2] == b"OK"  # 2**58 ms is 0 ns after the wrap: not deferred
    t = topic_stats(small, "dpub")
    assert (t["message_count"], t["depth"]) == (3, 3)


def test_pub_size_limits(small):
    # --max-msg-size=10
    assert request(small, "POST", "/pub?topic=big", b"x" * 10)[::2] == (200, b"OK")
    status, _, body = request(small, "POST", "/pub?topic=big", b"x" * 11)
    assert (status, body) == (413, err("MSG_TOO_BIG"))
    # too big is found before the topic is looked at
    assert request(small, "POST", "/pub", b"x" * 11)[2] == err("MSG_TOO_BIG")
    # without a Content-Length the body is read up to the limit
    status, _, body = request(small, "POST", "/pub?topic=big", b"x" * 30, chunked=True)
    assert (status, body) == (413, err("MSG_TOO_BIG"))
    status, _, body = request(small, "POST", "/pub?topic=big", b"y" * 10, chunked=True)
    assert (status, body) == (200, b"OK")
    assert topic_stats(small, "big")["message_count"] == 2


def test_pub_then_consume(srv):
    assert request(srv, "POST", "/channel/create?topic=pub_consume&channel=ch")[0] == 404
    assert request(srv, "POST", "/topic/create?topic=pub_consume")[0] == 200
    assert request(srv, "POST", "/channel/create?topic=pub_consume&channel=ch")[0] == 200
    for body in (b"one", b"two", b"three"):
        assert request(srv, "POST", "/pub?topic=pub_consume", body)[2] == b"OK"
    assert wait_for(lambda: channel_stats(srv, "pub_consume", "ch")["depth"] == 3)
    conn = TCP(srv)
    try:
        conn.sub("pub_consume", "ch")
        conn.send(b"RDY 10")
        got = [conn.message() for _ in range(3)]
        assert [m[2] for m in got] == [b"one", b"two", b"three"]
        assert all(m[1] == 1 for m in got)
        c = channel_stats(srv, "pub_consume", "ch")
        assert (c["depth"], c["in_flight_count"], c["message_count"]) == (0, 3, 3)
        for msg_id, _, _ in got:
            conn.send(b"FIN " + msg_id)
        assert wait_for(lambda: channel_stats(srv, "pub_consume", "ch")["in_flight_count"] == 0)
    finally:
        conn.close()


def test_pub_defer(srv):
    request(srv, "POST", "/topic/create?topic=pub_defer")
    request(srv, "POST", "/channel/create?topic=pub_defer&channel=ch")
    assert request(srv, "POST", "/pub?topic=pub_defer&defer=60000", b"later")[2] == b"OK"
    assert request(srv, "POST", "/pub?topic=pub_defer&defer=500", b"soon")[2] == b"OK"
    assert request(srv, "POST", "/pub?topic=pub_defer&defer=0", b"now")[2] == b"OK"
    assert channel_stats(srv, "pub_defer", "ch")["deferred_count"] in (1, 2)
    assert topic_stats(srv, "pub_defer")["message_count"] == 3
    # the 500 ms one comes due
    assert wait_for(lambda: channel_stats(srv, "pub_defer", "ch")["deferred_count"] == 1)
    assert wait_for(lambda: channel_stats(srv, "pub_defer", "ch")["depth"] == 2)


def test_pub_defer_before_any_channel_counts_in_topic_depth(srv):
    assert request(srv, "POST", "/pub?topic=pub_defer_nochan&defer=60000", b"x")[2] == b"OK"
    t = topic_stats(srv, "pub_defer_nochan")
    assert (t["depth"], t["message_count"]) == (1, 1)
    request(srv, "POST", "/channel/create?topic=pub_defer_nochan&channel=c")
    c = channel_stats(srv, "pub_defer_nochan", "c")
    assert (c["deferred_count"], c["depth"]) == (1, 0)


# ---------------------------------------------------------------------------
# /mpub


def test_mpub_text(srv):
    status, headers, body = request(srv, "POST", "/mpub?topic=mpub_text", b"a\nbb\n\nccc\n")
    assert (status, body) == (200, b"OK")
    assert headers["x-nsq-content-type"] == V1
    t = topic_stats(srv, "mpub_text")
    assert (t["depth"], t["message_count"], t["message_bytes"]) == (3, 3, 6)


def test_mpub_text_keeps_cr_and_consumes_in_order(srv):
    request(srv, "POST", "/topic/create?topic=mpub_cr")
    request(srv, "POST", "/channel/create?topic=mpub_cr&channel=c")
    assert request(srv, "POST", "/mpub?topic=mpub_cr", b"x\r\ny\n\nz")[2] == b"OK"
    conn = TCP(srv)
    try:
        conn.sub("mpub_cr", "c")
        conn.send(b"RDY 5")
        assert [conn.message()[2] for _ in range(3)] == [b"x\r", b"y", b"z"]
    finally:
        conn.close()


def test_mpub_empty_body_is_ok(srv):
    status, _, body = request(srv, "POST", "/mpub?topic=mpub_empty", b"")
    assert (status, body) == (200, b"OK")
    t = topic_stats(srv, "mpub_empty")
    assert (t["depth"], t["message_count"]) == (0, 0)
    assert request(srv, "POST", "/mpub?topic=mpub_empty", b"\n\n\n")[2] == b"OK"
    assert topic_stats(srv, "mpub_empty")["message_count"] == 0


@pytest.mark.parametrize("flag", ["true", "1", "bogus", ""])
def test_mpub_binary(srv, flag):
    name = f"mpub_bin_{flag or 'empty'}"
    msgs = [b"x" * 100, b"\x00\xff" * 3, b"a\nb"]
    status, _, body = request(srv, "POST", f"/mpub?topic={name}&binary={flag}", mpub_body(msgs))
    assert (status, body) == (200, b"OK")
    t = topic_stats(srv, name)
    assert (t["depth"], t["message_count"], t["message_bytes"]) == (3, 3, 109)


def test_mpub_binary_param_warns_on_deprecated_value(srv):
    request(srv, "POST", "/mpub?topic=mpub_warn&binary=yes", mpub_body([b"m"]))
    assert wait_for(lambda: any("WARNING: deprecated value 'yes' used for /mpub binary param"
                                in line for line in srv.lines))


def test_mpub_binary_false_is_text(srv):
    body = mpub_body([b"ab"])  # as text: one line of 10 bytes
    assert request(srv, "POST", "/mpub?topic=mpub_bin_false&binary=false", body)[2] == b"OK"
    assert topic_stats(srv, "mpub_bin_false")["message_bytes"] == len(body)
    assert request(srv, "POST", "/mpub?topic=mpub_bin_zero&binary=0", b"a\nb")[2] == b"OK"
    assert topic_stats(srv, "mpub_bin_zero")["message_count"] == 2


def test_mpub_binary_consume(srv):
    request(srv, "POST", "/topic/create?topic=mpub_bin_c")
    request(srv, "POST", "/channel/create?topic=mpub_bin_c&channel=c")
    msgs = [b"first\n", b"\x00", b"third"]
    assert request(srv, "POST", "/mpub?topic=mpub_bin_c&binary=true", mpub_body(msgs))[2] == b"OK"
    conn = TCP(srv)
    try:
        conn.sub("mpub_bin_c", "c")
        conn.send(b"RDY 5")
        assert [conn.message()[2] for _ in range(3)] == msgs
    finally:
        conn.close()


@pytest.mark.parametrize("body,message", [
    (b"", "BAD_BODY"),
    (b"\x00\x00", "BAD_BODY"),
    (struct.pack(">I", 0), "BAD_BODY"),
    (struct.pack(">i", -1), "BAD_BODY"),
    (struct.pack(">I", 2000000), "BAD_BODY"),  # > (max body - 4) / 5
    (struct.pack(">I", 2), "BAD_MESSAGE"),  # no sizes
    (struct.pack(">II", 1, 0), "BAD_MESSAGE"),
    (struct.pack(">Ii", 1, -5), "BAD_MESSAGE"),
    (struct.pack(">II", 1, 5) + b"abc", "BAD_MESSAGE"),
    (struct.pack(">II", 2, 1) + b"a" + struct.pack(">I", 2000000) + b"b", "BAD_MESSAGE"),
])
def test_mpub_binary_errors(srv, body, message):
    status, headers, got = request(srv, "POST", "/mpub?topic=mpub_bin_err&binary=true", body)
    assert (status, got) == (413, err(message))
    assert headers["content-type"] == JSON_TYPE
    # atomic: nothing was queued, but the topic was made before the body was read
    t = topic_stats(srv, "mpub_bin_err")
    assert (t["depth"], t["message_count"]) == (0, 0)


def test_mpub_binary_ignores_trailing_bytes(srv):
    body = mpub_body([b"a", b"b"]) + b"trailing junk"
    assert request(srv, "POST", "/mpub?topic=mpub_trail&binary=true", body)[2] == b"OK"
    assert topic_stats(srv, "mpub_trail")["message_count"] == 2


@pytest.mark.parametrize("path,message", [
    ("/mpub", "MISSING_ARG_TOPIC"),
    ("/mpub?topic=bad$", "INVALID_TOPIC"),
    ("/mpub?topic=x%", "INVALID_REQUEST"),
])
def test_mpub_topic_errors(srv, path, message):
    assert request(srv, "POST", path, b"a\nb")[::2] == (400, err(message))


def test_mpub_limits(small):
    # --max-msg-size=10 --max-body-size=100
    status, _, body = request(small, "POST", "/mpub?topic=mlim", b"a\n" * 51)
    assert (status, body) == (413, err("BODY_TOO_BIG"))
    # Content-Length is checked before the topic
    assert request(small, "POST", "/mpub", b"a\n" * 51)[2] == err("BODY_TOO_BIG")
    assert request(small, "POST", "/mpub?topic=mlim", b"a\n" * 50)[2] == b"OK"
    status, _, body = request(small, "POST", "/mpub?topic=mlim", b"ok\n" + b"x" * 11 + b"\nok")
    assert (status, body) == (413, err("MSG_TOO_BIG"))
    assert request(small, "POST", "/mpub?topic=mlim", b"x" * 10 + b"\n")[2] == b"OK"
    # binary: each message against --max-msg-size
    body = mpub_body([b"x" * 11])
    assert request(small, "POST", "/mpub?topic=mlim&binary=1", body)[2] == err("BAD_MESSAGE")
    assert topic_stats(small, "mlim")["message_count"] == 51


def test_mpub_limits_chunked(small):
    # no Content-Length: nsqd reads line by line up to --max-body-size + 1
    status, _, body = request(small, "POST", "/mpub?topic=mchunk", b"a\n" * 60, chunked=True)
    assert (status, body) == (413, err("BODY_TOO_BIG"))
    # a too long line before the limit is reached is reported as such
    body = b"x" * 11 + b"\n" + b"a\n" * 60
    assert request(small, "POST", "/mpub?topic=mchunk", body, chunked=True)[2] == err("MSG_TOO_BIG")
    # ... but not the line that crosses the limit
    body = b"a\n" * 45 + b"y" * 20
    assert request(small, "POST", "/mpub?topic=mchunk", body, chunked=True)[2] == err("BODY_TOO_BIG")
    body = b"a\n" * 45
    assert request(small, "POST", "/mpub?topic=mchunk", body, chunked=True)[2] == b"OK"
    assert topic_stats(small, "mchunk")["message_count"] == 45


# ---------------------------------------------------------------------------
# /topic/*


@pytest.mark.parametrize("action", ["create", "delete", "empty", "pause", "unpause"])
def test_topic_missing_arg(srv, action):
    status, headers, body = request(srv, "POST", f"/topic/{action}")
    assert (status, body) == (400, err("MISSING_ARG_TOPIC"))
    assert headers["x-nsq-content-type"] == V1
    assert request(srv, "POST", f"/topic/{action}?topic=x;y")[::2] == (400, err("INVALID_REQUEST"))


@pytest.mark.parametrize("action,status,message", [
    ("create", 400, "INVALID_TOPIC"),
    ("empty", 400, "INVALID_TOPIC"),
    # delete, pause and unpause do not validate the name
    ("delete", 404, "TOPIC_NOT_FOUND"),
    ("pause", 404, "TOPIC_NOT_FOUND"),
    ("unpause", 404, "TOPIC_NOT_FOUND"),
])
def test_topic_invalid_name(srv, action, status, message):
    assert request(srv, "POST", f"/topic/{action}?topic=no$good")[::2] == (status, err(message))


@pytest.mark.parametrize("action", ["delete", "empty", "pause", "unpause"])
def test_topic_not_found(srv, action):
    status, _, body = request(srv, "POST", f"/topic/{action}?topic=never_made")
    assert (status, body) == (404, err("TOPIC_NOT_FOUND"))


def test_topic_lifecycle(srv):
    status, headers, body = request(srv, "POST", "/topic/create?topic=tl")
    assert (status, body) == (200, b"")
    assert headers["x-nsq-content-type"] == V1
    assert "content-type" not in headers
    assert request(srv, "POST", "/topic/create?topic=tl")[::2] == (200, b"")  # idempotent
    t = topic_stats(srv, "tl")
    assert (t["depth"], t["paused"], t["channels"]) == (0, False, [])

    request(srv, "POST", "/mpub?topic=tl", b"1\n2\n3")
    assert topic_stats(srv, "tl")["depth"] == 3
    assert request(srv, "POST", "/topic/empty?topic=tl")[::2] == (200, b"")
    t = topic_stats(srv, "tl")
    assert (t["depth"], t["message_count"]) == (0, 3)

    assert request(srv, "POST", "/topic/pause?topic=tl")[::2] == (200, b"")
    assert topic_stats(srv, "tl")["paused"] is True
    assert request(srv, "POST", "/topic/pause?topic=tl")[0] == 200
    assert request(srv, "POST", "/topic/unpause?topic=tl")[::2] == (200, b"")
    assert topic_stats(srv, "tl")["paused"] is False

    assert request(srv, "POST", "/topic/delete?topic=tl")[::2] == (200, b"")
    assert topic_stats(srv, "tl") is None
    assert request(srv, "POST", "/topic/delete?topic=tl")[::2] == (404, err("TOPIC_NOT_FOUND"))


def test_topic_pause_holds_messages_in_topic(srv):
    request(srv, "POST", "/topic/create?topic=tp")
    request(srv, "POST", "/channel/create?topic=tp&channel=c")
    request(srv, "POST", "/topic/pause?topic=tp")
    request(srv, "POST", "/mpub?topic=tp", b"a\nb")
    time.sleep(0.1)
    assert topic_stats(srv, "tp")["depth"] == 2
    assert channel_stats(srv, "tp", "c")["depth"] == 0
    request(srv, "POST", "/topic/unpause?topic=tp")
    assert wait_for(lambda: channel_stats(srv, "tp", "c")["depth"] == 2)
    assert topic_stats(srv, "tp")["depth"] == 0


def test_topic_create_ephemeral(srv):
    assert request(srv, "POST", "/topic/create?topic=eph%23ephemeral")[::2] == (200, b"")
    assert topic_stats(srv, "eph#ephemeral") is not None
    assert request(srv, "POST", "/topic/delete?topic=eph%23ephemeral")[0] == 200


# ---------------------------------------------------------------------------
# /channel/*

CHANNEL_ACTIONS = ["create", "delete", "empty", "pause", "unpause"]


@pytest.mark.parametrize("action", CHANNEL_ACTIONS)
@pytest.mark.parametrize("query,status,message", [
    ("", 400, "MISSING_ARG_TOPIC"),
    ("?channel=c", 400, "MISSING_ARG_TOPIC"),
    ("?topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
    ("?topic=bad!", 400, "INVALID_ARG_TOPIC"),
    ("?topic=ch_args", 400, "MISSING_ARG_CHANNEL"),
    ("?topic=ch_args&channel=", 400, "INVALID_ARG_CHANNEL"),
    ("?topic=ch_args&channel=b%40d", 400, "INVALID_ARG_CHANNEL"),
    ("?topic=ch_args&channel=c%", 400, "INVALID_REQUEST"),
    ("?topic=no_such_topic&channel=c", 404, "TOPIC_NOT_FOUND"),
])
def test_channel_arg_errors(srv, action, query, status, message):
    got_status, headers, body = request(srv, "POST", f"/channel/{action}{query}")
    assert (got_status, body) == (status, err(message))
    assert headers["content-type"] == JSON_TYPE
    assert headers["x-nsq-content-type"] == V1


@pytest.mark.parametrize("action", ["delete", "empty", "pause", "unpause"])
def test_channel_not_found(srv, action):
    request(srv, "POST", "/topic/create?topic=ch_nf")
    status, _, body = request(srv, "POST", f"/channel/{action}?topic=ch_nf&channel=nope")
    assert (status, body) == (404, err("CHANNEL_NOT_FOUND"))


def test_channel_lifecycle(srv):
    request(srv, "POST", "/topic/create?topic=cl")
    status, headers, body = request(srv, "POST", "/channel/create?topic=cl&channel=c1")
    assert (status, body) == (200, b"")
    assert headers["x-nsq-content-type"] == V1
    assert request(srv, "POST", "/channel/create?topic=cl&channel=c0")[0] == 200
    t = topic_stats(srv, "cl")
    assert [c["channel_name"] for c in t["channels"]] == ["c0", "c1"]  # sorted

    request(srv, "POST", "/mpub?topic=cl", b"1\n2")
    assert wait_for(lambda: channel_stats(srv, "cl", "c1")["depth"] == 2)
    assert request(srv, "POST", "/channel/empty?topic=cl&channel=c1")[::2] == (200, b"")
    assert channel_stats(srv, "cl", "c1")["depth"] == 0
    assert channel_stats(srv, "cl", "c0")["depth"] == 2

    assert request(srv, "POST", "/channel/pause?topic=cl&channel=c1")[::2] == (200, b"")
    assert channel_stats(srv, "cl", "c1")["paused"] is True
    assert channel_stats(srv, "cl", "c0")["paused"] is False
    assert request(srv, "POST", "/channel/unpause?topic=cl&channel=c1")[::2] == (200, b"")
    assert channel_stats(srv, "cl", "c1")["paused"] is False

    assert request(srv, "POST", "/channel/delete?topic=cl&channel=c1")[::2] == (200, b"")
    assert channel_stats(srv, "cl", "c1") is None
    assert [c["channel_name"] for c in topic_stats(srv, "cl")["channels"]] == ["c0"]
    status, _, body = request(srv, "POST", "/channel/delete?topic=cl&channel=c1")
    assert (status, body) == (404, err("CHANNEL_NOT_FOUND"))


def test_channel_pause_stops_delivery(srv):
    request(srv, "POST", "/topic/create?topic=cpause")
    request(srv, "POST", "/channel/create?topic=cpause&channel=c")
    request(srv, "POST", "/channel/pause?topic=cpause&channel=c")
    conn = TCP(srv)
    try:
        conn.sub("cpause", "c")
        conn.send(b"RDY 5")
        request(srv, "POST", "/pub?topic=cpause", b"held")
        assert wait_for(lambda: channel_stats(srv, "cpause", "c")["depth"] == 1)
        conn.sock.settimeout(0.3)
        with pytest.raises(socket.timeout):
            conn.frame()
        conn.sock.settimeout(10)
        request(srv, "POST", "/channel/unpause?topic=cpause&channel=c")
        assert conn.message()[2] == b"held"
    finally:
        conn.close()


def test_channel_empty_clears_in_flight_and_deferred(srv):
    request(srv, "POST", "/topic/create?topic=cempty")
    request(srv, "POST", "/channel/create?topic=cempty&channel=c")
    request(srv, "POST", "/pub?topic=cempty&defer=60000", b"d")
    request(srv, "POST", "/mpub?topic=cempty", b"a\nb\nc")
    conn = TCP(srv)
    try:
        conn.sub("cempty", "c")
        conn.send(b"RDY 1")
        conn.message()
        c = channel_stats(srv, "cempty", "c")
        assert (c["depth"], c["in_flight_count"], c["deferred_count"]) == (2, 1, 1)
        assert request(srv, "POST", "/channel/empty?topic=cempty&channel=c")[0] == 200
        c = channel_stats(srv, "cempty", "c")
        assert (c["depth"], c["in_flight_count"], c["deferred_count"]) == (0, 0, 0)
    finally:
        conn.close()


def test_channel_delete_last_of_ephemeral_topic_deletes_topic(srv):
    request(srv, "POST", "/topic/create?topic=etop%23ephemeral")
    request(srv, "POST", "/channel/create?topic=etop%23ephemeral&channel=c")
    assert request(srv, "POST", "/channel/delete?topic=etop%23ephemeral&channel=c")[0] == 200
    assert wait_for(lambda: topic_stats(srv, "etop#ephemeral") is None)


# ---------------------------------------------------------------------------
# /config/:opt


@pytest.mark.parametrize("opt,body,content_type", [
    ("log_level", b"2", JSON_TYPE),
    ("log_prefix", b"[nsqd] ", TEXT_TYPE),  # a Go string is written raw, not as JSON
    ("tcp_address", b"127.0.0.1:0", TEXT_TYPE),
    ("max_msg_size", b"1048576", JSON_TYPE),
    ("max_body_size", b"5242880", JSON_TYPE),
    ("msg_timeout", b"60000000000", JSON_TYPE),
    ("max_req_timeout", b"3600000000000", JSON_TYPE),
    ("output_buffer_timeout", b"250000000", JSON_TYPE),
    ("nsqlookupd_tcp_addresses", b"[]", JSON_TYPE),
    ("auth_http_addresses", b"[]", JSON_TYPE),
    ("e2e_processing_latency_percentiles", b"[]", JSON_TYPE),
    ("statsd_mem_stats", b"true", JSON_TYPE),
    ("tls_required", b"0", JSON_TYPE),
    ("tls_min_version", b"769", JSON_TYPE),
    ("deflate", b"true", JSON_TYPE),
    ("max_deflate_level", b"6", JSON_TYPE),
])
def test_config_get(srv, opt, body, content_type):
    status, headers, got = request(srv, "GET", f"/config/{opt}")
    assert (status, got) == (200, body)
    assert headers["content-type"] == content_type
    assert headers["x-nsq-content-type"] == V1


def test_config_statsd_prefix_and_broadcast_ports_are_resolved(srv):
    # nsqd.New rewrites them: %s -> broadcast address and HTTP port, ports 0 -> listened on
    status, headers, body = request(srv, "GET", "/config/statsd_prefix")
    host = socket.gethostname().replace(".", "_").replace(":", "_")
    assert (status, body) == (200, f"nsq.{host}_{srv.http_port}.".encode())
    assert headers["content-type"] == TEXT_TYPE
    assert request(srv, "GET", "/config/broadcast_http_port")[2] == str(srv.http_port).encode()
    assert request(srv, "GET", "/config/broadcast_tcp_port")[2] == str(srv.tcp_port).encode()


def test_config_get_empty_string_and_id(srv):
    status, headers, body = request(srv, "GET", "/config/data_path")
    assert (status, body) == (200, srv.data_path.encode())
    status, headers, body = request(srv, "GET", "/config/statsd_address")
    assert (status, body) == (200, b"")
    assert "content-type" not in headers
    status, _, body = request(srv, "GET", "/config/id")
    assert status == 200 and 0 <= int(body) < 1024


@pytest.mark.parametrize("opt", ["bogus", "verbose", "version", "config", "node_id",
                                 "lookupd_tcp_address", "workers", "shm_prefix",
                                 "client_timeout", "worker_id", "LOG_LEVEL"])
def test_config_get_invalid_option(srv, opt):
    status, headers, body = request(srv, "GET", f"/config/{opt}")
    assert (status, body) == (400, err("INVALID_OPTION"))
    assert headers["content-type"] == JSON_TYPE


def test_config_put_lookupd_addresses(srv):
    addrs = b'["127.0.0.1:4160","127.0.0.1:4162"]'
    status, headers, body = request(srv, "PUT", "/config/nsqlookupd_tcp_addresses", addrs)
    assert (status, body) == (200, addrs)
    assert headers["content-type"] == JSON_TYPE
    assert request(srv, "GET", "/config/nsqlookupd_tcp_addresses")[2] == addrs
    assert request(srv, "PUT", "/config/nsqlookupd_tcp_addresses",
                   b' [ "a", null ] ')[::2] == (200, b'["a",""]')
    assert request(srv, "PUT", "/config/nsqlookupd_tcp_addresses", b"[]")[::2] == (200, b"[]")


@pytest.mark.parametrize("opt,body,status,message", [
    ("nsqlookupd_tcp_addresses", b"", 413, "INVALID_VALUE"),
    ("nsqlookupd_tcp_addresses", b"not json", 400, "INVALID_VALUE"),
    ("nsqlookupd_tcp_addresses", b'"a"', 400, "INVALID_VALUE"),
    ("nsqlookupd_tcp_addresses", b"[1]", 400, "INVALID_VALUE"),
    ("nsqlookupd_tcp_addresses", b'{"a":1}', 400, "INVALID_VALUE"),
    ("nsqlookupd_tcp_addresses", b'["a"] x', 400, "INVALID_VALUE"),
    ("log_level", b"", 413, "INVALID_VALUE"),
    ("log_level", b"bad", 400, "INVALID_VALUE"),
    ("log_level", b"info\n", 400, "INVALID_VALUE"),
    ("log_level", b"warning", 400, "INVALID_VALUE"),
    ("max_msg_size", b"5", 400, "INVALID_OPTION"),
    ("bogus", b"5", 400, "INVALID_OPTION"),
    ("bogus", b"", 413, "INVALID_VALUE"),  # the body is checked first
])
def test_config_put_errors(srv, opt, body, status, message):
    got_status, headers, got = request(srv, "PUT", f"/config/{opt}", body)
    assert (got_status, got) == (status, err(message))
    assert headers["x-nsq-content-type"] == V1


def test_config_get_floats(small):
    status, headers, body = request(small, "GET", "/config/e2e_processing_latency_percentiles")
    assert (status, body) == (200, b"[1,0.99]")  # Go's float formatting
    assert request(small, "GET", "/config/max_msg_size")[2] == b"10"
    assert request(small, "GET", "/config/broadcast_address")[2] == b"bcast.example"


def test_config_put_body_limit(small):
    # the body is limited by --max-msg-size (10)
    status, _, body = request(small, "PUT", "/config/nsqlookupd_tcp_addresses", b'["' + b"a" * 9 + b'"]')
    assert (status, body) == (413, err("INVALID_VALUE"))
    assert request(small, "PUT", "/config/nsqlookupd_tcp_addresses", b'["aaaaaa"]')[0] == 200


def test_config_put_log_level(nsqd_factory):
    server = nsqd_factory()
    for text, level in [(b"fatal", b"5"), (b"DEBUG", b"1"), (b"Warn", b"3"), (b"error", b"4"),
                        (b"info", b"2")]:
        status, headers, body = request(server, "PUT", "/config/log_level", text)
        assert (status, body) == (200, level)
        assert headers["content-type"] == JSON_TYPE
        assert request(server, "GET", "/config/log_level")[2] == level
    # the level applies at once: at error, access lines (INFO) stop
    request(server, "PUT", "/config/log_level", b"error")
    request(server, "GET", "/ping?marker=quiet")
    request(server, "PUT", "/config/log_level", b"info")
    request(server, "GET", "/ping?marker=loud")
    assert wait_for(lambda: any("/ping?marker=loud" in line for line in server.lines))
    assert not any("/ping?marker=quiet" in line for line in server.lines)


# (option, what worker 0 then worker 1 is told, what GET /config answers after each)
RUNTIME_CONFIG = [
    ("log_level", [b"error", b"debug"], [b"4", b"1"]),
    ("nsqlookupd_tcp_addresses", [b'["127.0.0.1:1"]', b'["127.0.0.1:2","127.0.0.1:3"]'],
     [b'["127.0.0.1:1"]', b'["127.0.0.1:2","127.0.0.1:3"]']),
]


@pytest.mark.workers(2)
@pytest.mark.parametrize("opt,values,answers", RUNTIME_CONFIG, ids=[c[0] for c in RUNTIME_CONFIG])
def test_config_put_on_any_worker_is_answered_by_every_worker(nsqd_factory, opt, values,
                                                              answers):
    """One broker: a PUT /config on one worker holds on every worker once answered."""
    server = nsqd_factory()
    for index, (value, answer) in enumerate(zip(values, answers, strict=True)):
        assert http_call(http_on_worker(server, index), "PUT", f"/config/{opt}",
                         value) == (200, answer)
        # fresh connections until each worker has answered; no waiting
        for conn in http_on_each_worker(server).values():
            assert http_call(conn, "GET", f"/config/{opt}") == (200, answer)
            conn.close()


# ---------------------------------------------------------------------------
# routing, access log, debug


@pytest.mark.parametrize("method,path,allow", [
    ("GET", "/pub", "OPTIONS, POST"),
    ("PUT", "/mpub", "OPTIONS, POST"),
    ("POST", "/stats", "GET, OPTIONS"),
    ("POST", "/ping", "GET, OPTIONS"),
    ("HEAD", "/ping", "GET, OPTIONS"),
    ("DELETE", "/info", "GET, OPTIONS"),
    ("GET", "/topic/create", "OPTIONS, POST"),
    ("GET", "/channel/delete", "OPTIONS, POST"),
    ("POST", "/config/log_level", "GET, OPTIONS, PUT"),
    ("GET", "/debug/freememory", "OPTIONS, POST"),
])
def test_method_not_allowed(srv, method, path, allow):
    status, headers, body = request(srv, method, path)
    assert status == 405
    assert headers["allow"] == allow
    if method != "HEAD":
        assert body == err("METHOD_NOT_ALLOWED")
        assert headers["content-type"] == JSON_TYPE
        assert headers["x-nsq-content-type"] == V1


@pytest.mark.parametrize("method,path", [
    ("GET", "/"), ("GET", "/nope"), ("POST", "/nope"), ("GET", "/config/"),
    ("GET", "/config/a/b"), ("GET", "/topic"), ("GET", "/debug/pprof/heap"), ("PUT", "/nope"), ("OPTIONS", "/nope"),
    ("GET", "/put"), ("POST", "/create_topic"),  # pre-1.0 endpoints are gone
])
def test_not_found(srv, method, path):
    status, headers, body = request(srv, method, path)
    assert (status, body) == (404, err("NOT_FOUND"))
    assert headers["x-nsq-content-type"] == V1


@pytest.mark.parametrize("path,allow", [
    ("/pub", "OPTIONS, POST"), ("/ping", "GET, OPTIONS"), ("/config/x", "GET, OPTIONS, PUT"),
])
def test_options(srv, path, allow):
    status, headers, body = request(srv, "OPTIONS", path)
    assert (status, body) == (200, b"")
    assert headers["allow"] == allow


@pytest.mark.parametrize("method,path,code,location", [
    ("GET", "/ping/", 301, "/ping"),
    ("GET", "/PING", 301, "/ping"),
    ("GET", "//ping", 301, "/ping"),
    ("GET", "/x/../stats?format=json", 301, "/stats?format=json"),
    ("GET", "/Stats/?format=json", 301, "/stats?format=json"),
    ("GET", "/config/log_level/", 301, "/config/log_level"),
    ("GET", "/CONFIG/Log_Level", 301, "/config/Log_Level"),
    ("POST", "/pub/?topic=t", 307, "/pub?topic=t"),
    ("POST", "/Topic/Create?topic=t", 307, "/topic/create?topic=t"),
    ("PUT", "/config/log_level/", 307, "/config/log_level"),
])
def test_redirects(srv, method, path, code, location):
    status, headers, body = request(srv, method, path)
    assert status == code
    assert headers["location"] == location
    if method == "GET":
        text = "Moved Permanently"
        assert body == f'<a href="{location}">{text}</a>.\n\n'.encode().replace(b"&", b"&amp;")
        assert headers["content-type"] == "text/html; charset=utf-8"
    else:
        assert body == b""


def test_access_log(srv):
    request(srv, "GET", "/ping?log=me")
    request(srv, "POST", "/pub?topic=acc_log&mark=nolog", b"x")
    request(srv, "GET", "/nope?log=404")
    assert wait_for(lambda: any(" INFO: 404 GET /nope?log=404 (127.0.0.1:" in line
                                for line in srv.lines))
    line = next(line for line in srv.lines if "/ping?log=me" in line)
    assert " INFO: 200 GET /ping?log=me (127.0.0.1:" in line
    assert line.rstrip().endswith("s")  # a Go duration
    assert not any("mark=nolog" in line for line in srv.lines)  # /pub has no Log decorator


def test_debug_freememory_answers_like_nsqd(srv):
    # nsqd's PlainText decorator panics on the handler's nil body
    status, headers, body = request(srv, "POST", "/debug/freememory")
    assert (status, body) == (500, err("INTERNAL_ERROR"))
    assert wait_for(lambda: any("ERROR: panic in HTTP handler - unknown response type <nil>"
                                in line for line in srv.lines))


@pytest.mark.parametrize("query,status,body", [
    ("", 400, b'invalid block rate : strconv.Atoi: parsing "": invalid syntax'),
    ("?rate=x", 400, b'invalid block rate : strconv.Atoi: parsing "x": invalid syntax'),
    ("?rate=99999999999999999999", 400,
     b'invalid block rate : strconv.Atoi: parsing "99999999999999999999": value out of range'),
    ("?rate=1", 500, err("INTERNAL_ERROR")),
])
def test_debug_setblockrate(srv, query, status, body):
    got_status, headers, got = request(srv, "PUT", "/debug/setblockrate" + query)
    assert (got_status, got) == (status, body)
    if status == 400:
        assert "x-nsq-content-type" not in headers


def test_setblockrate_reads_form_body(srv):
    status, _, body = request(srv, "PUT", "/debug/setblockrate?rate=1", b"rate=zz",
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert (status, body) == (400, b'invalid block rate : strconv.Atoi: parsing "zz": invalid syntax')


def test_keep_alive_requests_are_not_delayed(srv):
    # TCP_NODELAY, as Go's net/http: otherwise each keep-alive request waits
    # out a delayed ACK (~40 ms) because gevent writes headers and body apart
    conn = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=10)
    try:
        started = time.perf_counter()
        for _ in range(50):
            conn.request("POST", "/pub?topic=keepalive", body=b"x")
            resp = conn.getresponse()
            assert resp.read() == b"OK"
        assert time.perf_counter() - started < 1.2
    finally:
        conn.close()


UNIX_SOCKET_SCRIPT = r"""
from gevent import monkey; monkey.patch_all()
import json, os, socket, sys
from types import SimpleNamespace
from nsqshm.nsqd.http_api import make_http_server
from nsqshm.nsqd.options import defaults
opts = defaults()
opts.http_address = sys.argv[1]
nsqd = SimpleNamespace(opts=opts, version="1.3.0", hostname="h", start_time=0.0, health="OK",
                       tcp_server=SimpleNamespace(address=("127.0.0.1", 4150)), topics={},
                       clients={})
server = make_http_server(nsqd)
nsqd.http_server = server
server.start()
c = socket.socket(socket.AF_UNIX)
c.connect(sys.argv[1])
c.sendall(b"GET /info HTTP/1.0\r\n\r\n")
data = b""
while chunk := c.recv(65536):
    data += chunk
print(json.dumps(json.loads(data.split(b"\r\n\r\n", 1)[1])))
"""


def test_http_on_unix_socket(tmp_path):
    import subprocess
    import sys

    path = str(tmp_path / "nsqd-http.sock")
    out = subprocess.run([sys.executable, "-c", UNIX_SOCKET_SCRIPT, path], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    info = json.loads(out)
    assert (info["http_port"], info["tcp_port"]) == (-1, 4150)


# ---------------------------------------------------------------------------
# pure helpers


def test_parse_query_like_go():
    from nsqshm.nsqd.http_api import parse_query

    assert parse_query(b"a=1&b=2&a=3") == ({"a": ["1", "3"], "b": ["2"]}, None)
    assert parse_query(b"a+b=c+d&&e&f=") == ({"a b": ["c d"], "e": [""], "f": [""]}, None)
    assert parse_query(b"x=%41%2f") == ({"x": ["A/"]}, None)
    values, error = parse_query(b"a=1;b=2&c=3")
    assert values == {"c": ["3"]} and str(error) == "invalid semicolon separator in query"
    values, error = parse_query(b"a=%zz&b=%4")
    assert values == {} and str(error) == 'invalid URL escape "%zz"'


def test_clean_path():
    from nsqshm.nsqd.http_api import clean_path

    cases = {"": "/", "a": "/a", "//a//b/": "/a/b/", "/a/./b": "/a/b", "/a/../b": "/b",
             "/../a": "/a", "/a/..": "/", "/a/../": "/", "/.": "/"}
    for raw, cleaned in cases.items():
        assert clean_path(raw) == cleaned, raw
