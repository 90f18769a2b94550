"""The C command parser (_core/commands.pyx) against the Python path, over
real sockets: the same command streams to a server that parses a
consumer's FIN, REQ, TOUCH and NOP in C and to one with
NSQSHM_PYTHON_COMMANDS=1 (every command through protocol_v2.py's methods),
and the bytes each answers, and the counts /stats then shows, must be the
same.  Each stream is sent whole, and one byte per send (the server reads
it cut at whatever points the segments arrive; tests/core/test_commands.py
cuts it at every byte deterministically).

A stream is written with placeholders: {0}-{3} the IDs of the four
messages the consumer holds, {X} an ID nobody holds."""

import json
import socket
import urllib.parse
import uuid

import pytest

from nsqshm import protocol as p
from tests.nsqd.conftest import Server, wait_for

WORKER_COUNTS = (1, 2)

UNKNOWN = b"0000000000000000"
MARKER = b"FIN ffffffffffffffff\n"  # answered E_FIN_FAILED: everything before it is done
MARKER_ANSWER = (p.FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN ffffffffffffffff failed ID not in flight")
NOT_FATAL = (b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED")

GOOD = [b"FIN {0}\n", b"TOUCH {1}\r\n", b"REQ {2} 0\n", b"REQ {3} 2000\r\n", b"NOP\n"]

# lines put at every position of GOOD: nsqd's errors, fatal and not, and
# lines that look like the C forms but are not (the Python path answers)
ERRORS = [
    b"FIN {X}\n",                  # E_FIN_FAILED ... ID not in flight (not fatal)
    b"REQ {X} 0\r\n",              # E_REQ_FAILED
    b"TOUCH {X}\n",                # E_TOUCH_FAILED
    b"FIN {0}\n",                  # a second FIN of one ID, or a FIN before the FIN
    b"FIN 123\n",                  # E_INVALID invalid message ID (fatal)
    b"FIN {0}\r\r\n",              # the ID with a '\r': invalid message ID
    b"REQ {1} x\n",                # E_INVALID REQ could not parse timeout x
    b"REQ {1}\n",                  # E_INVALID REQ insufficient number of params
    b"TOUCH\r\n",                  # E_INVALID TOUCH insufficient number of params
    b"BOGUS\n",                    # E_INVALID invalid command BOGUS
    b"RDY x\n",                    # E_INVALID RDY could not parse count x
]

# valid lines the C parser hands to the Python path, and state changes
OTHERS = [
    b"FIN {0} extra\n",            # an extra parameter: nsqd ignores it
    b"REQ {1} \n",                 # an empty timeout is 0
    b"REQ {1} 99999999999999999999\n",  # wraps as Go's uint64, then clamped
    b"NOP x\r\n",
    b"RDY 0\n",
    b"CLS\n",                      # CLOSE_WAIT; FIN, REQ, TOUCH still allowed
    b"\n",                         # E_INVALID invalid command (empty)
]


def streams(positions_of_others=(0, 3)):
    cases = {"good-lf": b"".join(GOOD).replace(b"\r\n", b"\n"),
             "good-crlf": b"".join(GOOD).replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"),
             "good-mixed": b"".join(GOOD)}
    for i, line in enumerate(ERRORS + OTHERS):
        for at in range(len(GOOD) + 1) if line in ERRORS else positions_of_others:
            cases[f"line{i}-at{at}"] = b"".join(GOOD[:at] + [line] + GOOD[at:])
    return cases


STREAMS = streams()
# one byte per send is slower: each line once, in the middle
BYTEWISE = {name: s for name, s in STREAMS.items() if name.startswith("good") or
            name.endswith("-at2")}


@pytest.fixture(scope="module")
def servers(tmp_path_factory, nsqd_workers):
    started = [Server([], str(tmp_path_factory.mktemp("c")), workers=nsqd_workers),
               Server([], str(tmp_path_factory.mktemp("py")), workers=nsqd_workers,
                      env={"NSQSHM_PYTHON_COMMANDS": "1"})]
    yield started
    for server in started:
        server.cleanup()


def consumer_holding_four(server):
    """A connection subscribed to a fresh topic, holding 4 messages, RDY 0
    (so nothing requeued comes back during the stream)."""
    topic = f"t{uuid.uuid4().hex[:12]}"
    sock = socket.create_connection(server.tcp, timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    dec = p.FrameDecoder()
    sock.sendall(p.MAGIC_V2 + p.sub(topic, "c"))
    assert read_frames(sock, dec, 1) == [(p.FRAME_TYPE_RESPONSE, b"OK")]
    sock.sendall(p.rdy(4))
    status, _ = server.post(f"/mpub?topic={topic}", b"m0\nm1\nm2\nm3")
    assert status == 200
    frames = read_frames(sock, dec, 4)
    ids = [p.decode_message(data).id for _, data in frames]
    sock.sendall(p.rdy(0))
    return topic, sock, dec, ids


def read_frames(sock, dec, n=None):
    """At least n frames (heartbeats skipped), or every frame until the
    connection ends."""
    out = []
    while n is None or len(out) < n:
        for f in dec.frames():
            if f != (p.FRAME_TYPE_RESPONSE, p.HEARTBEAT):
                out.append(f)
        if n is not None and len(out) >= n:
            break
        data = sock.recv(65536)
        if not data:
            assert n is None, f"closed after {out}"
            break
        dec.feed(data)
    return out


def channel_counts(server, topic):
    _, body = server.get("/stats?format=json&topic=" + urllib.parse.quote(topic))
    stats = json.loads(body)
    channel = stats["topics"][0]["channels"][0]
    clients = [{k: c[k] for k in ("ready_count", "in_flight_count", "finish_count",
                                  "requeue_count", "message_count")}
               for c in channel["clients"]]
    return {k: channel[k] for k in ("depth", "in_flight_count", "deferred_count",
                                    "requeue_count", "message_count")}, clients


def run(server, stream, one_byte_per_send):
    """What the server answers to the stream, with IDs as their placeholders;
    then the channel's and client's counts while the connection is open (None
    if the stream closed it)."""
    topic, sock, dec, ids = consumer_holding_four(server)
    names = {f"{{{i}}}".encode(): msg_id for i, msg_id in enumerate(ids)}
    names[b"{X}"] = UNKNOWN
    for name, msg_id in names.items():
        stream = stream.replace(name, msg_id)
    data = stream + MARKER
    with sock:
        if one_byte_per_send:
            try:
                for i in range(len(data)):
                    sock.send(data[i:i + 1])
            except OSError:
                pass  # closed after a fatal error: what it answered is read below
        else:
            sock.sendall(data)
        answers = []
        while MARKER_ANSWER not in answers:
            answers += read_frames(sock, dec, 1)  # at least one: all that has come
            if any(t == p.FRAME_TYPE_ERROR and not d.startswith(NOT_FATAL) for t, d in answers):
                answers += read_frames(sock, dec)  # a fatal error: the rest, to the close
                break
        counts = channel_counts(server, topic) if MARKER_ANSWER in answers else None
    text = [tuple(f) for f in answers]
    for i, msg_id in enumerate(ids):
        text = [tuple(x.replace(msg_id, f"{{{i}}}".encode()) if isinstance(x, bytes) else x
                      for x in f) for f in text]
    return text, counts


def test_c_parser_answers_as_the_python_path(servers):
    compare(servers, one_byte_per_send=False)


@pytest.mark.workers(1)
def test_c_parser_answers_as_the_python_path_one_byte_per_send(servers):
    compare(servers, one_byte_per_send=True)


def compare(servers, one_byte_per_send):
    c_server, py_server = servers
    differences = {}
    for name, stream in (BYTEWISE if one_byte_per_send else STREAMS).items():
        got = run(c_server, stream, one_byte_per_send)
        want = run(py_server, stream, one_byte_per_send)
        if got != want:
            differences[name] = (stream, got, want)
    assert not differences


def test_requeued_and_deferred_messages_come_back(servers):
    """REQ through the C parser: without a delay the message is in the
    channel again, with one it is deferred, and both are delivered again
    (attempts 2) to the next consumer."""
    c_server = servers[0]
    topic, sock, dec, ids = consumer_holding_four(c_server)
    with sock:
        sock.sendall(b"FIN %s\nREQ %s 0\r\nREQ %s 100\nTOUCH %s\n" % tuple(ids) + MARKER)
        assert read_frames(sock, dec, 1)[0][0] == p.FRAME_TYPE_ERROR
        wait_for(lambda: channel_counts(c_server, topic)[0]["in_flight_count"] == 1)
        sock.sendall(p.rdy(3))
        again = [p.decode_message(d) for _, d in read_frames(sock, dec, 2)]
        assert sorted(m.id for m in again) == sorted(ids[1:3])
        assert {m.attempts for m in again} == {2}
