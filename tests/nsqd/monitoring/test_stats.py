"""/stats: nsqd 1.3's JSON document (key names and order, null vs [] rules,
filters, client and producer entries) and its text report, checked against a
real server and, for the pure parts, against nsqshm.nsqd.monitoring.stats directly."""

import json
import re
import time
from types import SimpleNamespace

import pytest

from nsqshm import protocol as p
from nsqshm.nsqd.monitoring import stats as st
from tests.nsqd.conftest import Server, http_call, http_on_each_worker, wait_for
from tests.nsqd.test_http_api import TCP, request
from tests.nsqd.test_overflow import topic_owned_by
from tests.nsqd.workers.test_workers import client_on_worker

TOP_KEYS = ["version", "health", "start_time", "topics", "memory", "producers"]
TOPIC_KEYS = ["topic_name", "channels", "depth", "backend_depth", "message_count",
              "message_bytes", "paused", "e2e_processing_latency"]
CHANNEL_KEYS = ["channel_name", "depth", "backend_depth", "in_flight_count", "deferred_count",
                "message_count", "requeue_count", "timeout_count", "client_count", "clients",
                "paused", "e2e_processing_latency"]
MEMORY_KEYS = ["heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
               "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes",
               "gc_total_runs"]
CLIENT_KEYS = ["client_id", "hostname", "version", "remote_address", "state", "ready_count",
               "in_flight_count", "message_count", "finish_count", "requeue_count", "connect_ts",
               "sample_rate", "deflate", "snappy", "user_agent", "tls", "tls_cipher_suite",
               "tls_version", "tls_negotiated_protocol", "tls_negotiated_protocol_is_mutual"]
PRODUCER_KEYS = CLIENT_KEYS[:15] + ["pub_counts"] + CLIENT_KEYS[15:]
NO_E2E = {"count": 0, "percentiles": None}


def get_json(server, query=""):
    status, headers, body = request(server, "GET", "/stats?format=json" + query)
    assert status == 200, body
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert headers["x-nsq-content-type"] == "nsq; version=1.0"
    return json.loads(body), body


def get_text(server, query=""):
    status, headers, body = request(server, "GET", "/stats" + query)
    assert status == 200, body
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert headers["x-nsq-content-type"] == "nsq; version=1.0"
    return body.decode()


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    server = Server([], str(tmp_path_factory.mktemp("stats")))
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def empty(tmp_path_factory):
    """A server on which no topic is ever made."""
    server = Server([], str(tmp_path_factory.mktemp("empty")))
    yield server
    server.cleanup()


# ---------------------------------------------------------------------------
# JSON against a server


def test_empty_server_json(empty):
    doc, body = get_json(empty)
    assert list(doc) == TOP_KEYS
    start = doc["start_time"]
    assert body.startswith(
        b'{"version":"1.3.0","health":"OK","start_time":%d,"topics":[],"memory":{' % start)
    assert body.endswith(b'},"producers":null}')
    assert list(doc["memory"]) == MEMORY_KEYS
    assert all(isinstance(v, int) and v >= 0 for v in doc["memory"].values())
    assert doc["memory"]["heap_objects"] > 0
    assert abs(start - time.time()) < 600
    assert start == json.loads(request(empty, "GET", "/info")[2])["start_time"]


@pytest.mark.parametrize("value,included", [
    ("false", False), ("0", False), ("true", True), ("1", True), ("", True), ("no", True),
])
def test_include_mem(empty, value, included):
    doc, body = get_json(empty, f"&include_mem={value}")
    assert ("memory" in doc) is included
    if not included:
        assert body == (b'{"version":"1.3.0","health":"OK","start_time":%d,"topics":[],'
                        b'"producers":null}' % doc["start_time"])


def test_topic_and_channel_shape(srv):
    request(srv, "POST", "/mpub?topic=shape", b"abc\nde")
    request(srv, "POST", "/channel/create?topic=shape&channel=ch")
    request(srv, "POST", "/pub?topic=shape", b"fghi")
    assert wait_for(lambda: get_json(srv, "&topic=shape")[0]["topics"][0]["channels"][0]["depth"] == 3)
    doc, body = get_json(srv, "&topic=shape")
    (topic,) = doc["topics"]
    assert list(topic) == TOPIC_KEYS
    (channel,) = topic["channels"]
    assert list(channel) == CHANNEL_KEYS
    assert channel == {
        "channel_name": "ch", "depth": 3, "backend_depth": 0, "in_flight_count": 0,
        "deferred_count": 0, "message_count": 3, "requeue_count": 0, "timeout_count": 0,
        "client_count": 0, "clients": [], "paused": False, "e2e_processing_latency": NO_E2E,
    }
    assert {k: v for k, v in topic.items() if k != "channels"} == {
        "topic_name": "shape", "depth": 0, "backend_depth": 0, "message_count": 3,
        "message_bytes": 9, "paused": False, "e2e_processing_latency": NO_E2E,
    }
    assert b'"e2e_processing_latency":{"count":0,"percentiles":null}' in body


