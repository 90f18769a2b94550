"""nsqadmin's JSON API against real nsqd and nsqlookupd processes: shapes
(field order, nulls), aggregation across nodes, the actions' effects on the
nodes, errors, /config, the notification webhook, --base-path and
--admin-user."""

import json
import socket
import time

import pytest

from nsqshm import protocol as p
from tests.nsqadmin.conftest import Admin, StubHTTP, channel_of, nsqd_json, topic_of, wait_for
from tests.nsqd.transport import Conn

TOPIC_KEYS = ["node", "hostname", "topic_name", "depth", "memory_depth", "backend_depth",
              "message_count", "nodes", "channels", "paused", "e2e_processing_latency"]
CHANNEL_KEYS = ["node", "hostname", "topic_name", "channel_name", "depth", "memory_depth",
                "backend_depth", "in_flight_count", "deferred_count", "requeue_count",
                "timeout_count", "message_count", "client_count", "nodes", "clients", "paused",
                "e2e_processing_latency"]
CLIENT_KEYS = ["node", "remote_address", "version", "client_id", "hostname", "user_agent",
               "connect_ts", "connected", "in_flight_count", "ready_count", "finish_count",
               "requeue_count", "message_count", "sample_rate", "deflate", "snappy", "authed",
               "auth_identity", "auth_identity_url", "tls", "tls_cipher_suite", "tls_version",
               "tls_negotiated_protocol", "tls_negotiated_protocol_is_mutual"]
PRODUCER_KEYS = ["remote_addresses", "remote_address", "hostname", "broadcast_address",
                 "tcp_port", "http_port", "version", "topics", "out_of_date"]
E2E_KEYS = ["count", "percentiles", "topic", "channel", "host"]


@pytest.fixture(scope="module")
def admin(cluster):
    a = Admin([f"--lookupd-http-address={cluster.lookupd.http_address}"])
    yield a
    a.stop()


def consumer(node, topic, channel, rdy, **identify):
    """A subscribed raw V2 connection (snappy negotiated) with RDY rdy."""
    conn = Conn(node)
    reply = conn.identify(snappy=True, user_agent="ui-test/1.0", **identify)
    assert reply["snappy"] is True
    conn.start_snappy()
    conn.ok()
    conn.send(p.sub(topic, channel)).ok()
    conn.send(p.rdy(rdy))
    return conn


def page_has(admin, path, text, times):
    return admin.get(path)[2].count(text) == times


# -- reading ---------------------------------------------------------------------------


def test_ping(admin):
    status, headers, body = admin.get("/ping")
    assert (status, body) == (200, b"OK")
    assert headers["Content-Type"] == "text/plain; charset=utf-8"


def test_topics_lists_lookupd_topics_sorted(cluster, admin):
    cluster.make_topic("list-b")
    cluster.make_topic("list-a", nodes=cluster.nodes[:1])
    status, headers, body = admin.get("/api/topics")
    assert status == 200
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    assert headers["X-Nsq-Content-Type"] == "nsq; version=1.0"
    doc = json.loads(body)
    assert list(doc) == ["topics", "message"]
    assert doc["message"] == ""
    assert doc["topics"] == sorted(doc["topics"])
    assert {"list-a", "list-b"} <= set(doc["topics"])


def test_topic_aggregates_nodes(cluster, admin):
    cluster.make_topic("agg", channel="ch", messages=3)  # 3 on each node
    status, doc = admin.json("GET", "/api/topics/agg")
    assert status == 200
    assert list(doc) == TOPIC_KEYS + ["message"]
    assert (doc["node"], doc["hostname"], doc["topic_name"]) == ("*", "", "agg")
    assert doc["message_count"] == 6
    assert sorted(n["node"] for n in doc["nodes"]) == sorted(cluster.addrs)
    for node in doc["nodes"]:
        assert list(node) == TOPIC_KEYS
        assert node["message_count"] == 3 and node["nodes"] is None
    [channel] = doc["channels"]
    assert list(channel) == CHANNEL_KEYS
    # nsqadmin aggregates a channel into its first node's entry
    assert (channel["channel_name"], channel["node"], channel["depth"]) == ("ch", "*", 6)
    e2e = doc["e2e_processing_latency"]
    assert list(e2e) == E2E_KEYS
    assert (e2e["host"], e2e["topic"]) == ("*", "agg")
    assert [q["quantile"] for q in e2e["percentiles"]] == [0.99, 0.5]
    assert list(e2e["percentiles"][0]) == ["average", "count", "max", "min", "quantile"]


