"""A batch of messages a Consumer fetched: zero-copy views over the one
buffer of NSQ message frames the delivery wrote, finished or requeued at
once or message by message.

    batch.buffer             memoryview of the frames
    batch.offsets, .lengths  int64 numpy arrays: body i is buffer[offsets[i]:][:lengths[i]]
    batch.ids                numpy 'S16' array
    batch.timestamps         int64 ns;  batch.attempts: uint16 (this delivery counted)
    batch.to_arrow()         pyarrow.RecordBatch (body, id, timestamp, attempts, topic, channel)
"""

import numpy as np

from nsqshm._core.localbatch import Columns, index_frames

HEADER = 26  # timestamp 8, attempts 2, ID 16


class Batch:
    def __init__(self, consumer, frames, count):
        self.consumer = consumer
        self.topic = consumer.topic
        self.channel = consumer.channel
        self._frames = frames
        starts = np.empty(count, dtype=np.int64)
        sizes = np.empty(count, dtype=np.int64)
        n = index_frames(frames, 0, len(frames), starts, sizes) if count else 0
        self._starts = starts[:n]
        self._sizes = sizes[:n]
        self._pid = consumer._pid
        self.done = False

    def __len__(self):
        return len(self._starts)

    def __bool__(self):
        return len(self._starts) > 0

    def __repr__(self):
        return f"<Batch {self.topic}:{self.channel} {len(self)} messages>"

    # -- views ----------------------------------------------------------------------

    @property
    def buffer(self):
        return memoryview(self._frames).toreadonly()

    @property
    def offsets(self):
        return self._starts + HEADER

    @property
    def lengths(self):
        return self._sizes - HEADER

    def _field(self, at, width):
        raw = np.frombuffer(self._frames, dtype=np.uint8)
        idx = self._starts[:, None] + (at + np.arange(width))
        return np.ascontiguousarray(raw[idx])

    @property
    def ids(self):
        return self._field(10, 16).view("S16").ravel()

    @property
    def timestamps(self):
        return self._field(0, 8).view(">i8").ravel().astype(np.int64)

    @property
    def attempts(self):
        return self._field(8, 2).view(">u2").ravel().astype(np.uint16)

    def body(self, i):
        start = int(self._starts[i])
        return self.buffer[start + HEADER:start + int(self._sizes[i])]

    def bodies(self):
        """A memoryview per body (a Python object each: for convenience)."""
        return [self.body(i) for i in range(len(self))]

    def __getitem__(self, i):
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return Message(self, i % len(self) if len(self) else i)

    def __iter__(self):
        return (Message(self, i) for i in range(len(self)))

    def to_arrow(self):
        """A pyarrow.RecordBatch of the messages (bodies copied once, in C)."""
        from nsqshm.local.arrow import record_batch

        cols = Columns()
        cols.add_frames(self._frames)
        return record_batch(cols.export(), self.topic, self.channel)

    # -- FIN / REQ / TOUCH of the whole batch ------------------------------------------

    def finish(self):
        """FIN every message (one C loop); returns how many were still in
        flight (the others timed out, or were finished or requeued singly)."""
        self.done = True
        return self.consumer._finish_batch(self)

    def requeue(self, delay=0.0):
        """REQ every message still in flight, after `delay` seconds; returns how many."""
        self.done = True
        return self.consumer._requeue_ids(self.ids, delay)

    def touch(self):
        """TOUCH every message: returns how many were still in flight."""
        return self.consumer._touch_ids(self.ids)


class Message:
    """One message of a batch (a view; body is a memoryview into the batch)."""

    __slots__ = ("batch", "index")

    def __init__(self, batch, index):
        self.batch = batch
        self.index = index

    @property
    def body(self):
        return self.batch.body(self.index)

    @property
    def id(self):
        start = int(self.batch._starts[self.index])
        return bytes(self.batch._frames[start + 10:start + HEADER])

    @property
    def timestamp(self):
        start = int(self.batch._starts[self.index])
        return int.from_bytes(self.batch._frames[start:start + 8], "big")

    @property
    def attempts(self):
        start = int(self.batch._starts[self.index])
        return int.from_bytes(self.batch._frames[start + 8:start + 10], "big")

    def finish(self):
        self.batch.consumer.finish(self.id)

    def requeue(self, delay=0.0):
        self.batch.consumer.requeue(self.id, delay)

    def touch(self):
        self.batch.consumer.touch(self.id)

    def __repr__(self):
        return f"<Message {self.id.decode()} attempts={self.attempts}>"