def test_include_clients_false_gives_nulls(srv):
    request(srv, "POST", "/topic/create?topic=noclients")
    request(srv, "POST", "/channel/create?topic=noclients&channel=c")
    doc, body = get_json(srv, "&topic=noclients&include_clients=false")
    assert doc["topics"][0]["channels"][0]["clients"] is None
    assert doc["producers"] is None
    assert b'"clients":null' in body
    doc, _ = get_json(srv, "&topic=noclients&include_clients=0")
    assert doc["topics"][0]["channels"][0]["clients"] is None
    doc, _ = get_json(srv, "&topic=noclients&include_clients=yes")  # not a bool: true
    assert doc["topics"][0]["channels"][0]["clients"] == []


def test_filters_and_sorting(srv):
    for topic, channels in [("flt_b", ["z", "a"]), ("flt_a", ["m"]), ("flt_c", [])]:
        request(srv, "POST", f"/topic/create?topic={topic}")
        for c in channels:
            request(srv, "POST", f"/channel/create?topic={topic}&channel={c}")
    doc, _ = get_json(srv)
    names = [t["topic_name"] for t in doc["topics"]]
    assert names == sorted(names, key=str.encode)
    flt = [t for t in doc["topics"] if t["topic_name"].startswith("flt_")]
    assert [t["topic_name"] for t in flt] == ["flt_a", "flt_b", "flt_c"]
    assert [c["channel_name"] for c in flt[1]["channels"]] == ["a", "z"]
    assert flt[2]["channels"] == []

    doc, body = get_json(srv, "&topic=flt_b")
    assert [t["topic_name"] for t in doc["topics"]] == ["flt_b"]
    doc, _ = get_json(srv, "&topic=flt_b&channel=z")
    assert [c["channel_name"] for c in doc["topics"][0]["channels"]] == ["z"]
    doc, _ = get_json(srv, "&topic=flt_c&channel=z")
    assert doc["topics"] == []  # the topic lacks the channel: skipped
    doc, _ = get_json(srv, "&channel=m")  # channel alone: topics that have it
    assert [t["topic_name"] for t in doc["topics"]] == ["flt_a"]
    doc, body = get_json(srv, "&topic=flt_nope")
    assert doc["topics"] is None and b'"topics":null' in body


def test_pause_and_empty_reflected(srv):
    request(srv, "POST", "/topic/create?topic=pe")
    request(srv, "POST", "/channel/create?topic=pe&channel=c")
    request(srv, "POST", "/topic/pause?topic=pe")
    request(srv, "POST", "/channel/pause?topic=pe&channel=c")
    doc, _ = get_json(srv, "&topic=pe")
    assert doc["topics"][0]["paused"] is True
    assert doc["topics"][0]["channels"][0]["paused"] is True
    request(srv, "POST", "/mpub?topic=pe", b"1\n2")
    assert get_json(srv, "&topic=pe")[0]["topics"][0]["depth"] == 2
    request(srv, "POST", "/topic/empty?topic=pe")
    assert get_json(srv, "&topic=pe")[0]["topics"][0]["depth"] == 0


def test_consumer_client_entry(srv):
    request(srv, "POST", "/topic/create?topic=cons")
    request(srv, "POST", "/mpub?topic=cons", b"1\n2\n3")
    conn = TCP(srv)
    try:
        conn.identify(client_id="cid", hostname="chost", user_agent="ua/1.0<&>")
        conn.sub("cons", "c")
        conn.send(b"RDY 5")
        msgs = [conn.message() for _ in range(3)]
        conn.send(b"FIN " + msgs[0][0])
        conn.send(b"REQ " + msgs[1][0] + b" 0")
        again = conn.message()  # the requeued one comes back
        assert (again[0], again[1]) == (msgs[1][0], 2)
        doc, body = get_json(srv, "&topic=cons")
        channel = doc["topics"][0]["channels"][0]
        assert channel["client_count"] == 1
        (client,) = channel["clients"]
        assert list(client) == CLIENT_KEYS
        port = conn.sock.getsockname()[1]
        assert client == {
            "client_id": "cid", "hostname": "chost", "version": "V2",
            "remote_address": f"127.0.0.1:{port}", "state": 3, "ready_count": 5,
            "in_flight_count": 2, "message_count": 4, "finish_count": 1, "requeue_count": 1,
            "connect_ts": client["connect_ts"], "sample_rate": 0, "deflate": False,
            "snappy": False, "user_agent": "ua/1.0<&>", "tls": False, "tls_cipher_suite": "",
            "tls_version": "", "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
        }
        assert abs(client["connect_ts"] - time.time()) < 60
        assert b'"user_agent":"ua/1.0\\u003c\\u0026\\u003e"' in body  # Go escapes <, &, >
        assert channel["requeue_count"] == 1
        assert doc["producers"] is None  # a consumer is not a producer

        doc, _ = get_json(srv, "&topic=cons&include_clients=false")
        assert doc["topics"][0]["channels"][0]["client_count"] == 1
    finally:
        conn.close()
    assert wait_for(lambda: get_json(srv, "&topic=cons")[0]["topics"][0]["channels"][0]
                    ["client_count"] == 0)