def test_channel_with_clients(cluster, admin):
    cluster.make_topic("chan", channel="c", messages=2)
    conns = [consumer(n, "chan", "c", rdy=7) for n in cluster.nodes]
    conns.append(consumer(cluster.nodes[0], "chan", "sampled", rdy=1, sample_rate=50))
    try:
        assert wait_for(lambda: admin.json("GET", "/api/topics/chan/c")[1]["in_flight_count"] == 4)
        status, doc = admin.json("GET", "/api/topics/chan/c")
        assert status == 200
        assert list(doc) == CHANNEL_KEYS + ["message"]
        assert (doc["depth"], doc["client_count"], doc["message_count"]) == (0, 2, 4)
        assert sorted(n["node"] for n in doc["nodes"]) == sorted(cluster.addrs)
        assert len(doc["clients"]) == 2
        for client in doc["clients"]:
            assert list(client) == CLIENT_KEYS
            assert client["node"] in cluster.addrs
            assert (client["ready_count"], client["in_flight_count"]) == (7, 2)
            assert client["snappy"] is True and client["deflate"] is False
            assert client["user_agent"] == "ui-test/1.0"
            assert client["version"] == "V2"
            assert client["connected"] % 1_000_000_000 == 0
        assert page_has(admin, "/topics/chan/c", b"Snappy</span>", 2)
        [sampled] = admin.json("GET", "/api/topics/chan/sampled")[1]["clients"]
        assert sampled["sample_rate"] == 50
        assert page_has(admin, "/topics/chan/sampled", b"Sampled 50%", 1)
    finally:
        for c in conns:
            c.close()


def test_unknown_channel_is_an_empty_document(cluster, admin):
    cluster.make_topic("nochan")
    assert admin.request("GET", "/api/topics/nochan/missing")[2] == b'{"message":""}'


def test_unknown_topic_is_upstream_error(admin):
    status, _, body = admin.get("/api/topics/never-made")
    assert status == 502
    assert body == (b'{"message":"UPSTREAM_ERROR: Failed to query any nsqlookupd: got response '
                    b'404 Not Found \\"{\\\\\\"message\\\\\\":\\\\\\"TOPIC_NOT_FOUND\\\\\\"}\\""}')


def test_nodes(cluster, admin):
    cluster.make_topic("nodes-t")
    status, doc = admin.json("GET", "/api/nodes")
    assert status == 200 and list(doc) == ["nodes", "message"]
    by_addr = {f"{n['broadcast_address']}:{n['http_port']}": n for n in doc["nodes"]}
    assert set(by_addr) == set(cluster.addrs)
    for node in by_addr.values():
        assert list(node) == PRODUCER_KEYS
        assert node["remote_addresses"][0].startswith(cluster.lookupd.http_address + "/")
        assert node["version"] == "1.3.0" and node["out_of_date"] is False
        assert {"topic": "nodes-t", "tombstoned": False} in node["topics"]
        names = [t["topic"] for t in node["topics"]]
        assert names == sorted(names)


def test_node(cluster, admin):
    cluster.make_topic("node-t", channel="nc", messages=2)
    conn = consumer(cluster.nodes[0], "node-t", "nc", rdy=1)
    try:
        node = cluster.addrs[0]
        assert wait_for(lambda: admin.json("GET", f"/api/nodes/{node}")[1]["total_clients"] == 1)
        status, doc = admin.json("GET", f"/api/nodes/{node}")
        assert status == 200
        assert list(doc) == ["node", "topics", "total_messages", "total_clients", "message"]
        assert doc["node"] == node
        topic = next(t for t in doc["topics"] if t["topic_name"] == "node-t")
        assert topic["node"] == node and topic["message_count"] == 2
        assert doc["total_messages"] == sum(t["message_count"] for t in doc["topics"])
    finally:
        conn.close()
    assert admin.json("GET", "/api/nodes/127.0.0.1:1") == (404, {"message": "NODE_NOT_FOUND"})


