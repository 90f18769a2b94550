"""One TCP conversation with nsqd, as the mutation runs and the vectors of
nsqd13-differences.json define it: the whole input on a fresh connection
(magic included), then a half-close; the answer is the sequence of frames
until the server closes, each as its response text or E_ code ('' for none,
'JSON' for an IDENTIFY response, 'MSG' for a message), heartbeats left out.
"""

import errno
import socket
import struct
import time


def parse_frames(data):
    """Whole frames at the front of data as (type, body), and the rest."""
    frames = []
    pos = 0
    while len(data) - pos >= 8:
        size, ftype = struct.unpack_from(">ii", data, pos)
        if size < 4 or len(data) - pos - 4 < size:
            break
        frames.append((ftype, bytes(data[pos + 8:pos + 4 + size])))
        pos += 4 + size
    return frames, data[pos:]


def word(ftype, body):
    """A frame as an answer word."""
    if ftype == 1:
        return body.split(b" ", 1)[0].decode("latin-1")
    if ftype == 2:
        return "MSG"
    return "JSON" if body.startswith(b"{") else body.decode("latin-1")


class Answer:
    """What a conversation got back."""

    __slots__ = ("frames", "rest", "seconds", "hung")

    def __init__(self, frames, rest, seconds, hung):
        self.frames = frames    # (type, body), heartbeats left out
        self.rest = rest        # bytes after the last whole frame (a cut frame)
        self.seconds = seconds
        self.hung = hung        # neither closed nor answered within the timeout

    @property
    def words(self):
        return [word(t, b) for t, b in self.frames if t != 2]

    @property
    def messages(self):
        return [b[26:] for t, b in self.frames if t == 2]


# A peer that closed first (a fatal error, a reset) makes send or shutdown
# fail with one of these; what it answered before is still to be read.
PEER_CLOSED = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN)


def send_and_half_close(sock, data, chunk=None, linger=0.0):
    """Send data (in writes of `chunk` bytes if given), wait `linger` seconds,
    half-close; a peer that closed early ends the sending quietly."""
    try:
        if chunk:
            for i in range(0, len(data), chunk):
                sock.sendall(data[i:i + chunk])
        else:
            sock.sendall(data)
        if linger:
            time.sleep(linger)
        sock.shutdown(socket.SHUT_WR)
    except OSError as err:
        if err.errno not in PEER_CLOSED:
            raise


def read_to_end(sock, out, start, timeout):
    """Append what sock sends until it closes (a reset counts as the end) to
    `out`; True when `timeout` seconds after `start` pass first (hung)."""
    while True:
        remaining = timeout - (time.monotonic() - start)
        if remaining <= 0:
            return True
        sock.settimeout(remaining)
        try:
            part = sock.recv(65536)
        except OSError as err:
            if err.errno in PEER_CLOSED:
                return False
            if isinstance(err, TimeoutError):
                return True
            raise
        if not part:
            return False
        out += part


def talk(address, data, timeout=10.0, chunk=None, linger=0.0):
    """Send data (in writes of `chunk` bytes if given), wait `linger`
    seconds, half-close, read to the end; an Answer."""
    start = time.monotonic()
    sock = socket.create_connection(address, timeout=timeout)
    received = bytearray()
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        send_and_half_close(sock, data, chunk, linger)
        hung = read_to_end(sock, received, start, timeout)
    finally:
        sock.close()
    frames, rest = parse_frames(received)
    frames = [f for f in frames if f != (0, b"_heartbeat_")]
    return Answer(frames, bytes(rest), time.monotonic() - start, hung)


def converse(address, data, timeout=10.0, chunk=None):
    """(answer words, seconds taken, hung) of talk()."""
    answer = talk(address, data, timeout, chunk)
    return answer.words, answer.seconds, answer.hung
