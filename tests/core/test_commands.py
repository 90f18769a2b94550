"""CommandParser (_core/commands.pyx) on real in-flight tables: every
command stream of the table cut at every byte gives what the whole stream
gives, and what it applies and what it hands to the Python path are what
protocol_v2.py's own parsing (its line reading, message_id, base10,
duration_ms) says.  The bytes a server answers are compared with the
Python path's in tests/nsqd/tcp/test_command_parser.py."""

import struct
import time

import pytest

from nsqshm._core import codec
from nsqshm._core.commands import HANDOFF, NEED_MORE, CommandParser
from nsqshm._core.inflight import DeferredQueue, InFlight
from nsqshm.nsqd.errors import ClientErr
from nsqshm.nsqd.tcp.protocol_v2 import base10, duration_ms, message_id

CLIENT = 7
MSG_TIMEOUT = 60 * 10**9
MAX_MSG_TIMEOUT = 15 * 60 * 10**9
MAX_REQ_TIMEOUT = 60 * 60 * 10**9
IDS = [b"%016x" % (0xA0 + i) for i in range(4)]
GOOD = [b"FIN {0}\n", b"TOUCH {1}\r\n", b"REQ {2} 0\n", b"REQ {3} 2000\r\n", b"NOP\n"]
LINES = [
    b"FIN 0000000000000000\n", b"REQ 0000000000000000 0\r\n", b"TOUCH 0000000000000000\n",
    b"FIN {0}\n", b"FIN 123\n", b"FIN {0}\r\r\n", b"REQ {1} x\n", b"REQ {1}\n", b"TOUCH\r\n",
    b"BOGUS\n", b"RDY 5\n", b"FIN {0} extra\n", b"REQ {1} \n", b"REQ {1} 99999999999999999999\n",
    b"NOP x\r\n", b"\r\n", b"FIN 0123456789abcde\r\n", b"FIN 01234567 9abcdef\n",
]


def streams():
    yield b"".join(GOOD)
    yield b"".join(GOOD).replace(b"\r\n", b"\n")
    yield b"".join(GOOD).replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    for line in LINES:
        for at in range(len(GOOD) + 1):
            yield b"".join(GOOD[:at] + [line] + GOOD[at:])


def fill(stream):
    for i, msg_id in enumerate(IDS):
        stream = stream.replace(b"{%d}" % i, msg_id)
    return stream


STREAMS = [fill(s) for s in streams()]


def holding_four():
    inflight, deferred = InFlight(), DeferredQueue()
    for msg_id in IDS:
        inflight.add(codec.encode_message(msg_id, 1, 1, b"body"), CLIENT, 10**18)
    return inflight, deferred


def drive(stream, cuts):
    """Feed the stream in pieces cut at `cuts`, as reads: the C parser
    from the first unread byte, each line it hands off taken as the Python
    path takes it (skipped here).  What happened, comparable."""
    inflight, deferred = holding_four()
    parser = CommandParser(inflight, deferred, None, CLIENT, MSG_TIMEOUT, MAX_MSG_TIMEOUT,
                           MAX_REQ_TIMEOUT)
    buf, pos = bytearray(), 0
    handed, counts, requeued = [], [0, 0, 0, 0], bytearray()
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        buf += stream[a:b]
        while True:
            status = parser.parse(buf, pos)
            assert status in (HANDOFF, NEED_MORE)
            pos = parser.pos
            counts = [x + y for x, y in zip(counts, (parser.finished, parser.requeued,
                                                     parser.touched, parser.nops), strict=True)]
            requeued += parser.take_requeued()
            if status == NEED_MORE:
                break
            end = buf.index(b"\n", pos) + 1
            handed.append(bytes(buf[pos:end]))
            pos = end
    assert pos == len(buf)
    remaining = sorted(i for i in IDS if i in inflight)
    return handed, counts, bytes(requeued), remaining, len(deferred)


