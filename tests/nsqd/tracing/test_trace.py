"""Message tracing (nsqd/tracing/trace.py) on real servers of one and two workers:
PUB_TRACE, MPUB_TRACE and /pubtrace with Youzan's answers, the per-channel
switch, and a message's history through publish, delivery, timeout, REQ,
TOUCH and FIN from GET /message/trace."""

import json
import struct
import threading
import time

import pytest

from nsqshm import protocol as p
from tests.nsqd.conftest import http_call, http_on_worker, wait_for
from tests.nsqd.test_ext import OK, consumer, create_ext, history, pub_ext
from tests.nsqd.workers.test_workers import Client

WORKER_COUNTS = (1, 2)


def pub_trace(topic, trace_id, body):
    """PUB_TRACE <topic>\\n[4 BE size][8 BE trace id][body]"""
    data = struct.pack(">Q", trace_id) + body
    return b"PUB_TRACE %s\n" % topic.encode() + struct.pack(">I", len(data)) + data


def mpub_trace(topic, messages):
    parts = [struct.pack(">I", len(messages))]
    for trace_id, body in messages:
        block = struct.pack(">Q", trace_id) + body
        parts.append(struct.pack(">I", len(block)) + block)
    data = b"".join(parts)
    return b"MPUB_TRACE %s\n" % topic.encode() + struct.pack(">I", len(data)) + data


def traced_reply(answer):
    """getTracedReponse: "OK" [8 BE id][8 BE trace id][8 BE queue offset][4 BE raw size]"""
    assert len(answer) == 30 and answer[:2] == b"OK", answer
    return struct.unpack(">QQQI", answer[2:])


def test_trace_publish_deliver_timeout_req_touch_fin(nsqd_factory):
    server = nsqd_factory("--msg-timeout=1s")
    assert server.post("/topic/create?topic=tr")[0] == 200
    c = consumer(server, "tr", "c", rdy=1)
    assert server.post("/message/trace/enable?topic=tr&channel=c")[0] == 200
    pc = Client(server)
    pc.send(pub_trace("tr", 42, b"traced"))
    kind, answer = pc.response()
    msg_id, trace_id, offset, size = traced_reply(answer)
    # the raw size: what it takes in the queue, a disk queue record's [4 size][message]
    assert (trace_id, offset, size) == (42, 0, 4 + 26 + len(b"traced"))
    hex_id = b"%016x" % msg_id
    m = c.message()
    assert (m.id, m.body) == (hex_id, b"traced")
    # left to time out, then REQ with a delay, TOUCH, FIN
    m = c.message()
    assert m.attempts == 2
    c.send(p.req(m.id, 10))
    m = c.message()
    c.send(p.touch(m.id))
    c.send(p.fin(m.id))
    c.send(p.nop())
    events = None
    for _ in range(100):
        events = history(server, "topic=tr&trace_id=42")
        if [e["event"] for e in events][-1:] == ["FIN"]:
            break
        time.sleep(0.05)
    names = [e["event"] for e in events]
    assert names == ["PUB", "DELIVERED", "TIMEOUT", "DELIVERED", "REQ", "DELIVERED", "TOUCH",
                     "FIN"], events
    assert events[0]["trace_id"] == 42 and events[0]["client"]
    assert [e["attempt"] for e in events if e["event"] == "DELIVERED"] == [1, 2, 3]
    assert events[4]["delay_ms"] == 10
    assert history(server, f"topic=tr&id={hex_id.decode()}") == events
    # MPUB_TRACE: the answer's trace ID is 0; each message is found by its own
    pc.send(mpub_trace("tr", [(7, b"a"), (8, b"b")]))
    _, answer = pc.response()
    assert traced_reply(answer)[1] == 0
    assert [e["event"] for e in history(server, "topic=tr&trace_id=8")][:1] == ["PUB"]
    # off: nothing more is recorded for the channel
    assert server.post("/message/trace/disable?topic=tr&channel=c")[0] == 200
    pc.send(p.pub("tr", b"quiet"))
    assert pc.response() == OK
    assert c.message().body in (b"a", b"b", b"quiet")
    assert server.post("/message/trace/enable?topic=nosuch")[0] == 404
    status, body = server.post("/pubtrace?topic=tr&trace_id=99", b"h")
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "OK" and answer["trace_id"] == "99"
    assert history(server, "topic=tr&trace_id=99")[0]["id"] == f"{answer['id']:016x}"


