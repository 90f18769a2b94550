"""Delivery policies (issue 18, nsqshm/nsqd/policies/policy.py, policy_api.py): max
attempts with a dead-letter topic through REQ and timeouts, redrive, time
to live of topics and channels (in memory and on disk), set on any worker,
kept in nsqd.dat, shown in /stats and /metrics."""

import base64
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nsqshm import protocol as p
from tests.nsqd.conftest import http_call, http_on_each_worker, http_on_worker, wait_for
from tests.nsqd.tcp.test_protocol_v2 import Conn, publish

WORKER_COUNTS = (1, 2)  # every test on one worker and on two (conftest.py)
CLIENTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "clients")  # tests/nsqd/clients


def stats_channel(server, topic, channel):
    doc = json.loads(server.get(f"/stats?format=json&topic={topic}")[1])
    return next(c for c in doc["topics"][0]["channels"] if c["channel_name"] == channel)


def peek_topic(server, topic, n=100):
    return json.loads(server.get(f"/topic/peek?topic={topic}&n={n}")[1])["messages"]


def create(server, topic, channel):
    """nsqd's /channel/create needs the topic: /topic/create first."""
    assert server.post(f"/topic/create?topic={topic}")[0] == 200
    assert server.post(f"/channel/create?topic={topic}&channel={channel}")[0] == 200


def bodies(entries):
    return [base64.b64decode(m["body"]) for m in entries]


def set_policy(server, path, expect=200):
    status, body = server.post(path)
    assert status == expect, body
    return json.loads(body)


def test_max_attempts_through_req_moves_to_the_dead_letter_topic(nsqd):
    create(nsqd, "t", "c")
    got = set_policy(nsqd, "/channel/policy?topic=t&channel=c&max_attempts=3")
    assert got == {"ttl_ms": 0, "max_attempts": 3, "dead_letter_topic": "t.c.dead",
                   "dead_letter_expired": False, "max_depth": 0, "max_bytes": 0,
                   "overflow": "reject"}
    publish(nsqd, "t", b"a", b"b")
    c = Conn(nsqd).subscribe("t", "c", rdy=2)
    seen, pending = [], []
    while len(seen) < 6:  # each delivered 3 times, requeued each time
        pending = pending or c.messages(1)  # (one read may bring both)
        m = pending.pop(0)
        seen.append((m.body, m.attempts))
        c.send(p.req(m.id, 0))
    assert sorted(seen) == [(b, a) for b in (b"a", b"b") for a in (1, 2, 3)]
    assert c.nothing_for(0.6)  # not delivered a 4th time
    dead = peek_topic(nsqd, "t.c.dead")
    assert bodies(dead) == [b"a", b"b"] and [m["attempts"] for m in dead] == [3, 3]
    stats = stats_channel(nsqd, "t", "c")
    assert (stats["dead_letter_count"], stats["dead_letter_requeued_count"],
            stats["dead_letter_timed_out_count"], stats["depth"]) == (2, 2, 0, 0)
    # the dead-letter topic is a topic: a consumer reads the dead letters, attempts kept
    d = Conn(nsqd).subscribe("t.c.dead", "inspect", rdy=5)
    assert sorted((m.body, m.attempts) for m in d.messages(2)) == [(b"a", 4), (b"b", 4)]


def test_max_attempts_through_timeouts_keeps_the_id(nsqd):
    create(nsqd, "t", "c")
    set_policy(nsqd, "/channel/policy?topic=t&channel=c&max_attempts=2"
                     "&dead_letter_topic=parking")
    publish(nsqd, "t", b"slow")
    c = Conn(nsqd).subscribe("t", "c", rdy=1, msg_timeout=1000)
    first = c.messages(1)[0]
    second = c.messages(1, timeout=5)[0]  # timed out once, delivered again
    assert (second.id, second.attempts) == (first.id, 2)
    assert wait_for(lambda: stats_channel(nsqd, "t", "c")["dead_letter_count"] == 1, 5)
    assert c.nothing_for(1.5)
    stats = stats_channel(nsqd, "t", "c")
    assert (stats["dead_letter_timed_out_count"], stats["timeout_count"]) == (1, 2)
    assert stats["dead_letter_topic"] == "parking"
    dead = peek_topic(nsqd, "parking")
    assert [(m["id"], m["attempts"]) for m in dead] == [(first.id.decode(), 2)]
    assert dead[0]["timestamp"] == first.timestamp


