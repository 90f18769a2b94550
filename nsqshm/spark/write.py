"""Batch and streaming writes: each row's `body` (binary or string) is
published to the `topic` option, or to the row's own `topic` column when
the DataFrame has one.  Shared memory (Producer) when the broker is on
this host, else MPUB over TCP.  Publishing cannot be undone: a retried task
publishes again (at-least-once), so commit and abort have nothing to do."""

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType

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
    return has_topic


class _Sink:
    """Publishes Arrow batches through shared memory or TCP (one per task)."""

    def __init__(self, o):
        self.o = o
        broker = local_broker(o)
        if broker is not None:
            from nsqshm.local.producer import Producer

            self.producer = Producer(broker=broker)
            self.tcp = None
        else:
            from nsqshm.spark.tcp import Publisher

            self.producer = None
            self.tcp = Publisher(o.tcp_address)

    def publish(self, topic, bodies):
        if not len(bodies):
            return 0
        if self.producer is not None:
            return self.producer.publish_arrow(bodies, topic=topic)
        from nsqshm.local.arrow import body_spans

        data, offsets, width, start, count = body_spans(bodies)
        return self.tcp.publish_spans(topic, data, offsets, width, start, count)

    def batch(self, rb, has_topic):
        bodies = rb.column("body")
        if not has_topic:
            return self.publish(self.o.topic, bodies)
        topics = rb.column("topic")
        if topics.null_count:
            if not self.o.topic:
                raise OptionError('rows with a null "topic" and no "topic" option')
            topics = pc.fill_null(topics, self.o.topic)
        distinct = pc.unique(topics).to_pylist()
        if len(distinct) == 1:
            return self.publish(distinct[0], bodies)
        count = 0
        for topic in distinct:
            count += self.publish(topic, pc.filter(bodies, pc.equal(topics, pa.scalar(topic))))
        return count

    def close(self):
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
