"""One Spark input partition of a log topic: the msg offsets [start, until)
of one log partition, read on the executor.

On the broker's host the task maps the partition's segments read-only
(commitlog.LogReader, the same reader the broker's feeders use) and builds
Arrow batches in C: LogReader.read_into copies whole records into a buffer
and Columns.add_records lays them out column by column, no Python object
per message.  A range is fixed by the offsets Spark logged before the batch
ran, so a task run again (a retry, a query restarted from its checkpoint)
reads exactly the same messages.

Elsewhere the task reads the messages over the broker's HTTP API
(/message/get, one message per request: correct, not fast; see
docs/spark.md).

Offsets below the log start were removed by retention: with failOnDataLoss
the task fails saying so, otherwise it logs a warning and reads from the
start.
"""

import logging

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import InputPartition

READ_BUFFER = 16 << 20   # > the largest record a log takes (partition.MAX_RECORD)

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
                 batch_size):
        self.log_topic = log_topic
        self.partition = partition
        self.start = start
        self.until = until
        self.channel = channel          # the channel column's value (None: null)
        self.fail_on_data_loss = fail_on_data_loss
        self.batch_size = batch_size


def plan(log_topics, start, end, o):
    """The LogRanges between two offset maps ({topic: {p: offset}}), split by
    minPartitions."""
    from nsqshm.spark.logoffsets import split_ranges

    spans = []
    for topic, parts in sorted(end.items()):
        for p, until in sorted(parts.items()):
            frm = start.get(topic, {}).get(p, until)
            spans.append((topic, p, frm, until))
    channel = o.channel if o.channel_given else None
    return [LogRange(log_topics[t], p, f, u, channel, o.fail_on_data_loss, o.batch_size)
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
    if rng.log_topic.local:
        return _read_local(rng)
    return _read_http(rng)


def _batch(exported, rng, first):
    from nsqshm.local.arrow import record_batch

    n = exported[0]
    rb = record_batch(exported, rng.log_topic.name, rng.channel or "")
    columns = rb.columns
    if rng.channel is None:
        columns[5] = pa.nulls(n, pa.string())
    columns.append(pa.array(np.full(n, rng.partition, dtype=np.int32)))
    columns.append(pa.array(np.arange(first, first + n, dtype=np.int64)))
    return pa.RecordBatch.from_arrays(columns, names=[*rb.schema.names, "partition", "offset"])


def _read_local(rng):
    from nsqshm._core.commitlog import OffsetOutOfRange
    from nsqshm._core.localbatch import Columns

    lt = rng.log_topic
    reader = lt.reader(rng.partition)
    if reader is None:
        raise DataLossError(f"{lt.name} partition {rng.partition}: no log on this host "
                            f"under {lt.data_path}")
    try:
        offset = check_loss(rng, reader.start_offset)
        buf = bytearray(READ_BUFFER)
        cols = Columns()
        while offset < rng.until:
            try:
                n, _, nxt = reader.read_into(offset, buf, min(rng.batch_size,
                                                              rng.until - offset))
            except OffsetOutOfRange as err:  # retention passed us while reading
                offset = check_loss(rng, err.start_offset)
                continue
            if not n:
                raise DataLossError(f"{lt.name} partition {rng.partition}: the log ends at "
                                    f"{offset}, offsets up to {rng.until} were planned")
            cols.add_records(buf, n, True)
            yield _batch(cols.export(), rng, offset)
            offset = nxt
    finally:
        lt.close()


def _read_http(rng):
    """/message/get per message: the remote path (see the module docstring)."""
    from nsqshm.local.arrow import SCHEMA

    lt = rng.log_topic
    start, _ = lt.offsets()[rng.partition]
    offset = check_loss(rng, start)
    while offset < rng.until:
        n = min(rng.batch_size, rng.until - offset)
        bodies, ids, ts = [], [], []
        for off in range(offset, offset + n):
            doc = lt._message_get_doc(rng.partition, "count", off)
            if doc is None:
                start, _ = lt.offsets()[rng.partition]
                if off < start:
                    offset = check_loss(rng, start) if off == offset else off
                    break
                raise DataLossError(f"{lt.name} partition {rng.partition}: offset {off} "
                                    "is not in the log")
            bodies.append(doc["body"].encode("utf-8", "surrogateescape"))
            ids.append(f"{int(doc['id']):016x}")
            ts.append(int(doc["timestamp"]) // 1000)
        else:
            n = len(bodies)
            rb = pa.RecordBatch.from_arrays([
                pa.array(bodies, pa.binary()), pa.array(ids, pa.string()),
                pa.array(ts, SCHEMA.field("timestamp").type), pa.array([1] * n, pa.int32()),
                pa.array([lt.name] * n, pa.string()),
                pa.array([rng.channel] * n, pa.string()),
                pa.array(np.full(n, rng.partition, dtype=np.int32)),
                pa.array(np.arange(offset, offset + n, dtype=np.int64)),
            ], names=[*SCHEMA.names, "partition", "offset"])
            yield rb
            offset += n