def test_redrive_moves_dead_letters_back_with_fresh_attempts(nsqd):
    create(nsqd, "t", "c")
    set_policy(nsqd, "/channel/policy?topic=t&channel=c&max_attempts=1")
    publish(nsqd, "t", b"x", b"y", b"z")
    c = Conn(nsqd).subscribe("t", "c", rdy=3)
    for m in c.messages(3):
        c.send(p.req(m.id, 0))  # 1 attempt: dead at once
    assert wait_for(lambda: len(peek_topic(nsqd, "t.c.dead")) == 3, 5)
    assert c.nothing_for(0.5)
    status, body = nsqd.post("/channel/redrive?topic=t&channel=c&n=1")
    assert (status, json.loads(body)) == (200, {"moved": 1})
    m = c.messages(1)[0]
    assert (m.body, m.attempts) == (b"x", 1)
    c.send(p.fin(m.id))
    status, body = nsqd.post("/channel/redrive?topic=t&channel=c")
    assert (status, json.loads(body)) == (200, {"moved": 2})
    assert sorted(m.body for m in c.messages(2)) == [b"y", b"z"]
    assert peek_topic(nsqd, "t.c.dead") == []
    assert json.loads(nsqd.post("/channel/redrive?topic=t&channel=c")[1]) == {"moved": 0}


def dead_letters(server, sent):
    """t:c at max attempts 1, each of `sent` requeued once, one at a time (so
    they die in order): the subscribed connection."""
    create(server, "t", "c")
    set_policy(server, "/channel/policy?topic=t&channel=c&max_attempts=1")
    publish(server, "t", *sent)
    c = Conn(server).subscribe("t", "c", rdy=1)
    for _ in sent:
        m = c.messages(1)[0]
        c.send(p.req(m.id, 0))
    assert wait_for(lambda: sorted(bodies(peek_topic(server, "t.c.dead"))) == sorted(sent), 5)
    return c


@pytest.mark.parametrize("mem", [100, 2], ids=["memory", "disk"])
def test_redrive_by_id_takes_those_and_keeps_the_rest_in_order(nsqd_factory, mem):
    server = nsqd_factory(f"--mem-queue-size={mem}")
    c = dead_letters(server, [f"m{i}".encode() for i in range(8)])
    before = peek_topic(server, "t.c.dead")
    order = [m["id"] for m in before]
    chosen = [order[1], order[6]]  # one from the ring, one from disk when mem is 2
    status, body = server.post(f"/channel/redrive?topic=t&channel=c&id={chosen[0]}"
                               f"&id={chosen[1]}")
    assert (status, json.loads(body)) == (200, {"moved": 2})
    got = []
    for _ in chosen:
        m = c.messages(1)[0]
        got.append((m.id.decode(), m.attempts))
        c.send(p.fin(m.id))
    assert sorted(got) == sorted((i, 1) for i in chosen)
    assert c.nothing_for(0.3)
    after = peek_topic(server, "t.c.dead")
    assert [m["id"] for m in after] == [i for i in order if i not in chosen]
    assert [m["attempts"] for m in after] == [1] * 6  # the others untouched
    # an ID not there moves nothing; bad IDs and n with id are refused
    assert json.loads(server.post(f"/channel/redrive?topic=t&channel=c&id={chosen[0]}")[1]) \
        == {"moved": 0}
    assert [m["id"] for m in peek_topic(server, "t.c.dead")] == [m["id"] for m in after]
    for query, text in (("id=xyz", "INVALID_MESSAGE_ID"), ("id=" + "g" * 16, "INVALID_MESSAGE_ID"),
                        (f"id={order[0]}&n=1", "N_AND_ID_EXCLUSIVE")):
        assert server.post(f"/channel/redrive?topic=t&channel=c&{query}") == \
            (400, json.dumps({"message": text}).replace(" ", "").encode()), query


def test_redrive_from_the_dead_letter_disk_queue(nsqd_factory):
    server = nsqd_factory("--mem-queue-size=2")
    sent = [f"m{i}".encode() for i in range(6)]
    c = dead_letters(server, sent)
    # past --mem-queue-size: on disk (in order with one worker; with several,
    # one that does not own the topic pushes into its ring and the owner spills
    # the excess to disk: docs/workers.md, Known limits, Order)
    assert wait_for(lambda: sorted(bodies(peek_topic(server, "t.c.dead"))) == sent, 5)
    assert wait_for(lambda: json.loads(server.get("/stats?format=json&topic=t.c.dead")[1])
                    ["topics"][0]["backend_depth"] >= 4, 5)
    if server.workers == 1:
        assert bodies(peek_topic(server, "t.c.dead")) == sent
    assert json.loads(server.post("/channel/redrive?topic=t&channel=c")[1]) == {"moved": 6}
    got = []
    for _ in sent:
        m = c.messages(1)[0]
        got.append((m.body, m.attempts))
        c.send(p.fin(m.id))
    assert sorted(got) == [(b, 1) for b in sent]
    if server.workers == 1:
        assert [b for b, _ in got] == sent
    assert peek_topic(server, "t.c.dead") == []


