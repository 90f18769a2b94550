"""Youzan's ext topics on real servers of one and two workers (nsqd/ext.py):
PUB_EXT / MPUB_EXT / /pub_ext / /mpub_ext, frames with and without
extend_support, Youzan's errors, headers through memory, disk overflow, a
log topic, a restart and a SIGKILL of every process; ext_filter and tag
dispatch with several consumers."""

import json
import struct
import urllib.parse

import psutil
import pytest

from nsqshm import protocol as p
from tests.nsqd.conftest import http_call, http_on_each_worker, wait_for
from tests.nsqd.logtopics.test_log_topics import confirmed, nothing_more, take
from tests.nsqd.workers.test_workers import Client

WORKER_COUNTS = (1, 2)
OK = (p.FRAME_TYPE_RESPONSE, b"OK")


# -- Youzan's layouts (nsqdserver/protocol_v2.go internalPubExtAndTrace, readMPUBEXT;
# nsqd/message.go WriteToClient with ext) ---------------------------------------------------

def pub_ext(topic, headers, body, partition=None):
    """PUB_EXT <topic> [<partition>]\\n[4 BE size][2 BE n][n JSON][body]"""
    line = b"PUB_EXT %s" % topic.encode()
    if partition is not None:
        line += b" %d" % partition
    data = struct.pack(">H", len(headers)) + headers + body
    return line + b"\n" + struct.pack(">I", len(data)) + data


def mpub_ext(topic, messages):
    """MPUB_EXT <topic>\\n[4 BE size][4 BE count]([4 BE size][2 BE n][JSON][body])*"""
    parts = [struct.pack(">I", len(messages))]
    for headers, body in messages:
        block = struct.pack(">H", len(headers)) + headers + body
        parts.append(struct.pack(">I", len(block)) + block)
    data = b"".join(parts)
    return b"MPUB_EXT %s\n" % topic.encode() + struct.pack(">I", len(data)) + data


def ext_data(headers, body):
    """A message frame's data after [8 ts][2 attempts][16 id] for an extend_support
    client: [1 version][2 BE n][n JSON][body], or [0][body] without headers."""
    if headers is None:
        return b"\x00" + body
    return b"\x04" + struct.pack(">H", len(headers)) + headers + body


FRAME_ROWS = [  # (headers as sent or None for a plain PUB, body)
    (b'{"k":"v"}', b"one"),
    (None, b"plain"),
    (b'{"a":"1","##client_dispatch_tag":"t"}', b"two"),
    (b'{ "nested" : {"x": [1, "}"]}, "k": "\\u00e9" }', b"three"),
]


def create_ext(server, topic, extra=""):
    status, body = server.post(f"/topic/create?topic={topic}&ext=true{extra}")
    assert status == 200, body


def consumer(server, topic, channel, rdy=100, **identify):
    c = Client(server)
    c.send(p.identify({"feature_negotiation": True, **identify}))
    kind, answer = c.response()
    assert kind == p.FRAME_TYPE_RESPONSE, answer
    c.send(p.sub(topic, channel))
    assert c.response() == OK
    c.send(p.rdy(rdy))
    return c


def publish_rows(server, topic):
    pc = Client(server)
    for headers, body in FRAME_ROWS:
        pc.send(p.pub(topic, body) if headers is None else pub_ext(topic, headers, body))
        assert pc.response() == OK
    pc.close()


def bodies(client, n):
    return sorted(m.body for m in take(client, n))


