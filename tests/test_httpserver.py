"""nsqshm.httpserver (with nsqshm.httprequest and nsqshm.httpbody) against raw
requests on real sockets: Go net/http's answers
to malformed input, keep-alive and pipelining, chunked bodies, Expect:
100-continue, HEAD, and what happens to a body the application leaves unread."""

import multiprocessing
import socket
import ssl
import time

import pytest

from nsqshm.httpbody import BodyError
from nsqshm.httpserver import HTTPServer

GO_400 = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
          b"Connection: close\r\n\r\n400 Bad Request")


def go_status_error(code, reason, text):
    status = f"{code} {reason}: {text}".encode()
    return (b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Connection: close\r\n\r\n" + status)


# -- the applications under the server ----------------------------------------------------


def echo_app(environ, start_response):
    """Reads the whole body; answers what it saw."""
    try:
        body = environ["wsgi.input"].read()
    except BodyError as err:
        start_response("500 Internal Server Error", [("Content-Type", "text/plain")])
        return [f"body error: {err}".encode()]
    text = (f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']} q={environ['QUERY_STRING']} "
            f"host={environ.get('HTTP_HOST')} len={len(body)} ").encode("latin-1") + body
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(text)))])
    return [text]


def limit_app(environ, start_response):
    """As nsqd's /pub: a body announced over 10 bytes is refused unread
    (werkzeug's upper-case reason phrase: the server writes Go's)."""
    if int(environ.get("CONTENT_LENGTH") or 0) > 10:
        start_response("413 REQUEST ENTITY TOO LARGE", [("Content-Length", "11")])
        return [b"MSG_TOO_BIG"]
    return echo_app(environ, start_response)


def noread_app(environ, start_response):
    start_response("200 OK", [("Content-Length", "2")])
    return [b"OK"]


def stream_app(environ, start_response):
    """No Content-Length: chunked on HTTP/1.1, ended by the close on HTTP/1.0."""
    start_response("200 OK", [("Content-Type", "text/plain")])
    return (b"x" * 40000 for _ in range(3))


def raise_app(environ, start_response):
    raise RuntimeError("boom")


APPS = {"echo": echo_app, "limit": limit_app, "noread": noread_app, "stream": stream_app,
        "raise": raise_app}


def _serve(name, conn, cert=None):
    """A server in a forked child: its port, then every line it logs and every
    exception gevent would print, go back through conn."""
    import gevent.ssl

    gevent.get_hub().print_exception = lambda context, kind, value, tb: conn.send(
        f"gevent printed {kind.__name__}: {value}")

    ssl_args = {}
    if cert:
        ctx = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert + ".pem", cert + ".key")
        ssl_args["ssl_context"] = ctx
    server = HTTPServer(("127.0.0.1", 0), APPS[name], log_error=conn.send, **ssl_args)
    server.start()
    conn.send(server.address[1])
    server.serve_forever()


LOGS = {}  # app name -> the pipe its server's log lines come through


def logged(name):
    lines = []
    while LOGS[name].poll():
        lines.append(LOGS[name].recv())
    return lines


@pytest.fixture(scope="module")
def servers():
    ctx = multiprocessing.get_context("fork")
    procs, ports = [], {}
    for name in APPS:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(name, child), daemon=True)
        proc.start()
        procs.append(proc)
        ports[name] = parent.recv()
        LOGS[name] = parent
    yield ports
    for proc in procs:
        proc.kill()
        proc.join()


# -- a raw client ------------------------------------------------------------------------


