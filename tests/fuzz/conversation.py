"""One TCP conversation with nsqd, as the mutation runs and the vectors of
nsqd13-differences.json define it: the whole input on a fresh connection
(magic included), then a half-close; the answer is the sequence of frames
until the server closes, each as its response text or E_ code ('' for none,
'JSON' for an IDENTIFY response), heartbeats left out."""

import socket
import struct
import time

HEARTBEAT_FRAME = struct.pack(">ii", 15, 0) + b"_heartbeat_"


def frame_words(data):
    """The answer words of whole frames in data, and the bytes left over."""
    words = []
    pos = 0
    while len(data) - pos >= 8:
        size, ftype = struct.unpack_from(">ii", data, pos)
        if len(data) - pos - 4 < size:
            break
        body = bytes(data[pos + 8:pos + 4 + size])
        pos += 4 + size
        if ftype == 0 and body == b"_heartbeat_":
            continue
        if ftype == 1:
            words.append(body.split(b" ", 1)[0].decode("latin-1"))
        elif ftype == 0:
            words.append("JSON" if body.startswith(b"{") else body.decode("latin-1"))
        else:
            words.append("MSG")
    return words, data[pos:]


def converse(address, data, timeout=10.0, chunk=None):
    """Send data (in chunks of `chunk` bytes if given), half-close, read to
    the end.  Returns (answer words, seconds taken, hung): hung when the
    server neither closed nor answered within timeout."""
    start = time.monotonic()
    sock = socket.create_connection(address, timeout=timeout)
    received = bytearray()
    hung = False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if chunk:
                for i in range(0, len(data), chunk):
                    sock.sendall(data[i:i + chunk])
            else:
                sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed early (a fatal error): read what was answered
        while True:
            remaining = timeout - (time.monotonic() - start)
            if remaining <= 0:
                hung = True
                break
            sock.settimeout(remaining)
            try:
                part = sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                break
            except TimeoutError:
                hung = True
                break
            if not part:
                break
            received += part
    finally:
        sock.close()
    words, _ = frame_words(received)
    return words, time.monotonic() - start, hung