def test_producers(nsqd):
    # its own server: producers are global
    request(nsqd, "POST", "/pub?topic=via_http", b"x")
    assert get_json(nsqd)[0]["producers"] is None  # HTTP publishers are not clients
    conn = TCP(nsqd)
    other = TCP(nsqd)
    try:
        other.identify(client_id="idle")  # connected, never published: not a producer
        conn.pub("prod_a", b"1")
        conn.pub("prod_a", b"2")
        conn.send(b"MPUB prod_b", _mpub([b"x", b"y", b"z"]))
        conn.expect_ok()
        doc, body = get_json(nsqd)
        (producer,) = doc["producers"]
        assert list(producer) == PRODUCER_KEYS
        port = conn.sock.getsockname()[1]
        # before IDENTIFY, client_id and hostname are the remote IP
        assert (producer["client_id"], producer["hostname"]) == ("127.0.0.1", "127.0.0.1")
        assert producer["remote_address"] == f"127.0.0.1:{port}"
        assert producer["state"] == 0
        # nsqd reports a single pub_counts entry (a `break` in its loop)
        assert producer["pub_counts"] == [{"topic": "prod_a", "count": 2}]
        doc, _ = get_json(nsqd, "&topic=prod_b")
        assert doc["producers"][0]["pub_counts"] == [{"topic": "prod_b", "count": 3}]
        doc, _ = get_json(nsqd, "&topic=via_http")  # not published by it: key left out
        assert list(doc["producers"][0]) == CLIENT_KEYS
        doc, _ = get_json(nsqd, "&include_clients=false")
        assert doc["producers"] is None
    finally:
        conn.close()
        other.close()


def _mpub(messages):
    body = len(messages).to_bytes(4, "big")
    for m in messages:
        body += len(m).to_bytes(4, "big") + m
    return body


def test_deferred_and_in_flight_counts(srv):
    request(srv, "POST", "/topic/create?topic=counts")
    request(srv, "POST", "/channel/create?topic=counts&channel=c")
    request(srv, "POST", "/pub?topic=counts&defer=60000", b"d1")
    request(srv, "POST", "/pub?topic=counts&defer=60000", b"d2")
    request(srv, "POST", "/mpub?topic=counts", b"a\nb")
    conn = TCP(srv)
    try:
        conn.sub("counts", "c")
        conn.send(b"RDY 1")
        conn.message()
        c = get_json(srv, "&topic=counts&channel=c")[0]["topics"][0]["channels"][0]
        assert (c["deferred_count"], c["in_flight_count"], c["depth"]) == (2, 1, 1)
    finally:
        conn.close()


# ---------------------------------------------------------------------------
# text format against a server

RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)"
GO_DURATION = r"(\d+h)?(\d+m)?\d+(\.\d+)?(s|ms|µs|ns)"


def test_text_empty(empty):
    text = get_text(empty, "?include_mem=false")
    assert re.fullmatch(
        r"nsqd v1\.3\.0 \(built w/[^)]+\)\n"
        rf"start_time {RFC3339}\n"
        rf"uptime {GO_DURATION}\n"
        r"\nHealth: OK\n"
        r"\nTopics: None\n"
        r"\nProducers: None\n", text), text
    text = get_text(empty)
    memory = text.split("\nMemory:\n", 1)[1].split("\n\nTopics:", 1)[0].split("\n")
    assert [line.split("\t")[0] for line in memory] == [f"   {k:<25}" for k in MEMORY_KEYS]
    assert all(re.fullmatch(r" {3}\S+ *\t\d+", line) for line in memory)
    # any format but json is text
    assert get_text(empty, "?format=xml&include_mem=0").startswith("nsqd v1.3.0")
    assert get_text(empty, "?format=text&include_mem=0").startswith("nsqd v1.3.0")


