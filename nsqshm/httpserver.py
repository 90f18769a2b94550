"""A strict HTTP/1.1 server for WSGI applications on gevent, parsing requests
as Go's net/http server does (server.go, request.go, transfer.go,
net/textproto, internal/chunked.go of Go 1.19, which nsqd 1.3 is built with).

gevent.pywsgi is laxer than Go: it takes a request line without a version as
HTTP/0.9, accepts two different Content-Length headers and reads the extra
bytes as the next request, and reads and discards a whole announced body after
answering.  Behind a proxy that parses differently, each of those lets one
request smuggle another.  This server answers what nsqd's server answers:

- a request it cannot parse gets Go's raw error response (400, or 505, 431,
  501: nsqshm.httprequest) and the connection is closed, with a half-close
  first so that the client reads the answer;
- the request line and every header line are checked as they arrive, so a
  bad line is answered at once even while the client waits;
- a body announced but left unread by the application is discarded only up
  to 256 KiB; more (or a body the client will not send) closes the
  connection after the answer instead of reading it (nsqshm.httpbody).

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

from nsqshm.flags import format_address
from nsqshm.httpbody import RECV_SIZE, Body
from nsqshm.httprequest import (
    READ_LIMIT,
    REASONS,
    TOO_LARGE,
    RequestError,
    bad_request,
    check_line,
    has_token,
    head_end,
    parse_head,
)

RST_AVOIDANCE_DELAY = 0.5  # closeWriteAndWait: let the client read the answer before the close
BUFFERED_RESPONSE = 1 << 16  # a response body up to this size goes out in one send with its headers
RAW_HEADERS = "nsqshm.raw_headers"  # environ key: [(name, value)] as bytes, as received
STATUS_LINES = {code: f"{code} {reason}".encode() for code, reason in REASONS.items()}


class ClientGone(Exception):
    """Sending to the client failed: the connection is over."""


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
            end = head_end(buf, scan)
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
                if has_token([value.encode("latin-1")], b"close"):
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
            if key in (b"Host", b"Content-Length") or key == b"Transfer-Encoding" and not req.chunked:
                continue  # framing is the server's: HTTP/1.0 ignores Transfer-Encoding
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
        env[RAW_HEADERS] = req.headers  # every header as sent, "_" too (Youzan's X-NSQEXT-##k_v)
        return env
