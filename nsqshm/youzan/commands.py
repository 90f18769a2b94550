"""Youzan's command lines, parsed as its nsqd does (youzan/nsq nsqdserver/protocol_v2.go).

    SUB          <topic> <channel> [<partition>]
    SUB_ADVANCED <topic> <channel> [<partition> [<type>:<value>]]   frames carry offset+size
    SUB_ORDERED  <topic> <channel> <partition>                      frames carry offset+size
    PUB|MPUB|PUB_TRACE|MPUB_TRACE|PUB_EXT|MPUB_EXT <topic> [<partition>]
    INTERNAL_CREATE_TOPIC <topic> <partition> [<ext bool>]
    FIN <16-byte id>\\n   REQ <16-byte id> <ms>\\n   TOUCH <16-byte id>\\n

A message ID on Youzan's wire is 16 binary bytes (frames.py), which may hold ' ' or
'\\n'; Youzan's nsqd therefore cuts FIN/REQ/TOUCH at fixed positions (next_command).

Errors are raised as nsqd's ClientErr/FatalClientErr with Youzan's code and text; the
parse functions raise them in Youzan's order, so the first error of a bad line is
the one Youzan's nsqd answers. A partition of -1 (NO_PARTITION) means none was given:
Youzan then uses the topic's default partition on this node.
"""

from typing import NamedTuple

from nsqshm.nsqd.errors import (
    E_BAD_EXT,
    E_BAD_PARTITION,
    E_SUB_EXTEND_FORBIDDON,
    E_SUB_EXTEND_NEED,
    E_SUB_ORDER_IS_MUST,
    E_TOPIC_NOT_EXIST,
    FatalClientErr,
)
from nsqshm.nsqd.names import go_quote, is_valid_name
from nsqshm.youzan.go_strconv import atoi, parse_bool, text
from nsqshm.youzan.offset import ConsumeOffset, parse_consume_offset

E_INVALID = "E_INVALID"
NO_PARTITION = -1

# protocol_v2.go ErrOrderChannelOnSampleRate: SUB_ORDERED by a client with a sample rate
ORDERED_WITH_SAMPLE_RATE = "order consume is not allowed while sample rate is not 0"

# verb: (ordered, detail): detail = frames carry the queue offset and raw size
# (internalSUB's enableTrace, client.EnableTrace, Message.WriteToClient's writeDetail)
SUB_VERBS = {b"SUB": (False, False), b"SUB_ADVANCED": (False, True),
             b"SUB_ORDERED": (True, True)}
PUB_VERBS = (b"PUB", b"MPUB", b"PUB_TRACE", b"MPUB_TRACE", b"PUB_EXT", b"MPUB_EXT")


class Sub(NamedTuple):
    topic: str
    channel: str
    partition: int                   # NO_PARTITION: none given
    ordered: bool                    # SUB_ORDERED
    detail: bool                     # SUB_ADVANCED / SUB_ORDERED
    start: ConsumeOffset | None   # SUB_ADVANCED's fifth word


class Pub(NamedTuple):
    topic: str
    partition: int                   # NO_PARTITION: none given


def _partition(raw):
    try:
        return atoi(text(raw))
    except ValueError as e:
        raise FatalClientErr(E_BAD_PARTITION, f"topic partition is not valid: {e}") from None


def parse_sub(params, in_init_state=True, heartbeats=True):
    """SUB / SUB_ADVANCED / SUB_ORDERED: params are the line's words, verb first.

    Youzan's order: SUB_ADVANCED's position first (SUBADVANCED parses it before
    internalSUB), then state, heartbeats, count, topic, channel, partition.
    Youzan reads the partition only from a line of exactly four words, so its
    SUB_ADVANCED with a position uses the default partition; go-nsq sends
    "SUB_ADVANCED t c <partition> <position>" meaning that partition, and nsqshm
    reads the fourth word whenever there is one (docs/youzan.md, Deviations)."""
    ordered, detail = SUB_VERBS[bytes(params[0])]
    start = None
    if params[0] == b"SUB_ADVANCED" and len(params) > 4 and len(params[4]) > 0:
        try:
            start = parse_consume_offset(params[4])
        except ValueError as e:
            raise FatalClientErr(E_INVALID, str(e)) from None
    if not in_init_state:
        raise FatalClientErr(E_INVALID, "cannot SUB in current state")
    if not heartbeats:
        raise FatalClientErr(E_INVALID, "cannot SUB with heartbeats disabled")
    if len(params) < 3:
        raise FatalClientErr(E_INVALID, "SUB insufficient number of parameters")
    topic = text(params[1])
    if not is_valid_name(topic):
        raise FatalClientErr("E_BAD_TOPIC", f"SUB topic name {go_quote(topic)} is not valid")
    channel = text(params[2])
    if not is_valid_name(channel):
        raise FatalClientErr("E_BAD_CHANNEL", f"SUB channel name {go_quote(channel)} is not valid")
    partition = _partition(params[3]) if len(params) >= 4 else NO_PARTITION
    return Sub(topic, channel, partition, ordered, detail, start)


