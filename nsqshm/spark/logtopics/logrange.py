"""One Spark input partition of a log topic: the msg offsets [start, until)
of one log partition, read on the executor.

On the broker's host the task maps the partition's segments read-only
(commitlog.LogReader, the same reader the broker's feeders use) and builds
Arrow batches in C: Columns.add_log copies each message from where it lies
in the segment into the columns (LogReader.records), once, no Python object
per message.  A range is fixed by the offsets Spark logged before the batch
ran, so a task run again (a retry, a query restarted from its checkpoint)
reads exactly the same messages.

Elsewhere the task reads the range over TCP: SUB_ADVANCED on a channel of
its own whose cursor it moves to the range's start (logtcp), keeping each
offset of the range once by the position every log message's ID carries.

Offsets below the log start were removed by retention: with failOnDataLoss
the task fails saying so, otherwise it logs a warning and reads from the
start.
"""

import logging

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import InputPartition

log = logging.getLogger("nsqshm.spark")


class DataLossError(RuntimeError):
    pass


def data_loss_message(topic, partition, wanted, start):
    return (f"Some data may have been lost because they are not available in the log any "
            f"more: {topic} partition {partition} starts at offset {start}, offsets "
            f"{wanted}..{start - 1} were removed (retention, or the topic was deleted and "
            f"made again). If you want your streaming query to go on past them, set the "
            f'source option "failOnDataLoss" to "false".')


class LogRange(InputPartition):
    def __init__(self, log_topic, partition, start, until, channel, fail_on_data_loss,
                 batch_size, headers=False):
        self.log_topic = log_topic
        self.partition = partition
        self.start = start
        self.until = until
        self.channel = channel          # the channel column's value (None: null)
        self.fail_on_data_loss = fail_on_data_loss
        self.batch_size = batch_size
        self.headers = headers          # includeHeaders: a headers column


def plan(log_topics, start, end, o):
    """The LogRanges between two offset maps ({topic: {p: offset}}), split by
    minPartitions.  A partition that `start` lacks (a topic subscribePattern
    found after the query began) is read from its earliest offset, as
    Kafka's source reads a new partition."""
    from nsqshm.spark.logtopics.logoffsets import split_ranges

    spans = []
    for topic, parts in sorted(end.items()):
        known = start.get(topic)
        log_starts = log_topics[topic].offsets() if known is None else {}
        for p, until in sorted(parts.items()):
            frm = known.get(p) if known is not None else None
            if frm is None:
                frm = min(log_starts[p][0] if p in log_starts
                          else log_topics[topic].offsets()[p][0], until)
            spans.append((topic, p, frm, until))
    channel = o.channel if o.channel_given else None
    return [LogRange(log_topics[t], p, f, u, channel, o.fail_on_data_loss, o.batch_size,
                     o.include_headers)
            for t, p, f, u in split_ranges(spans, o.min_partitions)]


def check_loss(rng, log_start):
    """The first offset to read: rng.start, or the log start past a loss."""
    if rng.start >= log_start:
        return rng.start
    text = data_loss_message(rng.log_topic.name, rng.partition, rng.start, log_start)
    if rng.fail_on_data_loss:
        raise DataLossError(text)
    log.warning(text)
    return min(log_start, rng.until)


def read(rng):
    if rng.until <= rng.start:
        return iter(())
    lt = rng.log_topic
    # decided in each executor: a log on this host is read from its segments,
    # else over TCP (an executor on another host than the driver's broker)
    if lt.local and (lt.reader(rng.partition) is not None or not lt.tcp_address):
        return _read_local(rng)
    return _read_tcp(rng)


def _batch(exported, rng, offsets, keep=None):
    """The rows of Columns.export() (those at `keep`, when given) with their
    log offsets, in the log schema (headers last, with includeHeaders)."""
    from nsqshm.local.arrow import headers_array, null_headers, record_batch

    rb = record_batch(exported, rng.log_topic.name, rng.channel or "")
    headers = headers_array(exported) if rng.headers else None
    if keep is not None:
        keep = pa.array(keep)
        rb = rb.take(keep)
        headers = headers.take(keep) if headers is not None else None
    n = rb.num_rows
    columns = rb.columns
    if rng.channel is None:
        columns[5] = pa.nulls(n, pa.string())
    columns.append(pa.array(np.full(n, rng.partition, dtype=np.int32)))
    columns.append(pa.array(offsets))
    names = [*rb.schema.names, "partition", "offset"]
    if rng.headers:  # a topic without ext: no message has headers
        columns.append(headers if headers is not None else null_headers(n))
        names.append("headers")
    return pa.RecordBatch.from_arrays(columns, names=names)


