"""InFlight.deliver with a sample_rate: nsqd's odds (rand.Int31n(100) <=
rate keeps a message), and a message sampled out is neither framed nor put
in flight, only counted in sampled_out."""

import struct

import pytest

from nsqshm._core.inflight import InFlight


def msg(i, body=b"body"):
    return struct.pack(">QH", 1, 0) + f"{i:016x}".encode() + body


def pack(messages):
    return b"".join(struct.pack("=I", len(m)) + m for m in messages)


def frames(out):
    pos, got = 0, []
    while pos < len(out):
        size, ftype = struct.unpack(">II", out[pos:pos + 8])
        got.append((ftype, bytes(out[pos + 8:pos + 4 + size])))
        pos += 4 + size
    return got


@pytest.mark.parametrize("rate", [1, 20, 50, 99])
def test_kept_share_matches_nsqds_odds(rate):
    n = 50_000
    t = InFlight()
    out = bytearray()
    added = t.deliver(pack(msg(i) for i in range(n)), n, out, 7, 100, rate)
    expected = n * (rate + 1) / 100
    sd = (n * (rate + 1) / 100 * (1 - (rate + 1) / 100)) ** 0.5
    assert abs(added - expected) <= 5 * sd + 1
    assert len(t) == added == t.client_count(7)
    assert t.sampled_out == n - added
    got = frames(out)
    assert len(got) == added and all(ftype == 2 for ftype, _ in got)
    for _, m in got:  # framed as usual: attempts bumped, in flight by ID
        assert m[8:10] == b"\x00\x01" and m[10:26] in t


def test_rate_zero_keeps_everything_and_seed_repeats():
    records = pack(msg(i) for i in range(1000))
    t = InFlight()
    assert t.deliver(records, 1000, bytearray(), 1, 0, 0) == 1000
    assert t.sampled_out == 0
    kept = []
    for _ in range(2):
        t = InFlight()
        t.seed(42)
        out = bytearray()
        t.deliver(records, 1000, out, 1, 0, 30)
        kept.append([m[10:26] for _, m in frames(out)])
    assert kept[0] == kept[1] and 0 < len(kept[0]) < 1000


def test_sampled_out_messages_leave_out_untouched():
    t = InFlight()
    t.seed(1)
    out = bytearray(b"prefix")
    added = t.deliver(pack(msg(i, b"x" * 100) for i in range(200)), 200, out, 1, 0, 10)
    assert out[:6] == b"prefix"
    assert len(out) == 6 + added * (8 + 26 + 100)


@pytest.mark.parametrize("rate", [-1, 100, 1000])
def test_bad_rate(rate):
    with pytest.raises(ValueError, match="sample_rate"):
        InFlight().deliver(pack([msg(1)]), 1, bytearray(), 1, 0, rate)