def python_path(stream):
    """What protocol_v2.py makes of each line (its line split, '\\r' strip,
    parameter checks): the lines the C parser may take are the valid FIN,
    TOUCH, REQ (a non-empty timeout) and NOP of exactly their parameters,
    applied when the client holds the message; every other line is the
    Python path's."""
    held = set(IDS)
    handed, counts, requeued, deferred = [], [0, 0, 0, 0], [], 0
    for raw in [line + b"\n" for line in stream.split(b"\n")[:-1]]:  # as Reader.readline
        line = raw[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
        params = line.split(b" ")
        verb = params[0]
        try:
            if verb in (b"FIN", b"TOUCH") and len(params) == 2:
                msg_id = message_id(params, verb.decode())
                if msg_id in held:
                    if verb == b"FIN":
                        held.remove(msg_id)
                    counts[0 if verb == b"FIN" else 2] += 1
                    continue
            elif verb == b"REQ" and len(params) == 3 and params[2]:
                msg_id = message_id(params, "REQ")
                ms = base10(params[2])
                if ms is not None and msg_id in held:
                    held.remove(msg_id)
                    counts[1] += 1
                    if min(max(duration_ms(ms), 0), MAX_REQ_TIMEOUT) > 0:
                        deferred += 1
                    else:
                        requeued.append(msg_id)
                    continue
            elif line == b"NOP":
                counts[3] += 1
                continue
        except ClientErr:
            pass
        handed.append(raw)
    return handed, counts, requeued, sorted(held), deferred


@pytest.mark.parametrize("stream", STREAMS, ids=range(len(STREAMS)))
def test_every_cut_gives_what_the_python_path_does(stream):
    whole = drive(stream, [])
    handed, counts, requeued, remaining, deferred = python_path(stream)
    assert whole[0] == handed
    assert whole[1] == counts
    assert ids_of_records(whole[2]) == requeued
    assert whole[3:] == (remaining, deferred)
    for cut in range(1, len(stream)):
        assert drive(stream, [cut]) == whole, cut
    assert drive(stream, list(range(1, len(stream)))) == whole  # a byte per read


def ids_of_records(records):
    out, pos = [], 0
    while pos < len(records):
        (size,) = struct.unpack_from("=I", records, pos)
        out.append(bytes(records[pos + 4 + 10:pos + 4 + 26]))
        pos += 4 + size
    return out


def test_a_requeued_message_is_stored_with_its_attempts():
    inflight, deferred = holding_four()
    parser = CommandParser(inflight, deferred, None, CLIENT, MSG_TIMEOUT, MAX_MSG_TIMEOUT,
                           MAX_REQ_TIMEOUT)
    buf = bytearray(b"REQ %s 0\nREQ %s 1500\n" % (IDS[0], IDS[1]))
    assert parser.parse(buf, 0) == NEED_MORE
    assert (parser.pos, parser.requeued) == (len(buf), 2)
    records = parser.take_requeued()
    assert bytes(records[4:]) == codec.encode_message(IDS[0], 1, 1, b"body")
    assert len(deferred) == 1 and parser.scan_by == deferred.next_due()
    assert len(inflight) == 2  # (malloc blocks, no arena: freed at once, nothing to release)


def test_requeue_false_hands_every_req_to_python():
    inflight, deferred = holding_four()
    parser = CommandParser(inflight, deferred, None, CLIENT, MSG_TIMEOUT, MAX_MSG_TIMEOUT,
                           MAX_REQ_TIMEOUT)
    buf = bytearray(b"FIN %s\nREQ %s 0\n" % (IDS[0], IDS[1]))
    assert parser.parse(buf, 0, False) == HANDOFF
    assert (parser.pos, parser.finished, parser.requeued) == (21, 1, 0)


def test_touch_moves_the_deadline_within_max_msg_timeout():
    inflight, deferred = InFlight(), DeferredQueue()
    first = 1  # the deadline at delivery, long ago
    inflight.add(codec.encode_message(IDS[0], 1, 1, b"body"), CLIENT, first)
    # --max-msg-timeout = the msg timeout: delivery + it is the first deadline
    parser = CommandParser(inflight, deferred, None, CLIENT, MSG_TIMEOUT, MSG_TIMEOUT,
                           MAX_REQ_TIMEOUT)
    assert parser.parse(bytearray(b"TOUCH %s\n" % IDS[0]), 0) == NEED_MORE
    assert parser.touched == 1 and parser.scan_by == first
    assert inflight.next_deadline() == first
    # without the cap: now + the msg timeout
    parser = CommandParser(inflight, deferred, None, CLIENT, MSG_TIMEOUT, 10**18,
                           MAX_REQ_TIMEOUT)
    before = time.monotonic_ns()
    parser.parse(bytearray(b"TOUCH %s\r\n" % IDS[0]), 0)
    assert before + MSG_TIMEOUT <= inflight.next_deadline() <= time.monotonic_ns() + MSG_TIMEOUT
