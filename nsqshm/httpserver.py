"""A strict HTTP/1.1 server for WSGI applications on gevent, parsing requests
as Go's net/http server does (server.go, request.go, transfer.go,
net/textproto, internal/chunked.go of Go 1.19, which nsqd 1.3 is built with).

gevent.pywsgi is laxer than Go: it takes a request line without a version as
HTTP/0.9, accepts two different Content-Length headers and reads the extra
bytes as the next request, and reads and discards a whole announced body after
answering.  Behind a proxy that parses differently, each of those lets one
request smuggle another.  This server answers what nsqd's server answers:

- a request it cannot parse gets Go's raw error response and the connection
  is closed:

      HTTP/1.1 400 Bad Request\\r\\n
      Content-Type: text/plain; charset=utf-8\\r\\n
      Connection: close\\r\\n
      \\r\\n
      400 Bad Request

  or, for Go's statusError cases, "400 Bad Request: malformed Host header"
  (as both the reason phrase and the body), 505 for a version other than
  HTTP/1.x, 431 for a header block over MaxHeaderBytes + 4096, 501 with
  "Unsupported transfer encoding";
- a body announced but left unread by the application is discarded only up
  to 256 KiB; more (or a body the client will not send) closes the
  connection after the response instead of reading it;
- the request line and every header line are checked as they arrive, so a
  bad line is answered at once even while the client waits.

What is kept from pywsgi: keep-alive and pipelining, chunked request bodies
(wsgi.input is self-terminating: ``wsgi.input_terminated``), Expect:
100-continue (sent when the application first reads the body), HEAD, TLS
(``ssl_context``), unix sockets.  An application that raises is logged in one
line and its connection closed without an answer, as Go does with a handler
that panics.
"""

import errno
import socket
import sys
import time
from email.utils import formatdate

import gevent
from gevent.server import StreamServer

MAX_HEADER_BYTES = 1 << 20  # http.DefaultMaxHeaderBytes
READ_LIMIT = MAX_HEADER_BYTES + 4096  # Server.initialReadLimitSize: with bufio's slack
MAX_POST_HANDLER_READ = 256 << 10  # maxPostHandlerReadBytes: unread body discarded after a response
MAX_CHUNK_LINE = 4096  # internal/chunked.go maxLineLength, also the trailer's bound
RST_AVOIDANCE_DELAY = 0.5  # closeWriteAndWait: let the client read the answer before the close
RECV_SIZE = 1 << 16
BUFFERED_RESPONSE = 1 << 16  # a response body up to this size goes out in one send with its headers

ERROR_HEADERS = b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
REASONS = {
    100: "Continue", 200: "OK", 201: "Created", 202: "Accepted", 204: "No Content",
    206: "Partial Content", 301: "Moved Permanently", 302: "Found", 303: "See Other",
    304: "Not Modified", 307: "Temporary Redirect", 308: "Permanent Redirect",
    400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
    413: "Request Entity Too Large", 414: "Request URI Too Long", 417: "Expectation Failed",
    431: "Request Header Fields Too Large", 500: "Internal Server Error",
    501: "Not Implemented", 502: "Bad Gateway", 503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}

STATUS_LINES = {code: f"{code} {reason}".encode() for code, reason in REASONS.items()}
# RFC 7230 tchar (httpguts.IsTokenRune): methods and header names
TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
# httpguts.validHostByte: Go's lenient check of the Host header
HOST_BYTES = frozenset(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                       b"!$%&()*+,-.:;=[']_~")
HEX = frozenset(b"0123456789abcdefABCDEF")
# bytes.Trim sets: textproto.trim (header lines), textproto.TrimString (values)
LWS = b" \t"
ASCII_SPACE = b" \t\r\n"
_CTL = bytes(range(32)) + b"\x7f"
_CTL_BUT_TAB = bytes(c for c in _CTL if c != 9)


