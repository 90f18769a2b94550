"""nsqlookupd's HTTP API against a real `nsqshm lookupd` (nsqlookupd 1.3's
http.go): exact JSON bodies, status codes, headers and the routing rules
shared with nsqd."""

import json
import time

import pytest

from tests.nsqd.test_http_api import JSON_TYPE, TEXT_TYPE, V1, err, request
from tests.nsqlookupd.conftest import LookupConn, Lookupd, wait_for


@pytest.fixture(scope="module")
def srv():
    server = Lookupd()
    yield server
    server.stop()


def get(server, path):
    status, headers, body = request(server, "GET", path)
    return status, body


def post(server, path):
    status, headers, body = request(server, "POST", path)
    return status, body


def doc(server, path):
    status, headers, body = request(server, "GET", path)
    assert status == 200, body
    assert headers["content-type"] == JSON_TYPE
    assert headers["x-nsq-content-type"] == V1
    return json.loads(body)


def test_ping(srv):
    status, headers, body = request(srv, "GET", "/ping")
    assert (status, body) == (200, b"OK")
    assert headers["content-type"] == TEXT_TYPE


def test_info(srv):
    status, headers, body = request(srv, "GET", "/info")
    assert (status, body) == (200, b'{"version":"1.3.0"}')
    assert headers["content-type"] == JSON_TYPE
    assert headers["x-nsq-content-type"] == V1


def test_empty_answers(tmp_path):
    server = Lookupd()
    try:
        assert get(server, "/topics") == (200, b'{"topics":[]}')
        assert get(server, "/channels?topic=x") == (200, b'{"channels":[]}')
        assert get(server, "/nodes") == (200, b'{"producers":[]}')
        assert get(server, "/debug") == (200, b"{}")
        assert get(server, "/lookup?topic=x") == (404, err("TOPIC_NOT_FOUND"))
        assert get(server, "/listlookup") == (200, b"")  # Youzan's, standalone: no data
    finally:
        server.stop()


@pytest.mark.parametrize("path,status,message", [
    ("/lookup", 400, "MISSING_ARG_TOPIC"),
    ("/lookup?topic=%zz", 400, "INVALID_REQUEST"),
    ("/lookup?topic=a;b", 400, "INVALID_REQUEST"),
    ("/lookup?topic=nope", 404, "TOPIC_NOT_FOUND"),
    ("/cluster/topic?topic=t", 500, "MISSING_COORDINATOR"),  # cluster mode only
    ("/cluster/nodes", 500, "MISSING_COORDINATOR"),
    ("/channels", 400, "MISSING_ARG_TOPIC"),
    ("/channels?topic=%zz", 400, "INVALID_REQUEST"),
])
def test_get_errors(srv, path, status, message):
    s, headers, body = request(srv, "GET", path)
    assert (s, body) == (status, err(message))
    assert headers["content-type"] == JSON_TYPE
    assert headers["x-nsq-content-type"] == V1


