"""Storage behind a queue's ring: the disk queue, or a dummy for ephemeral
topics and channels (which never touch disk: what overflows is dropped, as
nsqd's dummy backend does)."""

import os

from nsqshm._core.diskqueue import DiskQueue, DiskQueueError

MIN_VALID_MSG_LENGTH = 26  # ID 16 + timestamp 8 + attempts 2


class DummyBackend:
    depth = 0
    needs_sync = False

    def put_packed(self, packed, max_records=-1):
        return 0, len(packed)

    def peek_into(self, buffer, max_records=-1):
        return 0, 0

    def advance(self, records):
        return 0

    def sync(self):
        pass

    def empty(self):
        pass

    def delete(self):
        pass

    def close(self):
        pass


class RingOnly(DummyBackend):
    """The disk queue as seen by a worker that does not own the topic: it has
    none; what does not fit the ring stays with the caller (never dropped)."""

    def put_packed(self, packed, max_records=-1):
        raise AssertionError("a worker that does not own the topic has no disk queue")


def memory_first(ring, backend, packed, mem_limit):
    """Push packed records into `ring` while the disk queue is empty (so
    order stays FIFO), up to `mem_limit` messages in the ring; return
    (records pushed, the rest: for the disk queue)."""
    view = memoryview(packed)
    if backend.depth == 0:
        room = mem_limit - ring.depth
        if room > 0:
            pushed, used = ring.push_packed(view, room)
            return pushed, view[used:]
    return 0, view


def write_to_disk(backend, view):
    """Append packed records to a disk queue: (records written, None), or,
    when a write failed (a full disk), (records that went in before it,
    the error).  The batch's first records are the ones written."""
    try:
        done, _ = backend.put_packed(view)
        return done, None
    except DiskQueueError as err:
        return err.written, err
    except OSError as err:
        # the records went in but the metadata sync after them failed; count
        # them as not written: kept elsewhere too, they are delivered twice
        # rather than lost
        return 0, err


def skip_records(view, n):
    """`view` (packed records) past its first n records."""
    pos = 0
    for _ in range(n):
        pos += 4 + int.from_bytes(view[pos:pos + 4], "little")
    return view[pos:]


def count_records(view):
    n = pos = 0
    while pos < len(view):
        pos += 4 + int.from_bytes(view[pos:pos + 4], "little")
        n += 1
    return n


def new_backend(nsqd, name, ephemeral):
    """nsqd's backend for a topic (`topic`) or channel (`topic:channel`)."""
    if ephemeral:
        return DummyBackend()
    opts = nsqd.opts
    return DiskQueue(name, nsqd.data_path, opts.max_bytes_per_file, MIN_VALID_MSG_LENGTH,
                     opts.max_msg_size + MIN_VALID_MSG_LENGTH, opts.sync_every, logf=nsqd.logf,
                     remove=lambda path: remove_later(nsqd, path))


_remover = None


def lower_priority():
    """Run this OS thread at nice 19: cleanup yields to serving."""
    import threading

    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError:
        pass


def remove_later(nsqd, path):
    """Delete a fully read segment on a low-priority OS thread: dropping 100 MB
    of page cache takes ~20 ms of kernel time, which neither the event loop
    nor, on a busy machine, the reading of the next segment should wait on.

    The hand-off never yields to another greenlet: the disk queue calls this
    in the middle of moving its read position, and gevent's ThreadPool.spawn
    blocks (and switches) while its one thread is busy -- another greenlet
    then read the same queue from a stale position and a segment was
    deleted twice, the next one skipped."""
    global _remover
    import queue
    import threading

    if _remover is None:
        _remover = queue.SimpleQueue()
        threading.Thread(target=_remove_loop, args=(_remover,), name="nsqshm-remover",
                         daemon=True).start()
    _remover.put((nsqd, path))


def _remove_loop(paths):
    lower_priority()
    while True:
        nsqd, path = paths.get()
        try:
            os.unlink(path)
        except OSError as err:
            nsqd.logf("error", f"failed to Remove({path}) - {err}")


def flush_ring(ring, backend, scratch, nsqd):
    """Move a ring's messages to its disk queue (shutdown).  On a failed
    write the batch goes back into the ring, which is then left in /dev/shm
    for the next start: False."""
    while True:
        n, nbytes = ring.pop_many_into(scratch)
        if not n:
            return True
        try:
            done, _ = backend.put_packed(memoryview(scratch)[:nbytes])
        except OSError as err:
            done = getattr(err, "written", 0)
            nsqd.logf("error", f"failed to write to disk at shutdown, messages stay in "
                               f"shared memory ({ring.name}) - {err}")
            rest = memoryview(scratch)[:nbytes]
            for _ in range(done):  # the part written stays on disk
                rest = rest[4 + int.from_bytes(rest[:4], "little"):]
            ring.unretire()  # (kept for the next start: local producers may push again)
            ring.push_packed(rest)
            return False


__all__ = ["DiskQueueError", "DummyBackend", "RingOnly", "count_records", "flush_ring",
           "memory_first", "new_backend", "skip_records", "write_to_disk"]
