"""nsqshm.httprequest: heads read as Go's readRequest reads them (the answers on
a socket are in tests/test_httpserver.py)."""

import pytest

from nsqshm.httprequest import (
    RequestError,
    canonical_key,
    check_line,
    parse_head,
    parse_target,
    parse_version,
)


def test_parse_head_is_go_readrequest():
    req = parse_head([b"POST /pub?topic=t HTTP/1.1", b"Host: h", b"content-length: 5",
                      b"X-Multi: a", b"x-multi: b"])
    assert (req.method, req.path, req.query, req.host, req.length) == (
        b"POST", b"/pub", b"topic=t", b"h", 5)
    assert req.values(b"X-Multi") == [b"a", b"b"]
    check_line(b"GET / HTTP/1.1", 0)  # a line alone: only the checks Go makes at once
    check_line(b" folded", 2)
    for line, index in ((b"GET /", 0), (b" Host: x", 1), (b"Host x", 1)):
        with pytest.raises(RequestError):
            check_line(line, index)


def test_header_names_are_canonical_for_the_application():
    req = parse_head([b"GET / HTTP/1.1", b"hOST: h", b"x-forwarded-for: 1"])
    assert req.headers == [(b"Host", b"h"), (b"X-Forwarded-For", b"1")]
    assert canonical_key(b"x-a b") == b"x-a b"  # not a token: kept as sent (then refused)


@pytest.mark.parametrize("proto,version", [
    (b"HTTP/1.1", (1, 1)), (b"HTTP/1.0", (1, 0)), (b"HTTP/9.9", (9, 9)), (b"HTTP/0.9", (0, 9)),
    (b"HTTP/10.0", None), (b"http/1.1", None), (b"HTTP/1.1 ", None), (b"HTTP/1,1", None),
])
def test_parse_version(proto, version):
    assert parse_version(proto) == version


@pytest.mark.parametrize("method,target,parsed", [
    (b"GET", b"/a%2Fb?x=%zz", (b"/a/b", b"x=%zz", None)),  # the query is not checked here
    (b"GET", b"/p?", (b"/p", b"", None)),
    (b"GET", b"http://h:80/p?q", (b"/p", b"q", b"h:80")),
    (b"GET", b"*", (b"*", b"", None)),
    (b"GET", b"mailto:x", (b"", b"", None)),  # opaque: no path
    (b"CONNECT", b"h:443", (b"", b"", b"h:443")),
    (b"GET", b"//x/y", (b"//x/y", b"", None)),
])
def test_parse_target(method, target, parsed):
    assert parse_target(method, target) == parsed


@pytest.mark.parametrize("target", [b"", b"p", b"../p", b":x", b"/%zz", b"/a\x7fb",
                                    b"http://h:x/p", b"http://[::1/p"])
def test_parse_target_refuses(target):
    with pytest.raises(RequestError):
        parse_target(b"GET", target)