def check_sub_topic(sub, exists, topic_ordered, topic_ext, extend_support):
    """What internalSUB answers once it looked the topic up (nsqshm has no
    AllowSubExtCompatible: a client on an ext topic must say extend_support)."""
    if not exists:
        raise FatalClientErr(E_TOPIC_NOT_EXIST, "")
    if topic_ordered and not sub.ordered:
        raise FatalClientErr(E_SUB_ORDER_IS_MUST, "this topic is configured only allow ordered sub")
    if topic_ext and not extend_support:
        raise FatalClientErr(E_SUB_EXTEND_NEED,
                             "this topic is extended and should identify as extend support.")
    if not topic_ext and extend_support:
        raise FatalClientErr(E_SUB_EXTEND_FORBIDDON,
                             "this topic is not extended and should not identify as extend support.")


def parse_pub(params):
    """PUB and its kin (preparePub): the partition is read from a line of exactly three
    words, as Youzan; no name check here (an unknown topic is E_TOPIC_NOT_EXIST)."""
    if len(params) < 2:
        raise FatalClientErr(E_INVALID, "insufficient number of parameters")
    partition = _partition(params[2]) if len(params) == 3 else NO_PARTITION
    return Pub(text(params[1]), partition)


def check_body_size(size, max_size, mpub):
    """preparePub's checks of the 4-byte body size (before the topic is looked up)."""
    if size <= 0:
        raise FatalClientErr("E_BAD_BODY", f"invalid body size {size}")
    if size > max_size:
        if mpub:
            raise FatalClientErr("E_BAD_BODY", f"body too big {size} > {max_size}")
        raise FatalClientErr("E_BAD_MESSAGE", f"message too big {size} > {max_size}")


def check_pub_topic(pub, exists, topic_ordered):
    """preparePub once the topic is looked up: an ordered topic needs a partition."""
    if not exists:
        raise FatalClientErr(E_TOPIC_NOT_EXIST, "")
    if pub.partition == NO_PARTITION and topic_ordered:
        raise FatalClientErr(E_BAD_PARTITION,
                             f"topic partition is not valid for multi partition: {NO_PARTITION}")


class CreateTopic(NamedTuple):
    topic: str
    partition: int
    ext: bool


def parse_internal_create_topic(params):
    """INTERNAL_CREATE_TOPIC (standalone only): answers OK, or E_CREATE_TOPIC_FAILED
    "CREATE_TOPIC <topic> failed" (not fatal) if the topic cannot be made."""
    if len(params) < 3:
        raise FatalClientErr(E_INVALID, "CREATE_TOPIC insufficient number of parameters")
    topic = text(params[1])
    if not is_valid_name(topic):
        raise FatalClientErr("E_BAD_TOPIC", f"topic name {go_quote(topic)} is not valid")
    partition = _partition(params[2])
    if partition < 0:
        raise FatalClientErr(E_BAD_PARTITION, "partition should not less than 0")
    ext = False
    if len(params) >= 4:
        try:
            ext = parse_bool(text(params[3]))
        except ValueError as e:
            raise FatalClientErr(E_BAD_EXT, f"topic ext is not valid: {e}") from None
    return CreateTopic(topic, partition, ext)


# FIN/REQ are cut at fixed positions: the 16 ID bytes are line[4:20] whatever they hold,
# and the line ends at the first '\n' at index 20 or later (IOLoop reads up to 20 bytes,
# then to the next '\n'). TOUCH's line is at least 23 bytes, ID at line[6:22].
#
#   FIN <id:16>\n          0..2 verb, 3 ' ', 4..19 id, 20 '\n'
#   REQ <id:16> <ms>\n     21.. timeout (no '\r' trimming)
#   TOUCH <id:16>\n        0..4 verb, 5 ' ', 6..21 id, 22 '\n'
def next_command(buf, pos=0):
    """The next command's words from buf[pos:] and the position after its line, as
    Youzan's IOLoop splits them; None while its line is incomplete."""
    head = bytes(buf[pos:pos + 5])
    if head[:3] in (b"FIN", b"REQ"):
        nl = buf.find(b"\n", pos + 20)
        if nl < 0:
            return None
        line = bytes(buf[pos:nl + 1])
        words = [line[:3], line[4:20]]
        if line[:3] == b"REQ" and len(line) >= 22:
            words.append(line[21:-1])
        return words, nl + 1
    if head == b"TOUCH":
        nl = buf.find(b"\n", pos)
        if nl < 0:
            return None
        end = nl + 1
        if end - pos < 23:  # a short line: TOUCH takes 23 bytes whatever they hold
            if len(buf) - pos < 23:
                return None
            end = pos + 23
        line = bytes(buf[pos:end])
        words = [line[:5]]
        if len(line) >= 23:
            words.append(line[6:22])
        return words, end
    nl = buf.find(b"\n", pos)
    if nl < 0:
        return None
    line = bytes(buf[pos:nl])
    if line.endswith(b"\r"):
        line = line[:-1]
    return line.split(b" "), nl + 1
