"""Moving a partition's leadership or a replica by HTTP (Youzan's nsqlookupd
`POST /topic/partition/move`), a graceful stop's hand-off, and the layout the
lookupd and nsqadmin show (`GET /cluster/topic`, the topic page's replication
table): three nsqd in network namespaces, a real etcd (cluster.py)."""

import base64
import http.client
import json
import re
import threading
import time
import urllib.parse

import pytest

from nsqshm import protocol as p
from nsqshm.consistence.topology import Keys
from tests.consistence.cluster import CLUSTER_ID, Client, Cluster
from tests.consistence.etcd_server import ETCD
from tests.consistence.netns import available
from tests.consistence.test_replication import channel_cursor, publish, wait_until
from tests.nsqadmin.conftest import Admin

pytestmark = [
    pytest.mark.skipif(bool(available()), reason=available() or "available"),
    pytest.mark.skipif(ETCD is None, reason="etcd not installed (scripts/setup.sh)"),
    pytest.mark.timeout(120),
]


@pytest.fixture
def cluster(tmp_path, request):
    # a TTL far above what a move takes: a move must not wait for a lease to run out
    made = Cluster(tmp_path, workers=getattr(request, "param", 1), ttl="10s")
    yield made
    made.close()


ON_1_AND_2_WORKERS = pytest.mark.parametrize("cluster", [1, 2], ids=["w1", "w2"],
                                             indirect=True)


def move(cluster, topic, partition, src, dst, leader):
    query = urllib.parse.urlencode({"topic": topic, "partition": partition,
                                    "move_leader": "true" if leader else "false",
                                    "move_from": src, "move_to": dst})
    status, body = cluster.lookupd.post(f"/topic/partition/move?{query}")
    return status, json.loads(body or b"null")


def layout(cluster, topic):
    return cluster.lookupd.get_json(f"/cluster/topic?topic={topic}")


def consume_some(node, topic, channel, count):
    """SUB with RDY count, take and FIN `count` messages, and keep the connection
    (a consumer that is still there when the leadership moves)."""
    client = Client(node)
    client.send(p.sub(topic, channel))
    assert client.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    client.send(p.rdy(count))
    bodies = []
    for _ in range(count):
        m = client.message()
        bodies.append(m.body)
        client.send(p.fin(m.id))
    return client, bodies


def rest_of_channel(node, topic, channel, count):
    """Exactly `count` messages from node (FINished), then nothing more for 1 s."""
    client = Client(node)
    try:
        got = client.consume(topic, channel, count)
        client.sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            client.message()
        return got
    finally:
        client.close()


@ON_1_AND_2_WORKERS
def test_the_leadership_moves_by_http_and_the_channel_goes_on_where_it_was(cluster):
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    old = cluster.leader("orders")
    new = next(n for n in cluster.nodes if n is not old)
    bodies = [b"m%03d" % i for i in range(100)]
    publish(old, "orders", bodies)
    consumer, first = consume_some(old, "orders", "audit", 40)
    assert first == bodies[:40]
    wait_until(lambda: channel_cursor(old, "orders", "audit") == (40, 0), 5,
               "the leader's channel confirmed the 40")

    began = time.monotonic()
    status, body = move(cluster, "orders", 0, old.id, new.id, leader=True)
    took = time.monotonic() - began
    assert (status, body) == (200, None)
    assert took < 5, took  # a hand-off and an election, not the 10 s lease
    assert cluster.leader("orders", timeout=1) is new
    doc = layout(cluster, "orders")["partitions"][0]
    assert (doc["leader"], doc["designated_leader"], doc["moving"]) == (new.id, new.id, None)
    assert set(doc["isr"]) == {n.id for n in cluster.nodes}

    # the old leader refuses writes with Youzan's code and delivers no more
    client = Client(old)
    kind, data = client.pub("orders", b"refused")
    assert (kind, data.split()[0]) == (p.FRAME_TYPE_ERROR, b"E_FAILED_ON_NOT_LEADER")
    client.close()
    consumer.close()
    publish(new, "orders", [b"after"])
    # the new leader took the cursor with the hand-off: the 40 are not delivered again
    assert rest_of_channel(new, "orders", "audit", 61) == [*bodies[40:], b"after"]


@ON_1_AND_2_WORKERS
def test_the_node_that_handed_its_leadership_off_does_not_win_it_back(cluster):
    """The node a move makes the designated leader is slow to elect (a loaded host:
    here frozen from before the move until 1.5 s after the hand-off, three times the
    0.5 s a candidate used to wait for it): the old leader and the third node wait
    for it while it is registered, and it leads after."""
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    old = cluster.leader("orders")
    new = next(n for n in cluster.nodes if n is not old)
    assert old.server.post("/channel/create?topic=orders&channel=audit")[0] == 200
    publish(old, "orders", [b"before"])
    wait_until(lambda: channel_cursor(new, "orders", "audit") is not None, 5,
               "the channel on the new leader")
    answer = []
    new.freeze()
    try:
        mover = threading.Thread(target=lambda: answer.append(
            move(cluster, "orders", 0, old.id, new.id, leader=True)))
        mover.start()
        wait_until(lambda: layout(cluster, "orders")["partitions"][0]["designated_leader"]
                   == new.id, 10, "the hand-off")
        time.sleep(1.5)
    finally:
        new.thaw()
    mover.join(30)
    assert answer == [(200, None)]
    assert cluster.leader("orders", timeout=1) is new
    doc = layout(cluster, "orders")["partitions"][0]
    assert (doc["leader"], doc["designated_leader"]) == (new.id, new.id)
    publish(new, "orders", [b"after"])
    assert rest_of_channel(new, "orders", "audit", 2) == [b"before", b"after"]