@pytest.mark.parametrize("path,status,message", [
    ("/topic/create", 400, "MISSING_ARG_TOPIC"),
    ("/topic/create?topic=bad!", 400, "INVALID_ARG_TOPIC"),
    ("/topic/create?topic=%zz", 400, "INVALID_REQUEST"),
    ("/topic/delete", 400, "MISSING_ARG_TOPIC"),
    ("/topic/tombstone", 400, "MISSING_ARG_TOPIC"),
    ("/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
    ("/channel/create", 400, "MISSING_ARG_TOPIC"),
    ("/channel/create?topic=bad!", 400, "INVALID_ARG_TOPIC"),
    ("/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
    ("/channel/create?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
    ("/channel/delete", 400, "MISSING_ARG_TOPIC"),
    ("/channel/delete?topic=t&channel=never", 404, "CHANNEL_NOT_FOUND"),
    ("/channel/delete?topic=t", 400, "MISSING_ARG_CHANNEL"),
    ("/topic/partition/move?topic=t&partition=0", 500, "MISSING_COORDINATOR"),
    ("/cluster/node/remove?remove_node=n", 500, "MISSING_COORDINATOR"),
])
def test_post_errors(srv, path, status, message):
    assert post(srv, path) == (status, err(message))


def test_routing_like_nsqd(srv):
    status, headers, body = request(srv, "GET", "/topic/create?topic=x")
    assert (status, body) == (405, err("METHOD_NOT_ALLOWED"))
    assert headers["allow"] == "OPTIONS, POST"
    assert request(srv, "POST", "/topics")[0] == 405
    assert get(srv, "/nope") == (404, err("NOT_FOUND"))
    status, headers, _ = request(srv, "GET", "/topics/")
    assert (status, headers["location"]) == (301, "/topics")
    status, headers, _ = request(srv, "OPTIONS", "/lookup")
    assert (status, headers["allow"]) == (200, "GET, OPTIONS")


def test_create_and_delete_topics_and_channels(srv):
    status, headers, body = request(srv, "POST", "/topic/create?topic=made")
    assert (status, body) == (200, b"")
    assert headers["x-nsq-content-type"] == V1
    assert "made" in doc(srv, "/topics")["topics"]
    assert get(srv, "/lookup?topic=made") == (200, b'{"channels":[],"producers":[]}')
    assert post(srv, "/channel/create?topic=made2&channel=ch") == (200, b"")
    assert get(srv, "/lookup?topic=made2") == (200, b'{"channels":["ch"],"producers":[]}')
    assert get(srv, "/channels?topic=made2") == (200, b'{"channels":["ch"]}')
    assert post(srv, "/channel/delete?topic=made2&channel=ch") == (200, b"")
    assert get(srv, "/channels?topic=made2") == (200, b'{"channels":[]}')
    assert "made2" in doc(srv, "/topics")["topics"]
    post(srv, "/channel/create?topic=made&channel=x")
    assert post(srv, "/topic/delete?topic=made") == (200, b"")
    assert "made" not in doc(srv, "/topics")["topics"]
    assert get(srv, "/channels?topic=made") == (200, b'{"channels":[]}')
    assert post(srv, "/topic/delete?topic=never") == (200, b"")  # not an error
    assert get(srv, "/debug") == (200, b"{}")  # registrations without producers are not shown


def test_lookup_nodes_and_debug_with_a_producer(srv):
    conn = LookupConn(srv)
    conn.identify(broadcast_address="p.example", hostname="phost", tcp_port=4150,
                  http_port=4151, version="1.3.0")
    conn.command(b"REGISTER shown_t shown_c")
    port = conn.sock.getsockname()[1]
    remote = f"127.0.0.1:{port}"
    peer = (f'"remote_address":"{remote}","hostname":"phost","broadcast_address":"p.example",'
            f'"tcp_port":4150,"http_port":4151,"version":"1.3.0"')
    assert get(srv, "/lookup?topic=shown_t") == (
        200, ('{"channels":["shown_c"],"producers":[{' + peer + "}]}").encode())
    assert get(srv, "/nodes") == (
        200, ('{"producers":[{' + peer + ',"tombstones":[false],"topics":["shown_t"]}]}').encode())
    debug = doc(srv, "/debug")
    assert sorted(debug) == ["channel:shown_t:shown_c", "client::", "topic:shown_t:"]
    (entry,) = debug["topic:shown_t:"]
    assert list(entry) == ["broadcast_address", "hostname", "http_port", "id", "last_update",
                           "tcp_port", "tombstoned", "tombstoned_at", "version"]
    assert entry["id"] == remote
    assert entry["tombstoned"] is False
    assert entry["tombstoned_at"] == -6795364578871345152  # Go's zero time.Time
    assert abs(entry["last_update"] / 1e9 - time.time()) < 60
    conn.close()
    wait_for(lambda: doc(srv, "/debug") == {})


def test_tombstone_hides_a_producer_for_the_lifetime():
    server = Lookupd(["--tombstone-lifetime=1s"])
    try:
        a, b = LookupConn(server), LookupConn(server)
        a.identify(broadcast_address="a.example", http_port=1001)
        b.identify(broadcast_address="b.example", http_port=1002)
        for conn in (a, b):
            conn.command(b"REGISTER tomb c")
            conn.command(b"REGISTER other")
        assert post(server, "/topic/tombstone?topic=tomb&node=a.example:1001") == (200, b"")
        assert post(server, "/topic/tombstone?topic=tomb&node=nobody:1") == (200, b"")
        producers = doc(server, "/lookup?topic=tomb")["producers"]
        assert [p["broadcast_address"] for p in producers] == ["b.example"]
        assert len(doc(server, "/lookup?topic=other")["producers"]) == 2  # per topic
        nodes = {n["broadcast_address"]: n for n in doc(server, "/nodes")["producers"]}
        assert nodes["a.example"]["topics"] == ["tomb", "other"]
        assert nodes["a.example"]["tombstones"] == [True, False]
        assert nodes["b.example"]["tombstones"] == [False, False]
        (entry,) = [e for e in doc(server, "/debug")["topic:tomb:"]
                    if e["broadcast_address"] == "a.example"]
        assert entry["tombstoned"] is True and abs(entry["tombstoned_at"] / 1e9 - time.time()) < 60
        time.sleep(1.1)
        assert len(doc(server, "/lookup?topic=tomb")["producers"]) == 2
        assert doc(server, "/nodes")["producers"][0]["tombstones"] == [False, False]
    finally:
        server.stop()


def test_inactive_producers_are_left_out():
    server = Lookupd(["--inactive-producer-timeout=800ms"])
    try:
        quiet, pinging = LookupConn(server), LookupConn(server)
        quiet.identify(broadcast_address="quiet.example")
        pinging.identify(broadcast_address="pinging.example")
        for conn in (quiet, pinging):
            conn.command(b"REGISTER idle")
        assert len(doc(server, "/lookup?topic=idle")["producers"]) == 2
        for _ in range(5):
            time.sleep(0.25)
            assert pinging.command(b"PING") == b"OK"
        assert [p["broadcast_address"] for p in doc(server, "/lookup?topic=idle")["producers"]] == [
            "pinging.example"]
        assert [n["broadcast_address"] for n in doc(server, "/nodes")["producers"]] == [
            "pinging.example"]
        # still registered (only /debug shows it)
        assert len(doc(server, "/debug")["topic:idle:"]) == 2
        assert quiet.command(b"PING") == b"OK"  # a ping makes it active again
        assert len(doc(server, "/lookup?topic=idle")["producers"]) == 2
    finally:
        server.stop()
