"""Consume positions of log topics (LogChannel.seek, Partition.position) on
real servers of one and two workers: SUB_ADVANCED and SUB with a partition,
POST /channel/setoffset, GET /message/get (Youzan's wire and HTTP)."""

import json
import time
import urllib.error
import urllib.request

import pytest

from nsqshm import protocol as p
from nsqshm._core.logcursor import decode_message_id
from nsqshm.nsqd.logtopics.partition import partition_owner
from tests.nsqd.conftest import http_call, http_on_worker, wait_for
from tests.nsqd.logtopics.test_log_topics import (
    channel_stats,
    create,
    detail,
    mpub_numbered,
    nothing_more,
    pub,
    stats,
    take,
)
from tests.nsqd.workers.test_workers import Client, client_on_worker

WORKER_COUNTS = (1, 2)
N = 30       # messages published to partition 0
SPLIT = 10   # the first SPLIT are published a second before the others


def _publish(server):
    """N messages to partition 0 of a 2-partition log topic: SPLIT, then the
    rest from a later second on; that second."""
    create(server, "lt", 2)
    pc = Client(server)
    for i in range(SPLIT):
        assert pub(pc, "lt", b"m%d" % i, partition=0) == (p.FRAME_TYPE_RESPONSE, b"OK")
    later = int(time.time()) + 1
    time.sleep(later - time.time() + 0.05)
    for i in range(SPLIT, N):
        assert pub(pc, "lt", b"m%d" % i, partition=0) == (p.FRAME_TYPE_RESPONSE, b"OK")
    # a PUB taken by the worker that does not own the partition is acknowledged once in
    # its inbound ring; the owner appends it a moment later (a loaded machine: later
    # still), and the end a position names (special:-1) is the log's
    assert wait_for(lambda: stats(server, "lt")["partitions"][0]["end_offset"] == N)
    return later


def _sub_advanced(server, channel, position, partition=b"0"):
    c = Client(server)
    c.send(b"SUB_ADVANCED lt %s %s %s\n" % (channel.encode(), partition, position))
    return c, c.response()


def _receives_from(client, first):
    """Every message of partition 0 from msg offset `first` on, once, in order."""
    client.send(p.rdy(100))
    got = take(client, N - first)
    assert [decode_message_id(m.id) for m in got] == [(0, o) for o in range(first, N)]
    # the frames carry each message's byte offset in the log, as Youzan's (the
    # records before it: a 16-byte header and the message each), and its size there
    assert [detail(m) for m in got] == [(_byte_offset(o), _record_size(o), b"m%d" % o)
                                        for o in range(first, N)]
    assert nothing_more(client)


def _record_size(offset):
    return 16 + 26 + len(b"m%d" % offset)


def _byte_offset(offset):
    return sum(_record_size(o) for o in range(offset))


