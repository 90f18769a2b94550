"""Producer: publish into a topic's ring, as a PUB or MPUB does in the
broker (the topic's pump then copies each message into every channel).
Into a topic made with ext=true each record gets Youzan's empty ext part
(a plain publish's stored form, as a PUB to it is stored), in C.

A log topic (docs/logtopics.md) takes each call's messages into one
partition's inbound ring, as a PUB that lands on a worker that does not own
the partition does: the partition's owner appends them to its log, in the
order pushed.  The partition is the call's `partition=`, else the next in
turn (one call's messages stay together and in order); an ordered topic
takes named partitions only, as its PUBs.  A push is acknowledged once in
shared memory, as into a classic topic's ring: it survives any broker
process's death, and the owner appends it when it runs again.  A graceful
stop retires the rings before it drains them a last time (Ring.retire): a
push then is refused whole, and the producer pushes it into the next
broker's ring once one runs (within `timeout`), so a restart loses nothing
(classic topics alike).  A broker in cluster mode refuses a log topic
(Broker.topic_rings): a replicated log topic's OK means every in-sync
replica has the message.

Bodies are packed into ring records in C (fresh IDs from the broker's
shared ID generator, attempts 0, one timestamp per call): a list of
bytes, one buffer with numpy offsets and lengths, or a pyarrow binary or
string array, without a Python object per message.  When the ring is full
the producer waits for the pump to make room, up to `timeout`.
"""

import os
import time

import numpy as np

from nsqshm._core.ext import plain_to_ext
from nsqshm._core.localbatch import pack_bodies
from nsqshm.local.broker import Broker, LocalError, NoBroker, check_name
from nsqshm.ring import RingError, RingRetired

CHUNK = 16384  # messages packed and pushed per ring call
RECORD_BYTES = 4 + 26  # a packed record's size field and message header, around the body
REATTACH_WAIT = 0.05  # s between looks for the next broker once this one stops


class PublishTimeout(LocalError):
    def __init__(self, text, published):
        super().__init__(text)
        self.published = published


