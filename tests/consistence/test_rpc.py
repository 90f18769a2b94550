"""The replication RPC (consistence/rpc.py): frames both ways over real sockets, and
the server taking only registered peers of its own cluster (registered_peer, checked
against a real etcd)."""

import json
import struct

import gevent
import gevent.socket
import pytest

from nsqshm.consistence import rpc
from nsqshm.consistence.nsqd_coordinator import registered_peer
from nsqshm.consistence.topology import NodeInfo, Topology

RECORDS = b"\x05\x00\x00\x00hello"  # what a log batch looks like: opaque to the RPC


@pytest.fixture
def server():
    """An RPC server on 127.0.0.1 whose peer check and append are the test's."""
    seen = []
    peers = {"leader:1"}
    srv = rpc.RPCServer(("127.0.0.1", 0), "c1", "follower:1",
                        lambda node, ip: node in peers and ip == "127.0.0.1",
                        lambda *args: (seen.append((args[:6], bytes(args[6]))) or (rpc.OK, 42, None)),
                        lambda topic, p, records: (rpc.NOT_LEADER, f"{topic}-{p} not mine"),
                        lambda level, msg: None)
    srv.start()
    srv.seen = seen
    yield srv
    srv.stop()


def test_append_reaches_the_follower_and_its_ack_comes_back(server):
    client = rpc.RPCClient("127.0.0.1", server.address[1], "c1", "leader:1", timeout=5)
    header = rpc.encode_append("orders", 3, 7, 41, len(RECORDS), prev_crc=0xCAFEF00D)
    assert client.append(header, RECORDS) == (rpc.OK, 42, None)
    assert server.seen == [(("leader:1", "orders", 3, 7, 41, 0xCAFEF00D), RECORDS)]
    client.close()


def test_the_nodes_own_id_needs_the_nodes_secret():
    """PUBLISH (a PUB another worker of the node took) is appended as the owner's own:
    only the node's workers, which share the supervisor's secret, may send it; a
    process on the host that says it is the node is refused."""
    published = []
    srv = rpc.RPCServer(("127.0.0.1", 0), "c1", "follower:1",
                        lambda node, ip: node == "follower:1" and ip == "127.0.0.1",
                        lambda *args: (rpc.OK, 0, None),
                        lambda topic, p, records: published.append(bytes(records)) or (
                            rpc.OK, ""),
                        lambda level, msg: None, secret="s3cret")
    srv.start()
    try:
        for secret in (None, "guess", 7):
            sock = gevent.socket.create_connection(srv.address, timeout=5)
            hello = json.loads(rpc.hello_body("c1", "follower:1"))
            if secret is not None:
                hello["secret"] = secret
            sock.sendall(rpc.frame(rpc.HELLO, json.dumps(hello).encode()))
            kind, body = rpc.read_frame(sock)
            assert (kind, json.loads(body)) == (rpc.ERROR, {
                "error": "follower:1 is this node, and the HELLO does not hold this node's "
                         "secret"}), secret
            sock.close()
        client = rpc.RPCClient("127.0.0.1", srv.address[1], "c1", "follower:1", timeout=5,
                               secret="s3cret")
        client.sock.sendall(rpc.encode_publish("orders", 0, len(RECORDS)) + RECORDS)
        kind, body = rpc.read_frame(client.sock)
        assert (kind, bytes(body)) == (rpc.PUBLISHED, b"\x00")
        assert published == [RECORDS]
        client.close()
    finally:
        srv.stop()


def test_publish_is_only_for_the_nodes_own_workers(server):
    client = rpc.RPCClient("127.0.0.1", server.address[1], "c1", "leader:1", timeout=5)
    # another node's PUBLISH is a protocol error: the connection is closed
    client.sock.sendall(rpc.encode_publish("orders", 0, len(RECORDS)) + RECORDS)
    with pytest.raises(rpc.RPCError):
        rpc.read_frame(client.sock)
    client.close()


@pytest.mark.parametrize("cluster, node", [("c2", "leader:1"), ("c1", "stranger:9")])
def test_another_cluster_or_an_unregistered_node_is_refused(server, cluster, node):
    with pytest.raises(rpc.RPCError, match="refused"):
        rpc.RPCClient("127.0.0.1", server.address[1], cluster, node, timeout=5)
    assert server.seen == []


@pytest.mark.parametrize("version", [None, rpc.PROTOCOL_VERSION - 1, "3"])
def test_a_peer_of_another_protocol_version_is_refused_with_both_versions(server, version):
    sock = gevent.socket.create_connection(server.address, timeout=5)
    hello = {"cluster": "c1", "node": "leader:1", "byteorder": rpc.BYTE_ORDER}
    if version is not None:
        hello["version"] = version
    sock.sendall(rpc.frame(rpc.HELLO, json.dumps(hello).encode()))
    kind, body = rpc.read_frame(sock)
    assert kind == rpc.ERROR
    assert json.loads(body)["error"] == (
        f"replication protocol version {version!r}, this node speaks {rpc.PROTOCOL_VERSION} "
        f"(every node of a cluster must run the same build)")
    sock.close()
    assert server.seen == []


def test_a_bad_frame_length_closes_the_connection(server):
    sock = gevent.socket.create_connection(server.address, timeout=5)
    sock.sendall(b"\xff\xff\xff\xff\x01")  # 4 GiB
    assert sock.recv(10) == b""
    sock.close()


