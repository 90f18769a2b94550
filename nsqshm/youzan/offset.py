"""A consume position, as Youzan writes it: "<type>:<value>".

The same text is the fifth word of SUB_ADVANCED and the body of POST /channel/setoffset
(youzan/nsq nsqdserver/protocol_v2.go ConsumeOffset.FromBytes; go-nsq command.go
ConsumeOffset.ToString). Types:

    timestamp:<seconds since the epoch>   the first message at or after that time
    virtual_queue:<byte offset>           the first message at or after that offset of the
                                          partition's queue
    msgcount:<n>                          the n-th message of the partition, counted from 1
                                          (0 and 1 = the first; Youzan's MsgCnt)
    special:-1                            the end: only messages published from now on
    special:-2                            nsqshm's "earliest" (the log start); Youzan answers
                                          it "not supported offset type"

Parsing is Youzan's: exactly one ':', one of the four type names, then a Go ParseInt
value; its error texts go on the wire (E_INVALID on SUB_ADVANCED, 400 on setoffset).
"""

from typing import NamedTuple

from nsqshm.youzan.go_strconv import parse_int, text

TIMESTAMP = "timestamp"
VIRTUAL_QUEUE = "virtual_queue"
MSGCOUNT = "msgcount"
SPECIAL = "special"
TYPES = (TIMESTAMP, SPECIAL, VIRTUAL_QUEUE, MSGCOUNT)

SPECIAL_END = -1
SPECIAL_EARLIEST = -2  # nsqshm's, not Youzan's

# What Youzan's SetChannelOffset answers for a special value it does not know
# (nsqdserver/context.go); nsqshm answers the same for any special but -1 and -2.
NOT_SUPPORTED = "not supported offset type"


class ConsumeOffset(NamedTuple):
    kind: str
    value: int

    def __str__(self):
        return f"{self.kind}:{self.value}"

    @property
    def is_end(self):
        return self.kind == SPECIAL and self.value == SPECIAL_END

    @property
    def is_earliest(self):
        return self.kind == SPECIAL and self.value == SPECIAL_EARLIEST


END = ConsumeOffset(SPECIAL, SPECIAL_END)
EARLIEST = ConsumeOffset(SPECIAL, SPECIAL_EARLIEST)


def count_of(offset):
    """Youzan's count of the message at msg offset `offset` (MsgCnt, from 1):
    what msgcount:, /message/get's count mode and queue_cnt_index carry."""
    return offset + 1


def offset_of_count(count):
    """The msg offset a Youzan count names (0 and 1 are both the first message)."""
    return max(count - 1, 0)


def parse_consume_offset(raw):
    """ConsumeOffset.FromBytes: raises ValueError(Youzan's text)."""
    s = text(raw)
    parts = s.split(":")
    if len(parts) != 2 or parts[0] not in TYPES:
        raise ValueError("invalid consume offset:" + s)
    return ConsumeOffset(parts[0], parse_int(parts[1]))


def check_supported(offset):
    """What nsqshm can seek to; raises ValueError(NOT_SUPPORTED) for an unknown special
    value (Youzan: E_INVALID on SUB_ADVANCED, 500 on /channel/setoffset)."""
    if offset.kind == SPECIAL and offset.value not in (SPECIAL_END, SPECIAL_EARLIEST):
        raise ValueError(NOT_SUPPORTED)
    return offset
