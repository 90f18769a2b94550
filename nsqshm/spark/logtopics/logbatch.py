"""Batch read of log topics: the offsets between startingOffsets (default
earliest) and endingOffsets (default latest), by offset or by timestamp, as
Kafka's batch source.  Nothing is consumed: a log read leaves the channels
alone, and the same options read the same messages again (while retention
keeps them)."""

from pyspark.sql.datasource import DataSourceReader

from nsqshm.spark.logtopics import logrange
from nsqshm.spark.logtopics.logoffsets import (
    parse_offsets,
    parse_timestamps,
    resolve,
    resolve_times,
)


def positions(kind, o, log_topics, raw, by_time_raw, ms, default, held_by_topic, **allow):
    """{topic: {p: offset}} for a starting or ending spec: by timestamp JSON
    first, then one timestamp, then offsets (Kafka's precedence)."""
    names = list(log_topics)
    spec = parse_offsets(kind, raw, names, default, **allow)
    times = parse_timestamps(f"{kind}ByTimestamp", by_time_raw, names)
    out = {}
    for name, lt in log_topics.items():
        held = held_by_topic[name]
        if times is not None:
            out[name] = resolve_times(f"{kind}ByTimestamp", times, name, held,
                                      lt.offset_for_time)
        elif ms is not None:
            out[name] = resolve_times(kind, ms, name, held, lt.offset_for_time)
        else:
            out[name] = resolve(kind, spec, name, held)
    return out


class LogBatchReader(DataSourceReader):
    def __init__(self, options, log_topics):
        self.o = options
        self.log_topics = log_topics

    def partitions(self):
        o = self.o
        held = {name: lt.offsets() for name, lt in self.log_topics.items()}
        start = positions("startingOffsets", o, self.log_topics, o.starting_raw,
                          o.starting_by_time, o.starting_ms, "earliest", held,
                          allow_latest=False)
        end = positions("endingOffsets", o, self.log_topics, o.ending_raw, o.ending_by_time,
                        o.ending_ms, "latest", held, allow_earliest=False)
        for name, parts in end.items():
            for p, until in parts.items():
                parts[p] = min(until, held[name][p][1])
                start[name][p] = min(start[name][p], parts[p])
        for lt in self.log_topics.values():
            lt.close()
        return logrange.plan(self.log_topics, start, end, o) or [
            logrange.LogRange(next(iter(self.log_topics.values())), 0, 0, 0, None, True, 1)]

    def read(self, partition):
        return logrange.read(partition)