class Producer:
    def __init__(self, topic=None, data_path=None, shm_prefix=None, *, timeout=30.0,
                 create=True, broker=None):
        self.broker = broker or Broker(data_path, shm_prefix)
        self.topic = check_name("topic", topic) if topic is not None else None
        self.timeout = timeout
        self.create = create
        self.max_msg_size = self.broker.max_msg_size
        self.published = 0
        self.closed = False
        self._pid = None
        if self.topic is not None:
            self._ring(self.topic)

    def _ring(self, topic):
        if self.closed:
            raise LocalError("producer is closed")
        if self._pid != os.getpid():  # new, or a forked child: handles of its own
            self._pid = os.getpid()
            self._rings = {}  # topic -> [its ring], or a log topic's partitions' rings
            self._ext = {}   # topic -> made with ext=true (plain records get [0] after the header)
            self._ordered = {}  # topic -> an ordered log topic (a partition must be named)
            self._log = {}  # topic -> a log topic (its rings: its partitions')
            self._turn = {}  # log topic -> the partition the next call without one takes
            self._ids = self.broker.ids()
            self._buf = bytearray()
        rings = self._rings.get(topic)
        if rings is None:
            check_name("topic", topic)
            rings, self._ext[topic], self._ordered[topic], self._log[topic] = \
                self.broker.topic_rings(topic, create=self.create)
            self._rings[topic] = rings
        return rings

    def _target(self, topic, partition):
        """Which of the topic's rings a call publishes into: a classic topic's (0),
        or the log topic's partition `partition` (None: the next in turn)."""
        rings = self._ring(topic)
        if not self._log[topic]:
            if partition is not None:
                raise ValueError(f"topic {topic!r} is a classic topic: it has no partitions")
            return 0
        if partition is None:
            if self._ordered[topic]:
                raise LocalError(f"topic {topic!r} is ordered: a publish to it names its "
                                 "partition (partition=)")
            partition = self._turn.get(topic, 0) % len(rings)
            self._turn[topic] = partition + 1
        elif isinstance(partition, bool) or not isinstance(partition, int) \
                or not 0 <= partition < len(rings):
            raise ValueError(f"invalid partition {partition!r}: topic {topic!r} has "
                             f"{len(rings)} partitions")
        return partition

    def _reattach(self, topic, deadline, published):
        """A ring of the topic was retired: its broker stops (a graceful stop drains
        the rings a last time).  Wait for the next broker on the same shared memory
        prefix and attach its rings; PublishTimeout past the deadline."""
        for ring in self._rings.pop(topic, ()):
            ring.close()
        while True:
            time.sleep(REATTACH_WAIT)
            try:
                self.broker = Broker(shm_prefix=self.broker.prefix)
                return self._ring(topic)
            except (NoBroker, LocalError, RingError):
                if deadline is not None and time.monotonic() >= deadline:
                    raise PublishTimeout(
                        f"the broker of topic {topic!r} stopped and none came back within "
                        f"{self.timeout} s ({published} of the messages published)",
                        published) from None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<Producer {self.topic or '*'} published={self.published}>"

    # -- publishing ------------------------------------------------------------------

    def publish(self, body, topic=None, partition=None):
        """Publish one message (bytes-like, or str as UTF-8).  partition: a log
        topic's (None: the next in turn); a classic topic has none."""
        body = memoryview(body.encode() if isinstance(body, str) else body).cast("B")
        return self.publish_buffer(body, np.zeros(1, dtype=np.int64),
                                   np.array([len(body)], dtype=np.int64), topic=topic,
                                   partition=partition)

    def publish_many(self, bodies, topic=None, partition=None):
        """Publish a sequence of bytes-like bodies; returns the count."""
        bodies = [memoryview(b.encode() if isinstance(b, str) else b).cast("B") for b in bodies]
        lengths = np.fromiter((len(b) for b in bodies), dtype=np.int64, count=len(bodies))
        offsets = np.zeros(len(bodies), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        return self.publish_buffer(b"".join(bodies), offsets, lengths, topic=topic,
                                   partition=partition)

    def publish_buffer(self, data, offsets, lengths=None, topic=None, partition=None):
        """Publish bodies that lie in one buffer: body i is
        data[offsets[i]:offsets[i] + lengths[i]]; without lengths, `offsets`
        has one more entry and body i ends where i + 1 begins (Arrow's layout).
        Offsets are int32 or int64 arrays.  Returns the count."""
        offsets = np.ascontiguousarray(offsets)
        if offsets.dtype not in (np.int32, np.int64):
            offsets = offsets.astype(np.int64)
        if lengths is not None:
            lengths = np.ascontiguousarray(lengths, dtype=offsets.dtype)
            count = len(lengths)
            if len(offsets) < count:
                raise ValueError("fewer offsets than lengths")
        else:
            count = max(0, len(offsets) - 1)
        return self._publish(data, offsets, lengths, 0, count, offsets.dtype.itemsize, topic,
                             partition)

    def publish_arrow(self, array, topic=None, partition=None):
        """Publish the values of a pyarrow binary or string array (or chunked
        array, large types too) as message bodies; returns the count."""
        from nsqshm.local.arrow import body_spans

        data, offsets, width, start, count = body_spans(array)
        return self._publish(data, offsets, None, start, count, width, topic, partition)

    def _publish(self, data, offsets, lengths, start, count, width, topic, partition):
        topic = topic or self.topic
        if topic is None:
            raise ValueError("no topic: give one to Producer() or to this call")
        index = self._target(topic, partition)
        buf = self._buf
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        done = 0
        while done < count:
            n = min(CHUNK, count - done)
            try:
                del buf[:]
            except BufferError:  # a view of it outlived a failed push (a traceback)
                buf = self._buf = bytearray()
            pack_bodies(data, offsets, lengths, start + done, n, width, self._ids,
                        time.time_ns(), self.max_msg_size, buf)
            if self._ext[topic]:  # (a new buffer, each record one byte longer)
                try:
                    records = plain_to_ext(buf, n, self.max_msg_size)
                except ValueError as err:
                    raise ValueError(f"{err} (topic {topic!r} stores an ext part)") from None
                self._push(topic, index, records, n, deadline, done, RECORD_BYTES + 1)
            else:
                self._push(topic, index, buf, n, deadline, done)
            done += n
            self.published += n
        return count

    def _push(self, topic, index, buf, n, deadline, before, overhead=RECORD_BYTES):
        """Push n packed records into the topic's ring `index`, waiting for room, and
        for the next broker when this one stops (RingRetired: nothing of that push
        went in, so nothing is published twice)."""
        view = memoryview(buf)
        pushed = 0
        ring = self._rings[topic][index]
        while True:
            try:
                k, used = ring.push_packed(view)
                if not k:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        self.published += pushed
                        raise PublishTimeout(f"ring {ring.name!r} stayed full for "
                                             f"{self.timeout} s ({before + pushed} of the "
                                             "messages published)", before + pushed)
                    k, used = ring.push_packed_wait(view, timeout=remaining)
            except RingRetired:
                try:
                    ring = self._reattach(topic, deadline, before + pushed)[index]
                except PublishTimeout:
                    self.published += pushed
                    raise
                continue
            if k:
                # for the topic's message_count and message_bytes in /stats: each
                # record is [u32 size][26-byte message header]([0])[body]
                ring.count_local(k, used - k * overhead)
            pushed += k
            view = view[used:]
            if pushed == n:
                return

    def close(self):
        if self.closed:
            return
        self.closed = True
        if self._pid == os.getpid():
            for rings in self._rings.values():
                for ring in rings:
                    ring.close()
            self._ids.close()
        self._rings = {}
