"""What a V2 connection reads, as nsqd's IOLoop reads it through its
16 KiB bufio.Reader: lines of at most MAX_LINE bytes with their '\n',
4-byte big-endian sizes, exact bodies, and an MPUB's messages as far as
their count and sizes go (readMPUB)."""

import errno
import socket

import gevent
from gevent import getcurrent
from gevent.exceptions import ConcurrentObjectUseError

from nsqshm._core import wire
from nsqshm.nsqd.tcp.compression import CorruptStream, decoding_recv

MAX_LINE = 16 * 1024  # nsqd's bufio.Reader size: a longer line (with its '\n') ends the connection
READ_SIZE = 256 * 1024  # at most this much per recv
KEEP_BYTES = 4 * READ_SIZE  # a read buffer up to this large keeps its memory between reads
BATCH_BYTES = 8192  # batched reads wait for this much (about 390 FINs), or for their delay


class Disconnect(Exception):
    """The connection ends without an error frame."""


class LineTooLong(Disconnect):
    """A line longer than nsqd's read buffer: the connection ends without an
    error frame, after the answers to the commands before it (nsqd has
    sent those already)."""


def _wait_on(sock):
    """gevent's wait for a socket to be readable, without its timeout (the
    caller's Timeout bounds it): its checks, then the hub's wait."""
    watcher = sock._read_event
    if watcher is None:
        raise OSError(errno.EBADF, "the socket was closed")
    if watcher.callback is not None:
        raise ConcurrentObjectUseError(f"This socket is already used by another greenlet: "
                                       f"{watcher.callback!r}")
    sock.hub.wait(watcher)


class _TimeUp(Exception):
    """A batched read's delay passed (_wait_batch)."""


class _Timer:
    """A timer a connection keeps for its waits, started again for each with
    libev's ev_timer_again: a stop then a start would go on from the time that
    was left, not start the whole time again."""

    def __init__(self, seconds):
        self.seconds = seconds
        # (priority -1, as gevent's Timeout: input that came in the same loop turn as
        # the expiry is read first, not dropped with the connection)
        self.timer = gevent.get_hub().loop.timer(seconds, seconds, priority=-1)

    def wait(self, sock, exc):
        """Until sock is readable; `exc` raised in this greenlet if that takes
        longer than `seconds`."""
        self.timer.again(getcurrent().throw, exc)
        try:
            _wait_on(sock)
        finally:
            self.timer.stop()