def test_text_topics_channels_clients(nsqd):
    request(nsqd, "POST", "/topic/create?topic=zeta")
    request(nsqd, "POST", "/mpub?topic=alpha", b"1\n2\n3")
    request(nsqd, "POST", "/topic/pause?topic=zeta")
    request(nsqd, "POST", "/channel/create?topic=zeta&channel=paused_ch")
    request(nsqd, "POST", "/channel/pause?topic=zeta&channel=paused_ch")
    consumer = TCP(nsqd)
    producer = TCP(nsqd)
    try:
        consumer.identify(client_id="c", hostname="conshost", user_agent="agent")
        consumer.sub("zeta", "sub")
        consumer.send(b"RDY 7")
        producer.identify(client_id="p", hostname="prodhost", user_agent="")
        producer.pub("zeta", b"msg")
        producer.pub("zeta", b"msg2")
        cport = consumer.sock.getsockname()[1]
        pport = producer.sock.getsockname()[1]
        text = get_text(nsqd, "?include_mem=false")
    finally:
        consumer.close()
        producer.close()
    body = text.split("\nHealth: OK\n", 1)[1]
    expected = (
        "\nTopics:"
        "\n   [alpha          ] depth: 3     be-depth: 0     msgs: 3        e2e%: \n"
        "\n*P [zeta           ] depth: 2     be-depth: 0     msgs: 2        e2e%: \n"
        "   *P [paused_ch                ] depth: 0     be-depth: 0     inflt: 0    def: 0    "
        "re-q: 0     timeout: 0     msgs: 0        e2e%: \n"
        "      [sub                      ] depth: 0     be-depth: 0     inflt: 0    def: 0    "
        "re-q: 0     timeout: 0     msgs: 0        e2e%: \n"
        f"        [V2 {f'conshost:{cport} agent':<21}] state: 3 inflt: 0    rdy: 7    "
        "fin: 0        re-q: 0        msgs: 0        connected: CONN\n"
        "\nProducers:\n"
        f"   [V2 {f'prodhost:{pport} ':<21}] msgs: 2        topics: zeta=2 connected: CONN\n"
    )
    pattern = re.escape(expected).replace("CONN", r"\d+s")
    assert re.fullmatch(pattern, body), body


def test_e2e_percentiles_configured(nsqd_factory):
    # with percentiles set and nothing finished yet, the result has nsqd's shape
    # for a stream that has seen nothing (test_e2e.py covers measured values)
    server = nsqd_factory("--e2e-processing-latency-percentile=1.0,0.99")
    request(server, "POST", "/topic/create?topic=bare")
    request(server, "POST", "/topic/create?topic=e2e")
    request(server, "POST", "/channel/create?topic=e2e&channel=c")
    _, body = get_json(server)
    empty = b'"e2e_processing_latency":{"count":0,"percentiles":null}'
    zero = (b'"e2e_processing_latency":{"count":0,"percentiles":[{"quantile":1,"value":0},'
            b'{"quantile":0.99,"value":0}]}')
    bare = body.index(b'"topic_name":"bare"')
    e2e = body.index(b'"topic_name":"e2e"')
    assert body.index(empty, bare) < e2e  # no channel: nothing to merge
    assert body.count(zero) == 2  # the channel and the topic
    text = get_text(server, "?include_mem=0")
    assert "msgs: 0        e2e%: 0.0ns, 0.0ns\n" in text
    assert "[bare           ] depth: 0     be-depth: 0     msgs: 0        e2e%: \n" in text


# ---------------------------------------------------------------------------
# pure functions


@pytest.mark.parametrize("value,text", [
    (1.0, "1"), (0.99, "0.99"), (0.5, "0.5"), (123456.0, "123456"), (-2.5, "-2.5"),
    (1e-6, "0.000001"), (1e-7, "1e-7"), (1.5e-7, "1.5e-7"), (1e20, "100000000000000000000"),
    (1e21, "1e+21"), (1.2345e22, "1.2345e+22"), (0.0, "0"), (0.1 + 0.2, "0.30000000000000004"),
])
def test_go_float(value, text):
    assert st.go_float(value) == text


def test_go_json():
    assert st.go_json({"b": 1, "a": [0.99, 1.0], "c": None, "d": True}) == \
        b'{"b":1,"a":[0.99,1],"c":null,"d":true}'
    assert st.go_json({"s": "<a&b>\u2028\u2029é\"\\\n"}) == \
        '{"s":"\\u003ca\\u0026b\\u003e\\u2028\\u2029é\\"\\\\\\n"}'.encode()
    assert st.go_json({"s": "x\udcff"}) == '{"s":"x\ufffd"}'.encode()  # invalid UTF-8
    assert st.go_json({"s": "x\udcff", "f": 0.5}) == '{"s":"x\ufffd","f":0.5}'.encode()
    assert st.go_json([]) == b"[]"