def error_response(code, text=None):
    """The raw answer Go's conn.serve writes for a request it could not read."""
    status = f"{code} {REASONS[code]}"
    if text is not None:  # statusError: the text follows in the status line and the body
        status = f"{status}: {text}"
    return b"HTTP/1.1 " + status.encode() + ERROR_HEADERS + status.encode()


BAD_REQUEST = error_response(400)
TOO_LARGE = error_response(431)
UNSUPPORTED_TE = (b"HTTP/1.1 501 Not Implemented" + ERROR_HEADERS
                  + b"Unsupported transfer encoding")


class RequestError(Exception):
    """A request Go would not hand to a handler: ``response`` is the raw answer."""

    def __init__(self, response=BAD_REQUEST):
        super().__init__(response.split(b"\r\n", 1)[0].decode("latin-1"))
        self.response = response


def bad_request(text=None):
    return RequestError(BAD_REQUEST if text is None else error_response(400, text))


class ClientGone(Exception):
    """Sending to the client failed: the connection is over."""


class BodyError(OSError):
    """The request body could not be read as announced (cut short, bad chunking)."""


# ---------------------------------------------------------------------------
# the request head


class Request:
    """What Go's readRequest makes of a request line and header block."""

    __slots__ = ("method", "target", "major", "minor", "path", "query", "host", "headers",
                 "length", "chunked", "close", "expect_continue", "expect_other")

    def header(self, key):
        """Header.get: the first value of a canonical key, or None."""
        for k, v in self.headers:
            if k == key:
                return v
        return None

    def values(self, key):
        return [v for k, v in self.headers if k == key]


def _has_token(values, token):
    """httpguts.HeaderValuesContainsToken: comma-separated, case-insensitive."""
    for value in values:
        for part in value.split(b","):
            if part.strip(ASCII_SPACE).lower() == token:
                return True
    return False


def parse_version(proto):
    """http.ParseHTTPVersion: (major, minor), or None when malformed."""
    if proto == b"HTTP/1.1":
        return 1, 1
    if proto == b"HTTP/1.0":
        return 1, 0
    if (len(proto) != 8 or not proto.startswith(b"HTTP/") or proto[6] != 0x2E
            or not (0x30 <= proto[5] <= 0x39 and 0x30 <= proto[7] <= 0x39)):
        return None
    return proto[5] - 0x30, proto[7] - 0x30


def parse_request_line(line):
    """(method, target, (major, minor)) of a request line, as Go reads it."""
    method, sp1, rest = line.partition(b" ")
    target, sp2, proto = rest.partition(b" ")
    if not sp1 or not sp2:
        raise bad_request()  # malformed HTTP request
    if not method or not TOKEN.issuperset(method):
        raise bad_request()  # invalid method
    version = parse_version(proto)
    if version is None:
        raise bad_request()  # malformed HTTP version
    return method, target, version


def _unescape_path(raw):
    """url.unescape in encodePath mode: every '%' takes two hex digits."""
    if b"%" not in raw:
        return raw
    parts = raw.split(b"%")
    out = [parts[0]]
    for part in parts[1:]:
        if len(part) < 2 or part[0] not in HEX or part[1] not in HEX:
            raise bad_request()  # invalid URL escape
        out.append(bytes((int(part[:2], 16),)) + part[2:])
    return b"".join(out)


def _check_authority(authority):
    """url.parseAuthority, loosely: a valid userinfo, '%' escapes and port."""
    userinfo, at, host = authority.rpartition(b"@")
    if at and any(c in b"/?#[]@" or c < 0x21 or c > 0x7E for c in userinfo):
        raise bad_request()  # net/url: invalid userinfo
    if host.startswith(b"["):
        end = host.find(b"]")
        if end < 0:
            raise bad_request()  # missing ']' in host
        port = host[end + 1:]
    else:
        port = host[host.rfind(b":"):] if b":" in host else b""
    if port and (port[:1] != b":" or not port[1:].isdigit() and port != b":"):
        raise bad_request()  # invalid port
    _unescape_path(host)
    return host


