"""A batch of messages a Consumer fetched: zero-copy views over the one
buffer of NSQ message frames the delivery wrote, finished or requeued at
once or message by message.

    batch.buffer             memoryview of the frames
    batch.offsets, .lengths  int64 numpy arrays: body i is buffer[offsets[i]:][:lengths[i]]
    batch.ids                numpy 'S16' array
    batch.timestamps         int64 ns;  batch.attempts: uint16 (this delivery counted)
    batch.to_arrow()         pyarrow.RecordBatch (body, id, timestamp, attempts, topic, channel)

A Consumer(headers=True) of an ext topic gets frames with Youzan's ext part
after the header ([1 version][2 BE n][JSON], or [0] alone): the bodies start
after it (found for the whole batch with numpy), message.headers parses its
JSON, and to_arrow() adds a headers column (Kafka's type).
"""

import json

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
        self._headers = getattr(consumer, "headers", False)
        # bytes after the 26-byte header before the body: the ext part, or none
        self._pre = _ext_lengths(frames, self._starts, self._sizes) if self._headers else \
            np.zeros(n, dtype=np.int64)
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
        return self._starts + HEADER + self._pre

    @property
    def lengths(self):
        return self._sizes - HEADER - self._pre

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
        return self.buffer[start + HEADER + int(self._pre[i]):start + int(self._sizes[i])]

    def headers(self, i):
        """Message i's headers (a dict; {} when it has none, or the topic is
        not ext, or the consumer did not ask for them)."""
        pre = int(self._pre[i])
        if pre <= 3:
            return {}
        start = int(self._starts[i]) + HEADER + 3
        return json.loads(bytes(self._frames[start:start + pre - 3]))

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
        from nsqshm.local.arrow import with_headers

        cols = Columns(ext=self._headers, headers=self._headers)
        cols.add_frames(self._frames)
        return with_headers(cols.export(), self.topic, self.channel, self._headers)

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


def _ext_lengths(frames, starts, sizes):
    """The length of each frame's ext part ([0]: 1; [v][2 BE n][JSON]: 3 + n),
    for the whole batch at once."""
    if not len(starts):
        return np.zeros(0, dtype=np.int64)
    raw = np.frombuffer(frames, dtype=np.uint8)
    last = len(raw) - 1
    ver = raw[np.minimum(starts + HEADER, last)]
    n = (raw[np.minimum(starts + HEADER + 1, last)].astype(np.int64) << 8) | \
        raw[np.minimum(starts + HEADER + 2, last)]
    pre = np.where(ver == 0, 1, 3 + n)
    if (sizes < HEADER + pre).any():
        raise ValueError("a frame shorter than its ext part")
    return pre


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
    def headers(self):
        return self.batch.headers(self.index)

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
