"""nsqd's nsqlookupd registration (nsqd 1.3's lookup.go / lookup_peer.go),
with real `nsqshm start` and `nsqshm lookupd` processes: what nsqd sends,
byte for byte (against a fake lookupd), topics and channels registered and
unregistered as they come and go, several nodes and lookupds, tombstones,
producer expiry, a lookupd restart, run-time address changes, and pynsq and
gnsq Readers that find nsqshm through nsqshm's lookupd."""

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from urllib.parse import quote

import pytest

from tests.nsqd.conftest import http_call, http_on_worker, wait_for
from tests.nsqd.test_http_api import TCP, request

HERE = os.path.dirname(__file__)
FAST_PING = "--lookupd-ping-interval=300ms"


def start_node(nsqd_factory, *lookupds, args=(), data_path=None):
    if data_path is not None:
        os.makedirs(data_path, exist_ok=True)
    return nsqd_factory(*[f"--lookupd-tcp-address={lk.tcp_address}" for lk in lookupds],
                        "--broadcast-address=127.0.0.1", *args, data_path=data_path)


def producers(lookupd, topic):
    return lookupd.producers(topic)


def channels(lookupd, topic):
    return sorted(lookupd.get_json(f"/channels?topic={quote(topic, safe='')}")["channels"])


def debug_keys(lookupd):
    return set(lookupd.get_json("/debug"))


def me(node):
    return ("127.0.0.1", node.tcp_port)


# ---------------------------------------------------------------------------
# the bytes nsqd sends (a fake nsqlookupd records them)


class FakeLookupd:
    """Accepts nsqd's connections, answers IDENTIFY with nsqlookupd's JSON and
    everything else with OK, and records (time, command line, body)."""

    def __init__(self, partitioned=False):
        self.partitioned = partitioned  # answer IDENTIFY as nsqshm's lookupd does
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.magics = []
        self.commands = []
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        f = conn.makefile("rb")
        try:
            self.magics.append(f.read(4))
            while True:
                line = f.readline()
                if not line:
                    return
                body = None
                if line == b"IDENTIFY\n":
                    body = f.read(struct.unpack(">i", f.read(4))[0])
                    info = {"broadcast_address": "127.0.0.1", "hostname": "fake",
                            "http_port": 1, "tcp_port": self.port, "version": "1.3.0"}
                    if self.partitioned:
                        info["topic_partitions"] = True
                    answer = json.dumps(info).encode()
                else:
                    answer = b"OK"
                self.commands.append((time.monotonic(), line, body))
                conn.sendall(struct.pack(">i", len(answer)) + answer)
        except OSError:
            return

    def lines(self):
        return [line for _, line, _ in self.commands]

    def close(self):
        self.listener.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def fake():
    server = FakeLookupd()
    yield server
    server.close()


@pytest.fixture
def fake_partitioned():
    server = FakeLookupd(partitioned=True)
    yield server
    server.close()


def test_identify_register_and_ping_bytes(nsqd_factory, fake):
    node = nsqd_factory(f"--lookupd-tcp-address={fake.address}", "--broadcast-address=bc.example",
                        "--lookupd-ping-interval=400ms")
    assert wait_for(lambda: fake.commands)
    assert fake.magics == [b"  V1"]
    _, line, body = fake.commands[0]
    assert line == b"IDENTIFY\n"
    # go-nsq's Identify of nsqd's map: keys sorted, compact; nsqshm's one field
    # more (topic_partitions), which nsqlookupd's decoder ignores
    assert body == (b'{"broadcast_address":"bc.example","hostname":"%s","http_port":%d,'
                    b'"tcp_port":%d,"topic_partitions":true,"version":"1.3.0"}'
                    % (socket.gethostname().encode(), node.http_port, node.tcp_port))
    node.post("/topic/create?topic=bytes_t")
    node.post("/channel/create?topic=bytes_t&channel=c1")
    node.post("/channel/delete?topic=bytes_t&channel=c1")
    node.post("/topic/create?topic=bytes_t2")
    node.post("/channel/create?topic=bytes_t2&channel=x")
    node.post("/topic/delete?topic=bytes_t2")
    expected = [b"REGISTER bytes_t\n", b"REGISTER bytes_t c1\n", b"UNREGISTER bytes_t c1\n",
                b"REGISTER bytes_t2\n", b"REGISTER bytes_t2 x\n",
                b"UNREGISTER bytes_t2 x\n", b"UNREGISTER bytes_t2\n"]
    assert wait_for(lambda: [li for li in fake.lines() if b"REGISTER" in li] == expected)
    # PINGs every --lookupd-ping-interval (nsqd: every 15 s)
    assert wait_for(lambda: fake.lines().count(b"PING\n") >= 3, timeout=5)
    pings = [t for t, line, _ in fake.commands if line == b"PING\n"]
    period = (pings[-1] - pings[0]) / (len(pings) - 1)  # a fixed-rate ticker
    assert 0.3 < period < 0.7, pings