class Reader:
    """Buffered reads of lines and exact sizes from a gevent socket (or, once
    upgraded, a TLS socket and/or a decompressing codec: `recv`)."""

    def __init__(self, sock, before_wait=None):
        self.sock = sock
        self.recv = sock.recv
        self.plain_sock = sock  # while it is the transport, bytes go straight into buf
        self.decoding = False
        self.drained = False  # the last recv emptied the socket
        self.lowat = 1  # the socket's SO_RCVLOWAT: > 1 while reads are batched
        self.batch_delay = 0.0
        self.buf = bytearray()
        self.pos = 0
        self.before_wait = before_wait  # called before each read from the socket
        self._deadline = None  # _wait_readable's _Timer, kept for the connection
        self._batch_timer = None  # _wait_batch's

    def fill(self):
        """Read more from the connection (Disconnect at its end)."""
        if self.before_wait is not None:
            self.before_wait()
        if self.pos:
            wire.drop_front(self.buf, self.pos, KEEP_BYTES)
            self.pos = 0
        sock = self.sock
        if sock is self.plain_sock and not self.decoding:
            # the plain socket: recv() onto the end of buf (one copy, the kernel's);
            # gevent's wait for readability, with the socket's timeout.  A recv that
            # took less than it could emptied the socket: wait first, rather than
            # spend a recv on EAGAIN (a consumer's FINs come a few per segment)
            if self.drained:
                if self.lowat > 1:
                    self._wait_batch(sock)
                else:
                    self._wait_readable(sock)
            while True:
                n = wire.recv_append(sock.fileno(), self.buf, READ_SIZE)
                if n > 0:
                    self.drained = n < READ_SIZE
                    return
                if n == 0:
                    raise Disconnect("EOF")
                if self.lowat > 1:  # nothing came in the delay: wake for any byte again
                    self._set_lowat(1)
                self._wait_readable(sock)
        try:
            data = self.recv(READ_SIZE)
        except CorruptStream as err:
            raise Disconnect(str(err)) from None
        if not data:
            raise Disconnect("EOF")
        self.buf += data

    # gevent's own wait for a socket with a timeout (sock._wait) makes a Timeout
    # each time: ~1.8 us, and a consumer's connection waits once for every few FINs
    # it reads.  These keep a timer per connection and start it again for each
    # wait (~0.2 us; bench/notes/logtopic.md).

    def _wait_readable(self, sock):
        """sock._wait(sock._read_event): until the socket is readable, at
        most the socket's timeout (socket.timeout then, as gevent raises)."""
        seconds = sock.timeout
        if seconds is None:
            sock._wait(sock._read_event)  # (no timeout: gevent makes none either)
            return
        if self._deadline is None or self._deadline.seconds != seconds:
            self._deadline = _Timer(seconds)
        self._deadline.wait(sock, socket.timeout)

    def _wait_batch(self, sock):
        """Until the socket is readable (past its low-water mark) or
        batch_delay passed, whichever comes first (the delay is far below a
        heartbeat timeout: the socket's timeout never ends this wait first)."""
        if self._batch_timer is None or self._batch_timer.seconds != self.batch_delay:
            self._batch_timer = _Timer(self.batch_delay)
        try:
            self._batch_timer.wait(sock, _TimeUp)
        except _TimeUp:
            pass

    def batch_reads(self, delay):
        """Batch the reads of the plain TCP socket from here on (delay > 0) or
        not (0): a wait for input ends once BATCH_BYTES are there (the
        kernel's SO_RCVLOWAT: no wake-up before) or after delay, whichever
        comes first.  A client that sends a command at a time and then waits
        for an answer gets it after delay at most; what is there is always
        read (a non-blocking recv ignores the low-water mark)."""
        lowat = BATCH_BYTES if delay > 0 else 1
        if lowat == self.lowat or self.sock is not self.plain_sock or self.decoding:
            return
        if self.sock.family not in (socket.AF_INET, socket.AF_INET6):
            return  # a Unix socket's poll ignores the mark
        self.batch_delay = delay
        self._set_lowat(lowat)

    def _set_lowat(self, lowat):
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
        except OSError:
            return
        self.lowat = lowat

    def pending(self):
        """Bytes received and not consumed yet."""
        return len(self.buf) - self.pos

    def set_codec(self, codec):
        """From here on the stream is compressed: what was received past the
        current position already is, too."""
        leftover = bytes(self.buf[self.pos:])
        del self.buf[:]
        self.pos = 0
        self.decoding = True
        if leftover:
            self.buf += codec.decode(leftover)
        self.recv = decoding_recv(self.sock.recv, codec)

    def readline(self):
        while True:
            i = self.buf.find(b"\n", self.pos, self.pos + MAX_LINE)
            if i >= 0:
                line = bytes(self.buf[self.pos:i])
                self.pos = i + 1
                return line
            if len(self.buf) - self.pos >= MAX_LINE:
                raise LineTooLong("bufio: buffer full")
            self.fill()

    def read(self, n):
        while len(self.buf) - self.pos < n:
            self.fill()
        data = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return data

    def read_view(self, n):
        """The next n bytes as a view of the read buffer, not a copy: the
        caller releases it before the next read (a live view makes the next
        fill raise BufferError)."""
        while len(self.buf) - self.pos < n:
            self.fill()
        view = memoryview(self.buf)[self.pos:self.pos + n]
        self.pos += n
        return view

    def read_len(self):
        """A 4-byte big-endian signed length (Go's int32 readLen)."""
        return int.from_bytes(self.read(4), "big", signed=True)

    def read_mpub(self, max_msg_size, max_body_size):
        """An MPUB's messages, read as nsqd's readMPUB reads them: from the
        stream, as far as the count and sizes go (the announced body size
        does not bound them).  Returns (status, index, value, data): data
        is the count and the messages (for wire.pack_mpub) when status is
        MPUB_OK, a view of the read buffer to release before the next read; else status is the first error, and an MPUB_INCOMPLETE one
        means the stream ended first."""
        scan_pos, index = 0, 0
        while True:
            status, index, value, scan_pos = wire.scan_mpub(
                self.buf, self.pos, scan_pos, index, max_msg_size, max_body_size)
            if status == wire.MPUB_OK:
                data = memoryview(self.buf)[self.pos:scan_pos]  # released by the caller
                self.pos = scan_pos
                return status, index, value, data
            if status not in wire.MPUB_INCOMPLETE:
                return status, index, value, None
            if scan_pos:
                scan_pos -= self.pos  # fill moves what is pending to the front
            try:
                self.fill()
            except Disconnect:
                return status, index, value, None
            if scan_pos:
                scan_pos += self.pos
