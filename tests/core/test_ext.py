"""nsqshm/_core/ext.pyx: the ext part of a stored message, the JSON header
reader, Youzan's ext_filter kinds (nsqd/ext_filter.go), tag dispatch, and
InFlight.deliver with an ExtView (frames stripped, filtered messages
consumed, a tagged head left in the records)."""

import struct
import uuid

import pytest

from nsqshm._core import ext
from nsqshm._core.codec import IdGenerator
from nsqshm._core.inflight import InFlight
from nsqshm._core.wire import pack_message

HEADER = b"\x00" * 8 + b"\x00\x00" + b"0123456789abcdef"  # [8 ts][2 attempts][16 id]


def record(headers, body):
    """A stored ext message: header, [4][2 BE n][JSON] or [0], body."""
    return HEADER + ext.ext_body(headers, body)


@pytest.mark.parametrize("json, key, value", [
    (b'{"k":"v"}', b"k", b"v"),
    (b' { "a" : 1 , "k" : "v" } ', b"k", b"v"),
    (b'{"a":{"k":"no"},"k":"yes"}', b"k", b"yes"),          # top level only
    (b'{"a":[1,"}",{"x":"]"}],"k":"v"}', b"k", b"v"),        # brackets inside strings
    (b'{"k":"\\u00e9\\n\\"\\\\"}', b"k", "é\n\"\\".encode()),
    (b'{"k":"\\ud83d\\ude00"}', b"k", "\U0001F600".encode()),  # a surrogate pair
    (b'{"k":"\\ud83d"}', b"k", "\ufffd".encode()),             # a lone one: U+FFFD (Go)
    (b'{"\\u006b":"v"}', b"k", b"v"),                          # an escaped key
    (b'{"k":1}', b"k", None),                                  # not a string
    (b'{"k":null}', b"k", None),
    (b'{}', b"k", None),
    (b'{"k":"v","k":"w"}', b"k", b"v"),                        # the first (gjson)
])
def test_header_string(json, key, value):
    assert ext.header_string(json, key) == value


@pytest.mark.parametrize("json", [b"", b"[]", b'{"k" "v"}', b'{"a":"v"'])
def test_header_string_bad_json(json):
    with pytest.raises(ValueError):
        ext.header_string(json, b"k")


@pytest.mark.parametrize("json, ms", [
    (b'{"k":"v"}', None),
    (b'{"##ttl_ms":"1500"}', 1500),
    (b'{"a":"b","##ttl_ms":"0"}', 0),                      # 0: no time to live
    (b'{"##ttl_ms":"1099511627776"}', 1 << 40),              # TTL_MS_MAX
    (b'{"##ttl_ms":"1099511627777"}', ValueError),
    (b'{"##ttl_ms":"9999999999999999"}', ValueError),        # 16 digits
    (b'{"##ttl_ms":1500}', ValueError),                      # a number: strings only
    (b'{"##ttl_ms":"-1"}', ValueError),
    (b'{"##ttl_ms":""}', ValueError),
    (b'{"##ttl_ms":"1.5"}', ValueError),
])
def test_header_ttl_ms(json, ms):
    if ms is ValueError:
        with pytest.raises(ValueError):
            ext.header_ttl_ms(json)
    else:
        assert ext.header_ttl_ms(json) == ms


def test_header_string_reads_no_further_than_it_needs():
    # headers are validated as JSON at publish; the reader stops at its key, as gjson
    assert ext.header_string(b'{"k":"v"', b"k") == b"v"
    assert ext.header_string(b'{"a":1 "k":"v"}', b"k") is None


