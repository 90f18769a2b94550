"""nsqlookupd's TCP protocol against a real `nsqshm lookupd`, over raw sockets:
every command and every error, byte for byte (nsqlookupd 1.3's tcp.go and
lookup_protocol_v1.go: size-prefixed answers without a frame type, every
error fatal)."""

import json
import socket
import struct
import time

import pytest

from tests.nsqlookupd.conftest import LookupConn, Lookupd, wait_for


@pytest.fixture(scope="module")
def srv():
    server = Lookupd()
    yield server
    server.stop()


def sized(data):
    return struct.pack(">i", len(data)) + data


def expect_fatal(conn, text):
    """One size-prefixed error answer, then the connection is closed."""
    assert conn.raw_response() == sized(text)
    assert conn.is_closed()


# ---------------------------------------------------------------------------
# magic


def test_bad_magic_is_answered_and_closed(srv):
    conn = LookupConn(srv, magic=b"  V2")
    expect_fatal(conn, b"E_BAD_PROTOCOL")


def test_short_magic_then_close_gets_nothing(srv):
    conn = LookupConn(srv, magic=b" ")
    conn.sock.shutdown(socket.SHUT_WR)
    assert conn.is_closed()


# ---------------------------------------------------------------------------
# PING


def test_ping_before_identify(srv):
    conn = LookupConn(srv)
    conn.send(b"PING\n")
    assert conn.raw_response() == b"\x00\x00\x00\x02OK"
    conn.send(b"PING extra params\n")  # parameters are ignored
    assert conn.raw_response() == b"\x00\x00\x00\x02OK"
    conn.close()


def test_lines_are_trimmed_and_pipelined(srv):
    conn = LookupConn(srv)
    conn.send(b"  PING\t\r\nPING\r\n\xc2\xa0PING\xe3\x80\x80\n")  # Go's TrimSpace: Unicode too
    assert [conn.response() for _ in range(3)] == [b"OK"] * 3
    conn.close()


def test_ping_refreshes_last_update(srv):
    conn = LookupConn(srv)
    conn.identify(broadcast_address="ping.example")

    def last_update():
        for entries in srv.get_json("/debug").values():
            for e in entries:
                if e["broadcast_address"] == "ping.example":
                    return e["last_update"]

    first = last_update()
    assert abs(first / 1e9 - time.time()) < 60
    time.sleep(0.05)
    assert conn.command(b"PING") == b"OK"
    assert last_update() > first
    conn.close()


# ---------------------------------------------------------------------------
# IDENTIFY


def test_identify_answer_is_nsqlookupds_sorted_json(srv):
    conn = LookupConn(srv)
    body = json.dumps({"broadcast_address": "a.example", "hostname": "h", "tcp_port": 4150,
                       "http_port": 4151, "version": "1.3.0"}).encode()
    conn.send(b"IDENTIFY\n" + sized(body))
    expected = (b'{"broadcast_address":"127.0.0.1","hostname":"%s","http_port":%d,'
                b'"tcp_port":%d,"version":"1.3.0"}'
                % (socket.gethostname().encode(), srv.http_port, srv.tcp_port))
    assert conn.raw_response() == sized(expected)
    conn.close()


def test_identify_keys_match_case_insensitively_and_unknown_ones_are_ignored(srv):
    conn = LookupConn(srv)
    body = (b'{"BROADCAST_ADDRESS":"ci.example","Tcp_Port":1,"http_port":2,"VERSION":"x",'
            b'"other":[1,{"a":null}],"remote_address":"ignored","hostname":null}')
    conn.send(b"IDENTIFY\n" + sized(body))
    assert json.loads(conn.response())["version"] == "1.3.0"
    nodes = srv.get_json("/nodes")["producers"]
    (node,) = [n for n in nodes if n["broadcast_address"] == "ci.example"]
    assert (node["tcp_port"], node["http_port"], node["version"], node["hostname"]) == (
        1, 2, "x", "")
    port = conn.sock.getsockname()[1]
    assert node["remote_address"] == f"127.0.0.1:{port}"  # set by nsqlookupd, not the body
    conn.close()


def test_identify_again_is_fatal(srv):
    conn = LookupConn(srv)
    conn.identify()
    conn.send(b"IDENTIFY\n")
    expect_fatal(conn, b"E_INVALID cannot IDENTIFY again")


