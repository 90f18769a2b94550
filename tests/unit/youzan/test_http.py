"""Youzan's HTTP parsing and JSON, byte for byte (youzan/nsq nsqdserver/http.go,
nsqlookupd/http.go, internal/http_api/topic_channel_args.go)."""

import pytest

from nsqshm.youzan import http as h
from nsqshm.youzan.offset import END

ARGS = "internal/http_api/topic_channel_args.go GetTopicPartitionChannelArgs"
SETOFF = "nsqdserver/http.go doSetChannelOffset"
CREATE = "nsqlookupd/http.go doCreateTopic"
GET = "nsqdserver/http.go doMessageGet"
PUBX = "nsqdserver/http.go internalPUB (pubExt)"


def outcome(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except h.HTTPError as e:
        return (e.status, e.text)


ARGS_CASES = [
    ({"topic": "t", "channel": "c"}, ("t", -1, "c"), ARGS + " (partition missing: -1)"),
    ({"topic": ["t", "u"], "partition": "2", "channel": "c"}, ("t", 2, "c"), "url.Values.Get"),
    ({"channel": "c"}, (400, "MISSING_ARG_TOPIC"), ARGS),
    ({"topic": "t*", "channel": "c"}, (400, "INVALID_ARG_TOPIC"), ARGS),
    ({"topic": "t", "partition": "p", "channel": "c"},
     (400, 'strconv.Atoi: parsing "p": invalid syntax'), ARGS + " returns the Atoi error"),
    ({"topic": "t"}, (400, "MISSING_ARG_CHANNEL"), ARGS),
    ({"topic": "t", "channel": "c c"}, (400, "INVALID_ARG_CHANNEL"), ARGS),
]


@pytest.mark.parametrize("query,expected,src", ARGS_CASES)
def test_topic_partition_channel_args(query, expected, src):
    assert outcome(h.topic_partition_channel_args, query) == expected


@pytest.mark.parametrize("body,expected,src", [
    (b"special:-1", END, SETOFF + " ConsumeOffset.FromBytes"),
    (b"", (406, "MSG_EMPTY"), SETOFF),
    (b"special:-1\n", (400, 'strconv.ParseInt: parsing "-1\\n": invalid syntax'),
     SETOFF + " (the body is taken as is)"),
    (b"offset:3", (400, "invalid consume offset:offset:3"), SETOFF),
])
def test_setoffset_body(body, expected, src):
    assert outcome(h.setoffset_body, body) == expected


FULL = {"topic": "t", "partition_num": "4", "replicator": "2"}
CREATE_CASES = [
    (FULL, True, h.TopicCreate("t", 4, 2, 0, 0, 0, 0, False, False), CREATE),
    ({**FULL, "suggestload": "10", "syncdisk": "1000", "retention": "3", "orderedmulti": "true",
      "extend": "true"}, True, h.TopicCreate("t", 4, 2, 10, 1000, 3, 0, True, True), CREATE),
    ({"topic": "t", "partition_num": "2", "retention_days": "7", "retention_bytes": "1048576",
      "ext": "true"}, False, h.TopicCreate("t", 2, 1, 0, 0, 7, 1048576, False, True),
     "nsqshm's nsqd: replicator optional, retention_days, retention_bytes, ext"),
    ({"partition_num": "1"}, True, (400, "MISSING_ARG_TOPIC"), CREATE),
    ({"topic": "a/b", "partition_num": "1"}, True, (400, "INVALID_ARG_TOPIC"), CREATE),
    ({"topic": "t"}, True, (400, "MISSING_ARG_TOPIC_PARTITION_NUM"), CREATE),
    ({"topic": "t", "partition_num": "0"}, True, (400, "INVALID_ARG_TOPIC_PARTITION_NUM"),
     CREATE + " GetValidPartitionNum: 0 < num <= 255"),
    ({"topic": "t", "partition_num": "256"}, True, (400, "INVALID_ARG_TOPIC_PARTITION_NUM"),
     CREATE),
    ({"topic": "t", "partition_num": "1"}, True, (400, "MISSING_ARG_TOPIC_REPLICATOR"), CREATE),
    ({**FULL, "replicator": "6"}, True, (400, "INVALID_ARG_TOPIC_REPLICATOR"),
     CREATE + " GetValidReplicator: 0 < num <= 5"),
    ({**FULL, "suggestload": "10001"}, True, (400, "INVALID_ARG_TOPIC_LOAD_FACTOR"), CREATE),
    ({**FULL, "syncdisk": "x"}, True, (400, "INVALID_ARG_TOPIC_SYNC_DISK"), CREATE),
    ({**FULL, "retention": "x"}, True, (400, 'strconv.Atoi: parsing "x": invalid syntax'),
     CREATE + " retention: err.Error()"),
    ({**FULL, "retention_days": "-1"}, True, (400, "INVALID_ARG_TOPIC_RETENTION"),
     "nsqshm: no negative retention"),
]


@pytest.mark.parametrize("query,require,expected,src", CREATE_CASES)
def test_topic_create(query, require, expected, src):
    assert outcome(h.topic_create, query, require) == expected


ID3 = (3 << 50) | 17
GET_CASES = [
    ({"topic": "t", "partition": "1", "search_mode": "count", "search_pos": "10"},
     h.MessageGet("t", 1, "count", 10, False, False, ""), GET),
    ({"topic": "t", "search_mode": "id", "search_pos": str(ID3), "needext": "true"},
     h.MessageGet("t", 3, "id", ID3, True, False, ""), GET + " GetPartitionFromMsgID"),
    ({"topic": "t", "partition": "0", "search_mode": "timestamp", "search_pos": "1700000000"},
     h.MessageGet("t", 0, "timestamp", 1700000000, False, False, ""), "nsqshm's timestamp mode"),
    ({"topic": "t", "partition": "0", "search_mode": "count"},
     (400, 'strconv.ParseInt: parsing "": invalid syntax'), GET + " search_pos first"),
    ({"topic": "t", "search_mode": "count", "search_pos": "1"},
     (400, 'strconv.Atoi: parsing "": invalid syntax'), GET + " partition Atoi"),
    ({"topic": "t", "partition": "0", "search_mode": "offset", "search_pos": "1"},
     (400, "search mode should be one of id/count/virtual_offset"), GET),
]


@pytest.mark.parametrize("query,expected,src", GET_CASES)
def test_message_get(query, expected, src):
    assert outcome(h.message_get, query) == expected


def test_message_get_json():
    # doMessageGet's struct: id, trace_id, body, timestamp, attempts, offset,
    # queue_cnt_index, ext; Go's string(b) and JSON escapes (\u003c, U+FFFD per bad byte)
    assert h.message_get_json(ID3, 9, b"a<\xe2\x82", 1700000000000000000, 2, 4096, 7, b"") == (
        b'{"id":%d,"trace_id":9,"body":"a\\u003c\xef\xbf\xbd\xef\xbf\xbd","timestamp":'
        b'1700000000000000000,"attempts":2,"offset":4096,"queue_cnt_index":7,"ext":""}' % ID3)


EXT_CASES = [
    ('{"b":"1","a":2}', [("X-Nsqext-Foo", "x"), ("X-Nsqext-Foo", "y")], True, False,
     h.HTTPExt(b'{"a":2,"b":"1","foo":"x"}', 0, False),
     PUBX + " json.Marshal(map) sorts keys; X-Nsqext-* lower-cased, Header.Get's first value"),
    ('{"##trace_id":"77","n":1.5e21}', [], True, False,
     h.HTTPExt(b'{"##trace_id":"77","n":1.5e+21}', 77, True), PUBX + " (numbers are float64)"),
    ('{"a":1}', [("x-nsqext-a", "h")], True, False, h.HTTPExt(b'{"a":"h"}', 0, False),
     PUBX + " a header overrides the ext key"),
    ("", [], True, False, (400, "E_INVALID_JSON_HEADER"), PUBX + " headerStr == \"\""),
    ("%7B%22a%22%3A%22x+y%22%7D", [], True, False, h.HTTPExt(b'{"a":"x y"}', 0, False),
     PUBX + " url.QueryUnescape of the value once more"),
    ('{"a":"100%"}', [], True, False, (400, "E_INVALID_JSON_HEADER"),
     PUBX + " QueryUnescape error"),
    ("{x", [], True, False, (400, "E_INVALID_JSON_HEADER"), PUBX),
    ('{"##trace_id":5}', [], True, False, (400, "INVALID_TRACE_ID"), PUBX),
    ('{"##trace_id":"a"}', [], True, False, (400, "INVALID_TRACE_ID"), PUBX),
    ('{"a":"1"}', [], False, True, (400, "E_EXT_NOT_SUPPORT"), PUBX),
    ('{"##a":"1"}', [], False, True, h.HTTPExt(None, 0, False), PUBX + " AllowExtCompatible"),
]


@pytest.mark.parametrize("param,headers,topic_ext,compat,expected,src", EXT_CASES)
def test_http_ext(param, headers, topic_ext, compat, expected, src):
    assert outcome(h.http_ext, param, headers, topic_ext, compat) == expected


def test_traced_pub_json():
    # internalPUB's needTraceRsp struct: status, id, trace_id (the text sent), queue_offset, rawsize
    assert h.traced_pub_json(5, "0077", 4096, 40) == (
        b'{"status":"OK","id":5,"trace_id":"0077","queue_offset":4096,"rawsize":40}')
    assert outcome(h.pubtrace_trace_id, {"trace_id": "x"}) == (400, "INVALID_TRACE_ID")
    assert h.pubtrace_trace_id({"trace_id": "12"}) == 12
