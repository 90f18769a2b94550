"""The head of an HTTP/1.1 request read as Go's net/http reads it (Go 1.19,
which nsqd 1.3 is built with: request.go readRequest, transfer.go
parseTransferEncoding and fixLength, net/textproto, net/url ParseRequestURI,
server.go conn.readRequest).

A head Go would not hand to a handler raises RequestError carrying Go's raw
answer, the one conn.serve writes before it closes the connection:

    HTTP/1.1 400 Bad Request\\r\\n
    Content-Type: text/plain; charset=utf-8\\r\\n
    Connection: close\\r\\n
    \\r\\n
    400 Bad Request

or a statusError ("400 Bad Request: malformed Host header" as both the reason
phrase and the body), 505 for a version other than HTTP/1.x, 431 for a head
over MaxHeaderBytes + 4096, 501 "Unsupported transfer encoding".  Order as
Go's: request line, URL, header lines, Host count, transfer coding and length;
then the version, Host presence and bytes, header names and values.
``check_line`` makes the checks Go makes on each line as soon as it is read;
``parse_head`` the rest, on a whole head.
"""

MAX_HEADER_BYTES = 1 << 20  # http.DefaultMaxHeaderBytes
READ_LIMIT = MAX_HEADER_BYTES + 4096  # Server.initialReadLimitSize: with bufio's slack

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


def has_token(values, token):
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
        req.close = has_token(conn, b"close") or not has_token(conn, b"keep-alive")
    else:
        req.close = has_token(conn, b"close")
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
    req.expect_continue = expect is not None and has_token([expect], b"100-continue")
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


def head_end(buf, start=0):
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