# (type, inverse, key, data, data_list, headers, matches) from ext_filter.go's rules
FILTER_ROWS = [
    (1, "k", "a", (), b'{"k":"a"}', True),
    (1, "k", "a", (), b'{"k":"ab"}', False),
    (1, "k", "a", (), b'{"x":"a"}', False),
    (1, "k", "1", (), b'{"k":1}', False),                  # a number is not the string
    (2, "k", "^a.$", (), b'{"k":"ab"}', True),
    (2, "k", "^a.$", (), b'{"k":"abc"}', False),
    (2, "k", "^$", (), b'{"x":"1"}', True),                 # absent: "" (getMsgExtFilterStr)
    (3, "k", "b*", (), b'{"k":"b1"}', True),
    (3, "k", "b?", (), b'{"k":"b12"}', False),
    (3, "k", "[ab]x", (), b'{"k":"ax"}', True),
    (4, "any", "", ({"filter_ext_key": "k", "filter_data": "a"},
                    {"filter_ext_key": "j", "filter_data": "b"}), b'{"j":"b"}', True),
    (4, "all", "", ({"filter_ext_key": "k", "filter_data": "a"},
                    {"filter_ext_key": "j", "filter_data": "b"}), b'{"j":"b"}', False),
    (4, "all", "", ({"filter_ext_key": "k", "filter_data": "a"},
                    {"filter_ext_key": "j", "filter_data": "b"}), b'{"k":"a","j":"b"}', True),
]


@pytest.mark.parametrize("kind, key, data, data_list, headers, matches", FILTER_ROWS)
def test_filter_kinds(kind, key, data, data_list, headers, matches):
    f = ext.ExtFilter(kind, False, key, data, data_list)
    assert f.match(headers) is matches
    for inverse in (False, True):
        view = ext.ExtView(filter=ext.ExtFilter(kind, inverse, key, data, data_list))
        expected = ext.DELIVER if matches != inverse else ext.SKIP
        assert view.accept_record(record(headers, b"b")) == expected


@pytest.mark.parametrize("args", [
    (1, False, "", "a"),            # no key: ErrInvalidFilter
    (1, False, "k", ""),            # no data
    (2, False, "k", "("),           # a bad regexp
    (5, False, "k", "a"),           # ErrNotSupportedFilter
    (4, False, "some", "", ({"filter_ext_key": "k", "filter_data": "a"},)),
    (4, False, "any", "", ()),
])
def test_filters_youzan_refuses(args):
    with pytest.raises(ext.FilterError):
        ext.ExtFilter(*args)


def test_a_message_without_json_headers_matches_no_filter():
    view = ext.ExtView(filter=ext.ExtFilter(2, False, "k", ".*"))
    assert view.accept_record(record(None, b"b")) == ext.SKIP


TAGGED = record(b'{"##client_dispatch_tag":"x"}', b"b")
TAG_ROWS = [  # desired tag, tags wanted on the channel, message, verdict
    ("x", [b"x"], TAGGED, ext.DELIVER),
    ("y", [b"x", b"y"], TAGGED, ext.LEAVE),
    ("", [b"x"], TAGGED, ext.LEAVE),             # its consumer takes it
    ("", [b"y"], TAGGED, ext.DELIVER),           # nobody wants x: untagged consumers
    ("", [b"x"], record(None, b"b"), ext.DELIVER),
    ("x", [b"x"], record(None, b"b"), ext.LEAVE),  # a tagged consumer gets its tag only
]


@pytest.mark.parametrize("tag, tags, msg, verdict", TAG_ROWS)
def test_tag_dispatch(tag, tags, msg, verdict):
    assert ext.ExtView(tag=tag, tags=ext.TagSet(tags)).accept_record(msg) == verdict


def test_plain_to_ext_and_limits():
    out = bytearray()
    for body in (b"a", b"bc"):
        pack_message(body, _ids(), 1, out)
    conv = ext.plain_to_ext(out, 2, 100)
    assert isinstance(conv, ext.ExtRecords)
    n0 = struct.unpack_from("=I", conv)[0]
    assert n0 == 26 + 2 and conv[4 + 26:4 + 28] == b"\x00a"
    assert conv[4 + n0 + 4 + 26:] == b"\x00bc"
    prefix = ext.ext_body(b'{"k":"v"}', b"")
    conv = ext.plain_to_ext(out, 2, 100, prefix)
    assert conv[4 + 26:4 + 26 + len(prefix) + 1] == prefix + b"a"
    with pytest.raises(ValueError, match="message too big for an ext topic 2 \\+ 1 > 2"):
        ext.plain_to_ext(out, 2, 2)
    with pytest.raises(ValueError):
        ext.ext_body(b"x" * 0x10000, b"")


