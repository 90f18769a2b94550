"""Bounded queues (issue 18; nsqd has none): a maximum depth per topic and
per channel, in messages (`max_depth`) and/or in bytes (`max_bytes`: the
messages' sizes in nsqd's encoding, 26 bytes of timestamp, attempts and ID
plus the body), and what happens when a publish would pass either
(`overflow`, one per queue for both bounds):

    reject        backpressure: the publish fails (PUB E_PUB_FAILED, MPUB
                  E_MPUB_FAILED, HTTP 503 {"message": "QUEUE_FULL"}) and
                  nothing accepted is ever dropped; counted in
                  `rejected_count` of the full queue
    drop-oldest   the publish is taken and the queue's oldest messages make
                  room; counted in `dropped_count`

A publish is checked once per PUB / MPUB / HTTP publish (admit(), from
Topic.put_packed), only when the topic or one of its channels has a reject
bound (topic.bounded lists them).  A channel's depth there counts what its topic still holds
for it (not yet pumped).  Depths are the shared rings plus the disk queue as
the answering worker sees it: the owner's, or none on another worker, so a
bound above --mem-queue-size is exact only on the topic's owner (messages
past it are on the owner's disk).  Bytes on disk are the segment files'
from the read position to the write position less each record's 4-byte
size (disk_bytes: one fstat per segment between them, only for a queue
with a byte bound).

Dropping happens where it cannot race a reader that peeks and then
discards:

    channel   Channel.put_records (trim_channel): before a batch is stored
              its oldest messages leave the ring (a pop, safe from any
              worker), then, on the owner, the disk queue's head, then
              the batch's own head (a pump's batch of several publishes can
              be bigger than the room)
    topic     the owner's pump while the topic holds messages (no channel,
              paused: trim_topic, before it spills to disk); with its pump
              running, messages move on to the channels and their bounds
              apply

A message bigger than a byte bound is taken by drop-oldest (the queue is
emptied for it) and refused by reject, as a publish past max_depth is.
"""

import os

from nsqshm.nsqd.backend import skip_records
from nsqshm.nsqd.tracing import trace

OVERFLOWS = ("reject", "drop-oldest")


RECORD_SIZE = 4  # the u32 size before each message in a packed buffer and on disk


class QueueFull(Exception):
    """A publish refused by a reject bound; the text says which queue."""


def bound_of(queue):
    policy = queue.policy
    return policy.max_depth if policy is not None else 0


def is_bounded(policy):
    return policy is not None and (policy.max_depth or policy.max_bytes)


def _rejects(queue):
    policy = queue.policy
    return is_bounded(policy) and policy.overflow == "reject"


def drops(policy):
    """Whether a queue with this policy makes room by dropping its oldest."""
    return is_bounded(policy) and policy.overflow == "drop-oldest"


def update_topic(topic):
    """topic.bounded: the channels with a reject bound, the topic first (as
    None) if it has one; empty: publishes into it are not checked."""
    topic.bounded = ([None] if _rejects(topic) else []) + \
        [c for c in topic.channels.values() if _rejects(c)]


def disk_bytes(queue):
    """Message bytes in a disk queue (the owner's, or a worker's overflow):
    the segments' bytes from the read to the write position, less the size
    field of each record."""
    if queue is None or not getattr(queue, "depth", 0):
        return 0
    first, last = queue.read_file_num, queue.write_file_num
    if first == last:
        raw = queue.write_pos - queue.read_pos
    else:
        raw = queue.write_pos - queue.read_pos + sum(_file_size(queue, num)
                                                     for num in range(first, last))
    return max(0, raw - RECORD_SIZE * queue.depth)


def _file_size(queue, num):
    try:
        return os.stat(queue.file_name(num)).st_size
    except OSError:  # removed since (read to its end meanwhile): nothing of it counts
        return 0


def topic_bytes(topic):
    overflow = topic.overflow.queue if getattr(topic, "overflow", None) is not None else None
    return topic.ring.depth_bytes + disk_bytes(topic.backend) + disk_bytes(overflow)


def channel_bytes(channel):
    return channel.ring.depth_bytes + disk_bytes(channel.backend)


def admit(topic, count, nbytes=0):
    """Before `count` messages of `nbytes` (their sizes, see above) are
    published into topic: QueueFull if a reject bound would be passed (of
    the topic, or of one of its channels)."""
    held = topic.depth
    held_bytes = None  # read only for a byte bound
    for channel in topic.bounded:
        queue = topic if channel is None else channel
        policy = queue.policy
        if not is_bounded(policy) or policy.overflow != "reject" \
                or channel is not None and channel.exiting:
            continue  # changed or deleted since update_topic
        if policy.max_depth:
            depth = held if channel is None else channel.depth + held
            if depth + count > policy.max_depth:
                _reject(topic, channel, policy, count, f"max_depth {policy.max_depth}")
        if policy.max_bytes:
            if held_bytes is None:
                held_bytes = topic_bytes(topic)
            size = held_bytes if channel is None else channel_bytes(channel) + held_bytes
            if size + nbytes > policy.max_bytes:
                _reject(topic, channel, policy, count, f"max_bytes {policy.max_bytes}")


