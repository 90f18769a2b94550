"""The inputs a mutation run found answered differently from Go nsqd 1.3
(issue 21, item 5), each sent whole on a fresh connection to a real server
(`--workers 1` and `2`): every group gets Go's answer.

The table is tests/nsqd/vectors/nsqd13_tcp.json (a copy, so that this test
does not depend on the shared directory); when ../shared/vectors of the
repository root holds the original, its answers are checked against the copy.
Then a few of the rules behind the groups, with nsqd's exact texts."""

import json
import os
import socket
import struct

import pytest

from tests.fuzz.conversation import converse
from tests.nsqd.conftest import Server

HERE = os.path.dirname(__file__)
COPY = os.path.join(HERE, "vectors", "nsqd13_tcp.json")
SHARED = os.path.join(HERE, "..", "..", "..", "shared", "vectors", "nsqd13-differences.json")
GROUPS = json.load(open(COPY))["tcp"]


@pytest.fixture(scope="module", params=[1, 2], ids=["workers1", "workers2"])
def server(request, tmp_path_factory):
    srv = Server([f"--workers={request.param}"], str(tmp_path_factory.mktemp("data")))
    yield srv
    srv.cleanup()
    tracebacks = [line for line in srv.lines if "Traceback" in line]
    assert not tracebacks, "".join(srv.lines)


@pytest.mark.skipif(not os.path.exists(SHARED), reason="no shared/vectors next to the repository")
def test_the_copy_has_the_shared_vectors_answers():
    shared = json.load(open(SHARED))["tcp"]
    assert len(shared) == len(GROUPS)
    for original, copy in zip(shared, GROUPS, strict=True):
        assert original["input_hex"] == copy["input_hex"]
        if original["go_nsqd_1_3"] is not None:
            assert original["go_nsqd_1_3"] == copy["go_nsqd_1_3"]


def test_every_group_gets_nsqds_answer(server):
    wrong = []
    for group in GROUPS:
        words, _, hung = converse(server.tcp, bytes.fromhex(group["input_hex"]))
        answer = " ".join(words)
        if hung or answer != group["go_nsqd_1_3"]:
            wrong.append((group["group"], group["kind"], group["go_nsqd_1_3"], answer, hung))
    assert not wrong, "\n".join(map(repr, wrong))


# -- the rules, with nsqd's texts ----------------------------------------------------------

def frames(server, data):
    """Every frame (type, data) of a conversation until the server closes."""
    sock = socket.create_connection(server.tcp, timeout=10)
    sock.sendall(b"  V2" + data)
    sock.shutdown(socket.SHUT_WR)
    received = bytearray()
    while True:
        part = sock.recv(65536)
        if not part:
            break
        received += part
    sock.close()
    out, pos = [], 0
    while pos < len(received):
        size, ftype = struct.unpack_from(">ii", received, pos)
        out.append((ftype, bytes(received[pos + 8:pos + 4 + size])))
        pos += 4 + size
    return out


def mpub(topic, body_size, count, *bodies):
    return (b"MPUB " + topic + b"\n" + struct.pack(">ii", body_size, count)
            + b"".join(struct.pack(">i", len(b)) + b for b in bodies))


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    srv = Server(["--workers=1"], str(tmp_path_factory.mktemp("data")))
    yield srv
    srv.cleanup()


def test_mpub_reads_its_messages_from_the_stream_not_the_announced_body(one):
    # announced 1 MiB, then two messages and a NOP: nsqd answers at once, and
    # what follows the messages is the next command
    data = mpub(b"t", 1 << 20, 2, b"a", b"b") + b"NOP\nFOO\n"
    assert frames(one, data) == [(0, b"OK"), (1, b"E_INVALID invalid command FOO")]
    # announced 3 bytes: the count and messages are read past them
    assert frames(one, mpub(b"t", 3, 1, b"abc")) == [(0, b"OK")]


def test_mpub_cut_short_is_answered_before_the_close(one):
    data = mpub(b"t", 100, 2, b"a") + struct.pack(">i", 10) + b"xy"
    assert frames(one, data) == [(1, b"E_BAD_MESSAGE MPUB failed to read message body")]
    data = mpub(b"t", 100, 2, b"a")
    assert frames(one, data) == [(1, b"E_BAD_MESSAGE MPUB failed to read message(1) body size")]
    assert frames(one, b"MPUB t\n\x00\x00\x00\x10\x00\x00") == [
        (1, b"E_BAD_BODY MPUB failed to read message count")]
    assert frames(one, mpub(b"t", 10, 0x7FFFFFFF)) == [
        (1, b"E_BAD_BODY MPUB invalid message count 2147483647")]


def test_a_line_longer_than_nsqds_read_buffer_closes_without_a_frame(one):
    # 16 KiB with its '\n' is the most bufio.Reader.ReadSlice returns
    longest = b"NOP " + b"x" * (16 * 1024 - 5) + b"\n"
    assert frames(one, longest + b"FOO\n") == [(1, b"E_INVALID invalid command FOO")]
    assert frames(one, b"NOP " + b"x" * (16 * 1024 - 4) + b"\nFOO\n") == []
    # what came before it is answered first (nsqd answered it before reading on)
    data = b"PUB t\n\x00\x00\x00\x01xNOP " + b"x" * (16 * 1024) + b"\n"
    assert frames(one, data) == [(0, b"OK")]


IDENTIFY_OK = [(0, b"OK")]
IDENTIFY_BAD = [(1, b"E_BAD_BODY IDENTIFY failed to decode JSON body")]


@pytest.mark.parametrize("body, answer", [
    (b"null", IDENTIFY_OK),                                  # Unmarshal of null: no-op
    (b"\xef\xbb\xbf{}", IDENTIFY_BAD),                       # a BOM is no JSON
    (b'\xff\xfe{\x00}\x00', IDENTIFY_BAD),                   # nor is UTF-16
    (b'{"client_\xe9d": "x"}', IDENTIFY_OK),                 # invalid UTF-8 in a string: U+FFFD
    (b'{"sample_rate": 2147483648}', IDENTIFY_BAD),          # int32
    (b'{"heartbeat_interval": 9223372036854775808}', IDENTIFY_BAD),  # int64
    (b'{"msg_timeout": NaN}', IDENTIFY_BAD),
    (b"[]", IDENTIFY_BAD),
    (b'{"HEARTBEAT_INTERVAL": 1}', [(1, b"E_BAD_BODY IDENTIFY heartbeat interval (1) is invalid")]),
])
def test_identify_decodes_json_as_go(one, body, answer):
    assert frames(one, b"IDENTIFY\n" + struct.pack(">i", len(body)) + body) == answer


def test_dpub_timeouts_wrap_as_gos_duration(one):
    # 2^63 ms is 0 as a Duration: a valid DPUB, as in nsqd
    assert frames(one, b"DPUB t 9223372036854775808\n\x00\x00\x00\x01x") == [(0, b"OK")]
    assert frames(one, b"DPUB t 18446744073709551615\n\x00\x00\x00\x01x") == [
        (1, b"E_INVALID DPUB timeout 18446744073709551615 out of range 0-3600000")]