@pytest.mark.workers(1)  # (a publish on a worker that does not own the partition is
# recorded with the ID it had before the owner's append: docs/headers.md)
def test_a_log_topic_message_is_traced_by_its_log_id(nsqd_factory):
    server = nsqd_factory()
    assert server.post("/topic/create?topic=lt&partition_num=1")[0] == 200
    c = consumer(server, "lt", "c", rdy=1)
    assert server.post("/message/trace/enable?topic=lt")[0] == 200
    pc = Client(server)
    pc.send(pub_trace("lt", 5, b"logged"))
    msg_id = traced_reply(pc.response()[1])[0]
    m = c.message()
    assert int(m.id, 16) == msg_id  # the traced answer gives the log's ID
    c.send(p.fin(m.id))
    events = []
    for _ in range(100):
        events = history(server, f"topic=lt&id={m.id.decode()}")
        if [e["event"] for e in events][-1:] == ["FIN"]:
            break
        time.sleep(0.05)
    assert [e["event"] for e in events] == ["PUB", "DELIVERED", "FIN"]


@pytest.mark.workers(1, 2)
def test_traced_answers_give_the_log_queue_offset(nsqd_factory):
    """PUB_TRACE and /pubtrace on a log topic answer where the message went:
    its virtual offset in its partition (Youzan's BackendOffset), which
    /message/get finds it by, and its log ID.  With no partition named, a
    publish goes to a partition of the worker that took it (each of 2 workers
    owns one of the 2), so the offset is known when it answers."""
    server = nsqd_factory()
    assert server.post("/topic/create?topic=qo&partition_num=2")[0] == 200
    for partition in range(2):  # the first message's offset is 0: put some before
        assert server.post(f"/mpub?topic=qo&partition={partition}",
                           b"\n".join([b"before"] * 7))[0] == 200
    answers = []
    for i in range(3):
        pc = Client(server)
        pc.send(pub_trace("qo", 40 + i, b"traced%d" % i))
        answers.append((traced_reply(pc.response()[1]), b"traced%d" % i))
        status, body = server.post(f"/pubtrace?topic=qo&trace_id={50 + i}", b"http%d" % i)
        doc = json.loads(body)
        answers.append(((doc["id"], 50 + i, doc["queue_offset"], doc["rawsize"]),
                        b"http%d" % i))
    for (msg_id, trace_id, queue_offset, raw_size), body in answers:
        partition = msg_id >> 48
        assert queue_offset > 0, (body, msg_id)
        assert raw_size == 16 + 26 + len(body)  # a log record: where the next one starts
        status, got = server.get(f"/message/get?topic=qo&partition={partition}"
                                 f"&search_mode=virtual_offset&search_pos={queue_offset}")
        assert status == 200, got
        got = json.loads(got)
        assert (got["body"], got["id"], got["offset"], got["trace_id"]) == \
            (body.decode(), msg_id, queue_offset, trace_id)


@pytest.mark.workers(2)
def test_a_traced_publish_taken_by_a_worker_without_the_partition(nsqd_factory):
    """One partition, two workers: the worker that does not own it has the
    owner append a traced publish (peer op log_append), so whichever worker
    takes it, the answer names the message's log ID and queue offset, and
    its history is found by that ID."""
    server = nsqd_factory()
    assert server.post("/topic/create?topic=one&partition_num=1")[0] == 200
    assert server.post("/mpub?topic=one", b"\n".join([b"before"] * 5))[0] == 200
    answers = []
    for index in range(2):  # /pubtrace on each worker in turn
        conn = http_on_worker(server, index)
        status, body = http_call(conn, "POST", f"/pubtrace?topic=one&trace_id={70 + index}",
                                 b"w%d" % index)
        conn.close()
        assert status == 200, body
        doc = json.loads(body)
        answers.append((doc["id"], doc["queue_offset"], b"w%d" % index))
    for i in range(6):  # and PUB_TRACE on connections the kernel spreads
        pc = Client(server)
        pc.send(pub_trace("one", 80 + i, b"t%d" % i))
        msg_id, trace_id, queue_offset, _ = traced_reply(pc.response()[1])
        assert trace_id == 80 + i
        answers.append((msg_id, queue_offset, b"t%d" % i))
    for msg_id, queue_offset, body in answers:
        assert msg_id >> 48 == 0 and 5 <= msg_id & 0xFFFF_FFFF_FFFF < 13, (body, msg_id)
        status, got = server.get(f"/message/get?topic=one&partition=0"
                                 f"&search_mode=virtual_offset&search_pos={queue_offset}")
        assert status == 200, got
        got = json.loads(got)
        assert (got["body"], got["id"]) == (body.decode(), msg_id)
        events = history(server, f"topic=one&id={msg_id:016x}")
        assert [e["event"] for e in events] == ["PUB"], (body, events)