@pytest.mark.parametrize("ns,text", [
    (500.0, "500.0ns"), (1000.0, "1000.0ns"), (1500.0, "1.5us"), (2.5e6, "2.5ms"),
    (3e9, "3.0s"), (1e9, "1000.0ms"),
])
def test_nanoseconds_to_human(ns, text):
    assert st.nanoseconds_to_human(ns) == text


def test_e2e_result_and_text():
    assert st.e2e_result(None) == NO_E2E
    assert st.e2e_text(NO_E2E) == ""

    class Stream:
        def result(self):
            return {"count": 7, "percentiles": [{"quantile": 0.99, "value": 2.5e6},
                                                {"quantile": 1, "value": 3e9}]}

    result = st.e2e_result(Stream())
    assert result == {"count": 7, "percentiles": [{"quantile": 0.99, "value": 2.5e6},
                                                  {"quantile": 1.0, "value": 3e9}]}
    assert st.go_json(result) == \
        b'{"count":7,"percentiles":[{"quantile":0.99,"value":2500000},' \
        b'{"quantile":1,"value":3000000000}]}'
    assert st.e2e_text(result) == "2.5ms, 3.0s"


def test_percentile_like_nsqd():
    assert st._percentile(99.0, []) == 0
    arr = list(range(10))
    assert st._percentile(100.0, arr) == 9
    assert st._percentile(95.0, arr) == 9  # floor(9.5 + 0.5) = 10, clamped
    assert st._percentile(50.0, arr) == 5


def test_rfc3339_utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        assert st.rfc3339(1700000000.9) == "2023-11-14T22:13:20Z"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def fake_client(**kw):
    base = dict(client_id="id", hostname="h", remote_address="10.0.0.1:5555", state=3,
                ready_count=2, in_flight=1, message_count=9, finish_count=8, requeue_count=0,
                connect_time=1000.7, sample_rate=0, deflate=False, snappy=True, user_agent="ua",
                auth_identity="", pub_counts={}, tls=False)
    base.update(kw)
    return SimpleNamespace(**base)


def test_client_stats_omitempty_and_pub_counts():
    c = st.client_stats(fake_client())
    assert list(c) == CLIENT_KEYS
    assert c["connect_ts"] == 1000 and c["in_flight_count"] == 1
    p = st.client_stats(fake_client(pub_counts={"t1": 3, "t2": 4}, auth_identity="me",
                                    authed=True))
    assert list(p) == CLIENT_KEYS[:15] + ["authed", "auth_identity", "pub_counts"] + CLIENT_KEYS[15:]
    assert p["pub_counts"] == [{"topic": "t1", "count": 3}]
    assert st.client_stats(fake_client(pub_counts={"t1": 3, "t2": 4}), "t2")["pub_counts"] == \
        [{"topic": "t2", "count": 4}]
    assert "pub_counts" not in st.client_stats(fake_client(pub_counts={"t1": 3}), "t9")


def test_client_text():
    now = 1000.0 + 65.9
    consumer = st.client_stats(fake_client(connect_time=1000.0))
    assert st.client_text(consumer, now) == (
        "[V2 h:5555 ua            ] state: 3 inflt: 1    rdy: 2    fin: 8        re-q: 0        "
        "msgs: 9        connected: 1m5s")
    producer = st.client_stats(fake_client(connect_time=1000.0, pub_counts={"t": 12}))
    assert st.client_text(producer, now) == (
        "[V2 h:5555 ua            ] msgs: 12       topics: t=12 connected: 1m5s")
    long_id = st.client_stats(fake_client(hostname="a-very-long-hostname.example"))
    assert st.client_text(long_id, 1000.0).startswith(
        "[V2 a-very-long-hostname.example:5555 ua] state: 3")


def fake_nsqd(topics, clients=()):
    return SimpleNamespace(topics={t.name: t for t in topics}, clients={i: c for i, c in
                                                                        enumerate(clients)},
                           health="OK", start_time=1700000000.5)


def fake_topic(name, channels=(), **kw):
    base = dict(name=name, channels={c.name: c for c in channels}, depth=0, backend_depth=0, message_count=0,
                message_bytes=0, paused=False, deferred_waiting=[])
    base.update(kw)
    base["published"] = (base["message_count"], base["message_bytes"])  # Topic.published
    return SimpleNamespace(**base)


def fake_channel(name, clients=(), **kw):
    base = dict(name=name, clients={i: c for i, c in enumerate(clients)}, depth=0, backend_depth=0, inflight=[],
                deferred=[], message_count=0, requeue_count=0, timeout_count=0, paused=False)
    base.update(kw)
    return SimpleNamespace(**base)


