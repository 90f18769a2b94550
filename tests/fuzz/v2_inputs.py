"""Seeded V2 command streams for the fuzzer, each with what nsqd 1.3's source
says the server must answer, as far as that is known.

A stream is magic + commands for one connection.  Each command is built
with its expected answer: a word ('OK', 'JSON', 'CLOSE_WAIT', an E_ code)
or None (no frame), and whether it ends the connection (nsqd's fatal
errors).  A mutated stream keeps the expectations of the commands wholly
before its first mutated byte; after that only the oracle's general rules
hold (every frame a known answer, no hang, no message of another topic).

Message bodies are tagged with their topic (tag/untag), so that a
subscriber can tell a message that is not of its topic, even when
mutations have been at work (a mutated tag does not check).
"""

import json
import struct
import zlib

# every name nsqd accepts for a topic and a channel ([.a-zA-Z0-9_-]{1,64}, #ephemeral),
# odd ones first; the fuzzer keeps to these so that its topics stay few
ODD_NAMES = [b".", b"..", b"...", b"x#ephemeral", b"a" * 64, b"A-b.c_9", b"-", b"_"]
NAMES = ODD_NAMES + [b"fz0", b"fz1", b"fz2", b"fz3"]
CHANNEL_NAMES = NAMES + [b"c", b"c#ephemeral"]
# what nsqd refuses
BAD_NAMES = [b"", b"a" * 65, b"a:b", b"a\x00b", b"\xff\xfe", b"#ephemeral", b"x#eph", b"x#ephemeral#ephemeral",
             "\u00e9".encode(), b"\xf0\x9f\x98\x80", b"a/b", b"a\tb"]

FATAL = True
CLOSING = b"?closing"  # Stream.subscribed after CLS (what it was subscribed to is kept apart)
ANSWERS = {"OK", "JSON", "CLOSE_WAIT"}
ERROR_CODES = {"E_INVALID", "E_BAD_BODY", "E_BAD_TOPIC", "E_BAD_CHANNEL", "E_BAD_MESSAGE",
               "E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED", "E_FIN_FAILED", "E_REQ_FAILED",
               "E_TOUCH_FAILED", "E_SUB_FAILED", "E_IDENTIFY_FAILED", "E_AUTH_DISABLED",
               "E_AUTH_FAILED", "E_AUTH_FIRST", "E_UNAUTHORIZED", "E_BAD_PROTOCOL"}
# numbers worth trying wherever a size, count or timeout goes
EDGE_INTS = [0, 1, -1, 2, 63, 64, 255, 256, 1000, 3600000, 3600001, 16383, 16384, 65535, 65536,
             2 ** 31 - 1, -(2 ** 31), 2 ** 31 - 2]


def tag(topic, nonce):
    """A body saying which topic it was published to (checkable)."""
    head = b"T|" + topic + b"|" + str(nonce).encode() + b"|"
    return head + b"%08x" % zlib.crc32(head)


def untag(body):
    """The topic a tagged body names, or None (untagged or damaged)."""
    if not body.startswith(b"T|") or len(body) < 12:
        return None
    head, crc = body[:-8], body[-8:]
    if b"%08x" % zlib.crc32(head) != crc:
        return None
    return head[2:].split(b"|", 1)[0]


class Stream:
    """Commands for one connection: bytes and expectations."""

    def __init__(self, magic=b"  V2"):
        self.parts = [magic]
        self.expect = []      # (offset where the command ends, word or None, fatal)
        self.subscribed = None  # the topic of its SUB, if any (CLOSING after CLS)
        self.topic = None       # the topic of its SUB, kept after CLS
        self.ended = False      # a fatal command was added: nothing after it is read

    @property
    def data(self):
        return b"".join(self.parts)

    def add(self, data, answer=None, fatal=False):
        self.parts.append(data)
        self.expect.append((sum(map(len, self.parts)), answer, fatal))
        if fatal:
            self.ended = True