def freeze_etcd_on_designation(cluster, topic, partition, designated):
    """In a thread: watch the partition's ReplicaInfo on etcd and SIGSTOP etcd the
    moment it names `designated` the leader, before whatever write comes next could
    be committed (each waits for etcd's WAL fsync).  -> an Event set once frozen."""
    key = Keys(CLUSTER_ID).replica_info(topic, partition)
    host, port = cluster.etcd.endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v3/watch", json.dumps(
        {"create_request": {"key": base64.b64encode(key.encode()).decode()}}))
    stream = conn.getresponse()
    frozen = threading.Event()

    def watch():
        try:
            while not frozen.is_set():
                line = stream.readline()
                if not line:
                    return
                for event in json.loads(line).get("result", {}).get("events", ()):
                    value = json.loads(base64.b64decode(event["kv"]["value"]))
                    if value["Leader"] == designated:
                        cluster.etcd.freeze()
                        frozen.set()
        finally:
            conn.close()
    threading.Thread(target=watch, daemon=True).start()
    return frozen


@ON_1_AND_2_WORKERS
def test_a_hand_off_etcd_stops_answering_steps_down_and_the_partition_is_led_again(cluster):
    """etcd stops answering (frozen: connections open, nothing answered) right after
    the leader designated its successor, before the move's end and its resign.  The
    followers now take the successor for this write epoch's leader and refuse the old
    one's frames: leading on, it could neither replicate nor be replaced (its session
    alive, nobody elected).  It steps down instead, and sends its resign until etcd
    answers; once etcd is back the successor leads, with every acknowledged message
    (before the fix: no leader took writes)."""
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    old = cluster.leader("orders")
    new = next(n for n in cluster.nodes if n is not old)
    assert old.server.post("/channel/create?topic=orders&channel=audit")[0] == 200
    bodies = [b"m%02d" % i for i in range(20)]
    publish(old, "orders", bodies)
    wait_until(lambda: all(channel_cursor(n, "orders", "audit") is not None
                           for n in cluster.nodes), 5, "the channel on every node")
    frozen = freeze_etcd_on_designation(cluster, "orders", 0, new.id)
    try:
        threading.Thread(target=move, args=(cluster, "orders", 0, old.id, new.id, True),
                         daemon=True).start()  # (answered 500: etcd stops answering)
        assert frozen.wait(15), "no designation of the new leader"
        wait_until(lambda: any("fenced, acknowledging nothing: handed its leadership" in line
                               for line in old.server.lines), 15, "the old leader stepping down")
    finally:
        cluster.etcd.thaw()
    if not any("resign not answered" in line for line in old.server.lines):
        # its end of the move and its resign were both committed before the SIGSTOP
        # (two etcd writes against a signal from this process: not seen in 10 runs)
        pytest.skip("etcd was frozen only after the old leader's resign")

    def published():
        try:
            client = Client(cluster.leader("orders", timeout=5))
        except (AssertionError, OSError):
            return False
        try:
            return client.pub("orders", b"after") == (0, b"OK")
        except OSError:
            return False
        finally:
            client.close()
    wait_until(published, 20, "a leader that takes writes")
    assert cluster.leader("orders") is new
    doc = layout(cluster, "orders")["partitions"][0]
    assert doc["leader"] == doc["designated_leader"] == new.id
    # every acknowledged message, once (a PUB refused after its append may have left
    # one more "after": appended, not acknowledged)
    got = rest_of_channel(new, "orders", "audit", new.end_offset("orders"))
    assert got[:20] == bodies and set(got[20:]) == {b"after"}