_GENERATORS = []  # the segments _ids made: unlinked after each test (they were left in /dev/shm)


def _ids():
    name = f"nsqshm-test-ext-{uuid.uuid4().hex[:8]}"
    _GENERATORS.append(name)
    return IdGenerator.open(name, node_id=1)


@pytest.fixture(autouse=True)
def _unlink_generators():
    yield
    while _GENERATORS:
        IdGenerator.unlink(_GENERATORS.pop())


def _records(*msgs):
    return b"".join(struct.pack("=I", len(m)) + m for m in msgs)


def _msg(i, headers):
    return (struct.pack(">QH", i, 0) + b"%016x" % i) + ext.ext_body(headers, b"body%d" % i)


def test_deliver_strips_frames_and_keeps_headers_in_flight():
    inflight = InFlight()
    msgs = [_msg(1, b'{"k":"v"}'), _msg(2, None)]
    out = bytearray()
    assert inflight.deliver(_records(*msgs), 2, out, 7, 1 << 62, 0, ext.ExtView(strip=True)) == 2
    frames, pos = [], 0
    while pos < len(out):
        size = struct.unpack_from(">I", out, pos)[0]
        frames.append(bytes(out[pos + 8:pos + 4 + size]))
        pos += 4 + size
    assert [f[26:] for f in frames] == [b"body1", b"body2"]
    assert inflight.consumed == 2
    # the in-flight copies keep the ext part: what a REQ or a timeout puts back
    held = bytearray(4096)
    n, size = inflight.drain(held)
    assert n == 2 and bytes(held[4 + 26:4 + 26 + 12]) == b'\x04\x00\x09{"k":"v"}'


def test_deliver_filter_and_tag_stop():
    inflight = InFlight()
    msgs = [_msg(1, b'{"k":"a"}'), _msg(2, b'{"k":"b"}'),
            _msg(3, b'{"##client_dispatch_tag":"x"}'), _msg(4, b'{"k":"a"}')]
    view = ext.ExtView(filter=ext.ExtFilter(1, False, "k", "a"), tag="", tags=ext.TagSet([b"x"]))
    out = bytearray()
    # 1 delivered, 2 filtered (confirmed), 3 left for the consumer of tag x: stop there
    assert inflight.deliver(_records(*msgs), 4, out, 7, 1 << 62, 0, view) == 1
    assert inflight.consumed == 2 and view.filtered == 1
    assert len(inflight) == 1


def _pub_ext_body(headers, body):
    return struct.pack(">H", len(headers)) + headers + body


@pytest.mark.parametrize("headers, trace", [
    (b'{"k":"v"}', None),
    (b' {"a": [1, -2.5e3, true, false, null, {"b": "\\u00e9"}], "k": ""} ', None),
    (b'{"##trace_id":"18446744073709551615"}', 18446744073709551615),
    (b'{"##trace_id":"0"}', 0),
])
def test_pack_pub_ext_valid(headers, trace):
    out = bytearray()
    done = ext.pack_pub_ext(_pub_ext_body(headers, b"body"), _ids(), 5, False, 1 << 20, 1 << 20,
                            16384, out)
    assert done == (1, None if trace is None else [trace], trace is not None)
    size = struct.unpack_from("=I", out)[0]
    assert size == len(out) - 4
    assert bytes(out[4 + 26:]) == ext.ext_body(headers, b"body")


