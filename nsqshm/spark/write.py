"""Batch and streaming writes: each row's `body` (binary or string) is
published to the `topic` option, or to the row's own `topic` column when
the DataFrame has one.  Shared memory (Producer) when the broker is on
this host, else MPUB over TCP.  Publishing cannot be undone: a retried task
publishes again (at-least-once), so commit and abort have nothing to do.

A log topic takes each partition's rows through shared memory when its
broker is on this host and standalone (the local Producer pushes them into
the partition's inbound ring; its owner appends them), else `MPUB T p` over
TCP (a replicated topic's OK waits for its in-sync replicas): a `partition`
column names each row's partition, or a `key` column is hashed to one
(CRC-32C of the key's bytes modulo the partition count, keyhash.pyx: stable,
so one key's messages stay in order in one partition); with neither, each
batch goes to the next partition in turn (shared memory) or the broker
spreads the rows round-robin (TCP).

A `headers` column (Kafka's sink's: array<struct<key string, value binary
or string>>) is published with MPUB_EXT over TCP, each row's pairs as one
JSON object of strings (localbatch.mpub_ext_body, in C); the topic must be
an ext topic (docs/headers.md).  An ext topic's rows go over TCP too, with
or without headers: a local producer writes no ext part."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from nsqshm.spark.connect import local_broker
from nsqshm.spark.options import OptionError


class Published(WriterCommitMessage):
    def __init__(self, count):
        self.count = count


def check_schema(o, schema):
    names = {f.name: f.dataType for f in schema.fields}
    if "body" not in names:
        raise OptionError('writing needs a "body" column (binary or string)')
    if not isinstance(names["body"], BinaryType | StringType):
        raise OptionError(f'column "body" is {names["body"].simpleString()}, '
                          "not binary or string")
    has_topic = "topic" in names
    if has_topic and not isinstance(names["topic"], StringType):
        raise OptionError('column "topic" must be a string')
    if not has_topic and not o.topic:
        raise OptionError('writing needs the "topic" option or a "topic" column')
    if "partition" in names and not isinstance(names["partition"],
                                               IntegerType | LongType | ShortType):
        raise OptionError(f'column "partition" is {names["partition"].simpleString()}, '
                          "not an integer")
    if "key" in names and not isinstance(names["key"], BinaryType | StringType):
        raise OptionError(f'column "key" is {names["key"].simpleString()}, not binary or string')
    if "partition" in names and "key" in names:
        raise OptionError('give a "partition" column or a "key" column, not both')
    if "headers" in names and not _headers_type(names["headers"]):
        raise OptionError(f'column "headers" is {names["headers"].simpleString()}, not '
                          "array<struct<key:string,value:binary>> (Kafka's headers)")
    return has_topic


def _headers_type(t):
    if not isinstance(t, ArrayType) or not isinstance(t.elementType, StructType):
        return False
    fields = t.elementType.fields
    return [f.name for f in fields] == ["key", "value"] and \
        all(isinstance(f.dataType, BinaryType | StringType) for f in fields)


class _Sink:
    """Publishes Arrow batches through shared memory or TCP (one per task)."""

    def __init__(self, o):
        self.o = o
        self.log_topics = {}    # topic -> LogTopic or None (classic)
        self.ext_topics = {}    # classic topic -> made with ext=true
        self.log_tcp = None
        broker = self.broker = local_broker(o)
        if broker is not None:
            from nsqshm.local.producer import Producer

            self.producer = Producer(broker=broker)
            self.tcp = None
        else:
            from nsqshm.spark.tcp import Publisher

            self.producer = None
            self.tcp = Publisher(o.tcp_address)

    def _log_topic(self, topic):
        if topic not in self.log_topics:
            from nsqshm.spark.logtopics.logtopic import LogTopic

            self.log_topics[topic] = LogTopic.find(self.o, topic)
        return self.log_topics[topic]

    def publish(self, topic, bodies, rows=None):
        if not len(bodies):
            return 0
        lt = self._log_topic(topic)
        if lt is not None:
            return self._publish_log(lt, bodies, rows)
        headers = rows is not None and "headers" in rows.schema.names
        if self.producer is not None and not headers and not self._is_ext(topic):
            return self.producer.publish_arrow(bodies, topic=topic)
        return self._publish_tcp(self.tcp or self._tcp_publisher(None), topic, bodies,
                                 rows if headers else None)

    def _is_ext(self, topic):
        if topic not in self.ext_topics:
            from nsqshm.spark.connect import topic_is_ext

            self.ext_topics[topic] = topic_is_ext(self.o, topic, self.broker)
        return self.ext_topics[topic]

    def _tcp_publisher(self, address):
        """The TCP publisher of what shared memory cannot take (log and ext topics)."""
        if self.log_tcp is None:
            from nsqshm.spark.tcp import Publisher

            address = address or self.o.tcp_address or (
                self.broker.info.get("tcp_address") if self.broker is not None else None)
            if not address:
                raise OptionError("no TCP address to publish to: give nsqdTcpAddress")
            self.log_tcp = Publisher(address)
        return self.log_tcp

    @staticmethod
    def _publish_tcp(publisher, topic, bodies, rows, partition=None):
        """MPUB, or MPUB_EXT when the rows have a headers column."""
        from nsqshm.local.arrow import body_spans, header_spans

        if rows is None or "headers" not in rows.schema.names:
            return publisher.publish_spans(topic, *body_spans(bodies), partition=partition)
        try:
            headers = header_spans(rows.column("headers"))
        except (TypeError, ValueError) as err:
            raise OptionError(f'column "headers": {err}') from None
        return publisher.publish_ext(topic, *body_spans(bodies), headers, partition=partition)

    def _publish_log(self, lt, bodies, rows):
        """Each partition's rows (their order kept): through the local Producer
        (shared memory) or MPUB T p."""
        headers = rows is not None and "headers" in rows.schema.names
        if self.producer is not None and lt.data_path is not None \
                and self.broker.cluster is False and not headers and not lt.ext:
            def send(part_bodies, part_rows, partition):
                return self.producer.publish_arrow(part_bodies, topic=lt.name,
                                                   partition=partition)
        else:
            publisher = self._tcp_publisher(lt.tcp_address)

            def send(part_bodies, part_rows, partition):
                return self._publish_tcp(publisher, lt.name, part_bodies, part_rows, partition)
        parts = self._partitions_of(lt, rows) if rows is not None else None
        if parts is None:
            if lt.ordered:  # (as its PUBs: a partition named, so that order means one)
                raise OptionError(f'log topic {lt.name!r} is ordered: its rows need a '
                                  '"partition" or a "key" column')
            return send(bodies, rows, None)
        count = 0
        distinct = np.unique(parts)
        for p in distinct:
            if len(distinct) > 1:
                chosen = rows.filter(pa.array(parts == p))
                count += send(chosen.column("body"), chosen, int(p))
            else:
                count += send(bodies, rows, int(p))
        return count

    @staticmethod
    def _partitions_of(lt, rows):
        """An int32 numpy array: each row's partition (None: no column)."""
        names = rows.schema.names
        if "partition" in names:
            col = rows.column("partition")
            if col.null_count:
                raise OptionError('rows with a null "partition"')
            parts = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)
            bad = parts[(parts < 0) | (parts >= lt.partitions)]
            if len(bad):
                raise OptionError(f"partition {int(bad[0])}: log topic {lt.name!r} has "
                                  f"partitions 0..{lt.partitions - 1}")
            return parts.astype(np.int32)
        if "key" in names:
            from nsqshm._core.keyhash import key_partitions
            from nsqshm.local.arrow import body_spans

            keys = rows.column("key")
            if keys.null_count:
                raise OptionError('rows with a null "key"')
            data, offsets, width, start, count = body_spans(keys)
            out = np.empty(count, dtype=np.int32)
            key_partitions(data, offsets, width, start, count, lt.partitions, out)
            return out
        return None

    def batch(self, rb, has_topic):
        bodies = rb.column("body")
        if not has_topic:
            return self.publish(self.o.topic, bodies, rb)
        topics = rb.column("topic")
        if topics.null_count:
            if not self.o.topic:
                raise OptionError('rows with a null "topic" and no "topic" option')
            topics = pc.fill_null(topics, self.o.topic)
        distinct = pc.unique(topics).to_pylist()
        if len(distinct) == 1:
            return self.publish(distinct[0], bodies, rb)
        count = 0
        for topic in distinct:
            chosen = rb.filter(pc.equal(topics, pa.scalar(topic)))
            count += self.publish(topic, chosen.column("body"), chosen)
        return count

    def close(self):
        if self.log_tcp is not None:
            self.log_tcp.close()
        if self.producer is not None:
            self.producer.close()
        if self.tcp is not None:
            self.tcp.close()


def _write(o, has_topic, iterator):
    sink = _Sink(o)
    count = 0
    try:
        for rb in iterator:
            count += sink.batch(rb, has_topic)
    finally:
        sink.close()
    return Published(count)


class _Publishing:
    def __init__(self, options, schema):
        self.o = options
        self.has_topic = check_schema(options, schema)

    def write(self, iterator):
        return _write(self.o, self.has_topic, iterator)


class Writer(_Publishing, DataSourceArrowWriter):
    pass


class StreamWriter(_Publishing, DataSourceStreamArrowWriter):
    def commit(self, messages, batchId):
        pass

    def abort(self, messages, batchId):
        pass