def _get(server, path):
    try:
        with urllib.request.urlopen(server.url(path), timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _message_get(server, query):
    status, body = _get(server, f"/message/get?topic=lt&{query}")
    return status, json.loads(body)


def test_sub_advanced_positions(nsqd_factory):
    server = nsqd_factory()
    later = _publish(server)
    # count: from 1, as Youzan's (the 8th message is msg offset 7)
    status, seventh = _message_get(server, "partition=0&search_mode=count&search_pos=8")
    assert status == 200 and seventh["body"] == "m7"
    assert seventh["offset"] == _byte_offset(7)
    cases = [("e", b"special:-2", 0), ("t", b"timestamp:%d" % later, SPLIT),
             ("v", b"virtual_queue:%d" % seventh["offset"], 7), ("m", b"msgcount:13", 12),
             ("m1", b"msgcount:1", 0), ("m0", b"msgcount:0", 0)]
    for channel, position, first in cases:
        c, answer = _sub_advanced(server, channel, position)
        assert answer == (p.FRAME_TYPE_RESPONSE, b"OK"), (position, answer)
        _receives_from(c, first)
    # special:-1: only what is published from now on
    c, answer = _sub_advanced(server, "end", b"special:-1")
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    c.send(p.rdy(10))
    assert nothing_more(c)
    assert pub(Client(server), "lt", b"new", partition=0) == (p.FRAME_TYPE_RESPONSE, b"OK")
    assert [detail(m)[2] for m in take(c, 1)] == [b"new"]


def test_positions_outside_the_log_or_inside_a_record_are_youzans(nsqd_factory):
    """Youzan's SearchLogByMsgCnt/SearchLogByMsgOffset never fail for a value
    outside the log (their binary search stops at the nearest commit log
    entry): before the start is the start, past the end the end; a byte inside
    a record is the record after it (read forward to the first at or after)."""
    server = nsqd_factory()
    _publish(server)
    inside_7 = _byte_offset(7) + 3
    for channel, position, first in (("below", b"msgcount:-3", 0),
                                     ("inside", b"virtual_queue:%d" % inside_7, 8),
                                     ("vbelow", b"virtual_queue:-9", 0)):
        c, answer = _sub_advanced(server, channel, position)
        assert answer == (p.FRAME_TYPE_RESPONSE, b"OK"), (position, answer)
        _receives_from(c, first)
    past = []
    for channel, position in (("past", b"msgcount:99"), ("vpast", b"virtual_queue:99999")):
        c, answer = _sub_advanced(server, channel, position)
        assert answer == (p.FRAME_TYPE_RESPONSE, b"OK"), (position, answer)
        assert channel_stats(server, "lt", channel)["partitions"][0]["confirmed_offset"] == N
        c.send(p.rdy(10))
        past.append(c)
    assert all(nothing_more(c) for c in past)
    assert pub(Client(server), "lt", b"new", partition=0) == (p.FRAME_TYPE_RESPONSE, b"OK")
    assert [[detail(m)[2] for m in take(c, 1)] for c in past] == [[b"new"], [b"new"]]
    # /channel/setoffset the same
    url = "/channel/setoffset?topic=lt&channel=below&partition=0"
    for body, confirmed in ((b"msgcount:31", N), (b"msgcount:32", N + 1), (b"msgcount:0", 0),
                            (b"virtual_queue:%d" % inside_7, 8)):
        assert server.post(url, body) == (200, b""), body
        assert channel_stats(server, "lt", "below")["partitions"][0]["confirmed_offset"] \
            == confirmed, body


def test_sub_advanced_moves_only_a_channel_without_clients(nsqd_factory):
    server = nsqd_factory()
    _publish(server)
    first, answer = _sub_advanced(server, "ch", b"msgcount:26")
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    assert wait_for(lambda: channel_stats(server, "lt", "ch")["client_count"] == 1)
    # a second client, on whichever worker: its position is ignored (Youzan's)
    second, answer = _sub_advanced(server, "ch", b"special:-2")
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    assert channel_stats(server, "lt", "ch")["partitions"][0]["confirmed_offset"] == 25
    first.send(p.rdy(100))
    got = take(first, N - 25)
    assert [detail(m)[2] for m in got] == [b"m%d" % o for o in range(25, N)]
    second.send(p.rdy(100))
    assert nothing_more(first) and nothing_more(second)


def test_sub_advanced_and_sub_errors(nsqd_factory):
    server = nsqd_factory()
    _publish(server)
    bad = [(b"SUB_ADVANCED lt c 0 msgcount\n", b"E_INVALID invalid consume offset:msgcount"),
           (b"SUB_ADVANCED lt c 0 msgcount:x\n",
            b'E_INVALID strconv.ParseInt: parsing "x": invalid syntax'),
           (b"SUB_ADVANCED lt c 0 special:-3\n", b"E_INVALID not supported offset type"),
           # Youzan's SearchLogByMsgTimestamp: "Invalid timestamp %v" below 0
           (b"SUB_ADVANCED lt c 0 timestamp:-1\n", b"E_INVALID Invalid timestamp -1"),
           (b"SUB_ADVANCED lt c x special:-1\n",
            b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": '
            b'invalid syntax'),
           # a partition the broker does not have: Youzan's nsqd finds no such
           # topic partition (internalSUB: getExistingTopic)
           (b"SUB_ADVANCED lt c 2 special:-1\n", b"E_TOPIC_NOT_EXIST "),
           (b"SUB lt c 2\n", b"E_TOPIC_NOT_EXIST "),
           (b"SUB_ORDERED lt c 2\n", b"E_TOPIC_NOT_EXIST "),
           (b"SUB_ORDERED lt c x\n", b'E_BAD_PARTITION topic partition is not valid: '
                                     b'strconv.Atoi: parsing "x": invalid syntax'),
           (b"SUB_ORDERED nosuch c 0\n", b"E_TOPIC_NOT_EXIST "),
           (b"SUB lt c x\n", b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: '
                             b'parsing "x": invalid syntax')]
    for line, text in bad:
        c = Client(server)
        c.send(line)
        kind, data = c.response()
        assert kind == p.FRAME_TYPE_ERROR, (line, data)
        if text is not None:
            assert data == text, (line, data)
        else:
            assert data.startswith(b"E_INVALID "), data
    # SUB with a valid partition subscribes (to the channel)
    c = Client(server)
    c.send(b"SUB lt c2 1\n")
    assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    # a classic topic is partition 0 alone (Youzan's view): another is not there;
    # a word that is no number is ignored, as nsqd ignores extra parameters
    for line, answer in [(b"SUB classic c x\n", (p.FRAME_TYPE_RESPONSE, b"OK")),
                         (b"SUB classic c 0\n", (p.FRAME_TYPE_RESPONSE, b"OK")),
                         (b"SUB classic c 2\n", (p.FRAME_TYPE_ERROR, b"E_TOPIC_NOT_EXIST ")),
                         (b"SUB_ADVANCED classic c 1\n",
                          (p.FRAME_TYPE_ERROR, b"E_TOPIC_NOT_EXIST "))]:
        c = Client(server)
        c.send(line)
        assert c.response() == answer, line
    c = Client(server)
    c.send(b"SUB_ADVANCED classic c 0 special:-2\n")
    assert c.response() == (p.FRAME_TYPE_ERROR, b"E_INVALID not supported offset type")


def test_setoffset_on_each_worker(nsqd_factory):
    server = nsqd_factory()
    _publish(server)
    c, answer = _sub_advanced(server, "ch", b"special:-2")
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    _receives_from(c, 0)
    assert wait_for(lambda: channel_stats(server, "lt", "ch")["partitions"][0]["confirmed_offset"] == N)
    for index, first in zip(range(server.workers), (20, 5), strict=False):
        conn = http_on_worker(server, index)
        status, body = http_call(conn, "POST", "/channel/setoffset?topic=lt&channel=ch&partition=0",
                                 b"msgcount:%d" % (first + 1))
        assert (status, body) == (200, b""), body
        part = channel_stats(server, "lt", "ch")["partitions"][0]
        assert part["confirmed_offset"] == first
        _receives_from(c, first)
        conn.close()
    # errors: Youzan's
    url = "/channel/setoffset?topic=lt&channel=ch&partition=0"
    assert server.post(url, b"") == (406, b'{"message":"MSG_EMPTY"}')
    assert server.post(url, b"count:1") == (400, b'{"message":"invalid consume offset:count:1"}')
    assert server.post(url, b"special:-3") == (500, b'{"message":"not supported offset type"}')
    assert server.post(url, b"timestamp:-5") == (500, b'{"message":"Invalid timestamp -5"}')
    assert server.post("/channel/setoffset?topic=lt&channel=nope&partition=0", b"special:-1") \
        == (404, b'{"message":"CHANNEL_NOT_FOUND"}')
    assert server.post("/channel/setoffset?topic=lt&channel=ch&partition=2", b"special:-1") \
        == (404, b'{"message":"Topic partition not exist"}')
    assert server.post("/channel/setoffset?topic=nope&channel=ch&partition=0", b"special:-1") \
        == (404, b'{"message":"E_TOPIC_NOT_EXIST"}')
    assert server.post("/channel/setoffset?topic=lt&partition=0", b"special:-1") \
        == (400, b'{"message":"MISSING_ARG_CHANNEL"}')
    # no partition: every partition of the channel
    assert server.post("/channel/setoffset?topic=lt&channel=ch", b"special:-2")[0] == 200
    _receives_from(c, 0)


def test_message_get_by_each_mode(nsqd_factory):
    server = nsqd_factory()
    later = _publish(server)
    status, m = _message_get(server, "partition=0&search_mode=count&search_pos=13")
    assert status == 200
    assert list(m) == ["id", "trace_id", "body", "timestamp", "attempts", "offset",
                       "queue_cnt_index", "ext"]
    # queue_cnt_index: the message's count from 1, as Youzan's (msg offset + 1)
    assert (m["body"], m["queue_cnt_index"], m["trace_id"], m["ext"]) == ("m12", 13, 0, "")
    assert decode_message_id(b"%016x" % m["id"]) == (0, 12)
    assert abs(m["timestamp"] / 1e9 - time.time()) < 60
    by_id = _message_get(server, f"search_mode=id&search_pos={m['id']}")
    by_virtual = _message_get(server, f"partition=0&search_mode=virtual_offset&"
                                      f"search_pos={m['offset']}")
    assert by_id == by_virtual == (200, m)
    status, t = _message_get(server, f"partition=0&search_mode=timestamp&search_pos={later}")
    assert (status, t["body"], t["queue_cnt_index"]) == (200, f"m{SPLIT}", SPLIT + 1)
    # Youzan's searches: a count before the first is the first; a byte inside a
    # record finds the record after it
    for query, body in (("search_mode=count&search_pos=0", "m0"),
                        ("search_mode=count&search_pos=-7", "m0"),
                        ("search_mode=virtual_offset&search_pos=1", "m1"),
                        (f"search_mode=virtual_offset&search_pos={m['offset'] - 1}", "m12")):
        status, found = _message_get(server, "partition=0&" + query)
        assert (status, found.get("body")) == (200, body), query
    # misses and errors; nothing consumed, no channel made
    assert _message_get(server, "partition=0&search_mode=count&search_pos=30")[0] == 200
    assert _message_get(server, "partition=0&search_mode=count&search_pos=31")[0] == 404
    assert _message_get(server, "partition=0&search_mode=virtual_offset&"
                                f"search_pos={_byte_offset(N)}")[0] == 404
    assert _message_get(server, f"search_mode=id&search_pos={m['id'] + 100}")[0] == 404
    assert _message_get(server, "partition=2&search_mode=count&search_pos=0") == \
        (404, {"message": "Topic partition not exist"})
    assert _message_get(server, "partition=0&search_mode=bytes&search_pos=0") == \
        (400, {"message": "search mode should be one of id/count/virtual_offset"})
    assert _message_get(server, "partition=0&search_mode=count&search_pos=x") == \
        (400, {"message": 'strconv.ParseInt: parsing "x": invalid syntax'})
    assert _get(server, "/message/get?topic=nope&partition=0&search_mode=count&search_pos=0") \
        == (404, b'{"message":"E_TOPIC_NOT_EXIST"}')
    assert channel_stats_none(server)


def channel_stats_none(server):
    doc = json.loads(server.get("/stats?format=json")[1])
    topic = next(t for t in doc["topics"] if t["topic_name"] == "lt")
    return topic["channels"] == []


def test_setoffset_keeps_what_the_channel_holds_of_other_partitions(nsqd_factory):
    """A seek of partition 0 drops only partition 0's records from the ring:
    partition 1's messages waiting there are delivered, once."""
    server = nsqd_factory()
    _publish(server)
    # partition -1: none named (Youzan's default), so every partition, from their ends
    c, answer = _sub_advanced(server, "ch", b"special:-1", partition=b"-1")
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    pc = Client(server)
    for i in range(8):
        assert pub(pc, "lt", b"q%d" % i, partition=1) == (p.FRAME_TYPE_RESPONSE, b"OK")
    assert wait_for(lambda: channel_stats(server, "lt", "ch")["depth"] == 8)
    assert server.post("/channel/setoffset?topic=lt&channel=ch&partition=0",
                       b"msgcount:%d" % (N - 3))[0] == 200
    c.send(p.rdy(100))
    got = take(c, 12)
    assert sorted(decode_message_id(m.id) for m in got) == \
        [(0, o) for o in range(N - 4, N)] + [(1, o) for o in range(8)]
    assert nothing_more(c)


def test_sub_advanced_moves_each_partition_for_that_partitions_first_client(nsqd_factory):
    """go-nsq opens a connection per partition, each `SUB_ADVANCED t c <p>
    <position>` (consumer.go ConnectToNSQD).  Youzan's nsqd has a channel per
    topic partition, so each partition's first client sets that partition's
    position (internalSUB: channel.GetClientsCount() of that partition's
    channel): a client of partition 0 does not keep partition 1 from moving
    (found in review: the second connection's position was ignored)."""
    server = nsqd_factory()
    _publish(server)
    pc = Client(server)
    for i in range(8):
        assert pub(pc, "lt", b"q%d" % i, partition=1) == (p.FRAME_TYPE_RESPONSE, b"OK")
    assert wait_for(lambda: stats(server, "lt")["partitions"][1]["end_offset"] == 8)
    first, answer = _sub_advanced(server, "ch", b"msgcount:26", partition=b"0")
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    second, answer = _sub_advanced(server, "ch", b"msgcount:6", partition=b"1")
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    assert [pp["confirmed_offset"] for pp in channel_stats(server, "lt", "ch")["partitions"]] \
        == [25, 5]
    # partition 1 has its first client now: a third one's position is ignored
    third, answer = _sub_advanced(server, "ch", b"special:-2", partition=b"1")
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    assert channel_stats(server, "lt", "ch")["partitions"][1]["confirmed_offset"] == 5
    second.send(p.rdy(100))
    assert [decode_message_id(m.id) for m in take(second, 3)] == [(1, 5), (1, 6), (1, 7)]
    first.send(p.rdy(100))
    assert [decode_message_id(m.id) for m in take(first, N - 25)] == \
        [(0, o) for o in range(25, N)]
    assert nothing_more(first) and nothing_more(second) and nothing_more(third)


def test_sub_advanced_ignores_the_position_of_a_client_that_is_not_the_first(nsqd_factory):
    """Youzan looks a position up only for the partition's first client
    (internalSUB: `if cnt > 1` it only logs; SetChannelOffset's errors answer
    E_INVALID otherwise): a later client's position that is out of the log,
    or a special value it does not know, is ignored, and the SUB is OK."""
    server = nsqd_factory()
    _publish(server)
    first, answer = _sub_advanced(server, "ch", b"msgcount:26")
    assert answer == (p.FRAME_TYPE_RESPONSE, b"OK")
    for position in (b"msgcount:99", b"special:-3", b"virtual_queue:1",
                     b"timestamp:-1", b"timestamp:99999999999"):
        c, answer = _sub_advanced(server, "ch", position)
        assert answer == (p.FRAME_TYPE_RESPONSE, b"OK"), (position, answer)
        c.close()
    assert channel_stats(server, "lt", "ch")["partitions"][0]["confirmed_offset"] == 25
    # a parse error is answered whatever the channel holds (SUBADVANCED: FromBytes first)
    c, answer = _sub_advanced(server, "ch", b"msgcount:x")
    assert answer == (p.FRAME_TYPE_ERROR, b'E_INVALID strconv.ParseInt: parsing "x": '
                                          b'invalid syntax')


def _drain(client, idle=1.0):
    """The msg offsets of everything the client gets until it is idle, each FINed."""
    got = []
    client.sock.settimeout(idle)
    try:
        while True:
            try:
                m = client.message()
            except (TimeoutError, OSError):
                return got
            got.append(decode_message_id(m.id)[1])
            client.send(p.fin(m.id))
    finally:
        client.sock.settimeout(5)


@pytest.mark.workers(2)
def test_fins_taken_on_another_worker_during_a_seek_do_not_skip_messages_after_it(
        nsqd_factory):
    """A seek back (/channel/setoffset on the worker that does not own the
    partition) while the consumer, on the owner, FINs what it holds: every
    message from the new position comes again.  The seek resets the cursor
    first and drops what is in flight on the other worker only when that
    worker applies its broadcast; a FIN taken there in between marked its
    offset in the cursor's new window, so that message was never delivered
    again after the seek (found in review)."""
    server = nsqd_factory()
    create(server, "fr", 1)
    total, held_n = 4000, 2500
    mpub_numbered(Client(server), "fr", total, 1000)
    owner = partition_owner("fr", 0, 2)
    c = client_on_worker(server, owner, "fr", "ch")  # the topic's first channel: from 0
    conn = http_on_worker(server, 1 - owner)
    url = "/channel/setoffset?topic=fr&channel=ch&partition=0"
    c.send(p.rdy(held_n))
    missing = {}
    for rnd in range(6):
        held = [c.message() for _ in range(held_n)]
        fins = [p.fin(m.id) for m in held]
        conn.request("POST", url, body=b"msgcount:0")
        for fin in fins:  # FINs on the owner while the other worker seeks
            c.send(fin)
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"")
        got = set(_drain(c))
        if set(range(total)) - got:
            missing[rnd] = sorted(set(range(total)) - got)
        # the next round: from 0 again (nothing in flight now, no race)
        assert http_call(conn, "POST", url, b"msgcount:0") == (200, b"")
    assert not missing, {rnd: (len(m), m[:10]) for rnd, m in missing.items()}


def test_a_position_refused_leaves_no_channel_behind(nsqd_factory):
    """A SUB_ADVANCED naming a partition whose position has no answer is
    refused (E_INVALID, fatal) before the channel is touched: Youzan's client
    is removed again by the fatal error and an ephemeral channel goes with it
    (found in review: the partition's lane was made first, so an ephemeral
    channel that no client ever joins or leaves stayed)."""
    server = nsqd_factory()
    _publish(server)
    c, answer = _sub_advanced(server, "eph#ephemeral", b"timestamp:-1")
    assert answer == (p.FRAME_TYPE_ERROR, b"E_INVALID Invalid timestamp -1")
    c.close()
    time.sleep(0.3)
    assert stats(server, "lt")["channels"] == []