@pytest.mark.parametrize("missing", ["broadcast_address", "tcp_port", "http_port", "version"])
def test_identify_missing_fields(srv, missing):
    info = {"broadcast_address": "b", "tcp_port": 1, "http_port": 2, "version": "v"}
    info[missing] = "" if isinstance(info[missing], str) else 0
    conn = LookupConn(srv)
    conn.send(b"IDENTIFY\n" + sized(json.dumps(info).encode()))
    expect_fatal(conn, b"E_BAD_BODY IDENTIFY missing fields")


def test_identify_hostname_is_optional(srv):
    conn = LookupConn(srv)
    body = b'{"broadcast_address":"b","tcp_port":1,"http_port":2,"version":"v"}'
    conn.send(b"IDENTIFY\n" + sized(body))
    assert json.loads(conn.response())["tcp_port"] == srv.tcp_port
    conn.close()


@pytest.mark.parametrize("body", [
    b"not json", b"", b"[]", b'"s"', b"1", b'{"tcp_port":"4150"}', b'{"tcp_port":4150.0}',
    b'{"tcp_port":1e3}', b'{"version":1}', b'{"hostname":true}', b'{"http_port":NaN}',
    b'{"tcp_port":9223372036854775808}', b'{"broadcast_address":{}}', b'{"a":1} x',
])
def test_identify_bad_json(srv, body):
    conn = LookupConn(srv)
    conn.send(b"IDENTIFY\n" + sized(body))
    expect_fatal(conn, b"E_BAD_BODY IDENTIFY failed to decode JSON body")


def test_identify_null_body_decodes_to_missing_fields(srv):
    conn = LookupConn(srv)
    conn.send(b"IDENTIFY\n" + sized(b"null"))
    expect_fatal(conn, b"E_BAD_BODY IDENTIFY missing fields")


def test_identify_without_body_size(srv):
    conn = LookupConn(srv)
    conn.send(b"IDENTIFY\n\x00\x00")
    conn.sock.shutdown(socket.SHUT_WR)
    expect_fatal(conn, b"E_BAD_BODY IDENTIFY failed to read body size")


def test_identify_with_short_body(srv):
    conn = LookupConn(srv)
    conn.send(b"IDENTIFY\n" + struct.pack(">i", 100) + b'{"a":')
    conn.sock.shutdown(socket.SHUT_WR)
    expect_fatal(conn, b"E_BAD_BODY IDENTIFY failed to read body")


# ---------------------------------------------------------------------------
# REGISTER / UNREGISTER


@pytest.mark.parametrize("command", [b"REGISTER", b"UNREGISTER"])
def test_register_before_identify(srv, command):
    conn = LookupConn(srv)
    conn.send(command + b" topic channel\n")
    expect_fatal(conn, b"E_INVALID client must IDENTIFY")


@pytest.mark.parametrize("command", [b"REGISTER", b"UNREGISTER"])
@pytest.mark.parametrize("args,error", [
    (b"", b"E_INVALID %s insufficient number of params"),
    (b" bad!", b"E_BAD_TOPIC %s topic name 'bad!' is not valid"),
    (b" ", b"E_INVALID %s insufficient number of params"),  # the line is trimmed first
    (b"  t", b"E_BAD_TOPIC %s topic name '' is not valid"),
    (b" t bad*chan", b"E_BAD_CHANNEL %s channel name 'bad*chan' is not valid"),
    (b" " + b"x" * 65, b"E_BAD_TOPIC %s topic name '" + b"x" * 65 + b"' is not valid"),
])
def test_register_errors(srv, command, args, error):
    conn = LookupConn(srv)
    conn.identify()
    conn.send(command + args + b"\n")
    expect_fatal(conn, error % command)