def test_counter(cluster, admin):
    cluster.make_topic("count-t", channel="cc", messages=2)
    status, doc = admin.json("GET", "/api/counter")
    assert status == 200 and list(doc) == ["stats", "message"]
    assert list(doc["stats"]) == sorted(doc["stats"])
    for addr in cluster.addrs:
        assert doc["stats"][f"count-t:cc:{addr}"] == {
            "node": addr, "topic_name": "count-t", "channel_name": "cc", "message_count": 2}


def test_inactive_topics(cluster, admin):
    assert cluster.lookupd.post("/topic/create?topic=ghost")[0] == 200
    assert cluster.lookupd.post("/channel/create?topic=ghost&channel=g1")[0] == 200
    status, doc = admin.json("GET", "/api/topics?inactive=true")
    assert status == 200
    assert doc["topics"]["ghost"] == ["g1"]
    assert "agg" not in doc["topics"]  # has producers
    assert admin.json("GET", "/api/topics?a=%zz") == (400, {"message": 'invalid URL escape "%zz"'})


# -- actions ---------------------------------------------------------------------------


def both(cluster, fn):
    return all(fn(n) for n in cluster.nodes)


def test_pause_unpause_empty_delete_channel(cluster, admin):
    cluster.make_topic("act", channel="c", messages=5)
    path = "/api/topics/act/c"
    assert admin.json("POST", path, {"action": "pause"}) == (200, {"message": ""})
    assert both(cluster, lambda n: channel_of(n, "act", "c")["paused"] is True)
    assert admin.json("POST", path, {"action": "unpause"}) == (200, {"message": ""})
    assert both(cluster, lambda n: channel_of(n, "act", "c")["paused"] is False)
    assert both(cluster, lambda n: channel_of(n, "act", "c")["depth"] == 5)
    assert admin.json("POST", path, {"action": "empty"}) == (200, {"message": ""})
    assert both(cluster, lambda n: channel_of(n, "act", "c")["depth"] == 0)
    assert admin.json("DELETE", path) == (200, {"message": ""})
    assert both(cluster, lambda n: channel_of(n, "act", "c") is None)


def test_pause_empty_delete_topic(cluster, admin):
    cluster.make_topic("tact", messages=4)
    assert admin.json("POST", "/api/topics/tact", {"action": "pause"}) == (200, {"message": ""})
    assert both(cluster, lambda n: topic_of(n, "tact")["paused"] is True)
    assert admin.json("POST", "/api/topics/tact", {"action": "empty"}) == (200, {"message": ""})
    assert both(cluster, lambda n: topic_of(n, "tact")["depth"] == 0)
    assert admin.json("DELETE", "/api/topics/tact") == (200, {"message": ""})
    assert both(cluster, lambda n: topic_of(n, "tact") is None)
    assert "tact" not in cluster.lookupd.get_json("/topics")["topics"]


def make_log_topic(cluster, topic, channel, per_partition):
    """A log topic of 2 partitions on the first node, a channel, messages."""
    node = cluster.nodes[0]
    assert node.post(f"/topic/create?topic={topic}&partition_num=2")[0] == 200
    assert node.post(f"/channel/create?topic={topic}&channel={channel}")[0] == 200
    for part in range(2):
        body = b"\n".join(b"m%d" % i for i in range(per_partition))
        assert node.post(f"/mpub?topic={topic}&partition={part}", body)[0] == 200
    assert wait_for(lambda: cluster.lookupd.producers(topic) == [("127.0.0.1", node.tcp_port)])
    return node


def cursors(node, topic, channel):
    return [(e["partition"], e["confirmed_offset"], e["lag"])
            for e in channel_of(node, topic, channel)["partitions"]]