def test_get_stats_rules():
    consumer = fake_client()
    producer = fake_client(pub_counts={"b": 1})
    nsqd = fake_nsqd([fake_topic("b", [fake_channel("y", [consumer]), fake_channel("x")]),
                      fake_topic("a", depth=2, deferred_waiting=[1]), fake_topic("B")],
                     clients=[consumer, producer])
    topics, producers = st.get_stats(nsqd)
    assert [t["topic_name"] for t in topics] == ["B", "a", "b"]  # byte order
    assert topics[1]["depth"] == 3  # waiting deferred messages count in the topic's depth
    assert [c["channel_name"] for c in topics[2]["channels"]] == ["x", "y"]
    assert topics[2]["channels"][1]["clients"][0]["client_id"] == "id"
    assert [p["pub_counts"] for p in producers] == [[{"topic": "b", "count": 1}]]
    topics, producers = st.get_stats(nsqd, include_clients=False)
    assert topics[2]["channels"][0]["clients"] is None and producers is None
    assert st.get_stats(nsqd, "zzz") == (None, None)  # nsqd returns early: no producers
    assert st.get_stats(fake_nsqd([]))[1] is None
    topics, _ = st.get_stats(nsqd, channel_name="x")
    assert [t["topic_name"] for t in topics] == ["b"]
    doc = st.stats_document(nsqd, include_mem=False)
    assert list(doc) == ["version", "health", "start_time", "topics", "producers"]
    assert doc["start_time"] == 1700000000


def test_mem_stats_shape():
    ms = st.mem_stats()
    assert list(ms) == MEMORY_KEYS
    assert all(isinstance(v, int) and v >= 0 for v in ms.values())


# ---------------------------------------------------------------------------
# counters kept by channel.py / topic.py, compared with nsqd's channel.go:
# messageCount grows in PutMessage and PutMessageDeferred only; requeues,
# timeouts and deferred messages coming due go through put() uncounted


def test_channel_message_count_not_bumped_by_requeue(srv):
    request(srv, "POST", "/topic/create?topic=mc_req")
    request(srv, "POST", "/channel/create?topic=mc_req&channel=c")
    request(srv, "POST", "/pub?topic=mc_req", b"x")
    conn = TCP(srv)
    try:
        conn.sub("mc_req", "c")
        conn.send(b"RDY 1")
        msg_id = conn.message()[0]
        conn.send(b"REQ " + msg_id + b" 0")
        assert conn.message()[0] == msg_id
        c = get_json(srv, "&topic=mc_req")[0]["topics"][0]["channels"][0]
        assert c["requeue_count"] == 1
        assert c["message_count"] == 1
    finally:
        conn.close()


def test_channel_message_count_counts_deferred_when_queued(srv):
    request(srv, "POST", "/topic/create?topic=mc_def")
    request(srv, "POST", "/channel/create?topic=mc_def&channel=c")
    request(srv, "POST", "/pub?topic=mc_def&defer=60000", b"x")
    c = get_json(srv, "&topic=mc_def")[0]["topics"][0]["channels"][0]
    assert c["deferred_count"] == 1
    assert c["message_count"] == 1


# ---------------------------------------------------------------------------
# every field against nsqd 1.3's Go types (nsqd/stats.go TopicStats,
# ChannelStats, memStats; client_v2.go ClientV2Stats; quantile.Result)

INT32, INT64, UINT32, UINT64 = "int32", "int64", "uint32", "uint64"
GO_RANGES = {INT32: (-(1 << 31), (1 << 31) - 1), INT64: (-(1 << 63), (1 << 63) - 1),
             UINT32: (0, (1 << 32) - 1), UINT64: (0, (1 << 64) - 1)}
TOPIC_TYPES = {"topic_name": str, "channels": list, "depth": INT64, "backend_depth": INT64,
               "message_count": UINT64, "message_bytes": UINT64, "paused": bool,
               "e2e_processing_latency": dict}
CHANNEL_TYPES = {"channel_name": str, "depth": INT64, "backend_depth": INT64,
                 "in_flight_count": INT64, "deferred_count": INT64, "message_count": UINT64,
                 "requeue_count": UINT64, "timeout_count": UINT64, "client_count": INT64,
                 "clients": list, "paused": bool, "e2e_processing_latency": dict}
CLIENT_TYPES = {"client_id": str, "hostname": str, "version": str, "remote_address": str,
                "state": INT32, "ready_count": INT64, "in_flight_count": INT64,
                "message_count": UINT64, "finish_count": UINT64, "requeue_count": UINT64,
                "connect_ts": INT64, "sample_rate": INT32, "deflate": bool, "snappy": bool,
                "user_agent": str, "authed": bool, "auth_identity": str,
                "auth_identity_url": str, "pub_counts": list, "tls": bool,
                "tls_cipher_suite": str, "tls_version": str, "tls_negotiated_protocol": str,
                "tls_negotiated_protocol_is_mutual": bool}
