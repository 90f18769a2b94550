"""Youzan's command lines, byte for byte: each row names the code of youzan/nsq
nsqdserver/protocol_v2.go (newest stored version) that answers it."""

import pytest

from nsqshm.nsqd.errors import ClientErr
from nsqshm.youzan import commands as c
from nsqshm.youzan.offset import ConsumeOffset

SUB = "protocol_v2.go internalSUB"
ADV = "protocol_v2.go SUBADVANCED"
PRE = "protocol_v2.go preparePub"
CREATE = "protocol_v2.go internalCreateTopic"
LOOP = "protocol_v2.go IOLoop (FIN/REQ/TOUCH cut at fixed positions)"


def words(line):
    return line.split(b" ")


def outcome(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except ClientErr as e:
        return (e.wire, e.fatal)


SUB_CASES = [
    (b"SUB t c", {}, c.Sub("t", "c", -1, False, False, None), SUB),
    (b"SUB t c 3", {}, c.Sub("t", "c", 3, False, False, None), SUB + " len(params) == 4"),
    (b"SUB_ORDERED t c 0", {}, c.Sub("t", "c", 0, True, True, None), "SUBORDERED: ordered, trace"),
    (b"SUB_ADVANCED t c", {}, c.Sub("t", "c", -1, False, True, None),
     "go-nsq SubscribeAndTrace; SUBADVANCED enableTrace"),
    (b"SUB_ADVANCED t c 1 msgcount:10", {},
     c.Sub("t", "c", 1, False, True, ConsumeOffset("msgcount", 10)),
     "go-nsq SubscribeAdvanced; partition read (nsqshm: Youzan reads it only from 4 words)"),
    (b"SUB_ADVANCED t c 1 ", {}, c.Sub("t", "c", 1, False, True, None),
     ADV + " len(params[4]) > 0"),
    (b"SUB_ADVANCED t c 1 bad", {}, (b"E_INVALID invalid consume offset:bad", True),
     ADV + " NewFatalClientErr(nil, E_INVALID, err.Error())"),
    (b"SUB_ADVANCED t c 1 bad", {"in_init_state": False},
     (b"E_INVALID invalid consume offset:bad", True), ADV + " parses before internalSUB"),
    (b"SUB t c", {"in_init_state": False}, (b"E_INVALID cannot SUB in current state", True), SUB),
    (b"SUB t c", {"heartbeats": False},
     (b"E_INVALID cannot SUB with heartbeats disabled", True), SUB),
    (b"SUB t", {}, (b"E_INVALID SUB insufficient number of parameters", True), SUB),
    (b"SUB t! c", {}, (b'E_BAD_TOPIC SUB topic name "t!" is not valid', True), SUB),
    (b"SUB t c!", {}, (b'E_BAD_CHANNEL SUB channel name "c!" is not valid', True), SUB),
    (b"SUB t c x", {},
     (b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax',
      True), SUB + " Atoi"),
    (b"SUB t c ", {},
     (b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "": invalid syntax',
      True), SUB + " (a trailing space is an empty fourth word)"),
    (b"SUB_ORDERED t c -1", {}, c.Sub("t", "c", -1, True, True, None),
     SUB + " partition -1: the default partition"),
]


@pytest.mark.parametrize("line,kw,expected,src", SUB_CASES)
def test_parse_sub(line, kw, expected, src):
    assert outcome(c.parse_sub, words(line), **kw) == expected


SUB_TOPIC_CASES = [
    # (line, exists, ordered topic, ext topic, extend_support, expected, source)
    (b"SUB t c", False, False, False, False, (b"E_TOPIC_NOT_EXIST ", True),
     SUB + ' NewFatalClientErr(nil, E_TOPIC_NOT_EXIST, "")'),
    (b"SUB t c 0", True, True, False, False,
     (b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub", True), SUB),
    (b"SUB_ORDERED t c 0", True, True, False, False, None, SUB),
    (b"SUB t c", True, False, True, False,
     (b"E_SUB_EXTEND_NEED this topic is extended and should identify as extend support.", True),
     SUB),
    (b"SUB t c", True, False, False, True,
     (b"E_SUB_EXTEND_FORBIDDON this topic is not extended and should not identify as extend "
      b"support.", True), SUB),
    (b"SUB t c", True, False, True, True, None, SUB),
]


@pytest.mark.parametrize("line,exists,ordered,ext,support,expected,src", SUB_TOPIC_CASES)
def test_check_sub_topic(line, exists, ordered, ext, support, expected, src):
    sub = c.parse_sub(words(line))
    assert outcome(c.check_sub_topic, sub, exists, ordered, ext, support) == expected


PUB_CASES = [
    (b"PUB t", c.Pub("t", -1), PRE),
    (b"PUB t 2", c.Pub("t", 2), PRE + " len(params) == 3; go-nsq PublishWithPart"),
    (b"MPUB_EXT t 0", c.Pub("t", 0), PRE),
    (b"PUB t 1 2", c.Pub("t", -1), PRE + " (4 words: no partition read)"),
    (b"PUB t! 1", c.Pub("t!", 1), PRE + " (no name check: unknown topic)"),
    (b"PUB", (b"E_INVALID insufficient number of parameters", True), PRE),
    (b"PUB t 0x1",
     (b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "0x1": invalid syntax',
      True), PRE),
]


@pytest.mark.parametrize("line,expected,src", PUB_CASES)
def test_parse_pub(line, expected, src):
    assert outcome(c.parse_pub, words(line)) == expected


SIZE_CASES = [
    (0, False, (b"E_BAD_BODY invalid body size 0", True), PRE),
    (-5, True, (b"E_BAD_BODY invalid body size -5", True), PRE + " (int32 size)"),
    (101, False, (b"E_BAD_MESSAGE message too big 101 > 100", True), PRE + " PUB"),
    (101, True, (b"E_BAD_BODY body too big 101 > 100", True), PRE + " isMpub"),
    (100, False, None, PRE),
]


@pytest.mark.parametrize("size,mpub,expected,src", SIZE_CASES)
def test_check_body_size(size, mpub, expected, src):
    assert outcome(c.check_body_size, size, 100, mpub) == expected


@pytest.mark.parametrize("line,exists,ordered,expected,src", [
    (b"PUB t", False, False, (b"E_TOPIC_NOT_EXIST ", True), PRE),
    (b"PUB t", True, True,
     (b"E_BAD_PARTITION topic partition is not valid for multi partition: -1", True),
     PRE + " origPart == -1 && topic.IsOrdered()"),
    (b"PUB t 0", True, True, None, PRE),
])
def test_check_pub_topic(line, exists, ordered, expected, src):
    assert outcome(c.check_pub_topic, c.parse_pub(words(line)), exists, ordered) == expected


CREATE_CASES = [
    (b"INTERNAL_CREATE_TOPIC t 0", c.CreateTopic("t", 0, False), CREATE + "; go-nsq CreateTopic"),
    (b"INTERNAL_CREATE_TOPIC t 2 true", c.CreateTopic("t", 2, True), CREATE + " ParseBool"),
    (b"INTERNAL_CREATE_TOPIC t",
     (b"E_INVALID CREATE_TOPIC insufficient number of parameters", True), CREATE),
    (b"INTERNAL_CREATE_TOPIC t# 0", (b'E_BAD_TOPIC topic name "t#" is not valid', True), CREATE),
    (b"INTERNAL_CREATE_TOPIC t p",
     (b'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "p": invalid syntax',
      True), CREATE),
    (b"INTERNAL_CREATE_TOPIC t -1", (b"E_BAD_PARTITION partition should not less than 0", True),
     CREATE),
    (b"INTERNAL_CREATE_TOPIC t 0 yes",
     (b'E_BAD_EXT topic ext is not valid: strconv.ParseBool: parsing "yes": invalid syntax', True),
     CREATE),
]


@pytest.mark.parametrize("line,expected,src", CREATE_CASES)
def test_parse_internal_create_topic(line, expected, src):
    assert outcome(c.parse_internal_create_topic, words(line)) == expected


ID = b"\x00\x00\x00\x00\x00\x00\x00\x0a \n\x00\x00\x00\x00\x00\x07"  # holds '\n' and ' '

NEXT_CASES = [
    (b"FIN " + ID + b"\n", ([b"FIN", ID], 21), LOOP + ": line[4:20] whatever it holds"),
    (b"REQ " + ID + b" 1500\n", ([b"REQ", ID, b"1500"], 26), LOOP + ": line[21:len-1]"),
    (b"REQ " + ID + b"\n", ([b"REQ", ID], 21), LOOP + " (no timeout: REQ insufficient params)"),
    (b"TOUCH " + ID + b"\n", ([b"TOUCH", ID], 23), LOOP + ": ReadFull to 23 bytes, line[6:22]"),
    (b"FIN " + ID, None, LOOP + " (the line is not complete)"),
    (b"TOUCH " + ID[:10], None, LOOP),
    (b"RDY 10\r\n", ([b"RDY", b"10"], 8), LOOP + " trims '\\r'"),
    (b"NOP\n", ([b"NOP"], 4), LOOP),
    (b"SUB_ADVANCED t c 0 special:-1\n",
     ([b"SUB_ADVANCED", b"t", b"c", b"0", b"special:-1"], 30), LOOP),
]


@pytest.mark.parametrize("buf,expected,src", NEXT_CASES)
def test_next_command(buf, expected, src):
    assert c.next_command(buf) == expected


def test_next_command_walks_a_stream_of_binary_ids():
    # protocol_v2.go IOLoop: a FIN whose ID holds "\n" does not end early
    stream = b"FIN " + ID + b"\nREQ " + ID + b" 0\nNOP\n"
    pos, got = 0, []
    while (r := c.next_command(stream, pos)) is not None:
        got.append(r[0])
        pos = r[1]
    assert got == [[b"FIN", ID], [b"REQ", ID, b"0"], [b"NOP"]] and pos == len(stream)