@pytest.mark.workers(1, 2)
def test_a_lookupd_that_reads_partitions_gets_youzans_lines(nsqd_factory, fake_partitioned):
    """To a lookupd that answered "topic_partitions": Youzan's REGISTER <topic>
    <partition> [<channel>]: each partition of a log topic, -11 for a classic
    topic, for channels and for a topic that goes; on a reconnect too."""
    fake = fake_partitioned
    node = nsqd_factory(f"--lookupd-tcp-address={fake.address}", FAST_PING)
    assert wait_for(lambda: fake.commands)
    node.post("/topic/create?topic=yz_c")
    node.post("/channel/create?topic=yz_c&channel=c1")
    node.post("/topic/create?topic=yz_log&partition_num=3")
    node.post("/channel/create?topic=yz_log&channel=c2")
    node.post("/channel/delete?topic=yz_log&channel=c2")
    node.post("/topic/delete?topic=yz_log")
    expected = [b"REGISTER yz_c -11\n", b"REGISTER yz_c -11 c1\n",
                b"REGISTER yz_log 0\n", b"REGISTER yz_log 1\n", b"REGISTER yz_log 2\n",
                b"REGISTER yz_log -11 c2\n", b"UNREGISTER yz_log -11 c2\n",
                b"UNREGISTER yz_log -11\n"]
    assert wait_for(lambda: [li for li in fake.lines() if b"REGISTER" in li] == expected)
    node.post("/topic/create?topic=yz_log2&partition_num=2")
    node.post("/channel/create?topic=yz_log2&channel=c3")
    assert wait_for(lambda: b"REGISTER yz_log2 -11 c3\n" in fake.lines())
    start = len(fake.commands)
    for conn in fake.conns:
        conn.shutdown(socket.SHUT_RDWR)
    assert wait_for(lambda: b"REGISTER yz_log2 -11 c3\n" in fake.lines()[start:], timeout=15)
    again = [li for li in fake.lines()[start:] if b"REGISTER" in li]
    assert sorted(again) == sorted([b"REGISTER yz_c -11 c1\n", b"REGISTER yz_log2 0\n",
                                    b"REGISTER yz_log2 1\n", b"REGISTER yz_log2 -11 c3\n"])


def test_reconnect_registers_everything_again(nsqd_factory, fake):
    node = nsqd_factory(f"--lookupd-tcp-address={fake.address}", FAST_PING)
    node.post("/topic/create?topic=again_t")
    node.post("/channel/create?topic=again_t&channel=a")
    node.post("/channel/create?topic=again_t&channel=b")
    node.post("/topic/create?topic=again_lonely")
    # (every registration in before the lookupd goes: a late one would land after `start`)
    assert wait_for(lambda: {b"REGISTER again_t b\n", b"REGISTER again_lonely\n"} <=
                    set(fake.lines()))
    for conn in fake.conns:
        conn.shutdown(socket.SHUT_RDWR)  # lookupd goes away
    start = len(fake.commands)
    assert wait_for(lambda: len(fake.magics) == 2, timeout=15)
    # connectCallback: IDENTIFY, then a topic alone or each of its channels
    assert wait_for(lambda: len(fake.commands) >= start + 4)
    after = fake.lines()[start:start + 4]
    assert after == [b"IDENTIFY\n", b"REGISTER again_t a\n", b"REGISTER again_t b\n",
                     b"REGISTER again_lonely\n"]
    assert wait_for(lambda: any("LOOKUPD(" in line and "PING - " in line
                                for line in node.lines))


# ---------------------------------------------------------------------------
# against nsqshm's lookupd