MEMORY_TYPES = {key: UINT64 for key in MEMORY_KEYS[:-1]} | {"gc_total_runs": UINT32}
TOP_TYPES = {"version": str, "health": str, "start_time": INT64, "topics": list,
             "memory": dict, "producers": list}


def check_fields(obj, types, omitempty=()):
    """Keys in the Go struct's order (omitempty ones may be absent) and each
    value of its Go type."""
    assert [k for k in types if k in obj] == list(obj), (list(obj), list(types))
    assert set(types) - set(obj) <= set(omitempty), set(types) - set(obj)
    for key, kind in types.items():
        if key not in obj:
            continue
        value = obj[key]
        if kind in GO_RANGES:
            low, high = GO_RANGES[kind]
            assert type(value) is int and low <= value <= high, (key, value)
        else:
            assert type(value) is kind, (key, value)


def test_every_field_has_nsqds_go_type(nsqd):
    request(nsqd, "POST", "/topic/create?topic=typed")
    request(nsqd, "POST", "/channel/create?topic=typed&channel=c")
    producer, consumer = TCP(nsqd), TCP(nsqd)
    try:
        producer.pub("typed", b"x")
        consumer.identify(client_id="typed", user_agent="ua")
        consumer.sub("typed", "c")
        consumer.send(b"RDY 1")
        consumer.message()
        doc, _ = get_json(nsqd)
        check_fields(doc, TOP_TYPES)
        check_fields(doc["memory"], MEMORY_TYPES)
        (topic,) = doc["topics"]
        check_fields(topic, TOPIC_TYPES)
        (channel,) = topic["channels"]
        check_fields(channel, CHANNEL_TYPES)
        for e2e in (topic["e2e_processing_latency"], channel["e2e_processing_latency"]):
            assert list(e2e) == ["count", "percentiles"] and type(e2e["count"]) is int
            assert e2e["percentiles"] is None or type(e2e["percentiles"]) is list
        omit = ("authed", "auth_identity", "auth_identity_url", "pub_counts")
        (client,) = channel["clients"]
        check_fields(client, CLIENT_TYPES, omitempty=omit)
        (prod,) = doc["producers"]
        check_fields(prod, CLIENT_TYPES, omitempty=omit)
        assert prod["pub_counts"] == [{"topic": "typed", "count": 1}]
    finally:
        producer.close()
        consumer.close()


def test_merge_stats_merges_the_workers_e2e_windows():
    def part(count, sketch):
        e2e = {"count": count, "percentiles": [{"quantile": 0.2, "value": -1.0},
                                               {"quantile": 0.9, "value": -1.0}],
               "sketch": sketch}
        channel = {"channel_name": "c", "depth": 0, "backend_depth": 0, "in_flight_count": 0,
                   "deferred_count": 0, "message_count": count, "requeue_count": 0,
                   "timeout_count": 0, "client_count": 1, "clients": None, "paused": False,
                   "e2e_processing_latency": e2e}
        return [{"topic_name": "t", "channels": [channel], "depth": 0, "backend_depth": 0,
                 "message_count": count, "message_bytes": 0, "paused": False,
                 "e2e_processing_latency": dict(e2e)}], None

    # 100 finishes at 1 ms on one worker, 300 at 5 ms on the other
    topics, _ = st.merge_stats([part(100, [1e6] * 100), part(300, [5e6] * 128)])
    for e2e in (topics[0]["e2e_processing_latency"],
                topics[0]["channels"][0]["e2e_processing_latency"]):
        assert e2e == {"count": 400, "percentiles": [{"quantile": 0.2, "value": 1e6},
                                                     {"quantile": 0.9, "value": 5e6}]}


@pytest.mark.parametrize("order", ["owner first", "owner last"])
@pytest.mark.parametrize("other_ring, owner_ring, owner_disk, overflow, want", [
    # the other worker read the ring before the owner moved 300 of its 1000 to disk
    (1000, 700, 300, 0, 1000),
    # the other worker read it after more came in: the owner's reading still counts
    (1200, 700, 300, 0, 1000),
    # the other worker's overflow queue is added to the owner's readings
    (700, 700, 300, 50, 1050),
])
def test_merge_stats_takes_the_ring_depth_with_the_owners_disk_depth(
        order, other_ring, owner_ring, owner_disk, overflow, want):
    """A depth is the owner's ring and disk readings, taken together (no
    message on its way from one to the other counted twice), plus the other
    workers' overflow; the largest ring reading only without an owner."""
    def part(ring, backend, owner):
        return [{"topic_name": "t", "channels": [], "depth": ring + backend,
                 "backend_depth": backend, "message_count": 0, "message_bytes": 0,
                 "paused": False, "e2e_processing_latency": {"count": 0, "percentiles": None},
                 "ring_depth": ring, "ring_owner": owner, "deferred_waiting": 0}], None

    parts = [part(owner_ring, owner_disk, True), part(other_ring, overflow, False)]
    topics, _ = st.merge_stats(parts if order == "owner first" else parts[::-1])
    assert topics[0]["depth"] == want
    assert "ring_owner" not in topics[0] and "ring_depth" not in topics[0]
    # no owner's part (a topic being made): the largest reading
    topics, _ = st.merge_stats([part(5, 0, False), part(9, 0, False)])
    assert topics[0]["depth"] == 9