def test_register_and_unregister(srv):
    conn = LookupConn(srv)
    conn.identify(broadcast_address="reg.example", tcp_port=5150, http_port=5151)
    assert conn.command(b"REGISTER reg_t reg_c") == b"OK"
    assert conn.command(b"REGISTER reg_t reg_c") == b"OK"  # twice: no change
    assert conn.command(b"REGISTER reg_t2") == b"OK"
    assert conn.command(b"REGISTER reg_t3 c extra params") == b"OK"  # extra ignored
    topics = srv.get_json("/topics")["topics"]
    assert {"reg_t", "reg_t2", "reg_t3"} <= set(topics)
    doc = srv.get_json("/lookup?topic=reg_t")
    assert doc["channels"] == ["reg_c"]
    (producer,) = doc["producers"]
    assert (producer["broadcast_address"], producer["tcp_port"], producer["http_port"]) == (
        "reg.example", 5150, 5151)

    assert conn.command(b"UNREGISTER reg_t reg_c") == b"OK"
    # the channel stays known without producers; the topic keeps its producer
    assert srv.get_json("/channels?topic=reg_t") == {"channels": ["reg_c"]}
    assert "channel:reg_t:reg_c" not in srv.get_json("/debug")
    assert len(srv.get_json("/lookup?topic=reg_t")["producers"]) == 1
    assert conn.command(b"UNREGISTER reg_t") == b"OK"
    assert srv.get_json("/lookup?topic=reg_t") == {"channels": ["reg_c"], "producers": []}
    assert conn.command(b"UNREGISTER never_registered") == b"OK"
    conn.close()


def test_unregister_topic_takes_its_channels(srv):
    conn = LookupConn(srv)
    conn.identify(broadcast_address="unt.example")
    conn.command(b"REGISTER unt a")
    conn.command(b"REGISTER unt b")
    assert conn.command(b"UNREGISTER unt") == b"OK"
    debug = srv.get_json("/debug")
    assert not [k for k in debug if k.startswith(("channel:unt:", "topic:unt:"))]
    assert srv.get_json("/channels?topic=unt") == {"channels": ["a", "b"]}
    conn.close()


def test_ephemeral_registrations_go_with_their_last_producer(srv):
    one, two = LookupConn(srv), LookupConn(srv)
    one.identify(broadcast_address="e1.example")
    two.identify(broadcast_address="e2.example")
    for conn in (one, two):
        conn.command(b"REGISTER eph_t c#ephemeral")
        conn.command(b"REGISTER e#ephemeral")
    one.command(b"UNREGISTER eph_t c#ephemeral")
    assert srv.get_json("/channels?topic=eph_t") == {"channels": ["c#ephemeral"]}
    two.command(b"UNREGISTER eph_t c#ephemeral")
    assert srv.get_json("/channels?topic=eph_t") == {"channels": []}
    one.command(b"UNREGISTER e#ephemeral")
    assert "e#ephemeral" in srv.get_json("/topics")["topics"]
    two.command(b"UNREGISTER e#ephemeral")
    assert "e#ephemeral" not in srv.get_json("/topics")["topics"]
    one.close()
    two.close()


def test_disconnect_unregisters_the_producer(srv):
    conn = LookupConn(srv)
    conn.identify(broadcast_address="gone.example")
    conn.command(b"REGISTER gone_t gone_c")
    assert len(srv.get_json("/lookup?topic=gone_t")["producers"]) == 1
    conn.close()
    assert wait_for(lambda: srv.get_json("/lookup?topic=gone_t")["producers"] == [])
    assert srv.get_json("/lookup?topic=gone_t")["channels"] == ["gone_c"]
    nodes = srv.get_json("/nodes")["producers"]
    assert "gone.example" not in [n["broadcast_address"] for n in nodes]


# ---------------------------------------------------------------------------
# unknown commands


@pytest.mark.parametrize("line,error", [
    (b"FOO", b"E_INVALID invalid command FOO"),
    (b"ping", b"E_INVALID invalid command ping"),
    (b"", b"E_INVALID invalid command "),
    (b"   ", b"E_INVALID invalid command "),
    (b"\xff\xfe x", b"E_INVALID invalid command \xff\xfe"),
])
def test_invalid_commands(srv, line, error):
    conn = LookupConn(srv)
    conn.send(line + b"\n")
    expect_fatal(conn, error)


def test_an_error_closes_after_earlier_answers(srv):
    conn = LookupConn(srv)
    conn.send(b"PING\nNOPE\nPING\n")
    assert conn.response() == b"OK"
    expect_fatal(conn, b"E_INVALID invalid command NOPE")


# ---------------------------------------------------------------------------
# nsqshm's partitioned registrations (Youzan's REGISTER <topic> <partition> [<channel>])