@pytest.mark.parametrize("headers", [
    b"", b"{", b"[]", b'"s"', b'{"k":"v"} x', b'{"k":"v",}', b'{"k":01}', b'{"k":"a\x01"}',
    b'{"k":tru}', b'{"##trace_id":1}', b'{"##trace_id":"-1"}', b'{"##trace_id":"1x"}',
    b'{"##trace_id":"18446744073709551616"}', b'{"##trace_id":""}',
])
def test_pack_pub_ext_leaves_youzans_errors_to_its_parser(headers):
    out = bytearray()
    assert ext.pack_pub_ext(_pub_ext_body(headers, b"b"), _ids(), 5, False, 1 << 20, 1 << 20,
                            16384, out) is None
    assert out == b""


def test_pack_pub_ext_limits_and_mpub():
    out = bytearray()
    body = _pub_ext_body(b'{"k":"v"}', b"b")
    assert ext.pack_pub_ext(body, _ids(), 5, False, 1 << 20, 1 << 20, 8, out) is None  # header
    assert ext.pack_pub_ext(body, _ids(), 5, False, len(body), 1 << 20, 100, out) is None  # size
    assert ext.pack_pub_ext(_pub_ext_body(b"{}", b""), _ids(), 5, False, 99, 99, 99, out) is None
    blocks = [_pub_ext_body(b'{"##trace_id":"9"}', b"one"), _pub_ext_body(b"", b"two")]
    mpub = struct.pack(">I", 2) + b"".join(struct.pack(">I", len(b)) + b for b in blocks)
    assert ext.pack_pub_ext(mpub, _ids(), 5, True, 1 << 20, 1 << 20, 100, out) == (2, [9, 0],
                                                                                  True)
    first = struct.unpack_from("=I", out)[0]
    assert bytes(out[4 + 26:4 + first]) == ext.ext_body(b'{"##trace_id":"9"}', b"one")
    assert bytes(out[4 + first + 4 + 26:]) == b"\x00two"
    for bad in (struct.pack(">I", 0), struct.pack(">I", 3) + mpub[4:], mpub[:-1]):
        assert ext.pack_pub_ext(bad, _ids(), 5, True, 1 << 20, 1 << 20, 100, bytearray()) is None


def test_deliver_counts_expired_and_sampled_records_as_taken():
    # consumed tells deliver_from_ring how many records to pop: a record dropped for its
    # age is taken too (else the ring keeps it at its head forever)
    inflight = InFlight()
    inflight.ttl_ns = 1
    msgs = [_msg(1, None), _msg(2, None)]  # published at 1 and 2 ns past the epoch: expired
    assert inflight.deliver(_records(*msgs), 2, bytearray(), 7, 1 << 62) == 0
    assert (inflight.consumed, inflight.expired) == (2, 2)
    assert inflight.deliver(_records(*msgs), 2, bytearray(), 7, 1 << 62, 0,
                            ext.ExtView(strip=True)) == 0
    assert inflight.consumed == 2


@pytest.mark.parametrize("json, members", [
    (b"{}", []),
    (b' { "a" : "x" } ', [(b"a", b"x")]),
    (b'{"a":"x\\u00e9\\n","b":12,"c":{"d":[1,"}"]},"e":true,"f":null}',
     [(b"a", "xé\n".encode()), (b"b", b"12"), (b"c", b'{"d":[1,"}"]}'), (b"e", b"true"),
      (b"f", b"null")]),
    (b'{"k\\"q":""}', [(b'k"q', b"")]),
    (b'{"\\ud83d\\ude00":"\\ud800"}', [("\U0001F600".encode(), "\ufffd".encode())]),
])
def test_json_members(json, members):
    """The walk the Spark headers column makes (localbatch.Columns): keys and
    string values unescaped, other values as their JSON text."""
    assert ext.json_members(json) == members


@pytest.mark.parametrize("json", [b"", b"[]", b'{"a"}', b'{"a":}', b'{"a":"x"', b'{a:1}',
                                  b'{"a":1,}', b'"s"'])
def test_json_members_refuses_what_is_not_an_object(json):
    with pytest.raises(ValueError):
        ext.json_members(json)
