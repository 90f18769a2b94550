"""The TCP protocol V2 over raw sockets against a real `nsqshm start`,
byte-exact: every command, every error path, fatal or not."""

import json
import os
import socket
import struct
import time

import pytest

from nsqshm import protocol as p
from tests.nsqd.conftest import wait_for

WORKER_COUNTS = (1, 2)  # every test on one worker and on two (conftest.py)

ID = b"0123456789abcdef"


class Conn:
    def __init__(self, server, magic=p.MAGIC_V2):
        self.sock = socket.create_connection(server.tcp, timeout=10)
        self.dec = p.FrameDecoder()
        if magic:
            self.sock.sendall(magic)

    def send(self, data):
        self.sock.sendall(data)
        return self

    def frames(self, n=1, timeout=10, skip_heartbeats=True):
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            for f in self.dec.frames():
                if skip_heartbeats and f == (p.FRAME_TYPE_RESPONSE, p.HEARTBEAT):
                    continue
                out.append(f)
            if len(out) >= n:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"got {out}")
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed after {out}")
            self.dec.feed(data)
        return out

    def frame(self, timeout=10):
        return self.frames(1, timeout)[0]

    def messages(self, n, timeout=10):
        frames = self.frames(n, timeout)
        assert all(t == p.FRAME_TYPE_MESSAGE for t, _ in frames), frames
        return [p.decode_message(d) for _, d in frames]

    def nothing_for(self, seconds):
        """True if no frame (other than heartbeats) arrives within `seconds`."""
        try:
            self.frames(1, timeout=seconds)
        except TimeoutError:
            return True
        return False

    def closed(self, timeout=5):
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.dec.feed(data)
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def identify(self, **data):
        data.setdefault("feature_negotiation", False)
        self.send(p.identify(data))
        return self.frame()

    def subscribe(self, topic, channel, rdy=None, **identify):
        if identify:
            assert self.identify(**identify)[0] == p.FRAME_TYPE_RESPONSE
        self.send(p.sub(topic, channel))
        assert self.frame() == (0, b"OK")
        if rdy is not None:
            self.send(p.rdy(rdy))
        return self

    def close(self):
        self.sock.close()


def publish(server, topic, *bodies):
    c = Conn(server)
    for body in bodies:
        c.send(p.pub(topic, body))
    assert c.frames(len(bodies)) == [(0, b"OK")] * len(bodies)
    c.close()


@pytest.fixture
def small(nsqd_factory):
    return nsqd_factory("--max-msg-size=100", "--max-body-size=1000")


# -- errors: (setup commands, command, expected error frame, fatal) ------------------

SUBSCRIBE = [p.sub("t", "c")]
MPUB_HEAD = b"MPUB t\n"


def mpub_raw(count, *sizes_bodies, body_size=None):
    payload = struct.pack(">i", count) + b"".join(struct.pack(">i", s) + b for s, b in sizes_bodies)
    size = len(payload) if body_size is None else body_size
    return MPUB_HEAD + struct.pack(">i", size) + payload


