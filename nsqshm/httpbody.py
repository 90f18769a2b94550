"""wsgi.input of nsqshm.httpserver: a request body read off the connection
as Go's net/http reads it (transfer.go body, internal/chunked.go), ending
where the body ends (``wsgi.input_terminated``).

A body cut short by the client (Content-Length larger than what arrives
before its half-close) or chunked wrongly raises BodyError, Go's
io.ErrUnexpectedEOF and chunked-reader errors; the connection is closed after
the answer.  ``settle`` decides, before the answer goes out, what becomes of
a body the application left unread (Go's chunkWriter.writeHeader): 256 KiB
or more announced is not read at all and the connection closes at once; less
is read and dropped; a client still waiting for its 100 Continue closes the
connection.

Chunked framing, as Go reads it:

    chunk     = size-in-hex [";" extension] CRLF data CRLF   (size line < 4096 bytes,
                                                              at most 16 hex digits)
    last      = "0" or "" [";" extension] CRLF
    trailer   = CRLF, or header lines ending in CRLF CRLF within 4096 bytes
"""

from nsqshm.httprequest import ASCII_SPACE, HEX, LWS

MAX_POST_HANDLER_READ = 256 << 10  # maxPostHandlerReadBytes: unread body discarded after a response
MAX_CHUNK_LINE = 4096  # internal/chunked.go maxLineLength, also the trailer's bound
RECV_SIZE = 1 << 16


class BodyError(OSError):
    """The request body could not be read as announced (cut short, bad chunking)."""