def parse_target(method, target):
    """url.ParseRequestURI: (path, raw query, host from an absolute URI or None)."""
    if len(target.translate(None, _CTL)) != len(target):
        raise bad_request()  # net/url: invalid control character in URL
    if not target:
        raise bad_request()  # empty url
    if target == b"*":
        return b"*", b"", None
    authority_only = method == b"CONNECT" and not target.startswith(b"/")
    if authority_only:
        target = b"http://" + target
    scheme, rest = b"", target
    for i, c in enumerate(target):  # getScheme
        if 0x41 <= c <= 0x5A or 0x61 <= c <= 0x7A:
            continue
        if 0x30 <= c <= 0x39 or c in b"+-.":
            if i == 0:
                break
            continue
        if c == 0x3A:  # ':'
            if i == 0:
                raise bad_request()  # missing protocol scheme
            scheme, rest = target[:i], target[i + 1:]
        break
    if rest.endswith(b"?") and rest.count(b"?") == 1:
        rest, query = rest[:-1], b""
    else:
        rest, _, query = rest.partition(b"?")
    if not rest.startswith(b"/"):
        if scheme:
            return b"", query, None  # opaque: no path
        raise bad_request()  # invalid URI for request
    host = None
    if scheme and rest.startswith(b"//"):
        authority, slash, path = rest[2:].partition(b"/")
        host = _check_authority(authority)
        rest = slash + path
    return _unescape_path(rest), query, host


def canonical_key(key):
    """textproto.CanonicalMIMEHeaderKey; a key that is not a token stays as sent."""
    if not TOKEN.issuperset(key):
        return key
    return b"-".join(part[:1].upper() + part[1:].lower() for part in key.split(b"-"))


def check_line(line, index):
    """The checks Go makes on line number index of a head as soon as it is
    read (the rest need the whole head)."""
    if index == 0:
        method, target, _ = parse_request_line(line)
        parse_target(method, target)
    elif line[:1] in (b" ", b"\t"):
        if index == 1:
            raise bad_request()  # malformed MIME header initial line
    elif b":" not in line:
        raise bad_request()  # malformed MIME header: missing colon


def parse_head(lines):
    """The Request of a whole head (its lines without line ends and without
    the blank line), read as Go's readRequest and conn.readRequest do."""
    method, target, (major, minor) = parse_request_line(lines[0])
    path, query, url_host = parse_target(method, target)
    kvs = []  # header lines, continuation lines joined on (readContinuedLineSlice)
    for i, line in enumerate(lines[1:]):
        if line[:1] in (b" ", b"\t"):
            if i == 0:
                raise bad_request()  # malformed MIME header initial line
            kvs[-1] += b" " + line.strip(LWS)
            continue
        line = line.strip(LWS)
        if b":" not in line:
            raise bad_request()  # malformed MIME header: missing colon
        kvs.append(line)
    headers = []
    for kv in kvs:
        key, _, value = kv.partition(b":")
        key = canonical_key(key)
        if key:  # an empty key is skipped, as textproto does
            headers.append((key, value.lstrip(LWS)))
    req = Request()
    req.method, req.target, req.major, req.minor = method, target, major, minor
    req.path, req.query, req.headers = path, query, headers
    hosts = req.values(b"Host")
    if len(hosts) > 1:
        raise bad_request()  # too many Host headers
    req.host = url_host if url_host else (hosts[0] if hosts else b"")
    conn = req.values(b"Connection")
    if major < 1:
        req.close = True
    elif (major, minor) == (1, 0):
        req.close = _has_token(conn, b"close") or not _has_token(conn, b"keep-alive")
    else:
        req.close = _has_token(conn, b"close")
    _read_transfer(req)
    # conn.readRequest, after readRequest succeeded
    if major != 1 and not (major == 2 and minor == 0 and method == b"PRI" and target == b"*"):
        raise RequestError(error_response(505, "unsupported protocol version"))
    if (major, minor) >= (1, 1) and not hosts and method != b"CONNECT" and not (
            method == b"PRI" and target == b"*"):
        raise bad_request("missing required Host header")
    if len(hosts) == 1 and not HOST_BYTES.issuperset(hosts[0]):
        raise bad_request("malformed Host header")
    for key, value in headers:
        if not TOKEN.issuperset(key):
            raise bad_request("invalid header name")
        if len(value.translate(None, _CTL_BUT_TAB)) != len(value):
            raise bad_request("invalid header value")
    expect = req.header(b"Expect")
    req.expect_continue = expect is not None and _has_token([expect], b"100-continue")
    req.expect_other = bool(expect) and not req.expect_continue
    return req


