"""Spark offsets on log topics, as Kafka's source has them
(docs/streaming/structured-streaming-kafka-integration.md in apache/spark):
one msg offset per partition, in JSON

    {"events": {"0": 23, "1": 40}}           topic -> partition -> next offset to read

as startingOffsets / endingOffsets take them (-2: earliest, -1: latest) and
as the streaming checkpoint keeps them (always real offsets).  Pure
functions: what the log holds comes in as {partition: (start, end)}.
"""

import json

from nsqshm.spark.options import OptionError

EARLIEST = -2
LATEST = -1


def parse_offsets(kind, raw, topics, default, allow_latest=True, allow_earliest=True):
    """startingOffsets / endingOffsets: "earliest", "latest" or JSON.
    Returns {topic: {partition: offset or EARLIEST/LATEST}} or the word."""
    if raw is None or raw == "":
        return default
    word = raw.strip().lower()
    if word in ("earliest", "latest"):
        if word == "latest" and not allow_latest or word == "earliest" and not allow_earliest:
            raise OptionError(f"{kind}: {word} is not allowed here")
        return word
    try:
        doc = json.loads(raw)
    except ValueError:
        raise OptionError(f"{kind} {raw!r} is not earliest, latest or JSON like "
                          '{"topic":{"0":23,"1":-1}}') from None
    if not isinstance(doc, dict):
        raise OptionError(f"{kind} {raw!r} is not a JSON object of topics")
    out = {}
    for topic, parts in doc.items():
        if topic not in topics:
            raise OptionError(f"{kind} names topic {topic!r}, which is not read")
        if not isinstance(parts, dict):
            raise OptionError(f"{kind}: topic {topic!r} needs an object of partitions")
        out[topic] = {}
        for p, off in parts.items():
            if not str(p).isdigit() or isinstance(off, bool) or not isinstance(off, int):
                raise OptionError(f"{kind}: {topic!r} partition {p!r}: {off!r} is not "
                                  "a partition number and an offset")
            if off < EARLIEST or off == LATEST and not allow_latest or \
                    off == EARLIEST and not allow_earliest:
                raise OptionError(f"{kind}: {topic!r} partition {p}: offset {off} is not "
                                  "allowed here")
            out[topic][int(p)] = off
    return out


def parse_timestamps(kind, raw, topics):
    """startingOffsetsByTimestamp / endingOffsetsByTimestamp JSON:
    {topic: {partition: ms}}."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
        out = {t: {int(p): int(ms) for p, ms in parts.items()} for t, parts in doc.items()}
    except (ValueError, TypeError, AttributeError):
        raise OptionError(f'{kind} {raw!r} is not JSON like {{"topic":{{"0":1700000000000}}}}'
                          ) from None
    for t in out:
        if t not in topics:
            raise OptionError(f"{kind} names topic {t!r}, which is not read")
    return out


def resolve(kind, spec, topic, held):
    """Real offsets {partition: offset} of one topic for a spec: "earliest",
    "latest" or a parsed JSON map (every partition named, as Kafka asks);
    `held` = {partition: (start, end)}."""
    if spec == "earliest":
        return {p: start for p, (start, _) in held.items()}
    if spec == "latest":
        return {p: end for p, (_, end) in held.items()}
    named = spec.get(topic)
    if named is None or set(named) != set(held):
        raise OptionError(f"{kind}: topic {topic!r} has partitions {sorted(held)}; if "
                          f"{kind} contains specific offsets, you must specify all of them "
                          f"(given: {sorted(named or {})})")
    out = {}
    for p, off in named.items():
        start, end = held[p]
        out[p] = start if off == EARLIEST else end if off == LATEST else off
    return out


def resolve_times(kind, times, topic, held, offset_for_time):
    """Real offsets of one topic for a by-time spec: {topic: {p: ms}} (every
    partition named) or one ms for all; offset_for_time(p, ms)."""
    if isinstance(times, dict):
        named = times.get(topic)
        if named is None or set(named) != set(held):
            raise OptionError(f"{kind}: topic {topic!r} has partitions {sorted(held)}; "
                              f"name every one (given: {sorted(named or {})})")
        return {p: offset_for_time(p, ms) for p, ms in named.items()}
    return {p: offset_for_time(p, times) for p in held}


def encode(offsets):
    """{topic: {p: off}} -> the checkpoint's JSON form (partition keys as strings)."""
    return {t: {str(p): int(off) for p, off in sorted(parts.items())}
            for t, parts in sorted(offsets.items())}


def decode(offset):
    return {t: {int(p): int(off) for p, off in parts.items()} for t, parts in offset.items()}


def rate_limit(start, latest, max_rows):
    """Kafka's maxOffsetsPerTrigger: up to `max_rows` offsets past `start`,
    shared over the partitions in proportion to what each has ({(topic, p):
    offset} in and out)."""
    avail = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
    total = sum(avail.values())
    if total <= max_rows:
        return dict(latest)
    out = {}
    given = 0
    for tp in sorted(latest):
        share = int(avail[tp] * max_rows // total)
        out[tp] = start.get(tp, latest[tp]) + share
        given += share
    # the rounding's remainder, one each, to the partitions with the most left
    for tp in sorted(latest, key=lambda k: avail[k] - (out[k] - start.get(k, latest[k])),
                     reverse=True):
        if given >= max_rows:
            break
        if out[tp] < latest[tp]:
            out[tp] += 1
            given += 1
    return out


def split_ranges(ranges, min_partitions):
    """[(topic, p, from, until)] split so that there are at least
    min_partitions of them where the data allows, each partition's range
    cut in proportion to its size (Kafka's KafkaOffsetRangeCalculator)."""
    ranges = [r for r in ranges if r[3] > r[2]]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(u - f for _, _, f, u in ranges)
    out = []
    for topic, p, f, u in ranges:
        size = u - f
        parts = max(1, min(size, round(size * min_partitions / total)))
        step, extra = divmod(size, parts)
        at = f
        for i in range(parts):
            n = step + (1 if i < extra else 0)
            out.append((topic, p, at, at + n))
            at += n
    return out