def exchange(port, data, half_close=False, timeout=2.0, wait_close=True, wrap=None):
    """Send data; read until the server closes (or timeout).  Returns (bytes, closed)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if wrap is not None:
        sock = wrap(sock)
    try:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        out = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                return out, False
            except ConnectionResetError:
                return out, True
            if not chunk:
                return out, True
            out += chunk
            if not wait_close and responses(out)[1] == b"":
                return out, False
        return out, False
    finally:
        sock.close()


def responses(data):
    """Split raw responses: ([(status line, headers, body)], the unparsed rest)."""
    out = []
    while data:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            break
        head = data[:end].split(b"\r\n")
        headers = {}
        for line in head[1:]:
            k, _, v = line.partition(b": ")
            headers[k.lower()] = v
        rest = data[end + 4:]
        if head[0].split(b" ")[1].startswith(b"1"):
            out.append((head[0], headers, b""))
            data = rest
            continue
        if b"content-length" in headers:
            n = int(headers[b"content-length"])
            if len(rest) < n:
                break
            body, data = rest[:n], rest[n:]
        elif headers.get(b"transfer-encoding") == b"chunked":
            body = b""
            while True:
                line, _, rest = rest.partition(b"\r\n")
                n = int(line, 16)
                body += rest[:n]
                rest = rest[n + 2:]
                if n == 0:
                    break
            data = rest
        else:
            body, data = rest, b""
        out.append((head[0], headers, body))
    return out, data


def get(path=b"/ping", extra=b""):
    return b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n"


# -- malformed requests: Go's raw answer, then the close ----------------------------------

BAD = [
    ("no version", b"GET /ping\r\n\r\n", GO_400),
    ("no version, line only", b"GET n\r\n", GO_400),
    ("version 9.9", b"GET /ping HTTP/9.9\r\nHost: x\r\n\r\n",
     go_status_error(505, "HTTP Version Not Supported", "unsupported protocol version")),
    ("version 0.9", b"GET /ping HTTP/0.9\r\n\r\n",
     go_status_error(505, "HTTP Version Not Supported", "unsupported protocol version")),
    ("version 2.0", b"GET /ping HTTP/2.0\r\nHost: x\r\n\r\n",
     go_status_error(505, "HTTP Version Not Supported", "unsupported protocol version")),
    ("version 10.0", b"GET /ping HTTP/10.0\r\nHost: x\r\n\r\n", GO_400),
    ("lower-case version", b"GET /ping http/1.1\r\nHost: x\r\n\r\n", GO_400),
    ("space in target", b"GET /pi ng HTTP/1.1\r\nHost: x\r\n\r\n", GO_400),
    ("bad method byte", b"\xafOST /pub HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx", GO_400),
    ("relative target", b"POST ../pub?topic=a%00b HTTP/1.1\r\nHost: x\r\n\r\n", GO_400),
    ("target without slash", b"POST ub?topic=h1 HTTP/1.1\r\nHost: x\r\n\r\n", GO_400),
    ("bad escape in path", b"HEAD /pi%zzng HTTP/1.1\r\nHost: x\r\n\r\n", GO_400),
    ("control byte in target", b"GET /pi\x01ng HTTP/1.1\r\nHost: x\r\n\r\n", GO_400),
    ("empty line first", b"\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n", GO_400),
    ("two Content-Lengths",
     b"POST /pub HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
     GO_400),
    ("Content-Length too big",
     b"POST /pub HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n", GO_400),
    ("negative Content-Length", b"POST /pub HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\nabc",
     GO_400),
    ("Content-Length list", b"POST /pub HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\n\r\nabc",
     GO_400),
    ("header without colon", b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection close\r\n\r\n", GO_400),
    ("first header folded", b"GET /ping HTTP/1.1\r\n Host: x\r\n\r\n", GO_400),
    ("two Host headers", b"GET /ping HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", GO_400),
    ("no Host", b"GET /ping HTTP/1.1\r\n\r\n",
     go_status_error(400, "Bad Request", "missing required Host header")),
    ("Host with space", b"GET /ping HTTP/1.1\r\nHost: a b\r\n\r\n",
     go_status_error(400, "Bad Request", "malformed Host header")),
    ("bare CR in Host", b"GET /ping HTTP/1.1\r\nHost: x\rConnection: close\r\n\r\n",
     go_status_error(400, "Bad Request", "malformed Host header")),
    ("space before colon", b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length : 0\r\n\r\n",
     go_status_error(400, "Bad Request", "invalid header name")),
    ("high byte in name", b"GET /ping HTTP/1.1\r\nHost: x\r\nCon\x9bnection: close\r\n\r\n",
     go_status_error(400, "Bad Request", "invalid header name")),
    ("control byte in value", b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A: a\x01b\r\n\r\n",
     go_status_error(400, "Bad Request", "invalid header value")),
    ("unknown transfer coding", b"POST /pub HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
     b"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\n"
     b"Connection: close\r\n\r\nUnsupported transfer encoding"),
    ("two transfer codings",
     b"POST /pub HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n",
     b"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\n"
     b"Connection: close\r\n\r\nUnsupported transfer encoding"),
    ("header block too large",
     b"GET /ping HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * ((1 << 20) + 5000) + b"\r\n\r\n",
     b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8"
     b"\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large"),
    ("head cut by EOF", b"GET /ping HTTP/1.1\r\nHost: x\r\n", GO_400),
]


@pytest.mark.parametrize("name,request_bytes,answer", BAD, ids=[b[0] for b in BAD])
def test_malformed_request_gets_go_answer_and_close(servers, name, request_bytes, answer):
    started = time.monotonic()
    data, closed = exchange(servers["echo"], request_bytes, half_close=name == "head cut by EOF")
    assert data == answer
    assert closed
    assert time.monotonic() - started < 1.5


def test_bad_request_line_answered_before_the_head_ends(servers):
    """Go reads line by line: a request line without version is refused at once."""
    data, closed = exchange(servers["echo"], b"GET /ping\r\nHost: x\r\n", timeout=1.5)
    assert data == GO_400 and closed


# -- accepted requests ------------------------------------------------------------------

GOOD = [
    ("long path", get(b"/" + b"a" * 100000), b"GET /" + b"a" * 100000 + b" q= host=x len=0 "),
    ("big header", get(extra=b"X-Big: " + b"a" * 500000 + b"\r\n"), b"GET /ping q= host=x len=0 "),
    ("high bytes in query", get(b"/stats?format=json\xff\xfe"),
     b"GET /stats q=format=json\xff\xfe host=x len=0 "),
    ("escaped path", get(b"/a%2Fb%20c?x=%41"), b"GET /a/b c q=x=%41 host=x len=0 "),
    ("absolute URI", get(b"http://other:80/p?q=1"), b"GET /p q=q=1 host=other:80 len=0 "),
    ("fragment kept in path", get(b"/ping#x"), b"GET /ping#x q= host=x len=0 "),
    ("lower-case header names",
     b"POST /pub HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc",
     b"POST /pub q= host=x len=3 abc"),
    ("HTTP/1.0 without Host", b"GET /ping HTTP/1.0\r\n\r\n", b"GET /ping q= host= len=0 "),
    ("HTTP/1.0 ignores Transfer-Encoding",
     b"POST /p HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
     b"POST /p q= host= len=3 abc"),
    ("HTTP/1.5 taken as 1.x", b"GET /ping HTTP/1.5\r\nHost: x\r\n\r\n", b"GET /ping q= host=x len=0 "),
    ("same Content-Length twice",
     b"POST /pub HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length:  3\r\n\r\nabc",
     b"POST /pub q= host=x len=3 abc"),
    ("empty Content-Length", b"POST /pub HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n",
     b"POST /pub q= host=x len=0 "),
    ("chunked", b"POST /pub HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\n\r\n", b"POST /pub q= host=x len=13 abc0123456789"),
    ("chunked with trailer", b"POST /pub HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n"
     b"2\r\nab\r\n0\r\nX-T: 1\r\n\r\n", b"POST /pub q= host=x len=2 ab"),
    ("folded header", b"GET /ping HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
     b"GET /ping q= host=x len=0 "),
]


@pytest.mark.parametrize("name,request_bytes,body", GOOD, ids=[g[0] for g in GOOD])
def test_accepted_request(servers, name, request_bytes, body):
    data, _ = exchange(servers["echo"], request_bytes, wait_close=False)
    [(status, headers, got)], rest = responses(data)
    assert status == b"HTTP/1.1 200 OK" or status == b"HTTP/1.0 200 OK"
    assert got == body
    assert b"date" in headers


def test_transfer_encoding_overrides_content_length_and_closes(servers):
    """Go 1.19 lets chunked win over Content-Length (it drops the latter); such a
    request closes the connection after its answer (RFC 9112 6.3), so bytes
    counted by a proxy from the Content-Length cannot become a request."""
    data, closed = exchange(servers["echo"],
                            b"POST /pub HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n" + get())
    (status, headers, body), = responses(data)[0]
    assert body == b"POST /pub q= host=x len=1 a"
    assert headers[b"connection"] == b"close" and closed


BAD_BODIES = [
    ("bad chunk size", b"zz\r\n", "invalid byte in chunk length"),
    ("chunk without CRLF", b"3\r\nabcX\r\n0\r\n\r\n", "malformed chunked encoding"),
    ("chunk line too long", b"1" + b" " * 5000 + b"\r\n", "header line too long"),
    ("chunk size too large", b"1" * 17 + b"\r\n", "http chunk length too large"),
]


@pytest.mark.parametrize("name,chunks,error", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_chunked_body_is_a_read_error_then_close(servers, name, chunks, error):
    data, closed = exchange(servers["echo"], b"POST /pub HTTP/1.1\r\nHost: x\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n" + chunks, half_close=True)
    (status, headers, body), = responses(data)[0]
    assert status == b"HTTP/1.1 500 Internal Server Error"
    assert body == f"body error: {error}".encode()
    assert headers[b"connection"] == b"close" and closed


def test_short_body_is_a_read_error_not_a_hang(servers):
    """Content-Length larger than what arrives before the half-close:
    io.ErrUnexpectedEOF for the application, then the close."""
    data, closed = exchange(servers["echo"],
                            b"POST /pub HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\nabc",
                            half_close=True)
    (status, headers, body), = responses(data)[0]
    assert body == b"body error: unexpected EOF"
    assert closed


# -- keep-alive, pipelining, HEAD, HTTP/1.0 -----------------------------------------------


def test_keep_alive_and_pipelining(servers):
    reqs = (b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
            + b"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n"
            + b"\r\n"  # an old client's CRLF after a POST body: dropped as Go does
            + get(b"/c"))
    data, closed = exchange(servers["echo"], reqs, timeout=1.0)
    got, rest = responses(data)
    assert [b for _, _, b in got] == [b"POST /a q= host=x len=2 hi", b"POST /b q= host=x len=1 z",
                                      b"GET /c q= host=x len=0 "]
    assert not closed and rest == b""


def test_connection_close_honoured(servers):
    data, closed = exchange(servers["echo"], get(extra=b"Connection: close\r\n"))
    (status, headers, _), = responses(data)[0]
    assert headers[b"connection"] == b"close" and closed


def test_head_has_no_body(servers):
    data, closed = exchange(servers["echo"], b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n" + get(b"/y"),
                            timeout=1.0)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    head, _, rest = data.partition(b"\r\n\r\n")
    assert b"Content-Length: 24" in head  # the GET's length, no bytes
    assert rest.startswith(b"HTTP/1.1 200 OK\r\n") and rest.endswith(b"GET /y q= host=x len=0 ")


def test_http10_closes_unless_keep_alive(servers):
    data, closed = exchange(servers["echo"], b"GET /p HTTP/1.0\r\n\r\n")
    assert data.startswith(b"HTTP/1.0 200 OK\r\n") and b"Connection" not in data and closed
    data, closed = exchange(servers["echo"], b"GET /p HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                            timeout=1.0)
    assert b"Connection: keep-alive\r\n" in data and not closed


def test_streamed_response_is_chunked_on_11_and_closed_on_10(servers):
    data, closed = exchange(servers["stream"], get(), timeout=1.0)
    (status, headers, body), = responses(data)[0]
    assert headers[b"transfer-encoding"] == b"chunked" and body == b"x" * 120000 and not closed
    data, closed = exchange(servers["stream"], b"GET / HTTP/1.0\r\n\r\n")
    assert data.endswith(b"\r\n\r\n" + b"x" * 120000) and closed


# -- Expect ------------------------------------------------------------------------------


def test_expect_100_continue_sent_on_first_read(servers):
    sock = socket.create_connection(("127.0.0.1", servers["echo"]), timeout=2)
    sock.sendall(b"POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
    assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    sock.sendall(b"abc")
    data = b""
    while not data.endswith(b"abc"):
        data += sock.recv(1000)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")
    sock.close()


def test_expect_100_continue_refused_without_reading(servers):
    """An answer before the body is read: no 100 Continue, and the connection
    closes (the next bytes could be the body or a request)."""
    data, closed = exchange(servers["limit"], b"POST /e HTTP/1.1\r\nHost: x\r\n"
                            b"Expect: 100-continue\r\nContent-Length: 30\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n")
    assert b"Connection: close\r\n" in data and data.endswith(b"MSG_TOO_BIG") and closed


def test_other_expectation_is_417(servers):
    data, closed = exchange(servers["echo"], get(extra=b"Expect: 200-ok\r\n"))
    assert data.startswith(b"HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\n")
    assert data.endswith(b"Content-Length: 0\r\n\r\n") and closed


# -- a body left unread ------------------------------------------------------------------


def test_refused_big_body_answered_at_once_and_closed(servers):
    """Go: an unread body of 256 KiB or more is not read; the answer goes out
    with Connection: close and the connection is closed at once."""
    started = time.monotonic()
    data, closed = exchange(servers["limit"], b"POST /pub HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Length: 104857600\r\n\r\nx")
    assert data.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n")
    assert b"Connection: close\r\n" in data and data.endswith(b"MSG_TOO_BIG")
    assert closed and time.monotonic() - started < 1.0


def test_small_unread_body_is_discarded_and_connection_kept(servers):
    data, closed = exchange(servers["limit"], b"POST /pub HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Length: 20\r\n\r\n" + b"y" * 20 + get(b"/next"), timeout=1.0)
    got, rest = responses(data)
    assert [s for s, _, _ in got] == [b"HTTP/1.1 413 Request Entity Too Large", b"HTTP/1.1 200 OK"]
    assert got[1][2] == b"GET /next q= host=x len=0 " and not closed


def test_unread_body_cut_short_closes(servers):
    data, closed = exchange(servers["noread"], b"POST /pub HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Length: 20\r\n\r\nabc", half_close=True)
    (status, headers, body), = responses(data)[0]
    assert body == b"OK" and headers[b"connection"] == b"close" and closed


# -- the application failing -------------------------------------------------------------


def test_application_exception_closes_without_answer(servers):
    logged("raise")
    data, closed = exchange(servers["raise"], get())
    assert data == b"" and closed
    [line] = logged("raise")
    assert line.startswith("http: panic serving 127.0.0.1:") and line.endswith(
        ": RuntimeError('boom')")


# -- TLS ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    from tests.nsqd.certs import make_certs

    certs = make_certs(tmp_path_factory.mktemp("certs"))
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=("echo", child, certs["server"]), daemon=True)
    proc.start()
    yield parent.recv()
    proc.kill()
    proc.join()


def test_tls_keep_alive_and_bad_request(tls_server):
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE

    def wrap(sock):
        return client.wrap_socket(sock)

    data, closed = exchange(tls_server, get(b"/a") + get(b"/b"), timeout=1.0, wrap=wrap)
    got, _ = responses(data)
    assert [b for _, _, b in got] == [b"GET /a q= host=x len=0 ", b"GET /b q= host=x len=0 "]
    data, closed = exchange(tls_server, b"GET /ping\r\n\r\n", wrap=wrap)
    assert data == GO_400 and closed


def test_options_star_is_answered_by_the_server(servers):
    """Go's globalOptionsHandler: 200, Content-Length 0, the application not run."""
    data, closed = exchange(servers["raise"], b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n" * 2,
                            timeout=1.0)
    got, rest = responses(data)
    assert [(s, h[b"content-length"]) for s, h, _ in got] == [(b"HTTP/1.1 200 OK", b"0")] * 2
    assert not closed