class Body:
    """wsgi.input: the request body, self-terminating (b"" at its end).

    A body cut short by the client, or chunked wrongly, raises BodyError
    (Go's io.ErrUnexpectedEOF and chunked-reader errors) and the connection
    is closed after the answer."""

    __slots__ = ("conn", "req", "remaining", "chunked", "chunk_left", "done", "failed",
                 "continue_pending", "continue_sent")

    def __init__(self, conn, req):
        self.conn = conn
        self.req = req
        self.chunked = req.chunked
        self.remaining = req.length  # -1: chunked
        self.chunk_left = 0
        self.done = req.length == 0
        self.failed = False
        self.continue_sent = False
        # Go answers "100 Continue" only to HTTP/1.1 with a body, on its first read
        self.continue_pending = (req.expect_continue and (req.major, req.minor) >= (1, 1)
                                 and not self.done)

    def _fail(self, why):
        self.failed = True
        self.done = True
        raise BodyError(why)

    def _start(self):
        if self.failed:
            raise BodyError("request body unreadable")
        if self.continue_pending:
            self.continue_pending = False
            self.continue_sent = True
            self.conn.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def read(self, size=-1):
        if size is None or size < 0:
            return self._read_all()
        if self.done or size == 0:
            return b""
        self._start()
        if self.chunked:
            return self._read_chunked(size)
        conn = self.conn
        want = min(size, self.remaining)
        if not conn.buf and not conn.fill(min(max(want, RECV_SIZE), 1 << 20)):
            self._fail("unexpected EOF")
        data = conn.buf[:want]
        conn.buf = conn.buf[len(data):]
        self.remaining -= len(data)
        if not self.remaining:
            self.done = True
        return data

    def _read_all(self):
        chunks = []
        while True:
            data = self.read(1 << 20)
            if not data:
                return b"".join(chunks)
            chunks.append(data)

    def readline(self, size=-1):
        out = []
        got = 0
        while size < 0 or got < size:
            conn = self.conn
            if self.done:
                break
            if not self.chunked and not conn.buf:
                self._start()
                if not conn.fill():
                    self._fail("unexpected EOF")
            if self.chunked:
                part = self.read(1 if size < 0 else size - got)  # rare: form parsing
            else:
                limit = self.remaining if size < 0 else min(self.remaining, size - got)
                nl = conn.buf.find(b"\n", 0, limit)
                part = self.read(nl + 1 if nl >= 0 else limit)
            out.append(part)
            got += len(part)
            if part.endswith(b"\n"):
                break
        return b"".join(out)

    def readlines(self, hint=-1):
        return list(iter(self.readline, b""))

    def __iter__(self):
        return iter(self.readline, b"")

    # -- chunked ------------------------------------------------------------------

    def _line(self, limit):
        """A line (without "\\n") of at most limit bytes from the connection."""
        conn = self.conn
        while True:
            nl = conn.buf.find(b"\n", 0, limit)
            if nl >= 0:
                line = conn.buf[:nl]
                conn.buf = conn.buf[nl + 1:]
                return line
            if len(conn.buf) >= limit:
                self._fail("header line too long")
            if not conn.fill():
                self._fail("unexpected EOF")

    def _read_chunked(self, size):
        conn = self.conn
        if not self.chunk_left:
            line = self._line(MAX_CHUNK_LINE).rstrip(ASCII_SPACE)  # trimTrailingWhitespace
            digits = line.partition(b";")[0]  # removeChunkExtension
            if not HEX.issuperset(digits):
                self._fail("invalid byte in chunk length")
            if len(digits) > 16:
                self._fail("http chunk length too large")
            n = int(digits, 16) if digits else 0  # parseHexUint("") is 0
            if n == 0:
                self._read_trailer()
                return b""
            self.chunk_left = n
        if not conn.buf and not conn.fill(min(max(self.chunk_left, RECV_SIZE), 1 << 20)):
            self._fail("unexpected EOF")
        data = conn.buf[:min(size, self.chunk_left)]
        conn.buf = conn.buf[len(data):]
        self.chunk_left -= len(data)
        if not self.chunk_left:
            while len(conn.buf) < 2:
                if not conn.fill():
                    self._fail("unexpected EOF")
            if conn.buf[:2] != b"\r\n":
                self._fail("malformed chunked encoding")
            conn.buf = conn.buf[2:]
        return data

    def _read_trailer(self):
        """body.readTrailer: "\\r\\n", or header lines ending in a blank line
        within 4 KiB (they are dropped: no application here reads trailers)."""
        conn = self.conn
        while len(conn.buf) < 2:
            if not conn.fill():
                self._fail("http: unexpected EOF reading trailer")
        if conn.buf[:2] == b"\r\n":
            conn.buf = conn.buf[2:]
            self.done = True
            return
        while True:
            end = conn.buf.find(b"\r\n\r\n", 0, MAX_CHUNK_LINE)
            if end >= 0:
                break
            if len(conn.buf) >= MAX_CHUNK_LINE or not conn.fill():
                self._fail("http: suspiciously long trailer after chunked body")
        lines = conn.buf[:end].split(b"\n")
        conn.buf = conn.buf[end + 4:]
        for i, line in enumerate(lines):
            line = line.rstrip(b"\r")
            if line[:1] in (b" ", b"\t") and i == 0 or b":" not in line and line[:1] not in LWS:
                self._fail("malformed trailer")
        self.done = True

    # -- what is left after the answer ----------------------------------------------

    def settle(self):
        """chunkWriter.writeHeader's handling of an unread body, before the
        answer goes out: "ok" (read to its end), "close" (the connection
        cannot be reused) or "limit" (too big to discard: closed at once)."""
        if self.done:
            return "close" if self.failed else "ok"
        if self.continue_pending:  # the client waits for our 100 (or sends anyway): unknown state
            return "close"
        if not self.chunked and self.remaining >= MAX_POST_HANDLER_READ:
            return "limit"
        self.continue_pending = False  # no 100 Continue now: the client sends on its own
        left = MAX_POST_HANDLER_READ + 1
        try:
            while left > 0:
                data = self.read(min(left, RECV_SIZE))
                if not data:
                    return "ok"
                left -= len(data)
        except OSError:
            return "close"
        return "limit"
