"""nsqshm.spark.logtopics.logoffsets: Kafka's offset JSON, the rate limit and the
range split (pure functions, no Spark)."""

import pytest

from nsqshm.spark.logtopics.logoffsets import (
    decode,
    encode,
    parse_offsets,
    rate_limit,
    resolve,
    split_ranges,
)
from nsqshm.spark.options import OptionError


def test_offsets_json_round_trip_and_resolve():
    spec = parse_offsets("startingOffsets", '{"t":{"0":23,"1":-2,"2":-1}}', ["t"], "latest")
    held = {0: (5, 40), 1: (7, 50), 2: (0, 60)}
    got = resolve("startingOffsets", spec, "t", held)
    assert got == {0: 23, 1: 7, 2: 60}
    assert encode({"t": got}) == {"t": {"0": 23, "1": 7, "2": 60}}
    assert decode(encode({"t": got})) == {"t": got}
    assert resolve("x", "earliest", "t", held) == {0: 5, 1: 7, 2: 0}
    assert resolve("x", "latest", "t", held) == {0: 40, 1: 50, 2: 60}


@pytest.mark.parametrize("raw,error", [
    ("middle", "is not earliest, latest or JSON"),
    ("[1]", "not a JSON object of topics"),
    ('{"t":{"0":-3}}', "offset -3 is not allowed"),
    ('{"t":{"x":1}}', "is not a partition number and an offset"),
    ('{"t":{"0":true}}', "is not a partition number and an offset"),
    ('{"u":{"0":1}}', "names topic 'u', which is not read"),
])
def test_offsets_json_errors(raw, error):
    with pytest.raises(OptionError, match=error):
        parse_offsets("startingOffsets", raw, ["t"], "latest")


def test_every_partition_must_be_named():
    spec = parse_offsets("startingOffsets", '{"t":{"0":1}}', ["t"], "latest")
    with pytest.raises(OptionError, match=r"has partitions \[0, 1\].*must specify all"):
        resolve("startingOffsets", spec, "t", {0: (0, 9), 1: (0, 9)})


def test_rate_limit_shares_in_proportion():
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 10}
    latest = {("t", 0): 300, ("t", 1): 100, ("t", 2): 10}
    assert rate_limit(start, latest, 100) == {("t", 0): 75, ("t", 1): 25, ("t", 2): 10}
    assert rate_limit(start, latest, 1000) == latest
    got = rate_limit({("t", 0): 0, ("t", 1): 0}, {("t", 0): 1, ("t", 1): 1}, 1)
    assert sum(got.values()) == 1   # the rounding's remainder still within the limit


def test_split_ranges_by_min_partitions():
    ranges = [("t", 0, 0, 90), ("t", 1, 5, 15), ("t", 2, 7, 7)]
    assert split_ranges(ranges, 0) == [("t", 0, 0, 90), ("t", 1, 5, 15)]
    split = split_ranges(ranges, 10)
    assert len(split) == 10
    assert [r for r in split if r[1] == 1] == [("t", 1, 5, 15)]
    part0 = [r for r in split if r[1] == 0]
    assert part0[0][2] == 0 and part0[-1][3] == 90 and \
        all(a[3] == b[2] for a, b in zip(part0, part0[1:], strict=False))
