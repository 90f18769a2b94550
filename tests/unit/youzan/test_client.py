"""What youzan/go-nsq sends (command.go, conn.go, producer.go), byte for byte."""

import json

import pytest

from nsqshm.youzan import client as c
from nsqshm.youzan.offset import END

ID = bytes(range(16))

CASES = [
    (c.sub("t", "c"), b"SUB t c\n", "command.go Subscribe"),
    (c.sub("t", "c", 2), b"SUB t c 2\n", "command.go SubscribeWithPart"),
    (c.sub_advanced("t", "c"), b"SUB_ADVANCED t c\n", "command.go SubscribeAndTrace"),
    (c.sub_advanced("t", "c", 1), b"SUB_ADVANCED t c 1\n", "command.go SubscribeWithPartAndTrace"),
    (c.sub_advanced("t", "c", 1, END), b"SUB_ADVANCED t c 1 special:-1\n",
     "command.go SubscribeAdvanced, ConsumeOffset.ToString"),
    (c.sub_ordered("t", "c", 0), b"SUB_ORDERED t c 0\n", "command.go SubscribeOrdered"),
    (c.pub("t", b"hi", 3), b"PUB t 3\n\x00\x00\x00\x02hi", "command.go PublishWithPart"),
    (c.mpub("t", [b"a", b"bc"], 0),
     b"MPUB t 0\n\x00\x00\x00\x0f\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc",
     "command.go MultiPublishWithPart, getMPubBody"),
    (c.pub_trace("t", 0, 258, b"m"),
     b"PUB_TRACE t 0\n\x00\x00\x00\x09\x00\x00\x00\x00\x00\x00\x01\x02m", "command.go PublishTrace"),
    (c.mpub_trace("t", 1, [1], [b"m"]),
     b"MPUB_TRACE t 1\n\x00\x00\x00\x11\x00\x00\x00\x01\x00\x00\x00\x09" + b"\x00" * 7
     + b"\x01m", "command.go getMPubBodyForTrace: size counts the 8-byte trace ID"),
    (c.pub_ext("t", 0, b"{}", b"m"), b"PUB_EXT t 0\n\x00\x00\x00\x05\x00\x02{}m",
     "doc/Message-Extend-Header-Design.md PUB_EXT"),
    (c.mpub_ext("t", 0, [(b"", b"m")]),
     b"MPUB_EXT t 0\n\x00\x00\x00\x0b\x00\x00\x00\x01\x00\x00\x00\x03\x00\x00m",
     "protocol_v2.go readMPUBEXT (mpubExt)"),
    (c.create_topic("t", 4), b"INTERNAL_CREATE_TOPIC t 4\n", "command.go CreateTopic"),
    (c.fin(ID), b"FIN " + ID + b"\n", "command.go Finish"),
    (c.req(ID, 1500), b"REQ " + ID + b" 1500\n", "command.go Requeue"),
    (c.touch(ID), b"TOUCH " + ID + b"\n", "command.go Touch"),
]


@pytest.mark.parametrize("encoded,expected,src", CASES)
def test_commands(encoded, expected, src):
    assert encoded == expected


def test_ext_json():
    # producer.go MsgExt.ToJson: a map (sorted by Go), trace ID as a decimal string
    assert c.ext_json(12, "tagA", {"k": "v"}) == (
        b'{"##client_dispatch_tag":"tagA","##trace_id":"12","k":"v"}')
    assert c.ext_json() == b""


def test_identify():
    # conn.go identify(): desired_tag always, extend_support only when the lookup said ext
    raw = c.identify(extend_support=True, client_id="x")
    assert raw.startswith(b"IDENTIFY\n")
    body = json.loads(raw[13:])
    assert body == {"client_id": "x", "feature_negotiation": True, "desired_tag": "",
                    "extend_support": True}
    assert "extend_support" not in json.loads(c.identify()[13:])