def _read_transfer(req):
    """transferReader.parseTransferEncoding and fixLength, for a request."""
    req.chunked = False
    te = req.values(b"Transfer-Encoding")
    if te and (req.major, req.minor) >= (1, 1):  # HTTP/1.0: ignored
        if len(te) != 1 or te[0].strip(ASCII_SPACE).lower() != b"chunked":
            raise RequestError(UNSUPPORTED_TE)
        # Transfer-Encoding overrides Content-Length (RFC 7230 3.3.3; Go 1.19
        # drops the Content-Length); such a request also closes the
        # connection after its answer (RFC 9112 6.3), which Go does not
        req.chunked = True
        req.length = -1
        if req.values(b"Content-Length"):
            req.close = True
        return
    lengths = [v.strip(ASCII_SPACE) for v in req.values(b"Content-Length")]
    if len(set(lengths)) > 1:
        raise bad_request()  # http: message cannot contain multiple Content-Length headers
    length = lengths[0] if lengths else b""
    if not length:
        req.length = 0
    elif not length.isdigit() or not length.isascii() or int(length) >= 1 << 63:
        raise bad_request()  # bad Content-Length (strconv.ParseUint(cl, 10, 63))
    else:
        req.length = int(length)


# ---------------------------------------------------------------------------
# the connection