def test_a_log_topics_partitions_and_a_channel_reset(cluster, admin):
    """A log topic's partitions in the topic and channel JSON (absent from a
    classic topic's, which stays nsqadmin's), and the channel moved to the
    end, the start and a time on its nodes (nsqd's /channel/setoffset)."""
    node = make_log_topic(cluster, "alog", "c", 4)
    assert cursors(node, "alog", "c") == [(0, 0, 4), (1, 0, 4)]
    status, doc = admin.json("GET", "/api/topics/alog")
    (n,) = doc["nodes"]
    assert [(e["partition"], e["start_offset"], e["end_offset"]) for e in n["partitions"]] == \
        [(0, 0, 4), (1, 0, 4)]
    status, doc = admin.json("GET", "/api/topics/alog/c")
    assert [(e["partition"], e["lag"]) for e in doc["nodes"][0]["partitions"]] == [(0, 4), (1, 4)]
    cluster.make_topic("aclassic", channel="c")
    assert "partitions" not in admin.json("GET", "/api/topics/aclassic")[1]["nodes"][0]

    path = "/api/topics/alog/c"
    assert admin.json("POST", path, {"action": "setoffset", "position": "latest"}) == \
        (200, {"message": ""})
    assert cursors(node, "alog", "c") == [(0, 4, 0), (1, 4, 0)]
    assert admin.json("POST", path, {"action": "setoffset", "position": "earliest"})[0] == 200
    assert cursors(node, "alog", "c") == [(0, 0, 4), (1, 0, 4)]
    future = int(time.time()) + 3600  # no message at or after it: the end
    assert admin.json("POST", path, {"action": "setoffset",
                                     "position": f"timestamp:{future}"})[0] == 200
    assert cursors(node, "alog", "c") == [(0, 4, 0), (1, 4, 0)]


def test_create_topic_and_channel(cluster, admin):
    cluster.make_topic("mk")
    status, doc = admin.json("POST", "/api/topics", {"topic": "mk", "channel": "fresh"})
    assert (status, doc) == (200, {"message": ""})
    assert "fresh" in cluster.lookupd.get_json("/channels?topic=mk")["channels"]
    assert both(cluster, lambda n: channel_of(n, "mk", "fresh") is not None)


def test_tombstone_node_for_topic(cluster, admin):
    cluster.make_topic("tomb")
    node = cluster.addrs[0]
    status, doc = admin.json("DELETE", f"/api/nodes/{node}", {"topic": "tomb"})
    assert (status, doc) == (200, {"message": ""})
    assert topic_of(cluster.nodes[0], "tomb") is None
    assert topic_of(cluster.nodes[1], "tomb") is not None
    assert f"DB: setting tombstone for producer@{node} of topic(tomb)" in "".join(
        cluster.lookupd.lines)
    assert cluster.lookupd.producers("tomb") == [("127.0.0.1", cluster.nodes[1].tcp_port)]


@pytest.mark.parametrize("method, path, body, status, message", [
    ("POST", "/api/topics/agg/ch", {"action": "explode"}, 400, "INVALID_ACTION"),
    ("POST", "/api/topics/agg", {"action": "setoffset", "position": "latest"}, 400,
     "INVALID_ACTION"),  # a channel's, not a topic's
    ("POST", "/api/topics/agg/ch", {"action": "setoffset", "position": "yesterday"}, 400,
     "INVALID_POSITION"),
    ("POST", "/api/topics/agg/ch", {"action": "setoffset"}, 400, "INVALID_POSITION"),
    ("POST", "/api/topics/agg/ch", b"", 400, "EOF"),
    ("POST", "/api/topics/agg/ch", b"pause", 400,
     "invalid character 'p' looking for beginning of value"),
    ("POST", "/api/topics/agg/ch", {"action": 1}, 400,
     "json: cannot unmarshal number into Go struct field .action of type string"),
    ("POST", "/api/topics", {"topic": "bad topic"}, 400, "INVALID_TOPIC"),
    ("POST", "/api/topics", {"topic": "ok", "channel": "bad!"}, 400, "INVALID_CHANNEL"),
    ("POST", "/api/topics", {"channel": "c"}, 400, "INVALID_TOPIC"),
    ("DELETE", "/api/nodes/127.0.0.1:4151", b"{", 400, "INVALID_BODY"),
    ("DELETE", "/api/nodes/127.0.0.1:4151", {"topic": "a b"}, 400, "INVALID_TOPIC"),
    ("DELETE", "/api/nodes/not%20a%20node", {"topic": "t"}, 400, "INVALID_NODE"),
    ("POST", "/api/topics/bad%24name", {"action": "pause"}, 400, "INVALID_TOPIC"),
    ("GET", "/api/topics/agg/x%21", None, 400, "INVALID_CHANNEL"),
    ("GET", "/api/topics/agg/x%2Fy", None, 404, "NOT_FOUND"),
    ("PUT", "/api/topics", None, 405, "METHOD_NOT_ALLOWED"),
    ("GET", "/api/nope", None, 404, "NOT_FOUND"),
    ("POST", "/api/cluster/nodes/a%20b", {"action": "remove"}, 400,
     "INVALID_NODE_ID: a cluster node ID is <address>:<rpc port>, up to 128 of A-Z a-z 0-9 . _ : -"),
    ("POST", "/api/cluster/nodes/10.0.0.1:4250", {"action": "drop"}, 400,
     'INVALID_ACTION: a cluster node\'s action is "remove" or "restore"'),
    ("POST", "/api/cluster/nodes/10.0.0.1:4250", b"", 400, "EOF"),
    ("POST", "/api/cluster/topics/t/0", {"action": "move", "from": "10.0.0.1:4250",
                                         "to": "10.0.0.2:4250"}, 400,
     'INVALID_ACTION: a partition\'s action is "move_leader" or "move_replica"'),
    ("POST", "/api/cluster/topics/t/%C2%B2", {"action": "move_leader", "from": "10.0.0.1:4250",
                                              "to": "10.0.0.2:4250"}, 400, "INVALID_PARTITION"),
    ("POST", "/api/cluster/topics/t/0", {"action": "move_leader", "from": "a b",
                                         "to": "10.0.0.2:4250"}, 400,
     "INVALID_NODE_ID: a cluster node ID is <address>:<rpc port>, up to 128 of A-Z a-z 0-9 . _ : -"),
    ("POST", "/api/cluster/topics/bad%24t/0", {"action": "move_leader"}, 400, "INVALID_TOPIC"),
])
def test_bad_requests(admin, method, path, body, status, message):
    assert admin.json(method, path, body) == (status, {"message": message})