def test_merge_memory_sums_the_workers_and_keeps_the_worst_pause():
    a = dict.fromkeys(MEMORY_KEYS, 10) | {"gc_pause_usec_99": 7, "gc_total_runs": 0xFFFFFFFF}
    b = dict.fromkeys(MEMORY_KEYS, 5) | {"gc_pause_usec_99": 9, "gc_total_runs": 3}
    merged = st.merge_memory([a, b])
    assert list(merged) == MEMORY_KEYS
    assert merged["heap_objects"] == merged["heap_in_use_bytes"] == merged["next_gc_bytes"] == 15
    assert merged["gc_pause_usec_100"] == 10 and merged["gc_pause_usec_99"] == 9
    assert merged["gc_total_runs"] == 2  # Go's uint32 NumGC wraps


def _client_ports(doc):
    consumers = {c["remote_address"].rpartition(":")[2]: c["nsqshm_worker"]
                 for t in doc["topics"] for ch in t["channels"] for c in ch["clients"] or ()}
    producers = {c["remote_address"].rpartition(":")[2]: c["nsqshm_worker"]
                 for c in doc["producers"] or ()}
    return consumers, producers


@pytest.mark.workers(2)
def test_stats_on_each_worker_describe_the_whole_broker(nsqd_factory, tmp_path):
    """Consumers and producers on both workers, listed by /stats whichever
    worker answers; memory is every worker's (an idle worker's heap alone is
    about half of it)."""
    from tests.nsqd.conftest import http_call, http_on_each_worker
    from tests.nsqd.workers.test_workers import client_on_worker

    server = nsqd_factory()
    consumers = [client_on_worker(server, i, "whole", "ch") for i in (0, 1)]
    producers = [client_on_worker(server, i, "whole") for i in (0, 1)]  # PUB probe
    want_consumers = {str(c.sock.getsockname()[1]): i for i, c in enumerate(consumers)}
    want_producers = {str(c.sock.getsockname()[1]): i for i, c in enumerate(producers)}
    (tmp_path / "one").mkdir()
    one = nsqd_factory("--workers=1", data_path=tmp_path / "one")
    heap_one = get_json(one)[0]["memory"]["heap_objects"]
    for index, conn in http_on_each_worker(server).items():
        status, body = http_call(conn, "GET", "/stats?format=json")
        doc = json.loads(body)
        assert status == 200 and _client_ports(doc) == (want_consumers, want_producers), index
        assert doc["memory"]["heap_objects"] > 1.5 * heap_one, index
        status, body = http_call(conn, "GET", "/stats")
        text = body.decode()
        assert text.count("msgs: 1        topics: probe=1") == 2, text
        assert text.count(" state: 3 inflt: ") == 2, text
        conn.close()
    for c in consumers + producers:
        c.close()


@pytest.mark.workers(2)
def test_depth_adds_the_owners_disk_queue_and_the_other_workers_overflow(nsqd_factory):
    """A topic's depth on two workers: the shared ring (counted once), the
    owner's disk queue and the other worker's overflow queue.  (The merge
    took the largest of the workers' views, which left out one of the two
    queues on disk.)  No channel: nothing moves, every message stays."""
    # a 256 KiB ring (--max-msg-size sizes it) holds at most 65 messages of
    # 4000 bytes, fewer than --mem-queue-size: the owner's PUBs past it go to
    # its disk queue, and the other worker's to its overflow (the ring stays full)
    server = nsqd_factory("--mem-queue-size=100", "--max-msg-size=65536")
    topic = topic_owned_by(0, "depth")
    body = b"d" * 4000
    for index, n in ((0, 200), (1, 20)):
        c = client_on_worker(server, index, None)
        c.send(p.pub(topic, body) * n)
        for _ in range(n):
            assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        c.close()
    for index, conn in http_on_each_worker(server).items():
        status, doc = http_call(conn, "GET", f"/stats?format=json&topic={topic}")
        (t,) = json.loads(doc)["topics"]
        assert (t["depth"], t["message_count"]) == (220, 220), index
        assert t["backend_depth"] >= 220 - 65, index  # the owner's disk queue and the overflow
        conn.close()