def test_a_peer_that_asks_for_partitions_is_answered_so(srv):
    conn = LookupConn(srv)
    conn.send(b"IDENTIFY\n" + sized(json.dumps({
        "broadcast_address": "p.example", "tcp_port": 1, "http_port": 2, "version": "1.3.0",
        "topic_partitions": True}).encode()))
    expected = (b'{"broadcast_address":"127.0.0.1","hostname":"%s","http_port":%d,'
                b'"tcp_port":%d,"topic_partitions":true,"version":"1.3.0"}'
                % (socket.gethostname().encode(), srv.http_port, srv.tcp_port))
    assert conn.raw_response() == sized(expected)
    conn.close()
    conn = LookupConn(srv)  # not a bool: ignored, as nsqlookupd ignores a field it lacks
    conn.send(b"IDENTIFY\n" + sized(b'{"broadcast_address":"x","tcp_port":1,"http_port":2,'
                                    b'"version":"v","topic_partitions":"yes"}'))
    assert "topic_partitions" not in json.loads(conn.response())
    assert conn.command(b"REGISTER plain_t c") == b"OK"  # NSQ's form: a channel, not a partition
    assert srv.get_json("/channels?topic=plain_t") == {"channels": ["c"]}
    conn.close()


@pytest.mark.parametrize("command", [b"REGISTER", b"UNREGISTER"])
@pytest.mark.parametrize("args,error", [
    (b" t", b"E_INVALID %s insufficient number of params"),
    (b" t x", b"E_BAD_PARTITIONID %s partition id 'x' is not valid"),
    (b" t 255", b"E_BAD_PARTITIONID %s partition id '255' is not valid"),
    (b" t -1", b"E_BAD_PARTITIONID %s partition id '-1' is not valid"),
    (b" t 0 bad*chan", b"E_BAD_CHANNEL %s channel name 'bad*chan' is not valid"),
    (b" bad! 0", b"E_BAD_TOPIC %s topic name 'bad!' is not valid"),
])
def test_partitioned_register_errors(srv, command, args, error):
    conn = LookupConn(srv)
    conn.identify(topic_partitions=True)
    conn.send(command + args + b"\n")
    expect_fatal(conn, error % command)


def test_partitioned_register_and_unregister(srv):
    conn = LookupConn(srv)
    conn.identify(broadcast_address="part.example", tcp_port=6150, http_port=6151,
                  topic_partitions=True)
    for line in (b"REGISTER pt 0", b"REGISTER pt 1", b"REGISTER pt -11 c",
                 b"REGISTER pt_classic -11"):
        assert conn.command(line) == b"OK"
    assert {"pt", "pt_classic"} <= set(srv.get_json("/topics")["topics"])
    assert srv.get_json("/channels?topic=pt") == {"channels": ["c"]}
    doc = srv.get_json("/lookup?topic=pt&access=r")
    assert sorted(doc["partitions"]) == ["0", "1"]
    assert doc["partitions"]["1"]["tcp_port"] == 6150
    assert srv.get_json("/lookup?topic=pt_classic&access=r")["partitions"] == {}
    assert "partition:pt:0" in srv.get_json("/debug")

    assert conn.command(b"UNREGISTER pt 0") == b"OK"  # one partition: the topic stays
    doc = srv.get_json("/lookup?topic=pt&access=r")
    assert sorted(doc["partitions"]) == ["1"] and len(doc["producers"]) == 1
    assert conn.command(b"UNREGISTER pt -11 c") == b"OK"
    assert "channel:pt:c" not in srv.get_json("/debug")
    assert conn.command(b"UNREGISTER pt -11") == b"OK"  # the whole topic, partitions too
    doc = srv.get_json("/lookup?topic=pt&access=r")
    assert (doc["partitions"], doc["producers"]) == ({}, [])
    assert not [k for k in srv.get_json("/debug") if k.startswith("partition:pt:")]
    conn.close()


def test_partitioned_registrations_go_with_the_connection(srv):
    conn = LookupConn(srv)
    conn.identify(broadcast_address="pgone.example", topic_partitions=True)
    conn.command(b"REGISTER pgone 3")
    assert sorted(srv.get_json("/lookup?topic=pgone&access=r")["partitions"]) == ["3"]
    conn.close()
    assert wait_for(lambda: srv.get_json("/lookup?topic=pgone&access=r")["partitions"] == {})