def test_cluster_nodes_without_a_cluster(cluster, admin, admin_factory):
    """A standalone lookupd (500 MISSING_COORDINATOR to GET /cluster/nodes): the Nodes
    page has no cluster table and no error; removing a node says why it cannot."""
    cluster.make_topic("standalone")
    page = admin.get("/nodes")[2].decode()
    assert 'id="nodes"' in page and 'id="cluster-nodes"' not in page
    assert 'class="alert' not in page
    status, doc = admin.json("POST", "/api/cluster/nodes/10.0.0.1:4250", {"action": "remove"})
    assert (status, doc) == (502, {"message": "UPSTREAM_ERROR: Failed to query any nsqlookupd: "
                                   f"nsqlookupd {cluster.lookupd.http_address} does not run "
                                   "in cluster mode (MISSING_COORDINATOR)"})
    assert "Traceback" not in "".join(admin.lines)
    direct = admin_factory(f"--nsqd-http-address={cluster.addrs[0]}")  # no lookupd at all
    assert 'id="cluster-nodes"' not in direct.get("/nodes")[2].decode()
    assert direct.json("POST", "/api/cluster/nodes/10.0.0.1:4250", {"action": "restore"}) == (
        400, {"message": "MISSING_LOOKUPD: nodes are removed from a cluster through nsqlookupd "
                         "(--lookupd-http-address)"})


MOVE = {"action": "move_leader", "from": "10.0.0.1:4250", "to": "10.0.0.2:4250"}


def test_a_move_goes_to_the_first_lookupd_that_takes_it_and_no_further(admin_factory):
    """A partition's move (Youzan's POST /topic/partition/move, which a lookupd
    answers once the move is done) goes on to the next lookupd only past one
    that cannot be reached or does not run in cluster mode: whatever a lookupd
    that got it answers, a bare 502 included, is the answer (a second would
    find the move under way and refuse it)."""
    dead = dead_address()
    answers = {"standalone": ("application/json", b'{"message":"MISSING_COORDINATOR"}', 500),
               "proxy": ("text/plain", b"bad gateway", 502),
               "done": ("application/json", b"", 200)}
    stubs = {name: StubHTTP(lambda method, path, a=a: a) for name, a in answers.items()}
    try:
        def move_through(*names):
            admin = admin_factory(*(f"--lookupd-http-address={a}" for a in
                                    [dead, *(stubs[n].addr for n in names)]))
            return admin.json("POST", "/api/cluster/topics/t/3", MOVE)

        status, doc = move_through("standalone", "proxy", "done")
        assert (status, doc) == (502, {"message": 'got response 502 Bad Gateway "bad gateway"'})
        want = ("/topic/partition/move?topic=t&partition=3&move_leader=true"
                "&move_from=10.0.0.1%3A4250&move_to=10.0.0.2%3A4250")
        assert [(r[0], r[1]) for r in stubs["proxy"].requests] == [("POST", want)]
        assert stubs["done"].requests == []
        status, doc = move_through("standalone", "done")
        assert status == 200 and doc["message"].startswith(
            f'WARNING: Post "http://{dead}/topic/partition/move?')
        assert "does not run in cluster mode (MISSING_COORDINATOR)" in doc["message"]
        assert len(stubs["done"].requests) == 1
    finally:
        for stub in stubs.values():
            stub.close()