ERRORS = [
    ([], b"FOO\n", b"E_INVALID invalid command FOO", True),
    ([], b"\n", b"E_INVALID invalid command ", True),
    ([], b"fin " + ID + b"\n", b"E_INVALID invalid command fin", True),
    ([], p.rdy(1), b"E_INVALID cannot RDY in current state", True),
    ([], p.fin(ID), b"E_INVALID cannot FIN in current state", True),
    ([], p.req(ID, 0), b"E_INVALID cannot REQ in current state", True),
    ([], p.touch(ID), b"E_INVALID cannot TOUCH in current state", True),
    ([], p.cls(), b"E_INVALID cannot CLS in current state", True),
    ([], b"SUB t\n", b"E_INVALID SUB insufficient number of parameters", True),
    ([], b"SUB bad! c\n", b'E_BAD_TOPIC SUB topic name "bad!" is not valid', True),
    ([], b"SUB t c\xff\n", b'E_BAD_CHANNEL SUB channel name "c\\xff" is not valid', True),
    ([], b"SUB t " + b"c" * 65 + b"\n",
     b'E_BAD_CHANNEL SUB channel name "' + b"c" * 65 + b'" is not valid', True),
    ([], b"SUB t#foo c\n", b'E_BAD_TOPIC SUB topic name "t#foo" is not valid', True),
    (SUBSCRIBE, p.sub("t", "c"), b"E_INVALID cannot SUB in current state", True),
    (SUBSCRIBE, p.identify({}), b"E_INVALID cannot IDENTIFY in current state", True),
    (SUBSCRIBE, b"RDY -1\n", b"E_INVALID RDY could not parse count -1", True),
    (SUBSCRIBE, b"RDY x\n", b"E_INVALID RDY could not parse count x", True),
    (SUBSCRIBE, p.rdy(2501), b"E_INVALID RDY count 2501 out of range 0-2500", True),
    (SUBSCRIBE, b"FIN\n", b"E_INVALID FIN insufficient number of params", True),
    (SUBSCRIBE, b"FIN 123\n", b"E_INVALID invalid message ID", True),
    (SUBSCRIBE, b"REQ " + ID + b"\n", b"E_INVALID REQ insufficient number of params", True),
    (SUBSCRIBE, b"REQ " + ID + b" x\n", b"E_INVALID REQ could not parse timeout x", True),
    (SUBSCRIBE, b"TOUCH\n", b"E_INVALID TOUCH insufficient number of params", True),
    (SUBSCRIBE, p.fin(ID), b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight", False),
    (SUBSCRIBE, p.req(ID, 10), b"E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight",
     False),
    (SUBSCRIBE, p.touch(ID), b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight",
     False),
    ([], b"PUB\n", b"E_INVALID PUB insufficient number of parameters", True),
    ([], b"PUB t!\n", b'E_BAD_TOPIC PUB topic name "t!" is not valid', True),
    ([], b"PUB t\n" + struct.pack(">i", 0), b"E_BAD_MESSAGE PUB invalid message body size 0", True),
    ([], b"PUB t\n" + struct.pack(">i", -5), b"E_BAD_MESSAGE PUB invalid message body size -5",
     True),
    ([], b"PUB t\n" + struct.pack(">i", 101) + b"x" * 101,
     b"E_BAD_MESSAGE PUB message too big 101 > 100", True),
    ([], b"MPUB\n", b"E_INVALID MPUB insufficient number of parameters", True),
    ([], b"MPUB t!\n", b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "t!" is not valid', True),
    ([], MPUB_HEAD + struct.pack(">i", 0), b"E_BAD_BODY MPUB invalid body size 0", True),
    ([], MPUB_HEAD + struct.pack(">i", 1148) + b"x" * 1148,
     b"E_BAD_BODY MPUB body too big 1148 > 1000", True),
    ([], mpub_raw(0), b"E_BAD_BODY MPUB invalid message count 0", True),
    ([], mpub_raw(200, body_size=4), b"E_BAD_BODY MPUB invalid message count 200", True),
    ([], mpub_raw(2, (1, b"a"), (0, b"")),
     b"E_BAD_MESSAGE MPUB invalid message(1) body size 0", True),
    ([], mpub_raw(2, (1, b"a"), (101, b"y" * 101)),
     b"E_BAD_MESSAGE MPUB message too big 101 > 100", True),
    # a short MPUB waits for the rest of its messages, as nsqd's readMPUB (which reads them
    # from the stream): its error at the end of the stream is in test_nsqd13_differences
    ([], b"DPUB t\n", b"E_INVALID DPUB insufficient number of parameters", True),
    ([], b"DPUB t! 10\n", b'E_BAD_TOPIC DPUB topic name "t!" is not valid', True),
    ([], b"DPUB t x\n", b"E_INVALID DPUB could not parse timeout x", True),
    ([], b"DPUB t 3600001\n", b"E_INVALID DPUB timeout 3600001 out of range 0-3600000", True),
    ([], b"DPUB t 10\n" + struct.pack(">i", 0), b"E_BAD_MESSAGE DPUB invalid message body size 0",
     True),
    ([], b"IDENTIFY\n" + struct.pack(">i", 0), b"E_BAD_BODY IDENTIFY invalid body size 0", True),
    ([], b"IDENTIFY\n" + struct.pack(">i", 1001),
     b"E_BAD_BODY IDENTIFY body too big 1001 > 1000", True),
    ([], b"IDENTIFY\n" + struct.pack(">i", 5) + b"{bad}",
     b"E_BAD_BODY IDENTIFY failed to decode JSON body", True),
    ([], p.identify({"heartbeat_interval": "x"}),
     b"E_BAD_BODY IDENTIFY failed to decode JSON body", True),
    ([], p.identify({"heartbeat_interval": 999}),
     b"E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid", True),
    ([], p.identify({"heartbeat_interval": 60001}),
     b"E_BAD_BODY IDENTIFY heartbeat interval (60001) is invalid", True),
    ([], p.identify({"output_buffer_timeout": 24}),
     b"E_BAD_BODY IDENTIFY output buffer timeout (24) is invalid", True),
    ([], p.identify({"output_buffer_size": 63}),
     b"E_BAD_BODY IDENTIFY output buffer size (63) is invalid", True),
    ([], p.identify({"output_buffer_size": 65537}),
     b"E_BAD_BODY IDENTIFY output buffer size (65537) is invalid", True),
    ([], p.identify({"sample_rate": 100}), b"E_BAD_BODY IDENTIFY sample rate (100) is invalid",
     True),
    ([], p.identify({"msg_timeout": 999}), b"E_BAD_BODY IDENTIFY msg timeout (999) is invalid",
     True),
    ([], p.identify({"msg_timeout": 900001}),
     b"E_BAD_BODY IDENTIFY msg timeout (900001) is invalid", True),
    ([p.identify({"heartbeat_interval": -1})], p.sub("t", "c"),
     b"E_INVALID cannot SUB with heartbeats disabled", True),
    ([], b"AUTH x\n", b"E_INVALID AUTH invalid number of parameters", True),
    ([], p.auth("secret"), b"E_AUTH_DISABLED AUTH disabled", True),
]


@pytest.mark.parametrize("setup,command,error,fatal", ERRORS,
                         ids=[e[2].decode(errors="replace")[:60] for e in ERRORS])
def test_error_paths(small, setup, command, error, fatal):
    c = Conn(small)
    for cmd in setup:
        c.send(cmd)
        assert c.frame()[0] == p.FRAME_TYPE_RESPONSE
    c.send(command)
    assert c.frame() == (p.FRAME_TYPE_ERROR, error)
    if fatal:
        assert c.closed(), "a fatal error must close the connection"
    else:
        c.send(p.nop() + p.pub("alive", b"x"))
        assert c.frame() == (0, b"OK")


def test_bad_magic(nsqd):
    c = Conn(nsqd, magic=b"  V1")
    assert c.frame() == (p.FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL")
    assert c.closed()


def test_line_over_16k_disconnects_without_a_frame(nsqd):
    c = Conn(nsqd)
    c.send(b"NOP" + b" " * 17000)
    assert c.closed()
    assert c.dec.frames() == []


def test_fin_of_another_clients_message(nsqd):
    publish(nsqd, "t", b"mine")
    a = Conn(nsqd).subscribe("t", "c", rdy=1)
    msg = a.messages(1)[0]
    b = Conn(nsqd).subscribe("t", "c")
    b.send(p.fin(msg.id))
    assert b.frame() == (1, b"E_FIN_FAILED FIN " + msg.id + b" failed client does not own message")
    a.send(p.fin(msg.id) + p.nop() + p.pub("t", b"x"))
    assert a.frame() == (0, b"OK")


# -- IDENTIFY ---------------------------------------------------------------------------

def test_identify_without_feature_negotiation_is_ok(nsqd):
    assert Conn(nsqd).identify(client_id="x") == (0, b"OK")


def test_identify_feature_negotiation_reply_is_nsqds_json(nsqd):
    # tls_v1 without --tls-cert is reported off (snappy and deflate: test_compression.py)
    reply = Conn(nsqd).identify(feature_negotiation=True, tls_v1=True)
    assert reply == (0, b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,'
                        b'"msg_timeout":60000,"tls_v1":false,"deflate":false,"deflate_level":6,'
                        b'"max_deflate_level":6,"snappy":false,"sample_rate":0,'
                        b'"auth_required":false,"output_buffer_size":16384,'
                        b'"output_buffer_timeout":250}')


def test_identify_negotiated_values_and_flags(nsqd_factory):
    server = nsqd_factory("--max-rdy-count=100", "--msg-timeout=30s", "--max-deflate-level=3")
    reply = json.loads(Conn(server).identify(
        feature_negotiation=True, msg_timeout=5000, output_buffer_size=2048,
        output_buffer_timeout=-1, sample_rate=10, HEARTBEAT_INTERVAL=2000,
        unknown_key=[1, 2])[1])
    assert reply["max_rdy_count"] == 100
    assert reply["msg_timeout"] == 5000
    assert reply["output_buffer_size"] == 2048
    assert reply["output_buffer_timeout"] == 0
    assert reply["sample_rate"] == 10
    assert reply["deflate_level"] == 3 and reply["max_deflate_level"] == 3
    default = json.loads(Conn(server).identify(feature_negotiation=True)[1])
    assert default["msg_timeout"] == 30000


def test_output_buffer_size_minus_one_means_no_buffering(nsqd):
    reply = json.loads(Conn(nsqd).identify(feature_negotiation=True, output_buffer_size=-1)[1])
    assert reply["output_buffer_size"] == 1 and reply["output_buffer_timeout"] == 0


# -- publishing and delivery ----------------------------------------------------------------

def test_pub_then_sub_delivers_nsq_message_frame(nsqd):
    before = time.time_ns()
    publish(nsqd, "t", b"hello world")
    c = Conn(nsqd).subscribe("t", "c", rdy=1)
    t, data = c.frame()
    assert t == p.FRAME_TYPE_MESSAGE
    msg = p.decode_message(data)
    assert msg.body == b"hello world"
    assert msg.attempts == 1
    assert len(msg.id) == 16 and all(ch in b"0123456789abcdef" for ch in msg.id)
    assert before <= msg.timestamp <= time.time_ns()


def test_mpub_keeps_order(nsqd):
    c = Conn(nsqd)
    bodies = [f"m{i}".encode() for i in range(500)]
    c.send(p.mpub("t", bodies))
    assert c.frame() == (0, b"OK")
    sub = Conn(nsqd).subscribe("t", "c", rdy=500)
    msgs = sub.messages(500)
    assert [m.body for m in msgs] == bodies
    assert len({m.id for m in msgs}) == 500


def test_topic_keeps_messages_until_its_first_channel(nsqd):
    publish(nsqd, "t", b"early")
    time.sleep(0.3)
    c = Conn(nsqd).subscribe("t", "late", rdy=5)
    assert [m.body for m in c.messages(1)] == [b"early"]


def test_every_channel_gets_every_message(nsqd):
    a = Conn(nsqd).subscribe("t", "a", rdy=10)
    b = Conn(nsqd).subscribe("t", "b", rdy=10)
    publish(nsqd, "t", b"1", b"2", b"3")
    assert [m.body for m in a.messages(3)] == [b"1", b"2", b"3"]
    assert [m.body for m in b.messages(3)] == [b"1", b"2", b"3"]


def test_consumers_of_a_channel_share_its_messages(nsqd):
    """300 messages, three consumers at RDY 100 that FIN nothing until each has
    its share: none can hold more than 100, so each gets exactly 100, whichever
    worker it is on, and every message goes to one of them.  (The test FINned as
    it read the first consumer before: a consumer that FINs as fast as it reads
    may take all 300 before the other worker runs at all, and on a loaded CI
    machine once did, [300, 0, 0]; nsqd promises no fairer share than that.)"""
    subs = [Conn(nsqd).subscribe("t", "c", rdy=100) for _ in range(3)]
    c = Conn(nsqd)
    c.send(p.mpub("t", [str(i).encode() for i in range(300)]))
    assert c.frame() == (0, b"OK")
    shares = [s.messages(100, timeout=10) for s in subs]
    assert all(s.nothing_for(0.3) for s in subs)  # (no more than RDY 100 each)
    got = sorted((m.body for share in shares for m in share), key=int)
    assert got == [str(i).encode() for i in range(300)]
    for s, share in zip(subs, shares, strict=True):
        s.send(b"".join(p.fin(m.id) for m in share))
    assert all(s.nothing_for(0.3) for s in subs)


def test_rdy_limits_messages_in_flight(nsqd):
    publish(nsqd, "t", *[b"x"] * 5)
    c = Conn(nsqd).subscribe("t", "c", rdy=2)
    msgs = c.messages(2)
    assert c.nothing_for(0.5)
    c.send(p.fin(msgs[0].id))
    assert len(c.messages(1)) == 1
    assert c.nothing_for(0.3)
    c.send(p.rdy(0))
    c.send(p.fin(msgs[1].id))
    assert c.nothing_for(0.5)  # RDY 0: nothing more even with room


def test_req_requeues_with_attempts_counted(nsqd):
    publish(nsqd, "t", b"again")
    c = Conn(nsqd).subscribe("t", "c", rdy=1)
    first = c.messages(1)[0]
    c.send(p.req(first.id, 0))
    second = c.messages(1)[0]
    assert (second.id, second.body, second.attempts) == (first.id, b"again", 2)


def test_req_with_delay_is_deferred(nsqd):
    publish(nsqd, "t", b"later")
    c = Conn(nsqd).subscribe("t", "c", rdy=1)
    msg = c.messages(1)[0]
    t0 = time.monotonic()
    c.send(p.req(msg.id, 700))
    again = c.messages(1, timeout=5)[0]
    assert time.monotonic() - t0 >= 0.65
    assert again.attempts == 2


def test_req_timeout_is_clamped_not_an_error(nsqd_factory):
    server = nsqd_factory("--max-req-timeout=1s")
    publish(server, "t", b"clamped")
    c = Conn(server).subscribe("t", "c", rdy=1)
    msg = c.messages(1)[0]
    t0 = time.monotonic()
    c.send(p.req(msg.id, 10**9))  # far over the maximum: clamped to 1 s
    assert c.messages(1, timeout=5)[0].attempts == 2
    assert time.monotonic() - t0 < 3


def test_msg_timeout_redelivers_with_attempts(nsqd):
    publish(nsqd, "t", b"slow")
    c = Conn(nsqd).subscribe("t", "c", rdy=1, msg_timeout=1000)
    first = c.messages(1)[0]
    t0 = time.monotonic()
    again = c.messages(1, timeout=5)[0]
    assert time.monotonic() - t0 >= 0.9
    assert (again.id, again.attempts) == (first.id, 2)
    c.send(p.fin(again.id) + p.pub("t", b"x"))
    assert c.frame() == (0, b"OK")


def test_touch_extends_the_timeout(nsqd):
    publish(nsqd, "t", b"touched")
    c = Conn(nsqd).subscribe("t", "c", rdy=1, msg_timeout=1000)
    msg = c.messages(1)[0]
    for _ in range(4):  # 2 s in all, each touch before the 1 s timeout
        time.sleep(0.5)
        c.send(p.touch(msg.id))
    c.send(p.fin(msg.id))
    assert c.nothing_for(1.5)  # never redelivered


def test_touch_cannot_pass_max_msg_timeout(nsqd_factory):
    server = nsqd_factory("--max-msg-timeout=2s")
    publish(server, "t", b"capped")
    c = Conn(server).subscribe("t", "c", rdy=1, msg_timeout=1500)
    msg = c.messages(1)[0]
    t0 = time.monotonic()
    for _ in range(6):
        time.sleep(0.4)
        c.send(p.touch(msg.id))
    again = c.messages(1, timeout=5)[0]
    assert 1.8 <= time.monotonic() - t0 < 3.5  # delivery + 2 s, touches notwithstanding
    assert again.attempts == 2


def test_dpub_delivers_after_the_delay(nsqd):
    c = Conn(nsqd).subscribe("t", "c", rdy=5)
    pub = Conn(nsqd)
    t0 = time.monotonic()
    pub.send(p.dpub("t", 800, b"deferred") + p.pub("t", b"now"))
    assert pub.frames(2) == [(0, b"OK"), (0, b"OK")]
    assert c.messages(1)[0].body == b"now"
    msg = c.messages(1, timeout=5)[0]
    assert msg.body == b"deferred" and time.monotonic() - t0 >= 0.75


def test_dpub_before_any_channel_waits_for_one(nsqd):
    pub = Conn(nsqd)
    pub.send(p.dpub("t", 300, b"d"))
    assert pub.frame() == (0, b"OK")
    c = Conn(nsqd).subscribe("t", "c", rdy=1)
    assert c.messages(1, timeout=5)[0].body == b"d"


def test_cls_then_close_wait_and_rdy_ignored(nsqd):
    publish(nsqd, "t", b"a", b"b")
    c = Conn(nsqd).subscribe("t", "c", rdy=1)
    msg = c.messages(1)[0]
    c.send(p.cls())
    assert c.frame() == (0, b"CLOSE_WAIT")
    c.send(p.rdy(10))  # ignored after CLS: no error, no messages
    c.send(p.fin(msg.id))
    assert c.nothing_for(0.5)
    assert not c.closed(0.2)  # the server leaves closing to the client


def test_nop_has_no_response(nsqd):
    c = Conn(nsqd)
    c.send(p.nop() + p.pub("t", b"x"))
    assert c.frame() == (0, b"OK")


def test_heartbeats_and_disconnect_when_unanswered(nsqd):
    c = Conn(nsqd)
    c.identify(heartbeat_interval=1000)
    t0 = time.monotonic()
    assert c.frames(1, skip_heartbeats=False) == [(0, p.HEARTBEAT)]
    assert c.closed(timeout=5)  # two unanswered heartbeats: the server hangs up
    assert 1.5 <= time.monotonic() - t0 <= 4


def test_answered_heartbeats_keep_the_connection(nsqd):
    c = Conn(nsqd)
    c.identify(heartbeat_interval=1000)
    for _ in range(3):
        assert c.frames(1, skip_heartbeats=False) == [(0, p.HEARTBEAT)]
        c.send(p.nop())
    c.send(p.pub("t", b"x"))
    assert c.frame() == (0, b"OK")


def shm_names(server):
    return sorted(e for e in os.listdir("/dev/shm") if e.startswith(server.prefix))


def test_ephemeral_channel_vanishes_with_its_last_consumer(nsqd):
    c = Conn(nsqd).subscribe("t", "c#ephemeral", rdy=1)
    ring = f"{nsqd.prefix}.c.t:c#ephemeral"
    assert ring in shm_names(nsqd)
    c.close()
    assert wait_for(lambda: ring not in shm_names(nsqd))


def test_ephemeral_topic_vanishes_with_its_last_channel(nsqd):
    c = Conn(nsqd).subscribe("e#ephemeral", "c#ephemeral", rdy=1)
    publish(nsqd, "e#ephemeral", b"x")
    assert c.messages(1)[0].body == b"x"
    c.close()
    assert wait_for(lambda: not [n for n in shm_names(nsqd) if ".e#ephemeral" in n or ":c#" in n])


def test_max_channel_consumers(nsqd_factory):
    server = nsqd_factory("--max-channel-consumers=1")
    first = Conn(server).subscribe("t", "c")
    c = Conn(server)
    c.send(p.sub("t", "c"))
    assert c.frame() == (1, b"E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 1")
    assert c.closed()
    first.close()
