"""Message frames and IDs, byte for byte (youzan/nsq nsqd/message.go internalWriteTo,
GetFullMsgID; consistence GetPartitionFromMsgID; youzan/go-nsq message.go
DecodeMessageWithExt, consumer.go onConnMessage)."""

import pytest

from nsqshm.youzan import frames as f

WRITE = "nsqd/message.go internalWriteTo(writeExt, writeCompatible=false, writeDetail)"
TS = b"\x00\x00\x00\x00\x00\x00\x00\x01"
ID = f.message_id(0x0008000000000005, 9)
IDB = b"\x00\x08\x00\x00\x00\x00\x00\x05" + b"\x00" * 7 + b"\x09"

DATA_CASES = [
    # (ext, detail, attempts, expected data, source)
    (None, None, 2, TS + b"\x00\x02" + IDB + b"body", WRITE + ": a plain message"),
    (None, None, 5000, TS + b"\x0f\xa0" + IDB + b"body", WRITE + ": Attempts > maxAttempts (4000)"),
    ((4, b'{"a":"b"}'), None, 1, TS + b"\x00\x01" + IDB + b"\x04\x00\x09" + b'{"a":"b"}' + b"body",
     WRITE + ": ExtVer, uint16 len, ExtBytes"),
    ((0, b""), None, 1, TS + b"\x00\x01" + IDB + b"\x00" + b"body",
     WRITE + ": NO_EXT_VER writes only the version byte"),
    (None, (4096, 42), 1, TS + b"\x00\x01" + IDB + b"\x00\x00\x00\x00\x00\x00\x10\x00"
     + b"\x00\x00\x00\x2a" + b"body", WRITE + ": Offset (8), RawMoveSize (4)"),
    ((4, b"{}"), (1, 2), 1, TS + b"\x00\x01" + IDB + b"\x04\x00\x02{}" + b"\x00" * 7 + b"\x01"
     + b"\x00\x00\x00\x02" + b"body", WRITE + ": ext before detail"),
]


@pytest.mark.parametrize("ext,detail,attempts,expected,src", DATA_CASES)
def test_message_data(ext, detail, attempts, expected, src):
    assert f.message_data(1, attempts, ID, b"body", ext, detail) == expected
    frame = f.message_frame(1, attempts, ID, b"body", ext, detail)
    assert frame[:8] == (len(expected) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x02"
    assert frame[8:] == expected
    # what go-nsq reads back (conn.ext from the lookup; consumer strips 12 bytes when
    # EnableOrdered or EnableTrace)
    msg = f.decode_message(expected, ext=ext is not None, detail=detail is not None)
    assert (msg.timestamp, msg.attempts, msg.id, msg.body) == (1, min(attempts, 4000), ID, b"body")
    if ext is not None:
        assert msg.ext_version == ext[0] and (msg.headers or b"") == ext[1]
    if detail is not None:
        assert (msg.queue_offset, msg.raw_size) == detail


def test_message_id():
    # nsqd/message.go GetFullMsgID: [8 BE ID][8 BE TraceID]; go-nsq GetTraceID: ID[8:16]
    assert ID == IDB
    assert f.split_message_id(ID) == (0x0008000000000005, 9)
    assert f.decode_message(TS + b"\x00\x00" + ID).trace_id == 9
    with pytest.raises(ValueError, match="^Invalid Message ID$"):  # getFullMessageID
        f.split_message_id(ID[:15])


@pytest.mark.parametrize("partition,seq,expected", [
    (0, 1, 1), (2, 5, (2 << 50) | 5), (1023, (1 << 50) - 1, (1 << 60) - 1)])
def test_partition_in_internal_id(partition, seq, expected):
    # consistence GetPartitionFromMsgID: (id & (1023 << 50)) >> 50
    assert f.internal_id(partition, seq) == expected
    assert f.partition_of(expected) == partition


@pytest.mark.parametrize("partition,seq", [(1024, 0), (-1, 0), (0, 1 << 50)])
def test_internal_id_range(partition, seq):
    with pytest.raises(ValueError):
        f.internal_id(partition, seq)


@pytest.mark.parametrize("data,ext,detail", [
    (TS + b"\x00\x00" + ID[:15], False, False),          # go-nsq: len(b) < 10+MsgIDLength
    (TS + b"\x00\x00" + ID, True, False),                # ext: no version byte
    (TS + b"\x00\x00" + ID + b"\x04\x00\x05{}", True, False),  # header shorter than its length
    (TS + b"\x00\x00" + ID + b"short", False, True),     # detail: fewer than 12 bytes
])
def test_decode_message_short(data, ext, detail):
    with pytest.raises(ValueError, match="^not enough data to decode valid message$"):
        f.decode_message(data, ext, detail)


def test_headers_limit():
    # nsqd/message.go WriteDelayedTo: "extend data exceed the limit" (a uint16 length)
    with pytest.raises(ValueError, match="exceed the limit"):
        f.message_data(1, 1, ID, b"", (4, b"x" * 65536))