class Connection:
    """One client connection: requests read and answered in turn."""

    __slots__ = ("server", "sock", "address", "buf", "eof", "last_method", "body")

    def __init__(self, server, sock, address):
        self.server = server
        self.sock = sock
        self.address = address
        self.buf = b""
        self.eof = False
        self.last_method = None
        self.body = None

    def recv(self, size=RECV_SIZE):
        """What the client sent next; b"" at EOF or a reset."""
        if self.eof:
            return b""
        try:
            data = self.sock.recv(size)
        except OSError:
            data = b""
        if not data:
            self.eof = True
        return data

    def fill(self, size=RECV_SIZE):
        """Read more from the client into buf; False at EOF or a reset."""
        data = self.recv(size)
        if not data:
            return False
        self.buf = self.buf + data if self.buf else data
        return True

    def send(self, data):
        try:
            self.sock.sendall(data)
        except OSError as err:
            raise ClientGone(err) from None

    # -- requests -------------------------------------------------------------------

    def serve(self):
        try:
            while True:
                try:
                    req = self.read_request()
                except RequestError as err:
                    self._send_quietly(err.response)
                    return self.close_after_wait()
                if req is None or not self.handle(req):
                    return
        except ClientGone:
            pass
        finally:
            self.close()

    def read_request(self):
        """The next Request, None at a clean EOF, or RequestError."""
        if self.last_method == b"POST":
            # RFC 7230 section 3: Go drops up to 4 CR/LF an old client sends after a POST body
            while len(self.buf) < 4 and self.fill():
                pass
            n = 0
            while n < 4 and n < len(self.buf) and self.buf[n] in b"\r\n":
                n += 1
            self.buf = self.buf[n:]
        # the head grows in a bytearray and is searched only where it grew:
        # a head sent a byte at a time costs linear time, as in Go's bufio
        buf = bytearray(self.buf)
        scan = 0  # where the blank line may start
        checked = 0  # bytes of buf whose lines were checked already
        seen = 0  # how many lines that is
        while True:
            end = _head_end(buf, scan)
            if end >= 0:
                if end > READ_LIMIT:
                    raise RequestError(TOO_LARGE)
                self.buf = bytes(buf[end:])
                lines = [ln[:-1] if ln.endswith(b"\r") else ln
                         for ln in bytes(buf[:end - 1]).split(b"\n")]
                if len(lines) > 1:
                    del lines[-1]  # the blank line (unless it is the request line)
                return parse_head(lines)
            if len(buf) > READ_LIMIT:
                raise RequestError(TOO_LARGE)
            nl = buf.rfind(b"\n", checked)
            if nl >= 0:  # new complete lines: Go reads line by line and fails early
                for line in bytes(buf[checked:nl]).split(b"\n"):
                    check_line(line[:-1] if line.endswith(b"\r") else line, seen)
                    seen += 1
                checked = nl + 1
            scan = max(0, len(buf) - 3)
            data = self.recv()
            if not data:
                self.buf = b""
                if not buf:
                    return None  # EOF between requests: closed without an answer
                # EOF inside a head: the partial line is read as a line, and a
                # head without its blank line is io.ErrUnexpectedEOF: 400
                check_line(bytes(buf[checked:]), seen)
                raise bad_request()
            buf += data

    def handle(self, req):
        """Run the application on req; True when the connection goes on."""
        server = self.server
        self.last_method = req.method
        body = self.body = Body(self, req)
        if req.expect_other:  # sendExpectationFailed
            self._send_quietly(b"HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: "
                               + http_date() + b"\r\nContent-Length: 0\r\n\r\n")
            return False
        if req.method == b"OPTIONS" and req.target == b"*":  # globalOptionsHandler
            writer = Response(self, req)
            writer.start("200 OK", [("Content-Length", "0")])
            writer.finish([])
            return not writer.close_after
        writer = Response(self, req)
        environ = server.environ(req, body, self.address)
        result = None
        try:
            result = server.application(environ, writer.start)
            writer.finish(result)
        except ClientGone:
            return False
        except Exception as exc:  # nsqd's routers catch their own: this is Go's handler panic
            server.log_error(f"http: panic serving {format_address(self.address)}: {exc!r}")
            return False
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as exc:  # the answer is out: only the log can know
                    server.log_error(f"http: closing the response failed: {exc!r}")
        if writer.close_after and writer.body_limit_hit:
            self.close_after_wait()
        return not writer.close_after

    # -- closing --------------------------------------------------------------------

    def _send_quietly(self, data):
        try:
            self.send(data)
        except ClientGone:
            pass

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def close_after_wait(self):
        """closeWriteAndWait: the answer goes out with a FIN, and what the
        client still sends is read for a moment (never more than 1 MiB) so
        that the close does not reset the answer away."""
        sock = self.sock
        try:
            if hasattr(sock, "unwrap"):  # TLS: no half-close of the record layer
                return self.close()
            sock.shutdown(socket.SHUT_WR)
            left = 1 << 20
            with gevent.Timeout(RST_AVOIDANCE_DELAY, False):
                while left > 0:
                    data = sock.recv(RECV_SIZE)
                    if not data:
                        break
                    left -= len(data)
        except OSError:
            pass
        self.close()


def _head_end(buf, start=0):
    """Offset just past the blank line that ends the head (searched from
    start), or -1.  Lines end with "\\n", a "\\r" before it is dropped
    (bufio.Reader.ReadLine)."""
    if buf[:1] == b"\n":
        return 1
    if buf[:2] == b"\r\n":
        return 2
    a = buf.find(b"\n\r\n", start)
    b = buf.find(b"\n\n", start)
    if a < 0:
        return b + 2 if b >= 0 else -1
    if b < 0 or a < b:
        return a + 3
    return b + 2


# ---------------------------------------------------------------------------
# the body


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


# ---------------------------------------------------------------------------
# the response


