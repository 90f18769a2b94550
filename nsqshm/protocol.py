"""NSQ's TCP protocol V2 as a pure codec (no I/O), client side: command
encoders and a frame decoder.  Used by the tests and the load generator.

Commands (client to server):

    VERB [arg ...]\\n
    VERB [arg ...]\\n[ 4-byte BE size ][ body ]          IDENTIFY AUTH PUB DPUB
    MPUB topic\\n[ 4-byte BE size ][ 4-byte BE count ]([ 4-byte BE size ][ body ])*

Frames (server to client): [ 4-byte BE size ][ 4-byte BE type ][ data ],
type 0 response, 1 error, 2 message; a message's data is
[ 8-byte BE ts ][ 2-byte BE attempts ][ 16-byte id ][ body ].
"""

import json
import struct

MAGIC_V2 = b"  V2"
FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2
HEARTBEAT = b"_heartbeat_"


def _line(*parts):
    return b" ".join(p if isinstance(p, bytes) else str(p).encode() for p in parts) + b"\n"


def _sized(body):
    return struct.pack(">I", len(body)) + body


def identify(data):
    return b"IDENTIFY\n" + _sized(json.dumps(data, separators=(",", ":")).encode())


def auth(secret):
    return b"AUTH\n" + _sized(secret if isinstance(secret, bytes) else secret.encode())


def sub(topic, channel):
    return _line(b"SUB", topic, channel)


def rdy(count):
    return _line(b"RDY", count)


def fin(msg_id):
    return b"FIN " + msg_id + b"\n"


def req(msg_id, timeout_ms=0):
    return b"REQ " + msg_id + b" " + str(int(timeout_ms)).encode() + b"\n"


def touch(msg_id):
    return b"TOUCH " + msg_id + b"\n"


def nop():
    return b"NOP\n"


def cls():
    return b"CLS\n"


def pub(topic, body):
    return _line(b"PUB", topic) + _sized(body)


def dpub(topic, defer_ms, body):
    return _line(b"DPUB", topic, int(defer_ms)) + _sized(body)


def mpub(topic, bodies):
    payload = struct.pack(">I", len(bodies)) + b"".join(_sized(b) for b in bodies)
    return _line(b"MPUB", topic) + _sized(payload)


class Message:
    __slots__ = ("id", "timestamp", "attempts", "body")

    def __init__(self, msg_id, timestamp, attempts, body):
        self.id, self.timestamp, self.attempts, self.body = msg_id, timestamp, attempts, body

    def __repr__(self):
        return f"Message({self.id!r}, attempts={self.attempts}, body={self.body[:32]!r})"


def decode_message(data):
    timestamp, attempts = struct.unpack_from(">QH", data)
    return Message(bytes(data[10:26]), timestamp, attempts, bytes(data[26:]))


class FrameDecoder:
    """Feed bytes in; take whole frames out as (type, data)."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, data):
        self.buf += data

    def frames(self):
        out = []
        buf = self.buf
        pos = 0
        while len(buf) - pos >= 8:
            size = struct.unpack_from(">I", buf, pos)[0]
            if len(buf) - pos < 4 + size:
                break
            ftype = struct.unpack_from(">I", buf, pos + 4)[0]
            out.append((ftype, bytes(buf[pos + 8:pos + 4 + size])))
            pos += 4 + size
        del buf[:pos]
        return out
