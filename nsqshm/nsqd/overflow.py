"""A worker's overflow disk queue for a topic it does not own.

Only a topic's owner has the topic's disk queue.  Another worker publishes
into the topic's ring; when the ring is full (the owner is behind, stopped,
or no channel takes the messages yet) what does not fit goes to this
worker's own disk queue for the topic, instead of failing the PUB (nsqd
never fails a PUB for a full memory queue while the disk has room):

    <data-path>/<topic>@w<index>.diskqueue.000000.dat   (go-diskqueue files)
    <data-path>/<topic>@w<index>.diskqueue.meta.dat

"@" is in no name nsqd accepts ([.a-zA-Z0-9_-], and ":" between topic and
channel), so these files never collide with a topic's or channel's queue.

Order: once the overflow holds messages, every later publish of this
worker for the topic goes behind them, and a drainer greenlet moves them
into the ring, oldest first, as the ring makes room; the ring is FIFO, so
the publishes of each connection (one connection, one worker) keep their
order.  When the overflow is empty its files are removed and publishes go
to the ring again.

A worker that dies leaves its overflow on disk: its replacement (the same
index; worker 0 for indexes that no longer run) drains it at start
(recover_all).  A graceful stop leaves it for the next start the same way.
"""

import os

import gevent

from nsqshm.nsqd.backend import DiskQueueError, new_backend, write_to_disk
from nsqshm.nsqd.names import is_valid_name

SUFFIX = ".diskqueue.meta.dat"


def queue_name(topic, index):
    return f"{topic}@w{index}"


class Overflow:
    def __init__(self, topic, index=None):
        self.topic = topic
        self.nsqd = topic.nsqd
        self.index = self.nsqd.index if index is None else index
        self.queue = None
        self._drainer = None
        self._told = False

    @property
    def depth(self):
        return self.queue.depth if self.queue is not None else 0

    def open(self):
        if self.queue is None:
            self.queue = new_backend(self.nsqd, queue_name(self.topic.name, self.index), False)
        return self.queue

    def put(self, view):
        """Append packed records (the ring had no room); raises DiskQueueError
        when the disk fails, the records before the failure kept."""
        queue = self.open()
        _, err = write_to_disk(queue, view)
        self.nsqd.backend_written(queue)
        if err is not None:
            self.nsqd.set_health(err)
            self.start()  # what went in is drained in any case
            raise err if isinstance(err, DiskQueueError) else DiskQueueError(
                err.errno or 5, str(err))
        self.nsqd.set_health()
        self.start()

    def start(self):
        if self._drainer is None and self.depth and not self.topic.exiting:
            self._drainer = gevent.spawn(self._drain)

    def _drain(self):
        """Into the ring as it makes room, oldest first; then remove the files."""
        topic = self.topic
        ring = topic.ring
        queue = self.queue
        try:
            while queue.depth and not topic.exiting:
                with self.nsqd.scratch.borrow() as scratch:
                    n, nbytes = queue.peek_into(scratch, 1024)
                    done = 0
                    if n:
                        done, _ = ring.push_packed(memoryview(scratch)[:nbytes])
                        if done:
                            queue.advance(done)
                            self.nsqd.backend_written(queue)
                if done:
                    self._told = False
                    gevent.idle()
                    continue
                if not self._told:  # once per wait: the owner's pump should make room
                    self.nsqd.tell_owner(topic.name)
                    self._told = True
                topic.wait_for_room(5.0)  # woken by the pop; the timeout: a safety net
            if not queue.depth and not topic.exiting and self.queue is queue:
                self.queue = None
                queue.delete()
        finally:
            self._drainer = None

    def stop(self):
        """Stop draining (graceful stop, phase 1: the owner flushes the ring next)."""
        if self._drainer is not None:
            self._drainer.kill(block=False)
            self._drainer = None

    def close(self):
        self.stop()
        if self.queue is not None:
            self.queue.close()
            self.queue = None

    def delete(self):
        self.stop()
        if self.queue is not None:
            self.queue.delete()
            self.queue = None

    def empty(self):
        if self.queue is not None:
            self.queue.empty()


def found_on_disk(nsqd):
    """(topic, index) of the overflow queues in the data path this worker
    drains: its own index's, and worker 0 those of indexes that no longer run."""
    try:
        entries = os.listdir(nsqd.data_path)
    except OSError:
        return []
    found = []
    for entry in sorted(entries):
        if not entry.endswith(SUFFIX):
            continue
        topic, sep, index = entry[:-len(SUFFIX)].rpartition("@w")
        if not sep or not index.isdigit() or not is_valid_name(topic):
            continue
        index = int(index)
        if index == nsqd.index or (index >= nsqd.nworkers and nsqd.index == 0):
            found.append((topic, index))
    return found
