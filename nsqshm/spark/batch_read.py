"""Batch read: what the channel holds now, consumed.

The planner snapshots each channel's depth and splits it into numPartitions
shards per topic.  Each Spark task takes its share in lots of batchSize
(shared memory: BulkConsumer, straight from the ring into its arena and
Arrow buffers; TCP: a SUB bounded by nsqd's max_rdy_count) and finishes a
lot once Spark asked for the next one, i.e. once the lot was handed to
Spark.  A task that fails or stops early puts back what it holds (shared
memory: at close, or by the broker if its process dies; TCP: nsqd requeues
a closed connection's messages).  A batch read is a consumer of the
channel like any other: what it read is gone from the channel.
"""

import math
import time

from pyspark.sql.datasource import DataSourceReader, InputPartition

from nsqshm.spark.connect import (
    channel_depth_tcp,
    create_channel,
    local_broker,
    topic_is_ext,
)
from nsqshm.spark.options import starting_ns

PUMP_WAIT = 2.0  # s to let a new channel receive the topic's backlog before the snapshot


class ShardPartition(InputPartition):
    def __init__(self, topic, index, quota, ext=False):
        self.topic = topic
        self.index = index
        self.quota = quota
        self.ext = ext              # an ext topic: its messages carry headers


class BatchReader(DataSourceReader):
    def __init__(self, options):
        self.o = options
        self.since_ns = starting_ns(options)

    def partitions(self):
        o = self.o
        broker = local_broker(o)
        left = o.max_messages or math.inf
        parts = []
        for topic in o.topics:
            create_channel(o, topic, broker)
            depth = _depth_shm(broker, topic, o.channel) if broker else channel_depth_tcp(o, topic)
            total = int(min(depth, left))
            left -= total
            per, extra = divmod(total, o.partitions)
            ext = topic_is_ext(o, topic, broker)
            for i in range(o.partitions):
                parts.append(ShardPartition(topic, i, per + (1 if i < extra else 0), ext))
        return parts

    def read(self, partition):
        if partition.quota <= 0:
            return iter(())
        broker = local_broker(self.o)
        if broker is not None:
            return _read_shm(broker, self.o, partition.topic, partition.quota, self.since_ns,
                             partition.ext)
        return _read_tcp(self.o, partition.topic, partition.quota, self.since_ns,
                         partition.ext)


def _depth_shm(broker, topic, channel):
    """The channel's depth (its disk queue included, from /stats when the
    broker has HTTP), once the topic's pump has moved what the topic held."""
    from nsqshm.spark.connect import channel_depth_http

    ring = broker.attach(broker.channel_ring_name(topic, channel))
    topic_ring = broker.attach(broker.topic_ring_name(topic))
    try:
        deadline = time.monotonic() + PUMP_WAIT
        while topic_ring.depth and time.monotonic() < deadline:
            time.sleep(0.01)
        if broker.http_address:
            try:
                return max(ring.depth, channel_depth_http(broker.http_address, topic, channel))
            except OSError:
                pass
        return ring.depth
    finally:
        ring.close()
        topic_ring.close()


def _read_shm(broker, o, topic, quota, since_ns, ext):
    from nsqshm.local.bulk import BulkConsumer

    bulk = BulkConsumer(topic, o.channel, broker=broker, create=False, since_ns=since_ns,
                        label="spark-read", user_agent="nsqshm.spark/read", ext=ext,
                        headers=o.include_headers)
    try:
        taken = 0
        while taken < quota:
            # the ring may be empty while its channel's disk queue is refilling it
            wait = o.idle_timeout if getattr(bulk.ring, "disk_backlog", False) else 0.0
            batch = bulk.take(min(o.batch_size, quota - taken), timeout=wait)
            if not bulk.held:
                break
            taken += bulk.held
            if batch.num_rows:
                yield batch
            bulk.finish()  # Spark asked for more: the lot was handed on
    finally:
        bulk.close()  # puts back what is still held (an error, or a stopped read)


def _read_tcp(o, topic, quota, since_ns, ext):
    from nsqshm.local.arrow import with_headers
    from nsqshm.spark.tcp import Subscription

    # extend_support (frames with the ext part) only where there are headers to read
    sub = Subscription(o.tcp_address, topic, o.channel, since_ns=since_ns,
                       ext=ext and o.include_headers, headers=o.include_headers)
    try:
        taken = 0
        while taken < quota:
            n = sub.collect(min(o.batch_size, quota - taken), o.idle_timeout)
            if not n:
                break
            taken += n
            batch = with_headers(sub.columns.export(), topic, o.channel, o.include_headers)
            if batch.num_rows:
                yield batch
            sub.finish()
    finally:
        sub.close()  # nsqd requeues what was not finished