# -- mutated requests --------------------------------------------------------------------

SEEDS = [
    b"POST /pub?topic=h1 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
    b"POST /pub HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nab",
    b"GET /ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /x HTTP/1.1\r\nHost: y\r\n\r\n",
    b"POST http://h:1/p?q HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\nTransfer-Encoding: chunked\r\n"
    b"\r\n1;x\r\na\r\n0\r\nT: 1\r\n\r\n",
]


def mutate(data, rnd):
    data = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        at = rnd.randint(0, len(data))
        op = rnd.randint(0, 3)
        if op == 0 and data:
            data[min(at, len(data) - 1)] = rnd.randint(0, 255)
        elif op == 1:
            data[at:at] = bytes([rnd.choice(b"\r\n :;0123456789aA-\t\x00\xff")])
        elif op == 2:
            del data[at:at + rnd.randint(1, 5)]
        else:
            data[at:at] = data[rnd.randint(0, len(data)):][:rnd.randint(1, 20)]
    return bytes(data)


@pytest.mark.parametrize("app", ["echo", "noread"])
def test_mutated_requests_end_cleanly(servers, app):
    """Mutations of valid requests, each ended by the client's half-close:
    every one is answered and closed, or closed, within 2 s, and the server
    logs nothing (no exception reached it or gevent)."""
    import random

    rnd = random.Random(21)
    logged(app)
    for _ in range(300):
        data = mutate(rnd.choice(SEEDS), rnd)
        out, closed = exchange(servers[app], data, half_close=True)
        assert closed, data
        assert out == b"" or out.startswith(b"HTTP/1."), (data, out)
    assert logged(app) == []