# -- partial and total failures (nsqd mode) --------------------------------------------


def dead_address():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def test_partial_failure_is_a_warning(cluster, admin_factory):
    dead = dead_address()
    cluster.make_topic("part")
    admin = admin_factory(f"--nsqd-http-address={cluster.addrs[0]}", f"--nsqd-http-address={dead}")
    status, doc = admin.json("GET", "/api/topics")
    assert status == 200
    assert "part" in doc["topics"]
    assert doc["message"] == (f'WARNING: Get "http://{dead}/stats?format=json&include_clients=false"'
                              f": dial tcp {dead}: connect: connection refused")


def test_total_failure_is_502(admin_factory):
    dead = dead_address()
    admin = admin_factory(f"--nsqd-http-address={dead}")
    status, doc = admin.json("GET", "/api/nodes")
    assert status == 502
    assert doc["message"] == (f'UPSTREAM_ERROR: Failed to query any nsqd: Get "http://{dead}/info"'
                              f": dial tcp {dead}: connect: connection refused")
    assert admin.get("/topics")[0] == 502  # the page says so too
    assert "Traceback" not in "".join(admin.lines)  # an expected failure, logged as such
    assert any("ERROR: failed to get nodes - Failed to query any nsqd" in line
               for line in admin.lines)


def go_nsqd(topic):
    """A stand-in for a Go nsqd 1.2.1: /info and /stats documents in Go nsqd's own
    shape (with fields nsqshm does not have, which nsqadmin ignores)."""
    stats = {"version": "1.2.1", "health": "OK", "start_time": 1700000000, "topics": [{
        "topic_name": topic, "channels": [{
            "channel_name": "c", "depth": 10, "backend_depth": 4, "in_flight_count": 1,
            "deferred_count": 2, "message_count": 40, "requeue_count": 3, "timeout_count": 1,
            "client_count": 0, "clients": [], "paused": True,
            "e2e_processing_latency": {"count": 8, "percentiles": [
                {"quantile": 0.99, "value": 2000000}, {"quantile": 0.5, "value": 500000}]},
        }], "depth": 0, "backend_depth": 0, "message_count": 40, "message_bytes": 400,
        "paused": False, "e2e_processing_latency": {"count": 0, "percentiles": None}}],
        "memory": {"heap_objects": 1}, "producers": []}
    info = {"version": "1.2.1", "broadcast_address": "127.0.0.1", "hostname": "go-nsqd",
            "http_port": 0, "tcp_port": 4150, "start_time": 1700000000}
    json_type = "application/json; charset=utf-8"
    stub = StubHTTP(lambda method, path: (json_type, info if path == "/info" else stats))
    info["http_port"] = int(stub.addr.rpartition(":")[2])
    return stub


def test_side_by_side_with_a_go_shaped_nsqd(cluster, admin_factory):
    cluster.make_topic("mixed", channel="c", nodes=cluster.nodes[:1], messages=2)
    go = go_nsqd("mixed")
    try:
        admin = admin_factory(f"--nsqd-http-address={cluster.addrs[0]}",
                              f"--nsqd-http-address={go.addr}")
        status, doc = admin.json("GET", "/api/topics/mixed/c")
        assert status == 200, doc
        assert sorted(n["node"] for n in doc["nodes"]) == sorted([cluster.addrs[0], go.addr])
        assert doc["message_count"] == 42 and doc["depth"] == 12 and doc["paused"] is True
        assert doc["memory_depth"] == 8  # depth - backend_depth, per node
        p99 = doc["e2e_processing_latency"]["percentiles"][0]
        assert p99["quantile"] == 0.99 and p99["max"] == 2000000
        status, nodes = admin.json("GET", "/api/nodes")
        versions = {n["hostname"]: (n["version"], n["out_of_date"]) for n in nodes["nodes"]}
        assert versions["go-nsqd"] == ("1.2.1", False)  # nsqadmin compares versions via lookupd only
    finally:
        go.close()