class Limits:
    def __init__(self, max_msg_size, max_body_size, max_rdy_count=2500, max_req_timeout_ms=3600000,
                 max_heartbeat_ms=60000):
        self.msg = max_msg_size
        self.body = max_body_size
        self.rdy = max_rdy_count
        self.req_ms = max_req_timeout_ms
        self.heartbeat_ms = max_heartbeat_ms


def sized(body, size=None):
    return struct.pack(">i", len(body) if size is None else size) + body


class Generator:
    """Builds streams from a random.Random: generate(rng) -> Stream."""

    def __init__(self, limits, names=NAMES):
        self.limits = limits
        self.names = names
        self.channels = names + [n for n in CHANNEL_NAMES if n not in NAMES]
        self.nonce = 0

    def body(self, rng, topic, size=None):
        self.nonce += 1
        b = tag(topic, self.nonce)
        if size is None:
            size = rng.choice([len(b), len(b), len(b) + rng.randrange(64), rng.randrange(1, 8)])
        if size <= len(b):
            return b[:size] if size < len(b) else b
        return b + b"\x00" * (size - len(b))

    def message_size(self, rng):
        m = self.limits.msg
        return rng.choice([1, 2, m - 1, m, rng.randrange(1, m + 1), rng.randrange(1, 200)])

    # -- one command each, appended to s ------------------------------------------------

    def pub(self, rng, s):
        topic = rng.choice(self.names)
        if rng.random() < 0.1:
            bad = rng.choice([0, -1, self.limits.msg + 1, 2 ** 31 - 1])
            s.add(b"PUB " + topic + b"\n" + struct.pack(">i", bad), "E_BAD_MESSAGE", FATAL)
        elif rng.random() < 0.05:
            s.add(b"PUB " + rng.choice(BAD_NAMES) + b"\n" + sized(b"x"), "E_BAD_TOPIC", FATAL)
        else:
            s.add(b"PUB " + topic + b"\n" + sized(self.body(rng, topic, self.message_size(rng))), "OK")

    def dpub(self, rng, s):
        topic = rng.choice(self.names)
        r = rng.random()
        if r < 0.1:
            s.add(b"DPUB " + topic + b" " + str(self.limits.req_ms + 1).encode() + b"\n",
                  "E_INVALID", FATAL)
        elif r < 0.15:
            s.add(b"DPUB " + topic + b" 1.5\n", "E_INVALID", FATAL)
        else:
            ms = rng.choice([0, 1, 10, 1000, self.limits.req_ms])
            s.add(b"DPUB " + topic + b" " + str(ms).encode() + b"\n"
                  + sized(self.body(rng, topic, self.message_size(rng))), "OK")

    def mpub(self, rng, s):
        topic = rng.choice(self.names)
        limit = self.limits
        n = rng.choice([1, 2, 3, 10, rng.randrange(1, 50)])
        bodies = []
        total = 4
        for _ in range(n):
            size = min(self.message_size(rng), max(1, limit.body - total - 4))
            if total + 4 + size > limit.body:
                break
            bodies.append(self.body(rng, topic, size))
            total += 4 + size
        payload = struct.pack(">i", len(bodies)) + b"".join(sized(b) for b in bodies)
        r = rng.random()
        if r < 0.08:  # the announced size is checked, not used (readMPUB)
            announced = rng.choice([1, 3, limit.body])
            s.add(b"MPUB " + topic + b"\n" + sized(payload, announced), "OK")
        elif r < 0.12:
            s.add(b"MPUB " + topic + b"\n" + sized(b"\x00" * 8, limit.body + 1), "E_BAD_BODY", FATAL)
        elif r < 0.16:
            count = rng.choice([0, -1, (limit.body - 4) // 5 + 1])
            s.add(b"MPUB " + topic + b"\n" + sized(struct.pack(">i", count)), "E_BAD_BODY", FATAL)
        elif r < 0.2:
            big = struct.pack(">ii", 1, limit.msg + 1)
            s.add(b"MPUB " + topic + b"\n" + sized(big), "E_BAD_MESSAGE", FATAL)
        else:
            s.add(b"MPUB " + topic + b"\n" + sized(payload), "OK")

    def identify(self, rng, s):
        if s.subscribed is not None:
            s.add(b"IDENTIFY\n" + sized(b"{}"), "E_INVALID", FATAL)
            return
        data = {"client_id": rng.choice(["fz", "", "\u00e9", "x" * 100]),
                "user_agent": "fuzz/1"}
        answer = "OK"
        if rng.random() < 0.5:
            data["feature_negotiation"] = True
            answer = "JSON"
        if rng.random() < 0.5:
            data["heartbeat_interval"] = rng.choice([1000, 5000, self.limits.heartbeat_ms])
        if rng.random() < 0.3:
            data["output_buffer_timeout"] = rng.choice([-1, 25, 250, 1000])
        if rng.random() < 0.3:
            data["output_buffer_size"] = rng.choice([-1, 64, 16384, 65536])
        if rng.random() < 0.2:
            data["msg_timeout"] = rng.choice([1000, 60000])
        body = json.dumps(data).encode()
        if rng.random() < 0.03:  # sizes at the limits of a command body
            size = rng.choice([self.limits.body + 1, 0, -1])
            s.add(b"IDENTIFY\n" + sized(b"{}", size), "E_BAD_BODY", FATAL)
            return
        if rng.random() < 0.15:
            body, answer = rng.choice([
                (b"null", "OK"), (b"\xef\xbb\xbf{}", "E_BAD_BODY"), (b"[1]", "E_BAD_BODY"),
                (b'{"sample_rate": 100}', "E_BAD_BODY"), (b'{"heartbeat_interval": 999}', "E_BAD_BODY"),
                (b'{"output_buffer_size": 63}', "E_BAD_BODY"), (b"{", "E_BAD_BODY"),
                (b'{"client_id": 1}', "E_BAD_BODY"), (b'{"msg_timeout": 1e3}', "E_BAD_BODY"),
            ])
        fatal = answer.startswith("E_")
        s.add(b"IDENTIFY\n" + sized(body), answer, fatal)

    def sub(self, rng, s):
        if s.subscribed is not None:
            s.add(b"SUB fz0 c\n", "E_INVALID", FATAL)
            return
        if rng.random() < 0.1:
            s.add(b"SUB " + rng.choice(BAD_NAMES) + b" c\n", "E_BAD_TOPIC", FATAL)
            return
        if rng.random() < 0.05:
            s.add(b"SUB fz0 " + rng.choice(BAD_NAMES) + b"\n", "E_BAD_CHANNEL", FATAL)
            return
        topic = rng.choice(self.names)
        s.add(b"SUB " + topic + b" " + rng.choice(self.channels) + b"\n", "OK")
        s.subscribed = topic

    def rdy(self, rng, s):
        if s.subscribed is None:
            s.add(b"RDY 1\n", "E_INVALID", FATAL)
            return
        if s.subscribed == CLOSING:  # nsqd ignores RDY after CLS, whatever it says
            s.add(b"RDY " + str(rng.choice([0, 1, -1, 10 ** 6])).encode() + b"\n", None)
            return
        r = rng.random()
        if r < 0.1:
            s.add(b"RDY " + str(self.limits.rdy + 1).encode() + b"\n", "E_INVALID", FATAL)
        elif r < 0.15:
            s.add(b"RDY -1\n", "E_INVALID", FATAL)
        else:
            s.add(b"RDY " + str(rng.choice([0, 1, 10, self.limits.rdy])).encode() + b"\n", None)

    def by_id(self, rng, s, verb, code):
        msg_id = rng.choice([b"0123456789abcdef", b"%016x" % rng.getrandbits(64)])
        extra = b" 0" if verb == b"REQ" else b""
        if s.subscribed is None:
            s.add(verb + b" " + msg_id + extra + b"\n", "E_INVALID", FATAL)
        elif rng.random() < 0.1:
            s.add(verb + b" short" + extra + b"\n", "E_INVALID", FATAL)
        else:
            s.add(verb + b" " + msg_id + extra + b"\n", code)  # an ID not in flight: not fatal

    def fin(self, rng, s):
        self.by_id(rng, s, b"FIN", "E_FIN_FAILED")

    def req(self, rng, s):
        self.by_id(rng, s, b"REQ", "E_REQ_FAILED")

    def touch(self, rng, s):
        self.by_id(rng, s, b"TOUCH", "E_TOUCH_FAILED")

    def cls(self, rng, s):
        if s.subscribed is None or s.subscribed == CLOSING:
            s.add(b"CLS\n", "E_INVALID", FATAL)
        else:
            s.add(b"CLS\n", "CLOSE_WAIT")
            s.subscribed = CLOSING

    def nop(self, rng, s):
        s.add(rng.choice([b"NOP\n", b"NOP\r\n"]), None)

    def auth(self, rng, s):
        if s.subscribed is None and rng.random() < 0.2:
            size = rng.choice([self.limits.body + 1, 0, -1])
            s.add(b"AUTH\n" + sized(b"secret", size), "E_BAD_BODY", FATAL)
        elif s.subscribed is not None:
            s.add(b"AUTH\n" + sized(b"secret"), "E_INVALID", FATAL)
        else:
            s.add(b"AUTH\n" + sized(b"secret"), "E_AUTH_DISABLED", FATAL)

    def junk(self, rng, s):
        r = rng.random()
        if r < 0.4:
            s.add(rng.choice([b"FOO\n", b"\n", b"pub x\n", b"PUBX\n", b"\xff\n"]), "E_INVALID", FATAL)
        elif r < 0.7:  # a line of at most nsqd's read buffer (16 KiB with its '\n') is a line
            s.add(b"NOP " + b"x" * (16 * 1024 - 5) + b"\n", None)
        else:  # one byte longer ends the connection without a frame
            s.add(b"NOP " + b"x" * (16 * 1024 - 4) + b"\n", "", FATAL)

    VERBS = ["pub", "pub", "pub", "mpub", "mpub", "dpub", "nop", "identify", "sub", "sub", "rdy",
             "fin", "req", "touch", "cls", "auth", "junk"]

    def generate(self, rng, max_commands=12):
        if rng.random() < 0.01:
            s = Stream(magic=rng.choice([b"  V1", b"  v2", b"GET ", b"\x00\x00\x00\x00"]))
            s.add(b"", "E_BAD_PROTOCOL", FATAL)
            return s
        s = Stream()
        for _ in range(rng.randrange(1, max_commands + 1)):
            topic = s.subscribed
            getattr(self, rng.choice(self.VERBS))(rng, s)
            if s.subscribed is not None and topic is None:
                s.topic = s.subscribed
            if s.ended:
                break
        return s


def mutate(rng, data, limits, start=4):
    """Apply 1-4 random mutations to data past `start`; returns (bytes,
    offset of the first mutated byte)."""
    data = bytearray(data)
    first = len(data)
    for _ in range(rng.randrange(1, 5)):
        if len(data) <= start:
            break
        pos = rng.randrange(start, len(data))
        op = rng.randrange(8)
        if op == 0:
            data[pos] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[pos] = rng.randrange(256)
        elif op == 2:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
        elif op == 3:
            del data[pos:pos + rng.randrange(1, 16)]
        elif op == 4:
            end = min(len(data), pos + rng.randrange(1, 64))
            data[pos:pos] = data[pos:end]
        elif op == 5:
            n = rng.choice(EDGE_INTS + [limits.msg, limits.msg + 1, limits.body, limits.body + 1])
            data[pos:pos + 4] = struct.pack(">i", n)
        elif op == 6:
            del data[pos:]
        else:
            data[pos:pos] = rng.choice([b"\n", b" ", b"\r\n", b"\x00", b"\xff", b"#ephemeral",
                                        b" " + rng.choice(BAD_NAMES), b"NOP\n"])
        first = min(first, pos)
    return bytes(data), first