def test_a_refused_move_says_why(cluster):
    assert cluster.create_topic("orders", 1, 2)[0] == 200
    leader = cluster.leader("orders")
    doc = layout(cluster, "orders")["partitions"][0]
    follower = next(n for n in doc["isr"] if n != leader.id)
    outside = next(n.id for n in cluster.nodes if n.id not in doc["isr"])
    for args, want in [
        ((leader.id, leader.id, True), (400, "move to and from node can not be the same")),
        ((follower, outside, True), (400, "move from not the topic leader")),
        ((leader.id, outside, False), (400, "can not move leader without moveleader param")),
        ((outside, follower, False), (400, "the move source node has no replica for the topic")),
        ((follower, leader.id, False), (400, "the move destination has the topic data already")),
        ((leader.id, "10.9.9.9:4250", True), (400, "the move destination is not found in cluster")),
        ((leader.id, "no/such", True), (400, "INVALID_ARG_NODE")),
    ]:
        status, body = move(cluster, "orders", 0, *args)
        assert (status, body["message"]) == want, args
    status, body = cluster.lookupd.post("/topic/partition/move?topic=nope&partition=0"
                                        f"&move_leader=true&move_from={leader.id}"
                                        f"&move_to={follower}")
    assert (status, json.loads(body)["message"]) == (404, "TOPIC_NOT_FOUND")
    for partition in ("x", "%C2%B2", "1_0"):  # (Go's strconv.Atoi: ASCII digits only)
        status, body = cluster.lookupd.post(
            f"/topic/partition/move?topic=orders&partition={partition}")
        assert (status, json.loads(body)["message"]) == (400, "INVALID_ARG_TOPIC_PARTITION_NUM")
    assert layout(cluster, "orders")["partitions"][0]["leader"] == leader.id  # nothing moved
    # Youzan's /listlookup (youzan/go-nsq polls it): the lookupds in etcd, and the master
    listed = cluster.lookupd.get_json("/listlookup")
    assert [n["HttpPort"] for n in listed["lookupdnodes"]] == [str(cluster.lookupd.http_port)]
    assert listed["lookupdleader"] == listed["lookupdnodes"][0]


def test_a_replica_moves_to_another_node_and_catches_up_first(cluster):
    assert cluster.create_topic("orders", 1, 2)[0] == 200
    leader = cluster.leader("orders")
    doc = layout(cluster, "orders")["partitions"][0]
    src = cluster.node(next(n for n in doc["isr"] if n != leader.id))
    dst = next(n for n in cluster.nodes if n.id not in doc["isr"])
    bodies = [b"m%03d" % i for i in range(200)]
    publish(leader, "orders", bodies)
    assert dst.end_offset("orders") is None  # it holds nothing of the topic yet

    status, _ = move(cluster, "orders", 0, src.id, dst.id, leader=False)
    assert status == 200
    doc = layout(cluster, "orders")["partitions"][0]
    assert (doc["leader"], set(doc["isr"]), doc["catchup"], doc["moving"]) == \
        (leader.id, {leader.id, dst.id}, [], None)
    assert dst.end_offset("orders") == 200  # caught up before it joined the ISR
    publish(leader, "orders", [b"after"])  # acknowledged by the new ISR: dst has it
    assert dst.end_offset("orders") == 201
    time.sleep(0.5)
    assert src.end_offset("orders") == 200  # the old replica gets nothing more


@ON_1_AND_2_WORKERS
def test_a_leader_stopped_gracefully_hands_off_the_log_and_the_cursors(cluster):
    """SIGTERM: the leader hands each partition to its most caught-up follower with
    the channels' cursors read after it stopped taking writes, then resigns: the new
    leader is elected at once (the TTL is 10 s) and its consumers go on exactly
    where the old one's were."""
    assert cluster.create_topic("orders", 1, 3)[0] == 200
    old = cluster.leader("orders")
    bodies = [b"m%03d" % i for i in range(100)]
    publish(old, "orders", bodies)
    consumer, first = consume_some(old, "orders", "audit", 30)
    wait_until(lambda: channel_cursor(old, "orders", "audit") == (30, 0), 5,
               "the leader's channel confirmed the 30")
    stopped_at = time.monotonic()
    assert old.server.stop() == 0
    new = cluster.leader("orders", not_in=(old.id,), timeout=10)
    assert time.monotonic() - stopped_at < 5
    consumer.close()
    publish(new, "orders", [b"after"])
    assert rest_of_channel(new, "orders", "audit", 71) == [*bodies[30:], b"after"]


def test_nsqadmin_shows_each_partitions_leader_isr_and_lag(cluster):
    assert cluster.create_topic("orders", 2, 2)[0] == 200
    leaders = [cluster.leader("orders", partition=i) for i in range(2)]
    for i, node in enumerate(leaders):
        publish(node, "orders", [b"x"] * (10 + i), partition=i)
    admin = Admin([f"--lookupd-http-address={cluster.lookupd.http_address}"])
    try:
        doc = layout(cluster, "orders")
        status, _, page = admin.get("/topics/orders")
        assert status == 200
        html = page.decode()
        table = html[html.index('id="topic-replication"'):]
        table = table[:table.index("</table>")]
        for part in doc["partitions"]:
            row = re.search(rf'<tr data-row="{part["partition"]}">(.*?)</tr>', table, re.S)
            assert row, table
            cells = row.group(1)
            assert f'<td class="leader">{part["leader"]}</td>' in cells
            for member in part["isr"]:  # every member has it all: lag 0
                assert re.search(rf'data-node="{re.escape(member)}">.*?'
                                 r'<span class="lag">0</span>', cells, re.S), cells
    finally:
        admin.stop()