# -- /config ------------------------------------------------------------------------------


def test_config_get_and_put(cluster, admin_factory):
    admin = admin_factory(f"--lookupd-http-address={cluster.lookupd.http_address}")
    assert admin.request("GET", "/config/log_level")[2] == b"2"
    status, headers, body = admin.get("/config/http_address")
    assert (status, body) == (200, b"127.0.0.1:0")
    assert headers["Content-Type"] == "text/plain; charset=utf-8"
    assert admin.request("PUT", "/config/log_level", b"debug")[2] == b"1"
    assert admin.json("PUT", "/config/log_level", b"loud") == (400, {"message": "INVALID_VALUE"})
    assert admin.json("PUT", "/config/log_level", b"") == (413, {"message": "INVALID_VALUE"})
    assert admin.json("PUT", "/config/http_address", b"x") == (400, {"message": "INVALID_OPTION"})
    assert admin.json("GET", "/config/nope") == (400, {"message": "INVALID_OPTION"})
    lookupd = json.dumps([cluster.lookupd.http_address] * 2, separators=(",", ":")).encode()
    assert admin.request("PUT", "/config/nsqlookupd_http_addresses", lookupd)[2] == lookupd
    assert admin.json("GET", "/config/admin_users") == (200, [])


def test_config_only_from_allowed_cidr(cluster, admin_factory):
    admin = admin_factory(f"--lookupd-http-address={cluster.lookupd.http_address}",
                          "--allow-config-from-cidr=10.0.0.0/8")
    assert admin.json("GET", "/config/log_level") == (403, {"message": "FORBIDDEN"})
    assert admin.get("/api/topics")[0] == 200


# -- notifications, admin users, base path --------------------------------------------------


def test_notification_webhook(cluster, admin_factory, receiver):
    cluster.make_topic("note", channel="c")
    admin = admin_factory(f"--lookupd-http-address={cluster.lookupd.http_address}",
                          f"--notification-http-endpoint={receiver.url}")
    auth = {"Authorization": "Basic YWxpY2U6c2VjcmV0", "User-Agent": "tester/2"}  # alice:secret
    assert admin.json("POST", "/api/topics/note/c", {"action": "pause"}, auth)[0] == 200
    assert wait_for(lambda: len(receiver.requests) == 1)
    method, path, headers, body = receiver.requests[0]
    assert (method, path, headers["Content-Type"]) == ("POST", "/notify", "application/json")
    doc = json.loads(body)
    assert list(doc) == ["action", "topic", "channel", "timestamp", "user", "remote_ip",
                         "user_agent", "url", "via"]
    assert (doc["action"], doc["topic"], doc["channel"], doc["user"]) == (
        "pause_channel", "note", "c", "alice")
    assert doc["remote_ip"].startswith("127.0.0.1:")
    assert doc["user_agent"] == "tester/2"
    assert doc["url"] == f"http://127.0.0.1:{admin.port}/api/topics/note/c"
    assert admin.json("POST", "/api/topics", {"topic": "note2", "channel": "x"})[0] == 200
    assert wait_for(lambda: len(receiver.requests) == 3)
    docs = [json.loads(r[3]) for r in receiver.requests[1:]]
    assert [d["action"] for d in docs] == ["create_topic", "create_channel"]
    assert "user" not in docs[0]  # omitempty


def test_admin_users(cluster, admin_factory):
    cluster.make_topic("guarded", channel="c")
    admin = admin_factory(f"--lookupd-http-address={cluster.lookupd.http_address}",
                          "--admin-user=ops", "--acl-http-header=X-Auth-User")
    path = "/api/topics/guarded/c"
    assert admin.json("POST", path, {"action": "pause"}) == (403, {"message": "FORBIDDEN"})
    assert admin.json("DELETE", path, None, {"X-Auth-User": "eve"}) == (403, {"message": "FORBIDDEN"})
    assert both(cluster, lambda n: channel_of(n, "guarded", "c")["paused"] is False)
    assert admin.json("POST", path, {"action": "pause"}, {"X-Auth-User": "ops"})[0] == 200
    assert both(cluster, lambda n: channel_of(n, "guarded", "c")["paused"] is True)
    page = admin.get("/topics/guarded/c")[2]
    assert b'data-action="pause"' not in page and b'data-action="unpause"' not in page
    page = admin.get("/topics/guarded/c", {"X-Auth-User": "ops"})[2]
    assert b'data-action="unpause"' in page