def _events_of(server, topic, ids, want_last, tries=200):
    """{id: [event names]} once every ID's history ends with want_last."""
    got = {}
    for _ in range(tries):
        got = {i: [e["event"] for e in history(server, f"topic={topic}&id={i.decode()}")]
               for i in ids}
        if all(names[-1:] == [want_last] for names in got.values()):
            return got
        time.sleep(0.05)
    return got


def test_a_traced_channel_consumed_with_fin_per_write_records_every_message(nsqd_factory):
    """The C command parser applies a traced channel's FINs (one send each, as
    go-nsq, pynsq and gnsq write them) and records each one."""
    server = nsqd_factory()
    c = consumer(server, "tf", "c", rdy=200)
    assert server.post("/message/trace/enable?topic=tf")[0] == 200
    pc = Client(server)
    count = 300
    pc.send(p.mpub("tf", [b"m%d" % i for i in range(count)]))
    assert pc.response() == OK
    ids = []
    for _ in range(count):
        m = c.message()
        ids.append(m.id)
        c.send(p.fin(m.id))
    sample = ids[:: count // 10]
    got = _events_of(server, "tf", sample, "FIN")
    assert all(names == ["PUB", "DELIVERED", "FIN"] for names in got.values()), got
    events = history(server, f"topic=tf&id={ids[0].decode()}")
    assert events[0]["client"].startswith("127.0.0.1:") and events[0]["topic"] == "tf"
    assert events[1]["channel"] == "c" and events[1]["attempt"] == 1
    assert events[0]["ts"] <= events[1]["ts"] <= events[2]["ts"]


def test_disk_and_dropped_events(nsqd_factory):
    """Past --mem-queue-size a traced topic's and channel's messages are
    written to disk (DISK); an ephemeral channel drops them (DROPPED)."""
    server = nsqd_factory("--mem-queue-size=1")
    held = [consumer(server, "td", channel, rdy=0) for channel in ("c", "e#ephemeral")]
    assert server.post("/message/trace/enable?topic=td")[0] == 200
    pc = Client(server)
    pc.send(p.mpub("td", [b"a", b"b", b"c", b"d"]))
    assert pc.response() == OK
    held[0].send(p.rdy(10))
    ids = []
    for _ in range(4):
        ids.append(held[0].message().id)
        held[0].send(p.fin(ids[-1]))
    events = _events_of(server, "td", ids, "FIN")
    assert all(names[-1] == "FIN" for names in events.values()), events
    on_disk = [e for i in ids for e in history(server, f"topic=td&id={i.decode()}")
               if e["event"] == "DISK"]
    assert {e.get("channel", "") for e in on_disk} >= {"c"}, events
    dropped = [e for i in ids for e in history(server, f"topic=td&id={i.decode()}")
               if e["event"] == "DROPPED"]
    assert len(dropped) == 3, events  # one kept in the ephemeral channel's memory
    assert {(e["channel"], e["reason"]) for e in dropped} == {
        ("e#ephemeral", "ephemeral channel past --mem-queue-size")}


def test_a_history_survives_a_restart_and_numbering_goes_on(nsqd_factory, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory(data_path=data)
    assert server.post("/topic/create?topic=tk")[0] == 200
    assert server.post("/channel/create?topic=tk&channel=c1")[0] == 200  # holds "before"
    assert server.post("/message/trace/enable?topic=tk")[0] == 200
    pc = Client(server)
    pc.send(pub_trace("tk", 11, b"before"))
    before = traced_reply(pc.response()[1])[0]
    pc.close()
    server.stop()
    server = nsqd_factory(data_path=data)
    c = consumer(server, "tk", "c2", rdy=1)  # a new channel: a new stream number
    pc = Client(server)
    pc.send(pub_trace("tk", 12, b"after"))
    traced_reply(pc.response()[1])
    m = c.message()
    c.send(p.fin(m.id))
    assert [e["event"] for e in history(server, f"topic=tk&id={before:016x}")] == ["PUB"]
    _events_of(server, "tk", [m.id], "FIN")
    # (c1's DISK event may be written after c2's FIN by another worker, or later under
    # load: the history is read once it holds all four)
    assert wait_for(lambda: len(history(server, f"topic=tk&id={m.id.decode()}")) >= 4,
                    timeout=10)
    after = [(e["event"], e.get("channel")) for e in history(server, f"topic=tk&id={m.id.decode()}")]
    # (c1 kept "before" on disk through the restart: "after" is stored behind it, in order)
    assert after == [("PUB", None), ("DISK", "c1"), ("DELIVERED", "c2"), ("FIN", "c2")]
    assert [e.get("channel") for e in history(server, "topic=tk&trace_id=12")] == [None, "c1", "c2", "c2"]
    assert history(server, "topic=other&trace_id=12") == []


def _dropped(server, topic, trace_id, tries=100):
    """The DROPPED events of the message published with trace_id, once there."""
    for _ in range(tries):
        events = [e for e in history(server, f"topic={topic}&trace_id={trace_id}")
                  if e["event"] == "DROPPED"]
        if events:
            return events
        time.sleep(0.05)
    return []


def _pub_traced(pc, topic, trace_ids):
    for trace_id in trace_ids:
        pc.send(pub_trace(topic, trace_id, b"m%d" % trace_id))
        assert traced_reply(pc.response()[1])[1] == trace_id


def test_what_policies_sampling_and_filters_drop_is_recorded_with_its_reason(nsqd_factory):
    """DROPPED, with why, for every way a traced channel lets a message go
    undelivered: drop-oldest past max_depth, a time to live, max attempts
    (to the dead-letter topic), a consumer's sample_rate, its ext_filter."""
    server = nsqd_factory()
    pc = Client(server)
    for topic in ("tb", "tt", "ta", "ts"):
        assert server.post(f"/topic/create?topic={topic}")[0] == 200
        assert server.post(f"/channel/create?topic={topic}&channel=c")[0] == 200
        assert server.post(f"/message/trace/enable?topic={topic}")[0] == 200
    assert server.post("/channel/policy?topic=tb&channel=c&max_depth=2&overflow=drop-oldest")[0] \
        == 200
    assert server.post("/channel/policy?topic=tt&channel=c&ttl=100")[0] == 200
    assert server.post("/channel/policy?topic=ta&channel=c&max_attempts=1")[0] == 200

    _pub_traced(pc, "tb", [1, 2, 3, 4])  # max_depth 2: the two oldest go
    _pub_traced(pc, "tt", [11])
    _pub_traced(pc, "ta", [21])
    time.sleep(0.2)  # tt's message expires before anyone asks for it
    expect = {("tb", 1): "drop-oldest (max_depth, max_bytes)",
              ("tb", 2): "drop-oldest (max_depth, max_bytes)",
              ("tt", 11): "expired (time to live)",
              ("ta", 21): "max attempts: to the dead-letter topic"}
    tt = consumer(server, "tt", "c", rdy=10)
    ta = consumer(server, "ta", "c", rdy=10)
    m = ta.message()
    ta.send(p.req(m.id, 0))  # its first attempt was its last
    sampled = consumer(server, "ts", "c", rdy=200, sample_rate=1)
    pc.send(mpub_trace("ts", [(100 + i, b"s") for i in range(50)]))
    assert pc.response()[0] == p.FRAME_TYPE_RESPONSE

    for (topic, trace_id), reason in expect.items():
        events = _dropped(server, topic, trace_id)
        assert [(e["channel"], e["reason"]) for e in events] == [("c", reason)], \
            (topic, trace_id, history(server, f"topic={topic}&trace_id={trace_id}"))
    for trace_id in (3, 4):  # the two newest stay
        assert not _dropped(server, "tb", trace_id, tries=1)
    sampled_out = [_dropped(server, "ts", 100 + i, tries=20 if i == 0 else 1) for i in range(50)]
    assert sum(1 for events in sampled_out if events) >= 40  # 1 in 100 kept, on average
    assert {e["reason"] for events in sampled_out for e in events} == \
        {"sampled out (sample_rate)"}

    create_ext(server, "tx")
    assert server.post("/message/trace/enable?topic=tx")[0] == 200
    picky = consumer(server, "tx", "c", ext_filter={"type": 1, "filter_ext_key": "k",
                                                    "filter_data": "a"})
    pc.send(pub_ext("tx", b'{"k":"b","##trace_id":"31"}', b"refused"))
    assert traced_reply(pc.response()[1])[1] == 31
    assert [e["reason"] for e in _dropped(server, "tx", 31)] == \
        ["refused by the consumer's ext_filter"]
    for c in (tt, ta, sampled, picky):
        c.close()


def test_switches_made_on_both_workers_at_once_all_survive_a_restart(nsqd_factory, tmp_path):
    """Each worker writes switches.json as the file was plus its change, under
    a lock: a switch another worker made a moment before, and that this one
    has not applied yet, is not lost from it (it was, at a restart)."""
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory(data_path=data)
    conns = [http_on_worker(server, i) for i in range(server.workers)]
    topics = [f"s{i}" for i in range(40)]
    for topic in topics:
        assert server.post(f"/topic/create?topic={topic}")[0] == 200

    statuses = []

    def enable(conn, mine):  # each worker's connection at once, in its own thread
        for topic in mine:
            statuses.append(http_call(conn, "POST", f"/message/trace/enable?topic={topic}")[0])

    threads = [threading.Thread(target=enable, args=(conn, topics[i::len(conns)]))
               for i, conn in enumerate(conns)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * len(topics)
    on = sorted(json.loads((data / "nsqshm.trace" / "switches.json").read_text()))
    assert on == sorted([t, ""] for t in topics)
    server.stop()
    server = nsqd_factory(data_path=data)
    pc = Client(server)
    for topic in topics:  # (a PUB without a trace ID: recorded only if the switch is on)
        pc.send(p.pub(topic, b"x"))
        assert pc.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    for topic in topics:
        assert [e["event"] for e in history(server, f"topic={topic}&trace_id=0")] == ["PUB"], topic


@pytest.mark.workers(1)
def test_drops_after_trace_enable_are_recorded_by_a_consumer_s_own_refill(nsqd_factory):
    """A consumer at its RDY takes its next messages in its own reader after
    a FIN (Channel.refill_finisher); what that C call drops (here expired by
    the channel's TTL) is recorded once tracing is on, as in a round of the
    dispatcher (found in review: the first was not)."""
    server = nsqd_factory()
    assert server.post("/topic/create?topic=tl")[0] == 200
    assert server.post("/channel/create?topic=tl&channel=c")[0] == 200
    assert server.post("/channel/policy?topic=tl&channel=c&ttl=100")[0] == 200
    c = Client(server)
    c.send(p.sub("tl", "c"))
    assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    c.send(p.rdy(1))
    pc = Client(server)
    pc.send(p.pub("tl", b"first"))
    assert pc.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    m = c.message()  # (a round of the dispatcher, tracing off; the consumer at its RDY now)
    assert server.post("/message/trace/enable?topic=tl")[0] == 200
    pc.send(mpub_trace("tl", [(1, b"x"), (2, b"y"), (3, b"z")]))
    assert pc.response()[0] == p.FRAME_TYPE_RESPONSE
    time.sleep(0.3)  # all three expire in the ring
    c.send(p.fin(m.id))  # the refill drops the first, the dispatcher the rest
    assert {t: bool(_dropped(server, "tl", t, tries=20)) for t in (1, 2, 3)} == \
        {1: True, 2: True, 3: True}
