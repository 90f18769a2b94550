"""Local clients: publish into and consume from a broker running on the
same host through its shared-memory rings, with NSQ's semantics (see
docs/local.md).

    from nsqshm.local import Producer, Consumer

    with Producer("events", data_path="/var/lib/nsq") as p:
        p.publish(b"hello")
        p.publish_arrow(pa.array([b"a", b"b"]))

    with Consumer("events", "archive", data_path="/var/lib/nsq") as c:
        batch = c.fetch(10_000, timeout=1.0)
        table = batch.to_arrow()      # or batch.buffer / offsets / lengths
        batch.finish()                # or batch.requeue(delay=5)

BulkConsumer takes messages in large lots that are finished or requeued
as a whole (the Spark source's path); Broker finds the running broker.
"""

from nsqshm.local.batch import Batch, Message
from nsqshm.local.broker import Broker, LocalError, NoBroker
from nsqshm.local.bulk import BulkConsumer
from nsqshm.local.consumer import Consumer
from nsqshm.local.producer import Producer, PublishTimeout

__all__ = ["Batch", "Broker", "BulkConsumer", "Consumer", "LocalError", "Message", "NoBroker",
           "Producer", "PublishTimeout"]