def test_frames_with_and_without_extend_support(nsqd_factory):
    server = nsqd_factory()
    create_ext(server, "xt")
    ext_client = consumer(server, "xt", "e", extend_support=True)
    plain = consumer(server, "xt", "plain")
    publish_rows(server, "xt")
    assert bodies(ext_client, 4) == sorted(ext_data(h, b) for h, b in FRAME_ROWS)
    assert bodies(plain, 4) == sorted(b for _, b in FRAME_ROWS)
    # MPUB_EXT (n = 0: a message without headers), then a plain MPUB
    pc = Client(server)
    pc.send(mpub_ext("xt", [(b'{"m":"1"}', b"m1"), (b"", b"m2")]))
    assert pc.response() == OK
    pc.send(p.mpub("xt", [b"p1", b"p2"]))
    assert pc.response() == OK
    assert bodies(ext_client, 4) == sorted([ext_data(b'{"m":"1"}', b"m1"), ext_data(None, b"m2"),
                                            ext_data(None, b"p1"), ext_data(None, b"p2")])
    assert bodies(plain, 4) == [b"m1", b"m2", b"p1", b"p2"]
    # HTTP: ext= is re-marshalled by Go (keys sorted), X-NSQEXT-<Key> headers lower-cased
    ext = urllib.parse.quote('{"z":"1","a":"2"}')
    status, answer = server.post(f"/pub_ext?topic=xt&ext={ext}", b"h1")
    assert (status, answer) == (200, b"OK")
    req = urllib.request.Request(server.url("/mpub_ext?topic=xt"), data=b"h2\nh3", method="POST",
                                 headers={"X-NSQEXT-Color": "red"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
    assert bodies(ext_client, 3) == sorted([ext_data(b'{"a":"2","z":"1"}', b"h1"),
                                            ext_data(b'{"color":"red"}', b"h2"),
                                            ext_data(b'{"color":"red"}', b"h3")])
    assert bodies(plain, 3) == [b"h1", b"h2", b"h3"]
    # a REQ puts the message back with its headers: the plain client's copy in flight kept them
    plain.send(p.rdy(0))
    pc.send(pub_ext("xt", b'{"r":"1"}', b"again"))
    assert pc.response() == OK
    assert take(ext_client, 1)[0].body == ext_data(b'{"r":"1"}', b"again")
    plain.send(p.rdy(1))
    m = plain.message()
    assert m.body == b"again"
    # (no close right after: a close with unread bytes resets the connection, and the
    # REQ could be dropped with it)
    other = consumer(server, "xt", "plain", extend_support=True)
    plain.send(p.rdy(0) + p.req(m.id))
    again = other.message()
    assert (again.body, again.attempts) == (ext_data(b'{"r":"1"}', b"again"), 2)


def test_errors_are_youzans(nsqd_factory):
    server = nsqd_factory("--max-msg-size=20000")
    create_ext(server, "xt")
    assert server.post("/topic/create?topic=plain")[0] == 200
    c = Client(server)
    # headers on a topic without ext: not fatal
    c.send(pub_ext("plain", b'{"k":"v"}', b"x"))
    assert c.response() == (p.FRAME_TYPE_ERROR,
                            b"E_EXT_NOT_SUPPORT ext content not supported in topic plain")
    c.send(pub_ext("xt", b"{bad", b"x"))
    assert c.response() == (p.FRAME_TYPE_ERROR, b"E_INVALID_JSON_HEADER fail to parse json header")
    c.send(pub_ext("xt", b'{"##trace_id":1}', b"x"))
    assert c.response() == (p.FRAME_TYPE_ERROR, b"INVALID_TRACE_ID passin trace id should be string")
    # a traced PUB_EXT answers Youzan's 30 bytes: OK, id, trace id, offset, size
    c.send(pub_ext("xt", b'{"##trace_id":"77"}', b"x"))
    kind, answer = c.response()
    assert kind == p.FRAME_TYPE_RESPONSE and len(answer) == 30 and answer[:2] == b"OK"
    assert struct.unpack(">QQQI", answer[2:])[1] == 77
    # header length past the body: fatal
    c.send(b"PUB_EXT xt\n" + struct.pack(">I", 4) + struct.pack(">H", 5) + b"{}")
    assert c.response() == (p.FRAME_TYPE_ERROR,
                            b"E_BAD_BODY invalid body size 4 in ext json header content length")
    c = Client(server)
    c.send(pub_ext("nosuch", b'{"k":"v"}', b"x"))
    assert c.response() == (p.FRAME_TYPE_ERROR, b"E_TOPIC_NOT_EXIST ")
    c = Client(server)
    big = json.dumps({"k": "v" * 17000}).encode()
    c.send(pub_ext("xt", big, b"x"))
    assert c.response() == (p.FRAME_TYPE_ERROR,
                            b"E_BAD_BODY ext json header too long %d > 16384" % len(big))
    # a message whose stored form (its ext part too) is over --max-msg-size
    c = Client(server)
    c.send(p.pub("xt", b"x" * 20000))
    assert c.response() == (p.FRAME_TYPE_ERROR, b"E_PUB_FAILED PUB failed message too big for "
                                                b"an ext topic 20000 + 1 > 20000")
    c = Client(server)
    c.send(pub_ext("xt", b'{"k":"v"}', b"x" * (20000 - 11)))
    assert c.response() == (p.FRAME_TYPE_ERROR,
                            b"E_BAD_MESSAGE message too big for an ext topic 20001 > 20000")
    # extend_support on a topic without ext
    c = Client(server)
    c.send(p.identify({"extend_support": True}))
    assert c.response()[0] == p.FRAME_TYPE_RESPONSE
    c.send(p.sub("plain", "c"))
    assert c.response() == (p.FRAME_TYPE_ERROR, b"E_SUB_EXTEND_FORBIDDON this topic is not "
                                                b"extended and should not identify as extend "
                                                b"support.")
    c = Client(server)
    c.send(p.identify({"desired_tag": "t" * 101}))
    assert c.response() == (p.FRAME_TYPE_ERROR,
                            b"E_BAD_BODY IDENTIFY invalid tag len 101, exceed limit 100")
    # HTTP
    assert server.post("/topic/create?topic=plain&ext=true") == (400, b'{"message":"TOPIC_EXISTS_WITHOUT_EXT"}')
    assert server.post("/topic/create?topic=xt&extend=true")[0] == 200
    ext = urllib.parse.quote('{"k":"v"}')
    assert server.post(f"/pub_ext?topic=plain&ext={ext}", b"x") == (400, b'{"message":"E_EXT_NOT_SUPPORT"}')
    assert server.post("/pub_ext?topic=xt&ext=%7Bbad", b"x") == (400, b'{"message":"E_INVALID_JSON_HEADER"}')
    assert server.post(f"/pub_ext?topic=nosuch&ext={ext}", b"x")[0] == 404
    # a traced /pub_ext answers Youzan's JSON with the message's ID, found in the trace log
    traced = urllib.parse.quote('{"##trace_id":"5"}')
    status, body = server.post(f"/pub_ext?topic=xt&ext={traced}", b"x")
    answer = json.loads(body)
    assert (status, answer["status"], answer["trace_id"]) == (200, "OK", "5")
    assert answer["rawsize"] == 4 + 26 + 3 + len(b'{"##trace_id":"5"}') + 1
    assert history(server, "topic=xt&trace_id=5")[0]["id"] == f"{answer['id']:016x}"


def history(server, query):
    """GET /message/trace's events (nsqd/tracing/trace.py)."""
    status, body = server.get(f"/message/trace?{query}")
    assert status == 200
    return json.loads(body)["events"]


def _kill_all(server):
    procs = [psutil.Process(server.proc.pid)] + psutil.Process(server.proc.pid).children()
    for proc in procs:
        proc.kill()
    server.proc.wait(10)


def test_headers_survive_disk_log_restart_and_sigkill(nsqd_factory, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory("--mem-queue-size=4", data_path=data)
    create_ext(server, "xt")
    create_ext(server, "lx", "&partition_num=2")
    for topic in ("xt", "lx"):
        c = consumer(server, topic, "c", rdy=0, extend_support=True)
        c.close()
    pc = Client(server)
    sent = []
    for i in range(40):  # most of them past the 4 of memory: on disk
        headers = b'{"i":"%d"}' % i
        for topic in ("xt", "lx"):
            pc.send(pub_ext(topic, headers, b"b%d" % i))
            assert pc.response() == OK
        sent.append(ext_data(headers, b"b%d" % i))
    server.stop()
    again = nsqd_factory("--mem-queue-size=4", data_path=data, prefix=server.prefix)
    first = {}
    for topic in ("xt", "lx"):
        c = consumer(again, topic, "c", rdy=20, extend_support=True)
        first[topic] = set(bodies(c, 20))
        assert first[topic] <= set(sent) and len(first[topic]) == 20
        c.send(p.rdy(0))
        c.close()  # what it held in flight goes back to the channel
    _kill_all(again)
    third = nsqd_factory("--mem-queue-size=4", data_path=data, prefix=server.prefix)
    for topic in ("xt", "lx"):
        c = consumer(third, topic, "c", extend_support=True)
        rest = set()
        while first[topic] | rest != set(sent):
            rest.add(take(c, 1)[0].body)
        assert rest <= set(sent)


# -- ext_filter (nsqd/ext_filter.go) and tag dispatch, several consumers ----------------------

FILTER_ROWS = [b'{"k":"a"}', b'{"k":"ab"}', b'{"k":"b1"}', None, b'{"k":"ax"}']
FILTERS = [  # channel, ext_filter, the messages (by FILTER_ROWS index) it gets
    ("equal", {"type": 1, "filter_ext_key": "k", "filter_data": "a"}, [0]),
    ("regexp", {"type": 2, "filter_ext_key": "k", "filter_data": "^a.$"}, [1, 4]),
    ("glob", {"type": 3, "filter_ext_key": "k", "filter_data": "b*"}, [2]),
    ("inverse", {"type": 1, "inverse": True, "filter_ext_key": "k", "filter_data": "a"},
     [1, 2, 3, 4]),
    ("multi", {"type": 4, "filter_ext_key": "any", "filter_data_list": [
        {"filter_ext_key": "k", "filter_data": "a"}, {"filter_ext_key": "k", "filter_data": "b1"}]},
     [0, 2]),
    ("none", None, [0, 1, 2, 3, 4]),
]


def channel_depths(server, topic):
    _, body = server.get(f"/stats?format=json&topic={topic}&include_clients=false")
    topics = json.loads(body)["topics"]
    return {c["channel_name"]: (c["depth"], c["in_flight_count"])
            for t in topics for c in t["channels"]}


def test_ext_filter_confirms_what_does_not_match(nsqd_factory):
    server = nsqd_factory()
    create_ext(server, "xf")
    consumers = {}
    for channel, spec, _ in FILTERS:
        identify = {"ext_filter": spec} if spec else {}
        consumers[channel] = consumer(server, "xf", channel, **identify)
    pc = Client(server)
    for i, headers in enumerate(FILTER_ROWS):
        body = b"%d" % i
        pc.send(p.pub("xf", body) if headers is None else pub_ext("xf", headers, body))
        assert pc.response() == OK
    for channel, _, wanted in FILTERS:
        c = consumers[channel]
        assert bodies(c, len(wanted)) == [b"%d" % i for i in wanted], channel
        assert nothing_more(c, wait=0.3), channel
    # the others were confirmed for the channel: nothing waits, nothing is in flight
    for channel, state in channel_depths(server, "xf").items():
        assert state == (0, 0), (channel, state)
    _, body = server.get("/stats?format=json&topic=xf")
    topic = json.loads(body)["topics"][0]
    assert topic["is_ext"] is True
    assert {c["channel_name"]: c["ext_filtered_count"] for c in topic["channels"]} == {
        channel: len(FILTER_ROWS) - len(wanted) for channel, _, wanted in FILTERS}


@pytest.mark.parametrize("kind", ["classic", "log"])
def test_tag_dispatch(nsqd_factory, kind):
    server = nsqd_factory()
    create_ext(server, "xg", "&partition_num=2" if kind == "log" else "")
    x = consumer(server, "xg", "c", desired_tag="x")
    y = consumer(server, "xg", "c", desired_tag="y")
    untagged = consumer(server, "xg", "c")
    other = consumer(server, "xg", "other")  # another channel gets every message
    pc = Client(server)
    sent = []
    for tag, n in (("x", 3), ("y", 2), ("z", 2), (None, 2)):
        for i in range(n):
            body = b"%s%d" % ((tag or "none").encode(), i)
            headers = b'{"##client_dispatch_tag":"%s"}' % tag.encode() if tag else b'{"k":"v"}'
            pc.send(pub_ext("xg", headers, body))
            assert pc.response() == OK
            sent.append(body)
    assert bodies(x, 3) == [b"x0", b"x1", b"x2"]
    assert bodies(y, 2) == [b"y0", b"y1"]
    # a tag nobody wants, and no tag: the untagged consumers (Youzan's rule)
    assert bodies(untagged, 4) == [b"none0", b"none1", b"z0", b"z1"]
    assert bodies(other, len(sent)) == sorted(sent)
    for c in (x, y, untagged):
        assert nothing_more(c, wait=0.3)
    # a tagged message waits for its consumer while it is connected; once it is
    # gone, the untagged consumers get it
    x.send(p.rdy(0))
    pc.send(pub_ext("xg", b'{"##client_dispatch_tag":"x"}', b"x3"))
    assert pc.response() == OK
    assert nothing_more(untagged, wait=0.3)
    x.close()
    assert take(untagged, 1)[0].body == b"x3"


def test_a_log_channel_confirms_what_its_filter_skips(nsqd_factory):
    server = nsqd_factory()
    create_ext(server, "lf", "&partition_num=2")
    c = consumer(server, "lf", "c", ext_filter={"type": 1, "filter_ext_key": "k",
                                                "filter_data": "yes"})
    pc = Client(server)
    for i in range(20):
        pc.send(pub_ext("lf", b'{"k":"%s"}' % (b"yes" if i % 4 == 0 else b"no"), b"%d" % i,
                        partition=i % 2))
        assert pc.response() == OK
    assert bodies(c, 5) == sorted(b"%d" % i for i in range(0, 20, 4))
    # every offset of both partitions is finished: the skipped ones by the filter
    assert wait_for(lambda: confirmed(server, "lf", "c") == [10, 10])
    # Youzan's /message/get: the body without the ext part, the headers with needext=true
    query = "/message/get?topic=lf&partition=0&search_mode=count&search_pos=3"
    for extra, headers in (("", ""), ("&needext=true", '{"k":"yes"}')):
        status, body = server.get(query + extra)
        got = json.loads(body)
        assert (status, got["body"], got["ext"]) == (200, "4", headers)


def test_the_flag_survives_a_kill_whichever_worker_made_it(nsqd_factory, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory(data_path=data)
    for index, conn in http_on_each_worker(server).items():
        assert http_call(conn, "POST", f"/topic/create?topic=x{index}&ext=true")[0] == 200
    _kill_all(server)  # (nothing written at a graceful stop)
    again = nsqd_factory(data_path=data, prefix=server.prefix)
    pc = Client(again)
    for index in range(server.workers):
        pc.send(pub_ext(f"x{index}", b'{"k":"v"}', b"b"))
        assert pc.response() == OK


# -- INTERNAL_CREATE_TOPIC (protocol_v2.go internalCreateTopic) -----------------------------

def test_internal_create_topic(nsqd_factory):
    """Partition 0 of a new name: the classic topic (ext when asked); a log
    topic's partitions; anything else E_CREATE_TOPIC_FAILED, not fatal; bad
    lines with Youzan's fatal answers (their table: tests/unit/youzan)."""
    server = nsqd_factory()
    assert server.post("/topic/create?topic=lt&partition_num=2")[0] == 200
    c = Client(server)
    failed = (p.FRAME_TYPE_ERROR, b"E_CREATE_TOPIC_FAILED CREATE_TOPIC %s failed")
    for line, answer in [(b"ct 0", OK), (b"cx 0 true", OK), (b"ct 0 true", OK),
                         (b"ct 1", (failed[0], failed[1] % b"ct")),
                         (b"lt 1", OK), (b"lt 2", (failed[0], failed[1] % b"lt"))]:
        c.send(b"INTERNAL_CREATE_TOPIC %s\n" % line)
        assert c.response() == answer, line
    c.send(p.nop() + p.pub("ct", b"still open"))
    assert c.response() == OK
    _, body = server.get("/stats?format=json")
    topics = {t["topic_name"]: t for t in json.loads(body)["topics"]}
    assert (topics["ct"].get("is_ext"), topics["cx"].get("is_ext")) == (None, True)  # ct: as it was
    assert topics["ct"]["message_count"] == 1
    for line, answer in [
            (b"ct", b"E_INVALID CREATE_TOPIC insufficient number of parameters"),
            (b"ct 0 maybe", b'E_BAD_EXT topic ext is not valid: strconv.ParseBool: '
                            b'parsing "maybe": invalid syntax'),
            (b"ct -1", b"E_BAD_PARTITION partition should not less than 0")]:
        c = Client(server)
        c.send(b"INTERNAL_CREATE_TOPIC %s\n" % line)
        assert c.response() == (p.FRAME_TYPE_ERROR, answer), line
        with pytest.raises(ConnectionError):  # fatal: closed after the error
            c.frame()


# -- SUB_ADVANCED / SUB_ORDERED frames: Youzan's EnableTrace detail -------------------------

def test_sub_advanced_frames_carry_the_queue_offset_and_raw_size(nsqd_factory):
    """After the ID and the ext part: [8 BE queue offset][4 BE raw size], which
    youzan/go-nsq takes off every frame of a SUB_ADVANCED or SUB_ORDERED
    connection.  A classic topic's queue offset is 0, its raw size a disk
    queue record's (4 + message); a plain SUB's frames have neither."""
    from nsqshm.youzan.frames import decode_message

    server = nsqd_factory()
    create_ext(server, "xd")
    assert server.post("/topic/create?topic=cd")[0] == 200
    clients = {}
    for topic, ext in (("xd", True), ("cd", False)):
        for verb in ("SUB_ADVANCED", "SUB"):
            c = Client(server)
            c.send(p.identify({"feature_negotiation": True, "extend_support": ext}))
            assert c.response()[0] == p.FRAME_TYPE_RESPONSE
            c.send(b"%s %s %s\n" % (verb.encode(), topic.encode(), verb.lower().encode()))
            assert c.response() == OK
            c.send(p.rdy(10))
            clients[(topic, verb)] = c
    pc = Client(server)
    pc.send(pub_ext("xd", b'{"k":"a"}', b"with headers"))
    assert pc.response() == OK
    pc.send(p.pub("cd", b"plain body"))
    assert pc.response() == OK
    stored = {"xd": 26 + 3 + len(b'{"k":"a"}') + len(b"with headers"), "cd": 26 + len(b"plain body")}
    for (topic, verb), c in clients.items():
        kind, data = c.frame()
        while kind != p.FRAME_TYPE_MESSAGE:
            kind, data = c.frame()
        m = decode_message(data, ext=topic == "xd", detail=verb == "SUB_ADVANCED")
        assert m.body == (b"with headers" if topic == "xd" else b"plain body"), (topic, verb)
        if topic == "xd":
            assert m.headers == b'{"k":"a"}'
        assert (m.queue_offset, m.raw_size) == \
            ((0, 4 + stored[topic]) if verb == "SUB_ADVANCED" else (0, 0)), (topic, verb)


def test_a_sampling_client_of_an_ext_log_topic_gets_filters_and_detail_in_place(nsqd_factory):
    """A log channel's client with a sample rate takes the same C call as any
    other (InFlight.deliver with its ext view and detail): with
    extend_support its SUB_ADVANCED frames carry the 12 detail bytes after the
    ext part, its ext_filter applies, and what it samples out or filters out
    is finished in the cursor, so the confirmed offset reaches the end."""
    from nsqshm.youzan.frames import decode_message

    server = nsqd_factory()
    create_ext(server, "xs", "&partition_num=1")
    clients = {}
    # sample_rate 99 delivers everything (nsqd drops when rand(100) > rate) yet
    # takes the sampling client's path; 5 delivers about one in 17
    for channel, identify in (("all", {"sample_rate": 99}),
                              ("picky", {"sample_rate": 99, "ext_filter": {
                                  "type": 1, "filter_ext_key": "k", "filter_data": "yes"}}),
                              ("few", {"sample_rate": 5})):
        c = Client(server)
        c.send(p.identify({"feature_negotiation": True, "extend_support": True, **identify}))
        assert c.response()[0] == p.FRAME_TYPE_RESPONSE
        c.send(b"SUB_ADVANCED xs %s 0 msgcount:0\n" % channel.encode())
        assert c.response() == OK
        c.send(p.rdy(100))
        clients[channel] = c
    pc = Client(server)
    rows = [(b'{"k":"%s"}' % (b"yes" if i % 3 == 0 else b"no"), b"body %d" % i) for i in range(30)]
    for headers, body in rows:
        pc.send(pub_ext("xs", headers, body))
        assert pc.response() == OK
    wanted = {"all": list(range(30)), "picky": list(range(0, 30, 3))}
    for channel, indexes in wanted.items():
        c = clients[channel]
        for i in indexes:
            kind, data = c.frame()
            while kind != p.FRAME_TYPE_MESSAGE:
                kind, data = c.frame()
            m = decode_message(data, ext=True, detail=True)
            headers, body = rows[i]
            assert (m.headers, m.body) == (headers, body), channel
            # the byte offset in the log (the records before it) and the record's size
            sizes = [16 + 26 + 3 + len(h) + len(b) for h, b in rows]
            assert (m.queue_offset, m.raw_size) == (sum(sizes[:i]), sizes[i])
            c.send(p.fin(m.id))
        assert nothing_more(c, wait=0.3), channel
    few = clients["few"]
    got = 0
    few.sock.settimeout(1)
    try:
        while True:
            kind, data = few.frame()
            if kind == p.FRAME_TYPE_MESSAGE:
                few.send(p.fin(decode_message(data, ext=True, detail=True).id))
                got += 1
    except TimeoutError:
        pass
    assert got <= 15  # (binomial, n 30, p 0.06: more than 15 has odds below 1e-12)
    for channel in ("all", "picky", "few"):
        assert wait_for(lambda channel=channel: confirmed(server, "xs", channel) == [30]), channel
    for c in (*clients.values(), pc):
        c.close()
