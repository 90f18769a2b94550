"""Publish bodies and the traced reply, byte for byte (youzan/nsq nsqdserver/protocol_v2.go
internalPubExtAndTrace, readMPUBEXT, getTracedReponse; newest stored version)."""

import struct

import pytest

from nsqshm.nsqd.errors import ClientErr
from nsqshm.youzan import bodies as b

PUBX = "protocol_v2.go internalPubExtAndTrace"
READ = "protocol_v2.go readMPUBEXT"


def outcome(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except ClientErr as e:
        return (e.wire, e.fatal)


def test_traced_reply():
    # getTracedReponse: "OK" + 8 id + 8 trace id + 8 offset + 4 raw size; go-nsq
    # producer.go reads resp[2:18] (GetNewMessageID takes the first 8), [18:26], [26:30]
    assert b.traced_reply(0x0400000000000001, 7, 4096, 42) == (
        b"OK" + b"\x04\x00\x00\x00\x00\x00\x00\x01" + b"\x00" * 7 + b"\x07"
        + b"\x00\x00\x00\x00\x00\x00\x10\x00" + b"\x00\x00\x00\x2a")


PUB_TRACE_CASES = [
    (b"\x00" * 7 + b"\x09" + b"m", b.Published(b"m", 9, None, True), PUBX + " traceEnable"),
    (b"\x00" * 8, (b"E_BAD_BODY invalid body size 8 with trace id enabled", True),
     PUBX + " bodyLen <= MsgTraceIDLength"),
]


@pytest.mark.parametrize("body,expected,src", PUB_TRACE_CASES)
def test_parse_pub_trace(body, expected, src):
    assert outcome(b.parse_pub_trace, body) == expected


def ext(headers, body=b"x"):
    return struct.pack(">H", len(headers)) + headers + body


NOT_SUPPORTED = (b"E_EXT_NOT_SUPPORT ext content not supported in topic t", False)
PUB_EXT_CASES = [
    # (body, topic is ext, allow_ext_compatible, expected, source)
    (ext(b'{"k":"v"}'), True, False, b.Published(b"x", 0, b'{"k":"v"}', False), PUBX),
    (ext(b'{"##trace_id":"123"}'), True, False,
     b.Published(b"x", 123, b'{"##trace_id":"123"}', True), PUBX + " needTraceRsp"),
    (b"\x00", True, False, (b"E_BAD_BODY invalid body size 1 with ext json header enabled", True),
     PUBX + " bodyLen <= MsgJsonHeaderLength"),
    (b"\x00\x02{}", True, False,
     (b"E_BAD_BODY invalid body size 4 in ext json header content length", True),
     PUBX + " bodyLen <= 2+extJsonLen (the body may not be empty)"),
    (ext(b""), True, False, (b"E_INVALID_JSON_HEADER fail to parse json header", False),
     PUBX + " (an empty header is not JSON)"),
    (ext(b"{bad"), True, False, (b"E_INVALID_JSON_HEADER fail to parse json header", False),
     PUBX + " NewClientErr: not fatal"),
    (ext(b"[1]"), True, False, (b"E_INVALID_JSON_HEADER fail to parse json header", False),
     "nsqshm: headers are an object"),
    (ext(b'{"a":NaN}'), True, False, (b"E_INVALID_JSON_HEADER fail to parse json header", False),
     "Go's JSON has no NaN"),
    (ext(b'{"##trace_id":123}'), True, False,
     (b"INVALID_TRACE_ID passin trace id should be string", False), PUBX),
    (ext(b'{"##trace_id":"-1"}'), True, False, (b"INVALID_TRACE_ID invalid trace id", False),
     PUBX + " ParseUint"),
    (ext(b'{"k":"v"}'), False, False, NOT_SUPPORTED, PUBX + " !topic.IsExt()"),
    (ext(b'{"k":"v"}'), False, True, NOT_SUPPORTED, PUBX + " canIgnoreJsonHeader: a custom key"),
    (ext(b'{"##client_dispatch_tag":"a"}'), False, True, b.Published(b"x", 0, None, False),
     PUBX + " AllowExtCompatible && canIgnoreExt: published without ext"),
]


@pytest.mark.parametrize("body,topic_ext,compat,expected,src", PUB_EXT_CASES)
def test_parse_pub_ext(body, topic_ext, compat, expected, src):
    assert outcome(b.parse_pub_ext, body, "t", topic_ext, compat) == expected


def mpub_body(*blocks, count=None):
    n = len(blocks) if count is None else count
    return struct.pack(">i", n) + b"".join(struct.pack(">i", len(x)) + x for x in blocks)


MPUB_CASES = [
    # (body, kind, topic ext, compat, expected, source)
    (mpub_body(b"a", b"bc"), b.MPUB, False, False, [b.Published(b"a"), b.Published(b"bc")], READ),
    (mpub_body(b"a") + b"junk", b.MPUB, False, False, [b.Published(b"a")],
     "nsqshm: bytes after the last message are ignored"),
    (b"\x00\x00", b.MPUB, False, False, (b"E_BAD_BODY MPUB failed to read message count", True),
     READ),
    (mpub_body(count=0), b.MPUB, False, False, (b"E_BAD_BODY MPUB invalid message count 0", True),
     READ),
    (mpub_body(count=-1), b.MPUB, False, False,
     (b"E_BAD_BODY MPUB invalid message count -1", True), READ + " (int32 count)"),
    (mpub_body(count=5), b.MPUB, False, False, (b"E_BAD_BODY MPUB invalid message count 5", True),
     READ + " maxMessages = (maxBodySize - 4) / 5 = 4"),
    (mpub_body(count=2) + b"\x00\x00\x00\x01a\x00", b.MPUB, False, False,
     (b"E_BAD_MESSAGE MPUB failed to read message(1) body size", True), READ),
    (mpub_body(b""), b.MPUB, False, False,
     (b"E_BAD_MESSAGE MPUB invalid message(0) body size 0", True), READ),
    (mpub_body(b"x" * 31), b.MPUB, False, False,
     (b"E_BAD_MESSAGE MPUB message too big 31 > 30", True), READ),
    (mpub_body(b"abc")[:-1], b.MPUB, False, False,
     (b"E_BAD_MESSAGE MPUB failed to read message body", True), READ),
    (mpub_body(b"\x00" * 7 + b"\x05m"), b.MPUB_TRACE, False, False,
     [b.Published(b"m", 5)], READ + " traceEnable; go-nsq getMPubBodyForTrace"),
    (mpub_body(b"\x00" * 8), b.MPUB_TRACE, False, False,
     (b"E_BAD_MESSAGE MPUB invalid message(0) body size 8 for tracing", True), READ),
    (mpub_body(ext(b""), ext(b'{"##trace_id":"4"}', b"y")), b.MPUB_EXT, True, False,
     [b.Published(b"x"), b.Published(b"y", 4, b'{"##trace_id":"4"}')],
     READ + " extJsonLen 0: a plain message"),
    (mpub_body(b"\x01"), b.MPUB_EXT, True, False,
     (b"E_BAD_BODY invalid body size 1 in ext json header content length", True), READ),
    (mpub_body(ext(b"{bad")), b.MPUB_EXT, False, False, NOT_SUPPORTED,
     READ + " !topicExt && !allowExtCompatible is checked before the JSON"),
    (mpub_body(ext(b"{bad")), b.MPUB_EXT, True, False,
     (b"E_INVALID_JSON_HEADER fail to parse json header", False), READ),
    (mpub_body(ext(b'{"##k":"v"}')), b.MPUB_EXT, False, True, [b.Published(b"x")],
     READ + " canIgnoreJsonHeader"),
]


@pytest.mark.parametrize("body,kind,topic_ext,compat,expected,src", MPUB_CASES)
def test_parse_mpub(body, kind, topic_ext, compat, expected, src):
    # max message size 30, max body size 24 (so at most (24 - 4) / 5 = 4 messages)
    assert outcome(b.parse_mpub, body, 30, 24, kind, "t", topic_ext, compat) == expected