def test_topics_and_channels_come_and_go(nsqd_factory, lookupd):
    node = start_node(nsqd_factory, lookupd)
    node.post("/topic/create?topic=life")
    assert wait_for(lambda: producers(lookupd, "life") == [me(node)])
    node.post("/channel/create?topic=life&channel=c")
    assert wait_for(lambda: channels(lookupd, "life") == ["c"])
    nodes = lookupd.get_json("/nodes")["producers"]
    assert [(n["broadcast_address"], n["tcp_port"], n["http_port"], n["version"],
             n["hostname"], n["topics"]) for n in nodes] == [
        ("127.0.0.1", node.tcp_port, node.http_port, "1.3.0", socket.gethostname(), ["life"])]

    # an ephemeral channel and an ephemeral topic, made by a subscriber
    consumer = TCP(node)
    consumer.sub("life", "e#ephemeral")
    other = TCP(node)
    other.sub("eph#ephemeral", "c#ephemeral")
    assert wait_for(lambda: channels(lookupd, "life") == ["c", "e#ephemeral"])
    assert wait_for(lambda: producers(lookupd, "eph#ephemeral") == [me(node)])
    consumer.close()
    other.close()
    # gone with their last consumer: nsqd unregisters, lookupd forgets them
    assert wait_for(lambda: channels(lookupd, "life") == ["c"])
    assert wait_for(lambda: "eph#ephemeral" not in lookupd.get_json("/topics")["topics"])

    node.post("/channel/delete?topic=life&channel=c")
    assert wait_for(lambda: "channel:life:c" not in debug_keys(lookupd))
    assert channels(lookupd, "life") == ["c"]  # lookupd keeps the name, without producers
    node.post("/topic/delete?topic=life")
    assert wait_for(lambda: producers(lookupd, "life") == [])


def test_broadcast_ports_are_registered(nsqd_factory, lookupd):
    node = start_node(nsqd_factory, lookupd,
                      args=["--broadcast-tcp-port=5150", "--broadcast-http-port=5151"])
    node.post("/topic/create?topic=ports")
    assert wait_for(lambda: producers(lookupd, "ports") == [("127.0.0.1", 5150)])
    (n,) = lookupd.get_json("/nodes")["producers"]
    assert n["http_port"] == 5151
    assert request(node, "GET", "/config/broadcast_tcp_port")[2] == b"5150"


def test_nsqd_reports_its_real_ports_in_config(nsqd):
    assert request(nsqd, "GET", "/config/broadcast_tcp_port")[2] == str(nsqd.tcp_port).encode()
    assert request(nsqd, "GET", "/config/broadcast_http_port")[2] == str(nsqd.http_port).encode()


def test_two_nodes_behind_two_lookupds(nsqd_factory, lookupd_factory, tmp_path):
    lk1, lk2 = lookupd_factory(), lookupd_factory()
    a = start_node(nsqd_factory, lk1, lk2)
    b = start_node(nsqd_factory, lk1, lk2, data_path=tmp_path / "b")
    for i in range(10):
        (a if i % 2 else b).post("/pub?topic=both", f"m{i}".encode())
    for lk in (lk1, lk2):
        assert wait_for(lambda lk=lk: producers(lk, "both") == sorted([me(a), me(b)]))
        nodes = sorted(n["tcp_port"] for n in lk.get_json("/nodes")["producers"])
        assert nodes == sorted([a.tcp_port, b.tcp_port])
    result = run_reader("pynsq", [lk1], "both", "c", 10)
    assert sorted(result["received"]) == sorted(f"m{i}" for i in range(10))
    assert result["nsqd"] == sorted([f"127.0.0.1:{a.tcp_port}", f"127.0.0.1:{b.tcp_port}"])