def test_base_path(cluster, admin_factory):
    cluster.make_topic("based")
    admin = admin_factory(f"--lookupd-http-address={cluster.lookupd.http_address}",
                          "--base-path=/nsq/admin/")
    assert admin.get("/nsq/admin/ping")[2] == b"OK"
    assert "based" in admin.json("GET", "/nsq/admin/api/topics")[1]["topics"]
    assert admin.get("/ping")[0] == 404
    assert admin.get("/api/topics")[0] == 404
    page = admin.get("/nsq/admin/topics")[2].decode()
    assert 'href="/nsq/admin/topics/based"' in page
    assert 'src="/nsq/admin/static/nsqadmin.js"' in page
    assert admin.get("/nsq/admin/static/nsqadmin.css")[0] == 200


def test_static_assets(admin):
    status, headers, body = admin.get("/static/nsqadmin.js")
    assert status == 200 and headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert b"data-action" in body
    assert admin.get("/static/missing.js")[:3:2] == (404, b"NOT_FOUND")
    assert admin.get("/static/.hidden")[0] == 404


def test_pages_escape_cluster_names(cluster, admin):
    cluster.make_topic("esc", channel="c")
    conn = consumer(cluster.nodes[0], "esc", "c", rdy=1, hostname="<img src=x onerror=alert(1)>")
    try:
        assert wait_for(lambda: b"onerror" in admin.get("/topics/esc/c")[2])
        page = admin.get("/topics/esc/c")[2]
        assert b"<img src=x" not in page
        assert b"&lt;img src=x onerror=alert(1)&gt;" in page
    finally:
        conn.close()


def test_nsqd_json_reachable(cluster):
    # the fixtures' own sanity: both nodes registered with lookupd
    assert len(cluster.lookupd.get_json("/nodes")["producers"]) == 2
    assert nsqd_json(cluster.nodes[0], "/info")["http_port"] == cluster.nodes[0].http_port


def test_graphite_rate_and_proxy(cluster, admin_factory):
    points = [{"target": "x", "datapoints": [[120.0, 1700000000]]}]
    graphite = StubHTTP(lambda method, path: ("application/json", points))
    try:
        admin = admin_factory(f"--lookupd-http-address={cluster.lookupd.http_address}",
                              f"--graphite-url=http://user:pw@{graphite.addr}",
                              "--proxy-graphite", "--statsd-interval=1m")
        target = "sumSeries(nsq.*.topic.t.message_count)"
        status, doc = admin.json("GET", f"/api/graphite?metric=rate&target={target}")
        assert (status, doc) == (200, {"rate": "2.00"})  # 120 per 60 s
        path = graphite.requests[0][1]
        assert path == ("/render?format=json&from=-120sec&target=sumSeries%28nsq.%2A.topic.t."
                        "message_count%29&until=-60sec")
        assert admin.json("GET", "/api/graphite?metric=depth&target=x") == (
            400, {"message": "INVALID_ARG_METRIC"})
        assert admin.json("GET", "/api/graphite?metric=rate") == (
            400, {"message": "INVALID_ARG_TARGET"})
        status, _, body = admin.get("/render?target=x&format=json")
        assert status == 200 and json.loads(body)[0]["target"] == "x"
        _, path, headers, _ = graphite.requests[-1]
        assert (path, headers["Authorization"]) == ("/render?target=x&format=json",
                                                    "Basic dXNlcjpwdw==")
    finally:
        graphite.close()


def test_config_put_rejects_addresses_that_are_not_host_port(cluster, admin_factory):
    admin = admin_factory(f"--lookupd-http-address={cluster.lookupd.http_address}")
    assert admin.json("PUT", "/config/nsqlookupd_http_addresses", b'["no-port"]') == (
        400, {"message": "INVALID_VALUE"})
    assert admin.json("PUT", "/config/nsqlookupd_http_addresses", b'{"a":1}') == (
        400, {"message": "INVALID_VALUE"})