def _reject(topic, channel, policy, count, bound):
    policy.rejected_count += count
    what = f"topic {topic.name}" if channel is None else f"channel {topic.name}:{channel.name}"
    raise QueueFull(f"{what} is full ({bound})")


def trim_channel(channel, packed, count):
    """drop-oldest: make room for the `count` packed records about to be
    stored.  When the queue's own messages are not enough (a batch bigger
    than the room, as a pump's batch of several publishes can be), the
    batch's own oldest records go too: returns how many of them (the caller
    skips them; they are traced and counted here)."""
    on_disk = channel.backend.depth
    incoming_bytes = len(packed) - RECORD_SIZE * count
    skip = _trim(channel, channel.policy, channel.owned, count, incoming_bytes, channel_bytes,
                 packed)
    if on_disk and channel.owned and not channel.backend.depth:
        channel.ring.disk_backlog = False  # all dropped: nothing left to read there
    return skip


def trim_topic(topic):
    """drop-oldest on the owner, while the pump holds the topic's messages."""
    _trim(topic, topic.policy, True, 0, 0, topic_bytes)


def _trim(queue, policy, owned, incoming, incoming_bytes, size_of, packed=b""):
    dropped = skip = 0
    if policy.max_depth:
        excess = queue.ring.depth + queue.backend.depth + incoming - policy.max_depth
        if excess > 0:
            dropped = _discard(queue, excess)
            if dropped < excess and owned and queue.backend.depth:
                dropped += _advance(queue, min(excess - dropped, queue.backend.depth))
            # the batch's own head, for what is still over (read again: a consumer on
            # another worker may have popped meanwhile); 0 < max_depth: some stay
            excess = queue.ring.depth + queue.backend.depth + incoming - policy.max_depth
            skip = max(0, min(excess, incoming - 1))
    if policy.max_bytes:
        excess = size_of(queue) + incoming_bytes - policy.max_bytes
        if excess > 0:
            dropped += _drop_bytes(queue, owned, excess)
            excess = size_of(queue) + incoming_bytes - policy.max_bytes
        if excess > 0 and incoming > 1:  # the batch's own head, keeping its newest
            n, _ = _records_covering(packed, len(packed), excess)
            skip = max(skip, min(n, incoming - 1))
    if skip:
        head = memoryview(packed)[:len(packed) - len(skip_records(packed, skip))]
        trace.queue_dropped(queue, head, skip, trace.DROP_BOUND)
    policy.dropped_count += dropped + skip
    return skip


def _drop_bytes(queue, owned, excess):
    """Drop the oldest messages (ring, then the owner's disk queue) until
    at least `excess` bytes of them are gone: how many."""
    dropped = 0
    sources = [(queue.ring.peek_many_into, lambda n: _discard(queue, n))]
    if owned:
        sources.append((queue.backend.peek_into, lambda n: _advance(queue, n)))
    for peek, drop in sources:
        while excess > 0:
            with queue.nsqd.scratch.borrow() as scratch:
                count, nbytes = peek(scratch, -1)
                n, freed = _records_covering(scratch, nbytes, excess)
            if not count:
                break
            done = drop(n)
            dropped += done
            excess -= freed
            if not done:
                break
    return dropped


def _records_covering(buf, nbytes, excess):
    """How many of the packed records ([u32 native size][message]) at the
    head of buf hold `excess` message bytes: (records, their bytes)."""
    pos = n = freed = 0
    view = memoryview(buf)
    while pos < nbytes and freed < excess:
        size = int.from_bytes(view[pos:pos + RECORD_SIZE], "little")
        freed += size
        pos += RECORD_SIZE + size
        n += 1
    return n, freed


def _discard(queue, n):
    """Drop the ring's first n messages: how many were there.  A traced queue
    pops them, so that the DROPPED events name what went (another process
    may pop between a peek and a discard)."""
    if not trace.queue_traced(queue):
        return queue.ring.discard(n)
    dropped = 0
    while dropped < n:
        with queue.nsqd.scratch.borrow() as scratch:
            count, nbytes = queue.ring.pop_many_into(scratch, n - dropped)
            if not count:
                break
            trace.queue_dropped(queue, memoryview(scratch)[:nbytes], count, trace.DROP_BOUND)
        dropped += count
    return dropped


def _advance(queue, n):
    """Drop the disk queue's first n messages (the owner's)."""
    before = queue.backend.depth
    left = n if trace.queue_traced(queue) else 0
    while left > 0:  # traced: what goes, read first (only the owner reads its disk queue)
        with queue.nsqd.scratch.borrow() as scratch:
            count, nbytes = queue.backend.peek_into(scratch, left)
            if not count:
                break
            trace.queue_dropped(queue, memoryview(scratch)[:nbytes], count, trace.DROP_BOUND)
        queue.backend.advance(count)
        left -= count
    queue.backend.advance(n - (before - queue.backend.depth))
    queue.nsqd.backend_written(queue.backend)
    return before - queue.backend.depth
