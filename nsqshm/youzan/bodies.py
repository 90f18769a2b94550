"""Bodies of Youzan's publish commands, parsed as its nsqd does (youzan/nsq
nsqdserver/protocol_v2.go internalPubExtAndTrace, readMPUBEXT), and the reply of a
traced publish (getTracedReponse). The body is the block after the command line's
4-byte size, already read in full.

    PUB_TRACE   [8 BE trace id][message body]
    PUB_EXT     [2 BE header length n][n bytes: JSON object][message body]

    MPUB, MPUB_TRACE, MPUB_EXT:
    [4 BE count]( [4 BE size][size bytes] )*count, each sized block being
        MPUB        [message body]
        MPUB_TRACE  [8 BE trace id][message body]                (size counts the 8)
        MPUB_EXT    [2 BE header length n][n bytes JSON][body]   (n = 0: no headers)

    traced reply (PUB_TRACE, MPUB_TRACE, PUB_EXT with a "##trace_id" header):
    "OK"[8 BE message id][8 BE trace id][8 BE queue offset][4 BE raw size]   30 bytes

A message body must not be empty after its trace ID or headers (Youzan's checks are
"size <= prefix"). Headers must be a JSON object (nsqshm; Youzan takes any JSON value);
"##trace_id" in it must be a string of a uint64. Headers on a topic created without
ext are refused with E_EXT_NOT_SUPPORT, unless allow_ext_compatible and every key
starts with "##" (then they are dropped), as Youzan's AllowExtCompatible option.
"""

import json
import struct
from typing import NamedTuple

from nsqshm.nsqd.errors import (
    E_EXT_NOT_SUPPORT,
    E_INVALID_JSON_HEADER,
    INVALID_TRACE_ID,
    ClientErr,
    FatalClientErr,
)
from nsqshm.youzan.go_strconv import parse_uint

TRACE_ID_LENGTH = 8        # nsqd/message.go MsgTraceIDLength
HEADER_LENGTH_SIZE = 2     # nsqd/message.go MsgJsonHeaderLength
TRACE_ID_KEY = "##trace_id"                     # internal/ext/ext.go
CLIENT_DISPATCH_TAG_KEY = "##client_dispatch_tag"
RESERVED_PREFIX = "##"

MPUB = "MPUB"
MPUB_TRACE = "MPUB_TRACE"
MPUB_EXT = "MPUB_EXT"

_TRACED = struct.Struct(">2sQQQI")


class Published(NamedTuple):
    """One message of a publish command."""
    body: bytes
    trace_id: int = 0
    headers: bytes | None = None   # the JSON object as sent; None: store without ext
    traced: bool = False              # the reply is the traced one (PUB_EXT: a ##trace_id)


def traced_reply(msg_id, trace_id, queue_offset, raw_size):
    """getTracedReponse: "OK" + id + trace id + queue offset + raw size (30 bytes)."""
    return _TRACED.pack(b"OK", msg_id, trace_id, queue_offset, raw_size)


def parse_pub_trace(body):
    """PUB_TRACE's body: (trace id, message body)."""
    if len(body) <= TRACE_ID_LENGTH:
        raise FatalClientErr("E_BAD_BODY", f"invalid body size {len(body)} with trace id enabled")
    return Published(bytes(body[TRACE_ID_LENGTH:]), struct.unpack_from(">Q", body)[0],
                     None, True)


def _reject_constant(name):
    raise ValueError(name)  # NaN, Infinity: not JSON to Go


def _headers(raw):
    """The header object, or E_INVALID_JSON_HEADER (not fatal). Youzan's newest text
    appends ":" and Go's JSON error; the older fixed text is kept (no Go error text to
    copy byte for byte)."""
    try:
        obj = json.loads(bytes(raw).decode("utf-8"), parse_constant=_reject_constant)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        raise ClientErr(E_INVALID_JSON_HEADER, "fail to parse json header")
    return obj


def _trace_id(headers):
    """The "##trace_id" header: (trace id, present)."""
    if TRACE_ID_KEY not in headers:
        return 0, False
    value = headers[TRACE_ID_KEY]
    if not isinstance(value, str):
        raise ClientErr(INVALID_TRACE_ID, "passin trace id should be string")
    try:
        return parse_uint(value), True
    except ValueError:
        raise ClientErr(INVALID_TRACE_ID, "invalid trace id") from None


