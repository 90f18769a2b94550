"""Youzan's message frames and message IDs (youzan/nsq nsqd/message.go WriteToClient,
nsqdserver/protocol_v2.go messagePump/SendMessage; youzan/go-nsq message.go
DecodeMessageWithExt, consumer.go onConnMessage).

A frame is nsqd's [4 BE size][4 BE type = 2][data]; the data:

    [8 BE timestamp ns][2 BE attempts][16 id]                          always
    [1 ext version]                                                    if ext
    [2 BE header length n][n bytes JSON]                               if ext and version != 0
    [8 BE queue offset][4 BE raw size]                                 if detail
    [body]

ext:    the client said IDENTIFY extend_support and the topic was created with ext;
        the version is 4 (JSON headers) for a message with headers, 0 for one without.
detail: the client subscribed with SUB_ADVANCED or SUB_ORDERED; the queue offset is the
        message's byte offset in its partition's queue, the raw size its size there.
Attempts are capped at 4000 (maxAttempts); the client never sees the 0xa000 ext mark
that Youzan's disk format adds to attempts.

The 16-byte ID is binary: [8 BE internal id][8 BE trace id]. The internal id of a
partitioned topic carries the partition in bits 50..59 (consistence
GetPartitionFromMsgID); FIN/REQ/TOUCH send the 16 bytes back, and nsqd takes the first
8 as the id (GetMessageIDFromFullMsgID), which must be > 0.
"""

import struct
from typing import NamedTuple

FRAME_TYPE_MESSAGE = 2
MAX_ATTEMPTS = 4000             # nsqd/message.go maxAttempts
NO_EXT_VER = 0                  # internal/ext/ext.go
TAG_EXT_VER = 2
JSON_HEADER_EXT_VER = 4
PARTITION_SHIFT = 50            # consistence MAX_INCR_ID_BIT
PARTITION_LIMIT = 1024          # "the max partition id will be less than 1024"

_DETAIL = struct.Struct(">QI")      # queue offset, raw size
_FRAME = struct.Struct(">II")


def message_id(internal_id, trace_id=0):
    """The 16 ID bytes of the wire (GetFullMsgID)."""
    return struct.pack(">QQ", internal_id, trace_id)


def split_message_id(raw):
    """(internal id, trace id) of 16 ID bytes; ValueError("Invalid Message ID") for
    another length (getFullMessageID)."""
    if len(raw) != 16:
        raise ValueError("Invalid Message ID")
    return struct.unpack(">QQ", raw)


def partition_of(internal_id):
    return (internal_id >> PARTITION_SHIFT) & (PARTITION_LIMIT - 1)


def internal_id(partition, sequence):
    """An internal id that names its partition the way Youzan's does."""
    if not 0 <= partition < PARTITION_LIMIT or not 0 <= sequence < (1 << PARTITION_SHIFT):
        raise ValueError("partition or sequence out of range")
    return (partition << PARTITION_SHIFT) | sequence


def message_data(timestamp, attempts, msg_id, body, ext=None, detail=None):
    """A message frame's data. msg_id: the 16 ID bytes; ext: None, or (version,
    header bytes); detail: None, or (queue offset, raw size)."""
    if len(msg_id) != 16:
        raise ValueError("a message ID is 16 bytes")
    parts = [struct.pack(">QH", timestamp, min(attempts, MAX_ATTEMPTS)), bytes(msg_id)]
    if ext is not None:
        version, headers = ext
        parts.append(bytes((version,)))
        if version != NO_EXT_VER:
            if len(headers) > 0xFFFF:
                raise ValueError("extend data exceed the limit")
            parts.append(struct.pack(">H", len(headers)))
            parts.append(bytes(headers))
    if detail is not None:
        parts.append(_DETAIL.pack(*detail))
    parts.append(bytes(body))
    return b"".join(parts)


def message_frame(timestamp, attempts, msg_id, body, ext=None, detail=None):
    data = message_data(timestamp, attempts, msg_id, body, ext, detail)
    return _FRAME.pack(len(data) + 4, FRAME_TYPE_MESSAGE) + data


class Message(NamedTuple):
    timestamp: int
    attempts: int
    id: bytes                    # the 16 ID bytes, to send back in FIN/REQ/TOUCH
    body: bytes
    ext_version: int = NO_EXT_VER
    headers: bytes | None = None
    queue_offset: int = 0
    raw_size: int = 0

    @property
    def trace_id(self):
        return split_message_id(self.id)[1]


def decode_message(data, ext=False, detail=False):
    """A frame's data as youzan/go-nsq reads it (ValueError with go-nsq's text)."""
    short = ValueError("not enough data to decode valid message")
    if len(data) < 26:
        raise short
    timestamp, attempts = struct.unpack_from(">QH", data)
    msg_id = bytes(data[10:26])
    pos = 26
    version, headers = NO_EXT_VER, None
    if ext:
        if len(data) < pos + 1:
            raise short
        version = data[pos]
        pos += 1
        if version != NO_EXT_VER:
            if len(data) < pos + 2:
                raise short
            n = struct.unpack_from(">H", data, pos)[0]
            pos += 2
            if len(data) < pos + n:
                raise short
            headers = bytes(data[pos:pos + n])
            pos += n
    offset = raw_size = 0
    if detail:  # go-nsq's consumer takes 12 bytes off the body (it logs a short one)
        if len(data) < pos + 12:
            raise short
        offset, raw_size = _DETAIL.unpack_from(data, pos)
        pos += 12
    return Message(timestamp, attempts, msg_id, bytes(data[pos:]), version, headers,
                   offset, raw_size)