class Response:
    """start_response and the writing of the application's answer."""

    __slots__ = ("conn", "req", "status", "headers", "headers_sent", "chunked", "close_after",
                 "body_limit_hit", "code")

    def __init__(self, conn, req):
        self.conn = conn
        self.req = req
        self.status = None
        self.headers = None
        self.headers_sent = False
        self.chunked = False
        self.close_after = req.close
        self.body_limit_hit = False
        self.code = 0

    def start(self, status, headers, exc_info=None):
        if exc_info is not None and self.headers_sent:
            raise exc_info[1].with_traceback(exc_info[2])
        self.status = status
        self.headers = headers
        self.code = int(status[:3])
        return self.write

    def _body_allowed(self):
        return self.req.method != b"HEAD" and not (100 <= self.code < 200 or self.code in (204, 304))

    def _head(self, body_length):
        """The status line and headers; body_length: the whole body's size when known."""
        req = self.req
        body = self.conn.body
        if body is not None and (not body.done or body.failed):
            settled = body.settle()
            if settled != "ok":
                self.close_after = True
                self.body_limit_hit = settled == "limit"
        http11 = (req.major, req.minor) >= (1, 1)
        # Go writes its own reason phrase (http.StatusText), not the application's
        status = STATUS_LINES.get(self.code) or self.status.encode("latin-1")
        out = [b"HTTP/1.1 " if http11 else b"HTTP/1.0 ", status, b"\r\n"]
        has_length = has_date = False
        connection = None
        for name, value in self.headers:
            lname = name.lower()
            if lname == "content-length":
                has_length = True
            elif lname == "date":
                has_date = True
            elif lname == "connection":
                connection = value.lower()
                if _has_token([value.encode("latin-1")], b"close"):
                    self.close_after = True
                continue
            elif lname == "transfer-encoding":
                continue  # framing is the server's
            out += (name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
        if not has_date:
            out += (b"Date: ", http_date(), b"\r\n")
        if not has_length and self._body_allowed():
            if body_length is not None:
                out += (b"Content-Length: ", str(body_length).encode(), b"\r\n")
            elif http11:
                self.chunked = True
                out.append(b"Transfer-Encoding: chunked\r\n")
            else:
                self.close_after = True  # HTTP/1.0: the close ends the body
        known = has_length or body_length is not None or not self._body_allowed()
        if not http11:
            if not req.close and known and not self.close_after:
                out.append(b"Connection: keep-alive\r\n")  # HTTP/1.0 keep-alive
            else:
                self.close_after = True
        elif self.close_after:
            out.append(b"Connection: close\r\n")
        elif connection:
            out += (b"Connection: ", connection.encode("latin-1"), b"\r\n")
        out.append(b"\r\n")
        self.headers_sent = True
        return b"".join(out)

    def write(self, data):
        """The legacy write() callable of start_response."""
        if not self.headers_sent:
            self.conn.send(self._head(None))
        self._send_body(data)

    def _send_body(self, data):
        if not data or not self._body_allowed():
            return
        if self.chunked:
            self.conn.send(b"%x\r\n" % len(data) + data + b"\r\n")
        else:
            self.conn.send(data)

    def finish(self, result):
        """Send the application's iterable: a short body goes out in one send
        with the headers (as Go's 2 KiB response buffer; TCP_NODELAY)."""
        chunks = []
        size = 0
        rest = iter(result)
        for data in rest:
            if data:
                chunks.append(data)
                size += len(data)
                if size > BUFFERED_RESPONSE:
                    break
        else:
            rest = None
        if self.status is None:
            raise RuntimeError("the application did not call start_response")
        if not self.headers_sent:
            head = self._head(size if rest is None else None)
            if self._body_allowed() and not self.chunked:
                self.conn.send(head + b"".join(chunks))
                chunks = []
            else:
                self.conn.send(head)
        for data in chunks:
            self._send_body(data)
        if rest is not None:
            for data in rest:
                self._send_body(data)
        if self.chunked and self._body_allowed():
            self.conn.send(b"0\r\n\r\n")


# ---------------------------------------------------------------------------
# the server


_date_cache = [0, b""]


def http_date():
    """The Date header's value (http.TimeFormat), computed once a second."""
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = formatdate(now, usegmt=True).encode()
    return _date_cache[1]


def format_address(address):
    if isinstance(address, tuple) and len(address) >= 2:
        host = address[0]
        return f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
    return str(address or "@")


class HTTPServer(StreamServer):
    """A gevent StreamServer running a WSGI application over strict HTTP/1.1.

    ``listener``: an address or a bound socket (TCP or unix); ``log_error``:
    called with one line for what Go's server writes to its ErrorLog (a TLS
    handshake that failed, an application that raised)."""

    def __init__(self, listener, application, log_error=None, **ssl_args):
        super().__init__(listener, **ssl_args)
        self.application = application
        self._log_error = log_error
        self.base_environ = None

    def init_socket(self):
        super().init_socket()
        if self.socket.family in (socket.AF_INET, socket.AF_INET6):
            # as Go: no delayed ACK wait for keep-alive clients; accepted sockets inherit it
            self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        address = self.address
        name, port = (str(address[0]), str(address[1])) if isinstance(address, tuple) else ("", "")
        self.base_environ = {
            "GATEWAY_INTERFACE": "CGI/1.1", "SERVER_SOFTWARE": "nsqshm", "SCRIPT_NAME": "",
            "SERVER_NAME": name, "SERVER_PORT": port,
            "wsgi.version": (1, 0), "wsgi.url_scheme": "https" if self.ssl_enabled else "http",
            "wsgi.errors": sys.stderr, "wsgi.multithread": False, "wsgi.multiprocess": False,
            "wsgi.run_once": False, "wsgi.input_terminated": True,
        }

    def log_error(self, msg):
        if self._log_error is not None:
            self._log_error(msg)

    def wrap_socket_and_handle(self, client_socket, address):
        try:
            sock = self.wrap_socket(client_socket, **self.ssl_args)
        except OSError as err:  # ssl.SSLError is an OSError
            if err.errno not in (errno.ECONNRESET, errno.EPIPE, None) or getattr(
                    err, "reason", None):
                self.log_error(f"http: TLS handshake error from {format_address(address)}: "
                               f"{getattr(err, 'reason', None) or err}")
            client_socket.close()
            return None
        try:
            return self.handle(sock, address)
        finally:
            sock.close()

    def handle(self, sock, address):
        Connection(self, sock, address).serve()

    def environ(self, req, body, address):
        """The WSGI environ of req (PEP 3333: str values decoded as latin-1)."""
        if self.base_environ is None:
            self.init_socket()
        env = dict(self.base_environ)
        env["REQUEST_METHOD"] = req.method.decode("latin-1")
        env["PATH_INFO"] = req.path.decode("latin-1")
        env["QUERY_STRING"] = req.query.decode("latin-1")
        env["RAW_URI"] = env["REQUEST_URI"] = req.target.decode("latin-1")
        env["SERVER_PROTOCOL"] = f"HTTP/{req.major}.{req.minor}"
        if isinstance(address, tuple) and len(address) >= 2:
            env["REMOTE_ADDR"] = str(address[0])
            env["REMOTE_PORT"] = str(address[1])
        else:
            env["REMOTE_ADDR"] = ""
            env["REMOTE_PORT"] = ""
        if req.length > 0:
            env["CONTENT_LENGTH"] = str(req.length)
        env["HTTP_HOST"] = req.host.decode("latin-1")
        for key, value in req.headers:
            if b"_" in key:
                continue  # X_Forwarded_For must not pose as X-Forwarded-For
            if key in (b"Host", b"Content-Length"):
                continue
            value = value.decode("latin-1")
            if key == b"Content-Type":
                env["CONTENT_TYPE"] = value
                continue
            name = "HTTP_" + key.decode("latin-1").upper().replace("-", "_")
            if name in env:
                env[name] += (";" if name == "HTTP_COOKIE" else ",") + value
            else:
                env[name] = value
        env["wsgi.input"] = body
        return env