def _ext_on_plain_topic(headers, topic, allow_ext_compatible):
    """canIgnoreJsonHeader: headers on a topic without ext."""
    if allow_ext_compatible and all(k.startswith(RESERVED_PREFIX) for k in headers):
        return None
    raise ClientErr(E_EXT_NOT_SUPPORT, f"ext content not supported in topic {topic}")


def parse_pub_ext(body, topic, topic_ext, allow_ext_compatible=False):
    """PUB_EXT's body (an empty header, n = 0, is E_INVALID_JSON_HEADER, as Youzan)."""
    size = len(body)
    if size <= HEADER_LENGTH_SIZE:
        raise FatalClientErr("E_BAD_BODY",
                             f"invalid body size {size} with ext json header enabled")
    n = struct.unpack_from(">H", body)[0]
    if size <= HEADER_LENGTH_SIZE + n:
        raise FatalClientErr("E_BAD_BODY",
                             f"invalid body size {size} in ext json header content length")
    raw = bytes(body[HEADER_LENGTH_SIZE:HEADER_LENGTH_SIZE + n])
    headers = _headers(raw)
    trace_id, traced = _trace_id(headers)
    stored = raw
    if not topic_ext:
        stored = _ext_on_plain_topic(headers, topic, allow_ext_compatible)
    return Published(bytes(body[HEADER_LENGTH_SIZE + n:]), trace_id, stored, traced)


def parse_mpub(body, max_msg_size, max_body_size, kind=MPUB, topic="", topic_ext=False,
               allow_ext_compatible=False):
    """MPUB / MPUB_TRACE / MPUB_EXT bodies: a list of Published, or Youzan's error for
    the first bad message (readMPUBEXT). Bytes after the last message are ignored
    (Youzan reads the messages from the stream and leaves them there)."""
    end = len(body)
    if end < 4:
        raise FatalClientErr("E_BAD_BODY", "MPUB failed to read message count")
    count = struct.unpack_from(">i", body)[0]
    if count <= 0 or count > (max_body_size - 4) // 5:
        raise FatalClientErr("E_BAD_BODY", f"MPUB invalid message count {count}")
    out = []
    pos = 4
    for i in range(count):
        if end - pos < 4:
            raise FatalClientErr("E_BAD_MESSAGE", f"MPUB failed to read message({i}) body size")
        size = struct.unpack_from(">i", body, pos)[0]
        pos += 4
        if size <= 0:
            raise FatalClientErr("E_BAD_MESSAGE", f"MPUB invalid message({i}) body size {size}")
        if size > max_msg_size:
            raise FatalClientErr("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_msg_size}")
        if end - pos < size:
            raise FatalClientErr("E_BAD_MESSAGE", "MPUB failed to read message body")
        block = body[pos:pos + size]
        pos += size
        if kind == MPUB:
            out.append(Published(bytes(block)))
        elif kind == MPUB_TRACE:
            if size <= TRACE_ID_LENGTH:
                raise FatalClientErr("E_BAD_MESSAGE",
                                     f"MPUB invalid message({i}) body size {size} for tracing")
            out.append(Published(bytes(block[TRACE_ID_LENGTH:]),
                                 struct.unpack_from(">Q", block)[0]))
        else:
            out.append(_mpub_ext_message(block, topic, topic_ext, allow_ext_compatible))
    return out


def _mpub_ext_message(block, topic, topic_ext, allow_ext_compatible):
    size = len(block)
    n = struct.unpack_from(">H", block)[0] if size >= HEADER_LENGTH_SIZE else 0
    if size <= HEADER_LENGTH_SIZE + n:
        raise FatalClientErr("E_BAD_BODY",
                             f"invalid body size {size} in ext json header content length")
    body = bytes(block[HEADER_LENGTH_SIZE + n:])
    if n == 0:
        return Published(body)
    if not topic_ext and not allow_ext_compatible:
        raise ClientErr(E_EXT_NOT_SUPPORT, f"ext content not supported in topic {topic}")
    raw = bytes(block[HEADER_LENGTH_SIZE:HEADER_LENGTH_SIZE + n])
    headers = _headers(raw)
    trace_id, _ = _trace_id(headers)
    stored = raw if topic_ext else _ext_on_plain_topic(headers, topic, allow_ext_compatible)
    return Published(body, trace_id, stored)