def run_reader(library, lookupds, topic, channel, n):
    script = os.path.join(HERE, "clients", "lookupd_client.py")
    out = subprocess.run([sys.executable, script, library,
                          ",".join(lk.http_address for lk in lookupds), topic, channel, str(n)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("library", ["pynsq", "gnsq"])
def test_readers_discover_nsqshm_through_lookupd(nsqd_factory, lookupd, library):
    node = start_node(nsqd_factory, lookupd)
    for i in range(20):
        node.post(f"/pub?topic={library}_disc", f"m{i}".encode())
    assert wait_for(lambda: producers(lookupd, f"{library}_disc") == [me(node)])
    result = run_reader(library, [lookupd], f"{library}_disc", "c", 20)
    assert sorted(result["received"]) == sorted(f"m{i}" for i in range(20))
    assert result["nsqd"] == [f"127.0.0.1:{node.tcp_port}"]


@pytest.mark.workers(1, 2)
def test_channels_known_to_lookupd_are_precreated(nsqd_factory, lookupd, tmp_path):
    a = start_node(nsqd_factory, lookupd)
    a.post("/topic/create?topic=pre")
    a.post("/channel/create?topic=pre&channel=archive")
    a.post("/channel/create?topic=pre&channel=live%23ephemeral")
    assert wait_for(lambda: channels(lookupd, "pre") == ["archive", "live#ephemeral"])
    b = start_node(nsqd_factory, lookupd, data_path=tmp_path / "b")

    def b_knows_lookupd():
        return any("LOOKUPD(" in line and "peer info" in line for line in b.lines)

    assert wait_for(b_knows_lookupd)
    # with 2 workers: published on worker 1, the owner of "pre"; worker 0, which
    # talks to lookupd, creates the channels, and worker 1 must have them first
    last = http_on_worker(b, b.workers - 1)
    assert http_call(last, "POST", "/pub?topic=pre", b"first") == (200, b"OK")
    b_stats = json.loads(b.get("/stats?format=json&topic=pre")[1])
    (topic,) = b_stats["topics"]
    # the message went to the channel nsqd created from lookupd's answer
    assert [(c["channel_name"], c["depth"]) for c in topic["channels"]] == [("archive", 1)]
    assert any("CI: querying nsqlookupd http://127.0.0.1:" in line for line in b.lines)


def test_tombstoned_node_is_left_out_of_lookups(nsqd_factory, lookupd_factory):
    lookupd = lookupd_factory("--tombstone-lifetime=1s")
    node = start_node(nsqd_factory, lookupd)
    node.post("/topic/create?topic=tomb")
    assert wait_for(lambda: producers(lookupd, "tomb") == [me(node)])
    status, _ = lookupd.post(f"/topic/tombstone?topic=tomb&node=127.0.0.1:{node.http_port}")
    assert status == 200
    assert producers(lookupd, "tomb") == []
    (n,) = lookupd.get_json("/nodes")["producers"]
    assert n["tombstones"] == [True]
    assert wait_for(lambda: producers(lookupd, "tomb") == [me(node)], timeout=3)


def youzan_lookup(lookupd, topic, **params):
    query = "".join(f"&{k}={v}" for k, v in params.items())
    return lookupd.get_json(f"/lookup?topic={quote(topic, safe='')}{query}")


@pytest.mark.workers(1, 2)
def test_youzans_lookup_names_a_log_topics_partitions(nsqd_factory, lookupd_factory):
    """/lookup with access= (and metainfo=, as youzan/go-nsq asks): the
    partitions of a log topic and the nsqd of each; a consumer that SUBs each
    partition it names, as Youzan's does, gets every message; NSQ's /lookup
    keeps its shape; a tombstone hides the node from writers only."""
    lookupd = lookupd_factory("--tombstone-lifetime=30s")
    node = start_node(nsqd_factory, lookupd)
    assert node.post("/topic/create?topic=yl&partition_num=3")[0] == 200
    assert node.post("/channel/create?topic=yl&channel=c")[0] == 200
    node.post("/topic/create?topic=yl_classic")
    peer = (node.tcp_port, node.http_port, "127.0.0.1")

    def partitions(doc):
        return {k: (v["tcp_port"], v["http_port"], v["broadcast_address"])
                for k, v in doc["partitions"].items()}

    assert wait_for(lambda: channels(lookupd, "yl") == ["c"] and
                    len(youzan_lookup(lookupd, "yl", access="r")["partitions"]) == 3)
    doc = youzan_lookup(lookupd, "yl", access="r", metainfo="true")
    # meta as the nsqd holding it says (Youzan's standalone lookupd has none): go-nsq's
    # ordered publish needs partition_num, and extend_support turns its ext mode on
    assert list(doc) == ["channels", "meta", "partitions", "producers"]
    assert doc["meta"] == {"extend_support": False, "partition_num": 3, "replica": 1}
    assert node.post("/topic/create?topic=yl_ext&partition_num=2&ext=true")[0] == 200
    assert wait_for(lambda: youzan_lookup(lookupd, "yl_ext", access="r").get("partitions"))
    assert youzan_lookup(lookupd, "yl_ext", access="r", metainfo="true")["meta"] == \
        {"extend_support": True, "partition_num": 2, "replica": 1}
    assert "meta" not in youzan_lookup(lookupd, "yl", access="r")  # (not asked)
    assert partitions(doc) == {"0": peer, "1": peer, "2": peer}
    assert [(p["tcp_port"], p["http_port"]) for p in doc["producers"]] == [peer[:2]]
    one = youzan_lookup(lookupd, "yl", access="w", partition=1)
    assert partitions(one) == {"1": peer} and len(one["producers"]) == 1
    assert partitions(youzan_lookup(lookupd, "yl", access="r", partition=7)) == {}
    plain = lookupd.get_json("/lookup?topic=yl")  # NSQ's request: NSQ's answer
    assert list(plain) == ["channels", "producers"] and plain["channels"] == ["c"]
    assert [(p["tcp_port"], p["http_port"]) for p in plain["producers"]] == [peer[:2]]
    classic = youzan_lookup(lookupd, "yl_classic", access="r", metainfo="true")
    assert classic["partitions"] == {} and len(classic["producers"]) == 1
    assert "meta" not in classic  # a classic topic: no partitions to tell of
    status, _, body = request(lookupd, "GET", "/lookup?topic=yl&access=x")
    assert (status, json.loads(body)) == (400, {"message": "INVALID_ACCESS_MODE"})

    # a consumer as Youzan's: SUB <topic> <channel> <partition> for each partition named
    for p in range(3):
        status, _ = node.post(f"/mpub?topic=yl&partition={p}",
                              b"\n".join(b"p%d-%d" % (p, i) for i in range(5)))
        assert status == 200
    got = []
    conns = []
    for pid, info in sorted(doc["partitions"].items()):
        c = TCP(node)
        conns.append(c)
        assert c.sock.getpeername()[1] == info["tcp_port"]
        c.send(b"SUB yl c " + pid.encode())
        c.expect_ok()
        c.send(b"RDY 10")
        for _ in range(5):
            msg_id, _, body = c.message()
            got.append(body)
            c.send(b"FIN " + msg_id)
    assert sorted(got) == sorted(b"p%d-%d" % (p, i) for p in range(3) for i in range(5))
    for c in conns:
        c.close()

    # a tombstone: writers (access=w) no longer see the node, readers do
    status, _ = lookupd.post(f"/topic/tombstone?topic=yl&node=127.0.0.1:{node.http_port}")
    assert status == 200
    writers = youzan_lookup(lookupd, "yl", access="w")
    assert (writers["partitions"], writers["producers"]) == ({}, [])
    assert len(youzan_lookup(lookupd, "yl", access="r")["partitions"]) == 3

    node.post("/topic/delete?topic=yl")
    assert wait_for(lambda: youzan_lookup(lookupd, "yl", access="r")["partitions"] == {})
    assert youzan_lookup(lookupd, "yl", access="r")["producers"] == []


@pytest.mark.workers(1, 2)
@pytest.mark.parametrize("allow", [False, True])
def test_writers_are_not_told_of_a_node_without_channels(nsqd_factory, lookupd_factory,
                                                          tmp_path, allow):
    """Youzan's access=w filter (unless --allow-write-with-nochannels): a node
    with no channel of the topic is left out for writers, and a topic no node
    reads answers 404; readers (access=r) and NSQ's lookup see every node."""
    lookupd = lookupd_factory(*(["--allow-write-with-nochannels=true"] if allow else []))
    read = start_node(nsqd_factory, lookupd, data_path=tmp_path / "r")
    bare = start_node(nsqd_factory, lookupd, data_path=tmp_path / "b")
    for node in (read, bare):
        assert node.post("/topic/create?topic=w&partition_num=2")[0] == 200
    assert wait_for(lambda: len(producers(lookupd, "w")) == 2)
    status, _, body = request(lookupd, "GET", "/lookup?topic=w&access=w")
    if allow:
        assert status == 200 and len(json.loads(body)["producers"]) == 2
    else:
        assert (status, json.loads(body)) == (404, {
            "message": "Topic has no channel, should init at least one for the new topic"})
    assert read.post("/channel/create?topic=w&channel=c")[0] == 200
    assert wait_for(lambda: channels(lookupd, "w") == ["c"])
    writers = youzan_lookup(lookupd, "w", access="w")
    ports = sorted(p["tcp_port"] for p in writers["producers"])
    assert ports == sorted([read.tcp_port, bare.tcp_port] if allow else [read.tcp_port])
    assert {v["tcp_port"] for v in writers["partitions"].values()} <= set(ports)
    assert len(youzan_lookup(lookupd, "w", access="r")["producers"]) == 2
    assert len(producers(lookupd, "w")) == 2


def test_producers_expire_without_pings(nsqd_factory, lookupd_factory, tmp_path):
    lookupd = lookupd_factory("--inactive-producer-timeout=1500ms")
    pinging = start_node(nsqd_factory, lookupd, args=[FAST_PING], data_path=tmp_path / "p")
    quiet = start_node(nsqd_factory, lookupd)  # pings every 15 s, as nsqd
    for node in (quiet, pinging):
        node.post("/topic/create?topic=expiry")
    assert wait_for(lambda: producers(lookupd, "expiry") == sorted([me(quiet), me(pinging)]))
    time.sleep(1.8)
    assert producers(lookupd, "expiry") == [me(pinging)]
    assert [n["tcp_port"] for n in lookupd.get_json("/nodes")["producers"]] == [
        pinging.tcp_port]


def test_lookupd_restart_nsqd_registers_again(nsqd_factory, lookupd_factory):
    lookupd = lookupd_factory()
    node = start_node(nsqd_factory, lookupd, args=[FAST_PING])
    node.post("/topic/create?topic=restart")
    node.post("/channel/create?topic=restart&channel=c")
    assert wait_for(lambda: producers(lookupd, "restart") == [me(node)])
    again = lookupd.restart()
    lookupd_factory.started.append(again)
    assert again.tcp_port == lookupd.tcp_port
    assert wait_for(lambda: producers(again, "restart") == [me(node)])
    assert channels(again, "restart") == ["c"]


def test_lookupd_addresses_changed_at_run_time(nsqd_factory, lookupd_factory):
    lk1, lk2 = lookupd_factory(), lookupd_factory()
    node = nsqd_factory("--broadcast-address=127.0.0.1")
    node.post("/topic/create?topic=runtime")
    body = json.dumps([lk1.tcp_address, lk2.tcp_address]).encode()
    status, _, got = request(node, "PUT", "/config/nsqlookupd_tcp_addresses", body)
    assert (status, got) == (200, body.replace(b" ", b""))
    for lk in (lk1, lk2):
        assert wait_for(lambda lk=lk: producers(lk, "runtime") == [me(node)])
    body = json.dumps([lk2.tcp_address]).encode()
    assert request(node, "PUT", "/config/nsqlookupd_tcp_addresses", body)[0] == 200
    # the dropped peer's connection is closed: lk1 forgets this nsqd
    assert wait_for(lambda: lk1.get_json("/nodes")["producers"] == [])
    assert producers(lk2, "runtime") == [me(node)]
    assert any(f"LOOKUP({lk1.tcp_address}): removing peer" in line for line in node.lines)


@pytest.mark.workers(2)
@pytest.mark.parametrize("put_on", [0, 1], ids=["put_on_worker0", "put_on_worker1"])
def test_lookupd_added_at_run_time_sees_every_topic_and_channel(nsqd_factory, lookupd, put_on):
    """Worker 0 talks to nsqlookupd for the broker: an address PUT on any
    worker reaches it, and it registers every topic and channel, whichever
    worker made or owns them (nsqd's lookupLoop on a new peer)."""
    node = nsqd_factory("--broadcast-address=127.0.0.1")
    topics = [f"late{i}" for i in range(6)]
    assert {zlib.crc32(t.encode()) % 2 for t in topics} == {0, 1}  # owned by both
    expect = {}
    for i, topic in enumerate(topics):
        conn = http_on_worker(node, i % 2)  # made on both workers too
        assert http_call(conn, "POST", f"/topic/create?topic={topic}")[0] == 200
        expect[topic] = [f"c{j}" for j in range(i % 3)]  # none, one or two channels
        for channel in expect[topic]:
            assert http_call(conn, "POST",
                             f"/channel/create?topic={topic}&channel={channel}")[0] == 200
        conn.close()
    assert producers(lookupd, topics[0]) == []
    body = json.dumps([lookupd.tcp_address]).encode()
    assert http_call(http_on_worker(node, put_on), "PUT", "/config/nsqlookupd_tcp_addresses",
                     body) == (200, body.replace(b" ", b""))
    for topic in topics:
        assert wait_for(lambda t=topic: producers(lookupd, t) == [me(node)]), topic
        assert channels(lookupd, topic) == expect[topic]