@pytest.mark.parametrize("library", ["pynsq", "gnsq"])
def test_real_clients_that_always_requeue(nsqd, library):
    create(nsqd, "t", "c")
    set_policy(nsqd, "/channel/policy?topic=t&channel=c&max_attempts=3")
    n = 10
    script = os.path.join(CLIENTS, f"{library}_client.py")
    out = subprocess.run([sys.executable, script, "requeue_always",
                          f"127.0.0.1:{nsqd.tcp_port}", "t", str(n)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    counts = {}
    for _, body, attempts in result["received"]:
        counts.setdefault(body, []).append(attempts)
    assert {b: sorted(a) for b, a in counts.items()} == {f"m{i}": [1, 2, 3] for i in range(n)}
    assert sorted(bodies(peek_topic(nsqd, "t.c.dead"))) == sorted(f"m{i}".encode()
                                                                   for i in range(n))
    assert stats_channel(nsqd, "t", "c")["dead_letter_count"] == n


def test_policy_set_on_any_worker_applies_everywhere_and_persists(nsqd_factory, tmp_path):
    server = nsqd_factory()
    create(server, "t", "c")
    conn = http_on_worker(server, server.workers - 1)
    status, body = http_call(conn, "POST", "/channel/policy?topic=t&channel=c&max_attempts=4"
                                           "&ttl=60000")
    assert status == 200, body
    status, body = http_call(conn, "POST", "/topic/policy?topic=t&ttl=120000")
    assert (status, json.loads(body)) == (200, {"ttl_ms": 120000, "max_depth": 0, "max_bytes": 0,
                                                "overflow": "reject"})
    conn.close()
    for each in http_on_each_worker(server).values():
        doc = json.loads(http_call(each, "GET", "/stats?format=json&topic=t")[1])
        topic = doc["topics"][0]
        c = topic["channels"][0]
        assert (topic["ttl_ms"], c["ttl_ms"], c["max_attempts"], c["dead_letter_topic"]) == \
            (120000, 60000, 4, "t.c.dead")
        each.close()
    with open(tmp_path / "nsqd.dat") as f:
        meta = json.load(f)
    t = next(t for t in meta["topics"] if t["name"] == "t")
    assert t["ttl_ms"] == 120000
    assert t["channels"] == [{"name": "c", "paused": False, "max_attempts": 4, "ttl_ms": 60000}]
    assert server.stop() == 0
    again = nsqd_factory()
    c = stats_channel(again, "t", "c")
    assert (c["ttl_ms"], c["max_attempts"]) == (60000, 4)
    # cleared: 0 turns a setting off
    assert set_policy(again, "/channel/policy?topic=t&channel=c&max_attempts=0&ttl=0") == \
        {"ttl_ms": 0, "max_attempts": 0, "dead_letter_topic": "", "dead_letter_expired": False,
         "max_depth": 0, "max_bytes": 0, "overflow": "reject"}


def test_channel_ttl_drops_expired_messages_and_counts_them(nsqd):
    create(nsqd, "t", "c")
    create(nsqd, "t", "keep")
    set_policy(nsqd, "/channel/policy?topic=t&channel=c&ttl=300")
    publish(nsqd, "t", b"old1", b"old2")
    time.sleep(0.5)
    publish(nsqd, "t", b"fresh")
    c = Conn(nsqd).subscribe("t", "c", rdy=10)
    assert c.messages(1)[0].body == b"fresh"
    assert c.nothing_for(0.3)
    assert stats_channel(nsqd, "t", "c")["expired_count"] == 2
    assert "expired_count" not in stats_channel(nsqd, "t", "keep")  # no policy: nsqd's keys
    k = Conn(nsqd).subscribe("t", "keep", rdy=10)
    assert [m.body for m in k.messages(3)] == [b"old1", b"old2", b"fresh"]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(nsqd.get("/metrics")[1].decode())
               for s in family.samples}
    assert samples[("nsq_channel_expired_total", (("channel", "c"), ("topic", "t")))] == 2
    assert ("nsq_channel_expired_total", (("channel", "keep"), ("topic", "t"))) not in samples


def test_topic_ttl_expires_messages_waiting_on_disk(nsqd_factory):
    server = nsqd_factory("--mem-queue-size=1")
    create(server, "t", "c")
    set_policy(server, "/topic/policy?topic=t&ttl=400")
    publish(server, "t", *[f"d{i}".encode() for i in range(5)])
    assert wait_for(lambda: stats_channel(server, "t", "c")["backend_depth"] == 4, 5)
    time.sleep(0.6)
    publish(server, "t", b"fresh")
    c = Conn(server).subscribe("t", "c", rdy=10)
    assert c.messages(1)[0].body == b"fresh"
    assert c.nothing_for(0.3)
    stats = stats_channel(server, "t", "c")
    assert (stats["expired_count"], stats["depth"]) == (5, 0)
    doc = json.loads(server.get("/stats?format=json&topic=t")[1])["topics"][0]
    assert (doc["ttl_ms"], doc["expired_count"]) == (400, 5)


def test_policy_errors(nsqd):
    create(nsqd, "t", "c")
    long_channel = "c" * 60
    create(nsqd, "t", long_channel)
    cases = [("/channel/policy?topic=t&channel=c&max_attempts=-1", 400, "INVALID_MAX_ATTEMPTS"),
             ("/channel/policy?topic=t&channel=c&max_attempts=65536", 400,
              "INVALID_MAX_ATTEMPTS"),
             ("/channel/policy?topic=t&channel=c&ttl=x", 400, "INVALID_TTL"),
             ("/channel/policy?topic=t&channel=c&dead_letter_topic=a/b", 400,
              "INVALID_DEAD_LETTER_TOPIC"),
             ("/channel/policy?topic=t&channel=c&dead_letter_topic=t", 400,
              "INVALID_DEAD_LETTER_TOPIC"),
             (f"/channel/policy?topic=t&channel={long_channel}&max_attempts=2", 400,
              "INVALID_DEAD_LETTER_TOPIC"),  # t.<60 c>.dead is over 64 characters
             ("/channel/policy?topic=t&channel=nope&ttl=1", 404, "CHANNEL_NOT_FOUND"),
             ("/topic/policy?topic=nope&ttl=1", 404, "TOPIC_NOT_FOUND"),
             ("/topic/policy?ttl=1", 400, "MISSING_ARG_TOPIC"),
             ("/channel/redrive?topic=t&channel=c&n=0", 400, "INVALID_N")]
    for path, status, text in cases:
        assert nsqd.post(path) == (status, json.dumps({"message": text}).replace(" ", "")
                                   .encode()), path
    assert "max_attempts" not in stats_channel(nsqd, "t", "c")  # nothing was set


def test_expired_messages_can_go_to_the_dead_letter_topic(nsqd):
    create(nsqd, "t", "c")
    got = set_policy(nsqd, "/channel/policy?topic=t&channel=c&ttl=300&dead_letter_expired=true")
    assert (got["dead_letter_expired"], got["dead_letter_topic"]) == (True, "t.c.dead")
    publish(nsqd, "t", b"old1", b"old2")
    time.sleep(0.5)
    publish(nsqd, "t", b"fresh")
    c = Conn(nsqd).subscribe("t", "c", rdy=10)
    assert c.messages(1)[0].body == b"fresh"
    assert wait_for(lambda: bodies(peek_topic(nsqd, "t.c.dead")) == [b"old1", b"old2"], 5)
    stats = stats_channel(nsqd, "t", "c")
    assert (stats["expired_count"], stats["dead_letter_expired_count"],
            stats["dead_letter_count"]) == (2, 2, 2)
    assert nsqd.post("/channel/policy?topic=t&channel=c&dead_letter_expired=maybe") == \
        (400, b'{"message":"INVALID_DEAD_LETTER_EXPIRED"}')


@pytest.mark.workers(2)
def test_a_replacement_worker_takes_the_policies_from_its_peer(nsqd_factory):
    from tests.nsqd.workers.test_workers import worker_of_http, worker_of_pid, workers

    server = nsqd_factory()
    create(server, "t", "c")
    set_policy(server, "/channel/policy?topic=t&channel=c&max_attempts=2&ttl=90000"
                       "&max_depth=50")
    pid = worker_of_pid(server, 1)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: len(workers(server)) == 2 and pid not in workers(server), 15)
    assert wait_for(lambda: any(worker_of_http(server)["index"] == 1 for _ in range(20)), 15)
    conn = http_on_worker(server, 1)
    doc = json.loads(http_call(conn, "GET", "/stats?format=json&topic=t")[1])
    conn.close()
    c = doc["topics"][0]["channels"][0]
    assert (c["max_attempts"], c["ttl_ms"], c["max_depth"]) == (2, 90000, 50)
    # and the new worker applies them: a consumer there dead-letters at 2 attempts
    publish(server, "t", b"x")
    sub = None
    for _ in range(50):  # a TCP connection on worker 1
        candidate = Conn(server).subscribe("t", "c")
        stats = json.loads(server.get("/stats?format=json&topic=t")[1])
        clients = stats["topics"][0]["channels"][0]["clients"]
        port = candidate.sock.getsockname()[1]
        if any(cl.get("nsqshm_worker") == 1 and cl["remote_address"].endswith(f":{port}")
               for cl in clients):
            sub = candidate
            break
        candidate.close()
    assert sub is not None
    sub.send(p.rdy(1))
    for attempt in (1, 2):
        m = sub.messages(1)[0]
        assert m.attempts == attempt
        sub.send(p.req(m.id, 0))
    assert wait_for(lambda: bodies(peek_topic(server, "t.c.dead")) == [b"x"], 5)