def test_before_its_hello_a_connection_may_send_no_more_than_a_hello(server):
    """A length past MAX_HELLO is refused before its body is read (or allocated):
    a stranger cannot make the worker hold 64 MiB per connection."""
    sock = gevent.socket.create_connection(server.address, timeout=5)
    sock.sendall(rpc.HEADER.pack(rpc.MAX_HELLO + 1, rpc.HELLO))
    assert sock.recv(10) == b""  # closed at once, nothing else sent
    sock.close()


def test_a_connection_that_says_nothing_is_closed_after_the_hello_timeout(server, monkeypatch):
    monkeypatch.setattr(rpc, "HELLO_TIMEOUT", 0.3)
    sock = gevent.socket.create_connection(server.address, timeout=5)
    t0 = gevent.get_hub().loop.now()
    assert sock.recv(10) == b""
    assert gevent.get_hub().loop.now() - t0 < 3
    sock.close()


@pytest.mark.parametrize("hello", [b"[1, 2]", b'"leader:1"', b"null",
                                   b'{"cluster": "c1", "node": "leader:1\nINF forged"}'])
def test_a_hello_that_is_not_a_peers_is_refused(server, hello):
    sock = gevent.socket.create_connection(server.address, timeout=5)
    sock.sendall(rpc.frame(rpc.HELLO, hello))
    kind, body = rpc.read_frame(sock)
    assert (kind, json.loads(body)) == (rpc.ERROR, {"error": "expected HELLO"})
    sock.close()


@pytest.mark.parametrize("body", [b"", b"\x00", b"\x00\x00\x01t", b"\x00\x00\x01t\x00\x02"])
def test_a_short_ack_is_a_protocol_error(body):
    """(Not an IndexError or struct.error the leader's sender does not catch.)"""
    with pytest.raises(rpc.RPCError, match="short ACK"):
        rpc.decode_ack(body)


def test_codec_round_trips():
    frame = rpc.encode_append("t", 2, 9, rpc.PROBE, 0)
    kind, body = rpc.read_frame(_Bytes(frame))
    assert kind == rpc.APPEND
    assert rpc.decode_append(body)[:5] == ("t", 2, 9, rpc.PROBE, 0)
    kind, body = rpc.read_frame(_Bytes(rpc.encode_ack(rpc.MISMATCH, "t", 2, 10, 0xDEADBEEF)))
    assert rpc.decode_ack(body) == (rpc.MISMATCH, "t", 2, 10, 0xDEADBEEF)
    kind, body = rpc.read_frame(_Bytes(rpc.encode_ack(rpc.OK, "t", 2, 10)))
    assert rpc.decode_ack(body) == (rpc.OK, "t", 2, 10, None)


def test_cursors_codec_round_trips_and_refuses_short_bodies():
    retries = struct.pack(">QHq", 6, 2, 0) + struct.pack(">QHq", 9, 3, 1_700_000_000_000)
    cursors = [("audit", 5, bytes(range(8)) * 1024, retries, 12), ("other", 0, b"", b"", 0)]
    kind, body = rpc.read_frame(_Bytes(rpc.encode_cursors("orders", 3, 7, 1234, cursors)))
    assert kind == rpc.CURSORS
    assert rpc.decode_cursors(body) == ("orders", 3, 7, 1234, cursors)
    for cut in (3, len(body) - 1, len(body) - 4, len(body) - 8200, len(body) - 8193 - 36,
                len(body) - 8193 - 44):
        with pytest.raises(rpc.RPCError):
            rpc.decode_cursors(body[:cut])
    with pytest.raises(rpc.RPCError, match="trailing"):
        rpc.decode_cursors(body + b"x")
    # a retry table that is not whole entries
    bad = rpc.encode_cursors("orders", 3, 7, 1234, [("audit", 5, b"", b"x" * 17, 5)])
    with pytest.raises(rpc.RPCError, match="retries length 17"):
        rpc.decode_cursors(rpc.read_frame(_Bytes(bad))[1])


def test_cursors_reach_the_follower_and_its_ack_comes_back():
    seen = []
    srv = rpc.RPCServer(("127.0.0.1", 0), "c1", "follower:1", lambda node, ip: True,
                        None, None, lambda level, msg: None,
                        on_cursors=lambda *args: seen.append(args) or (rpc.OK, 9))
    srv.start()
    try:
        client = rpc.RPCClient("127.0.0.1", srv.address[1], "c1", "leader:1", timeout=5)
        frame = rpc.encode_cursors("orders", 0, 4, 3, [("audit", 3, b"", b"", 7)])
        assert client.cursors(frame) == (rpc.OK, 9)
        assert seen == [("leader:1", "orders", 0, 4, 3, [("audit", 3, b"", b"", 7)])]
        client.close()
    finally:
        srv.stop()


class _Bytes:
    """recv_into over bytes (read_frame's only need of a socket)."""

    def __init__(self, data):
        self.data = memoryview(data)

    def recv_into(self, view):
        n = min(len(view), len(self.data))
        view[:n] = self.data[:n]
        self.data = self.data[n:]
        return n


def test_registered_peer_checks_etcd(sessions):
    topology = Topology(sessions(), "c1")
    topology.register_node(NodeInfo(id="127.0.0.1:4250", ip="127.0.0.1", rpc_port=4250))
    assert registered_peer(topology, "127.0.0.1:4250", "127.0.0.1")
    assert not registered_peer(topology, "127.0.0.1:4250", "127.0.0.2")  # not its address
    assert not registered_peer(topology, "10.0.0.9:4250", "127.0.0.1")  # not registered
    assert not registered_peer(Topology(topology.session, "c2"), "127.0.0.1:4250",
                               "127.0.0.1")  # another cluster