def columns_for(rng):
    """The C column builder of a range: an ext topic's ext part cut from the
    bodies, its headers laid out when asked for."""
    from nsqshm._core.localbatch import Columns

    return Columns(ext=rng.log_topic.ext, headers=rng.headers)


def _read_local(rng):
    from nsqshm._core.commitlog import OffsetOutOfRange

    lt = rng.log_topic
    reader = lt.reader(rng.partition)
    if reader is None:
        raise DataLossError(f"{lt.name} partition {rng.partition}: no log on this host "
                            f"under {lt.data_path}")
    try:
        offset = check_loss(rng, reader.start_offset)
        cols = columns_for(rng)
        while offset < rng.until:
            try:  # from the mmap'd segments straight into the columns: one copy
                n, nxt = cols.add_log(reader, offset, min(rng.batch_size, rng.until - offset),
                                      True)
            except OffsetOutOfRange as err:  # retention passed us while reading
                offset = check_loss(rng, err.start_offset)
                continue
            if not n:
                raise DataLossError(f"{lt.name} partition {rng.partition}: the log ends at "
                                    f"{offset}, offsets up to {rng.until} were planned")
            yield _batch(cols.export(), rng, np.arange(offset, offset + n, dtype=np.int64))
            offset = nxt
    finally:
        lt.close()


def message_positions(ids):
    """(partitions, offsets) numpy arrays from a buffer of 16-hex-digit IDs
    ((partition << 48) | offset, as append_packed stamps them)."""
    digits = np.frombuffer(ids, dtype=np.uint8).reshape(-1, 16).astype(np.uint64)
    digits = np.where(digits >= 97, digits - 87, np.where(digits >= 65, digits - 55, digits - 48))
    values = (digits << (np.arange(15, -1, -1, dtype=np.uint64) * np.uint64(4))).sum(
        axis=1, dtype=np.uint64)
    return (values >> np.uint64(48)).astype(np.int64), \
        (values & np.uint64((1 << 48) - 1)).astype(np.int64)


def _read_tcp(rng):
    """SUB_ADVANCED on a channel of this task's own, its cursor in the
    partition moved to the range's start: the broker delivers from there
    (and whatever the channel gets of other partitions, dropped).  Rows are
    kept by the position in their IDs, each offset of the range once, so a
    redelivery changes nothing; all is FINed as it arrives."""
    from nsqshm.spark.logtopics.logtcp import RangeSubscription

    lt = rng.log_topic
    if not lt.tcp_address:
        raise DataLossError(f"{lt.name}: the broker is not on this host: give nsqdTcpAddress")
    start, _ = lt.offsets()[rng.partition]
    first = check_loss(rng, start)
    want = rng.until - first
    seen = np.zeros(want, dtype=bool)
    # extend_support (frames with the ext part) only where there are headers to read
    sub = RangeSubscription(lt, rng.partition, first, columns_for(rng) if lt.ext and rng.headers
                            else None)
    try:
        # retention may have passed `first` before the SUB: the broker then starts at
        # its log start (Youzan's msgcount below it), so what lies below is a loss now
        start, _ = lt.offsets()[rng.partition]
        if start > first:
            seen[:check_loss(rng, start) - first] = True
        while not seen.all():
            got = sub.collect(rng.batch_size)
            sub.finish()
            if not got:
                if sub.idle_too_long():
                    missing = first + int(np.argmin(seen))
                    raise DataLossError(f"{lt.name} partition {rng.partition}: offset {missing} "
                                        f"did not arrive from {lt.tcp_address}")
                continue
            exported = sub.columns.export()
            parts, offs = message_positions(exported[3])
            rel = offs - first
            idx = np.nonzero((parts == rng.partition) & (rel >= 0) & (rel < want))[0]
            rel_u, at = np.unique(rel[idx], return_index=True)
            fresh = ~seen[rel_u]
            keep, rel_u = idx[at][fresh], rel_u[fresh]
            seen[rel_u] = True
            if not len(keep):
                continue
            yield _batch(exported, rng, rel_u + first, keep)
    finally:
        sub.close()
