"""Byte-exact, table-driven tests of the pure client codec nsqshm.protocol."""

import pytest

from nsqshm import protocol as p

ID = b"0123456789abcdef"

COMMANDS = [
    (p.sub("t", "c"), b"SUB t c\n"),
    (p.rdy(100), b"RDY 100\n"),
    (p.fin(ID), b"FIN 0123456789abcdef\n"),
    (p.req(ID, 5000), b"REQ 0123456789abcdef 5000\n"),
    (p.touch(ID), b"TOUCH 0123456789abcdef\n"),
    (p.nop(), b"NOP\n"),
    (p.cls(), b"CLS\n"),
    (p.pub("t", b"hi"), b"PUB t\n\x00\x00\x00\x02hi"),
    (p.dpub("t", 1500, b"x"), b"DPUB t 1500\n\x00\x00\x00\x01x"),
    (p.mpub("t", [b"a", b"bc"]),
     b"MPUB t\n\x00\x00\x00\x0f\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc"),
    (p.identify({"client_id": "x"}), b'IDENTIFY\n\x00\x00\x00\x11{"client_id":"x"}'),
    (p.auth("s3cret"), b"AUTH\n\x00\x00\x00\x06s3cret"),
]


@pytest.mark.parametrize("encoded,expected", COMMANDS)
def test_commands(encoded, expected):
    assert encoded == expected


def test_frame_decoder_handles_partial_and_multiple_frames():
    stream = (b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
              b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
              b"\x00\x00\x00\x22\x00\x00\x00\x02" + b"\x00" * 7 + b"\x05\x00\x01" + ID + b"body")
    dec = p.FrameDecoder()
    got = []
    for i in range(len(stream)):  # one byte at a time
        dec.feed(stream[i:i + 1])
        got += dec.frames()
    assert got[:2] == [(0, b"OK"), (0, p.HEARTBEAT)]
    assert got[2][0] == p.FRAME_TYPE_MESSAGE
    msg = p.decode_message(got[2][1])
    assert (msg.timestamp, msg.attempts, msg.id, msg.body) == (5, 1, ID, b"body")
    assert dec.buf == b""
