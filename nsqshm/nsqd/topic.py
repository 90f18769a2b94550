"""A topic: its shared-memory ingress ring, its channels, and the pump that
copies each message into every channel (nsqd's topic.go messagePump).

PUB, MPUB and HTTP publishes append packed records to the ring in one call
each.  The pump moves a batch at a time: one pop_many_into from the topic
ring, then one push_packed into each channel's ring; no Python object per
message.  Until the first channel exists the pump does not run, so the
topic keeps its messages, as nsqd does.  DPUB messages skip the ring and go
straight to every channel's deferred queue (kept here until a channel
exists).

With several workers only the topic's owner runs the pump and has the disk
queue; another worker's publishes go into the ring, past --mem-queue-size
if need be (the owner moves what is over the limit to disk while no
channel takes it), and what the full ring cannot take to the worker's own
overflow disk queue for the topic (overflow.py).

A full disk never loses an acknowledged message: a PUB that neither memory
(within --mem-queue-size, or the ring's room on a worker without the disk
queue) nor disk takes gets E_PUB_FAILED, and the pump holds a batch that a
channel could not store until it can (_fan_out): it stops taking from the
topic, whose ring fills, so publishers get E_PUB_FAILED instead.
"""

import time

import gevent
import gevent.event

from nsqshm._core.ext import ExtRecords, plain_to_ext
from nsqshm._core.inflight import DeferredQueue
from nsqshm._core.wire import pack_message
from nsqshm.nsqd.backend import (
    RingOnly,
    flush_ring,
    memory_first,
    new_backend,
    skip_records,
    write_to_disk,
)
from nsqshm.nsqd.channel import Channel, LatencyStream
from nsqshm.nsqd.names import is_ephemeral, is_valid_name
from nsqshm.nsqd.overflow import Overflow
from nsqshm.nsqd.policies import bounds, message_ttl, policy
from nsqshm.nsqd.tracing import trace
from nsqshm.nsqd.workers.waiting import RingWaker
from nsqshm.ring import FULL, Ring, RingRetired


class TopicError(Exception):
    pass


class TopicFull(TopicError):
    """A publish refused by a bounded queue's reject policy (bounds.py)."""


class Topic:
    channel_class = Channel
    # the bytes a message takes in the queue beyond its own: a disk queue
    # record's size field (Youzan's writeBytes; logtopic.py: a log record's)
    stored_overhead = 4
    is_log = False
    ext = False  # Youzan's ext topic: each message carries its ext part (ext.py)

    def __init__(self, nsqd, name):
        self.nsqd = nsqd
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.ring = nsqd.make_ring(f"t.{name}")
        self.owned = nsqd.owns(name)
        self.backend = new_backend(nsqd, name, self.ephemeral) if self.owned else RingOnly()
        self.overflow = Overflow(self)  # a worker without the disk queue: when the ring is full
        self.adopted = []  # overflows of worker indexes that no longer run (recovery.py)
        self.mem_limit = nsqd.opts.mem_queue_size
        self.channels = {}
        self.paused = False
        self.exiting = False
        # .policy: a time to live, a bound; .bounded: the queues whose reject
        # bound a publish is checked against (policy.py, bounds.py)
        policy.for_topic(self)
        self.message_count = 0
        self.message_bytes = 0
        # local producers count into the ring's header; the owner reports what
        # they published since it took the topic (nsqd's counts start with it)
        self._local_base = self.ring.local_published
        # DPUB messages before any channel, in the worker's arena as queue "<topic>:"
        self.deferred_waiting = DeferredQueue()
        if nsqd.arena is not None:
            self.deferred_waiting.use_arena(nsqd.arena, f"{name}:")
        self.e2e = None
        if nsqd.opts.e2e_processing_latency_percentile:  # nsqd merges its channels' streams
            self.e2e = LatencyStream(nsqd.opts, lambda: [c.inflight for c in self.channels.values()])
        self._wake = gevent.event.Event()
        self._waker = RingWaker(self.ring, self._wake)
        self._emptied = 0  # empty() calls: a batch the pump holds may be gone
        self._pump = gevent.spawn(self._pump_loop) if self.owned else None

    def __repr__(self):
        return f"<Topic {self.name}>"

    # -- publishing -----------------------------------------------------------------

    def put_packed(self, packed, count, body_bytes, partition=None):
        """Append `count` packed records (from nsqshm._core.wire) to the ring,
        or to disk past what memory may hold; TopicError when they cannot be
        stored (a full disk): nothing is acknowledged that is not stored."""
        if self.exiting:
            raise TopicError("exiting")
        packed = self.ext_records(packed, count)
        if self.bounded:
            try:
                bounds.admit(self, count, len(packed) - bounds.RECORD_SIZE * count)
            except bounds.QueueFull as err:
                raise TopicFull(str(err)) from None
        if self.owned:
            self.store(packed)
        else:
            view = memoryview(packed)
            if not self.overflow.depth:  # else behind what waits there, in order
                try:
                    _, used = self.ring.push_packed(view)
                except RingRetired:  # (the owner's last flush: the broker stops)
                    raise TopicError("exiting") from None
                view = view[used:]
            if view and not self.ephemeral:  # (an ephemeral topic drops it, as nsqd)
                try:  # (its drainer tells the owner the ring is full)
                    self.overflow.put(view)
                except OSError as err:
                    raise TopicError(str(err)) from None
        self.message_count += count
        self.message_bytes += body_bytes
        trace.published(self.nsqd, self.name, packed, count)  # acknowledged ones only

    def store(self, packed):
        """The owner: memory up to --mem-queue-size, then the disk queue."""
        _, view = memory_first(self.ring, self.backend, packed, self.mem_limit)
        if view:
            done, err = write_to_disk(self.backend, view)
            if done and trace.traced(self.nsqd, self.name):
                trace.records_event(self.nsqd, "DISK", self.name, "", view, done)
            self.nsqd.backend_written(self.backend)
            self._wake.set()
            self.nsqd.set_health(err)
            if err is not None:
                raise TopicError(str(err))

    def wake(self):
        self._wake.set()

    def wait_for_room(self, timeout):
        """Until the ring has room (the owner's pump popped), or timeout."""
        self._wake.clear()
        self._waker.arm(for_space=True)
        try:
            self._wake.wait(timeout)
        finally:
            self.ring.disarm(for_space=True)

    def ext_records(self, packed, count):
        """An ext topic stores plain messages with an empty ext part."""
        if not self.ext or type(packed) is ExtRecords:
            return packed
        try:
            return plain_to_ext(packed, count, self.nsqd.opts.max_msg_size)
        except ValueError as err:
            raise TopicError(str(err)) from None

    def put_message(self, body, partition=None, expires_at=0):
        """PUB (partition: a log topic's; a classic topic ignores it, as
        nsqd ignores a PUB's extra parameters; expires_at: the message's own
        deadline, message_ttl.py)."""
        self.put_packed(self.pack_one(body, expires_at), 1, len(body), partition)

    def raw_size(self, message_size):
        """Youzan's raw size of a message: what it takes in the queue (traced
        answers, SUB_ADVANCED's detail frames), so offset + raw size is the
        next message's offset."""
        return message_size + self.stored_overhead

    def pack_one(self, body, expires_at=0):
        """One message packed [u32 size][message]: a fresh ID, now's
        timestamp, its own deadline if it has one (message_ttl.py)."""
        out = bytearray()
        pack_message(body, self.nsqd.ids, time.time_ns(), out)
        return message_ttl.add(out, expires_at) if expires_at else out

    def put_deferred(self, body, delay_s, expires_at=0):
        """DPUB: a message due in delay_s seconds, for every channel."""
        if self.exiting:
            raise TopicError("exiting")
        msg = bytes(self.ext_records(self.pack_one(body, expires_at), 1)[4:])
        due = time.monotonic_ns() + int(delay_s * 1e9)
        self.message_count += 1
        self.message_bytes += len(body)
        if not self.channels:
            self.deferred_waiting.push(msg, due)
            return
        for channel in list(self.channels.values()):
            channel.put_deferred(msg, due)

    # -- channels ---------------------------------------------------------------------

    def get_channel(self, name):
        channel = self.channels.get(name)
        if channel is None:
            channel = self.channel_class(self, name)
            self.channels[name] = channel
            self._hand_over_waiting(channel)
            self._wake.set()
            self.nsqd.notify_change(topic=self.name, channel=name)
            self.nsqd.broadcast_change("channel_create", self.name, name)
        return channel

    def _hand_over_waiting(self, channel):
        """The first channel takes the DPUB messages that waited for it."""
        waiting = self.deferred_waiting
        with self.nsqd.scratch.borrow() as scratch:
            while True:
                due = waiting.next_due()
                if due < 0:
                    return
                n, _ = waiting.pop_due(due, scratch)
                pos = 0
                for _ in range(n):
                    size = int.from_bytes(scratch[pos:pos + 4], "little")
                    channel.put_deferred(bytes(scratch[pos + 4:pos + 4 + size]), due)
                    pos += 4 + size
                waiting.release()

    def _drop_waiting(self):
        with self.nsqd.scratch.borrow() as scratch:
            while self.deferred_waiting.drain(scratch)[0]:
                pass
        self.deferred_waiting.release()

    def defer_waiting(self, msg, due):
        """A recovered DPUB message that had no channel yet."""
        if self.channels:
            for channel in list(self.channels.values()):
                channel.put_deferred(msg, due)
        else:
            self.deferred_waiting.push(msg, due)

    def get_existing_channel(self, name):
        channel = self.channels.get(name)
        if channel is None and self.nsqd.cluster is not None and is_valid_name(name) \
                and Ring.exists(f"{self.nsqd.shm_prefix}.c.{self.name}:{name}"):
            channel = self.get_channel(name)  # made on another worker a moment ago
        return channel

    def delete_channel(self, name):
        channel = self.channels.pop(name, None)
        if channel is None:
            raise TopicError("channel does not exist")
        ring = getattr(channel, "ring", None)
        removed = None if ring is None else [ring.identity]
        channel.close(delete=True)
        self.nsqd.notify_change(topic=self.name, channel=name, deleted=True)
        self.nsqd.broadcast_change("channel_delete", self.name, name, rings=removed)
        # (the broadcast waits for the other workers: meanwhile another channel's
        # last client may have left and deleted this topic, or a delete came).  Applying
        # another worker's delete, an ephemeral topic left without channels stays: that
        # worker may still have a channel this one has yet to hear of, so it decides, and
        # its topic delete names the rings (deleting here, unheard, took the name of the
        # ring it went on using: a worker on a ring the others no longer had, found by
        # the bounded fuzz)
        if not self.channels and self.ephemeral and self.nsqd.topics.get(self.name) is self \
                and not self.nsqd.applying_peer_change():
            self.nsqd.delete_topic(self.name)

    # -- the pump ---------------------------------------------------------------------

    def _pump_loop(self):
        ring = self.ring
        backend = self.backend
        while not self.exiting:
            if self.paused or not self.channels:
                if self.policy is not None and bounds.drops(self.policy):
                    bounds.trim_topic(self)  # here: no batch of the pump is in the air
                # others' publishes land in the ring: past the limit, to disk
                stuck = self._spill_excess() == 0 and ring.depth > self.mem_limit
                self._wake.clear()
                self._waker.arm()
                if ring.depth <= self.mem_limit or stuck:
                    self._wake.wait(1.0 if stuck else None)
                ring.disarm()
                continue
            # the ring holds the oldest messages, the disk queue the newer ones
            # peek, store into every channel, then discard: a death in between
            # repeats messages at the next start, never loses them
            with self.nsqd.scratch.borrow() as scratch:
                from_disk = False
                n, nbytes = ring.peek_many_into(scratch)
                if not n and backend.depth:
                    n, nbytes = backend.peek_into(scratch, 1024)
                    from_disk = True
                if n and self._fan_out(memoryview(scratch)[:nbytes], n):
                    if from_disk:
                        backend.advance(n)
                        self.nsqd.backend_written(backend)
                    else:
                        ring.discard(n)
            if not n:
                self._wake.clear()
                self._waker.arm()
                if ring.depth == 0 and not backend.depth:
                    self._wake.wait()
                ring.disarm()
                continue
            if ring.depth or backend.depth:
                gevent.idle()  # more to move: let clients run first

    def _fan_out(self, batch, n):
        """Store a batch of n records in every channel.  A channel that cannot
        take all of it (its disk failing, its ring full) holds the pump here:
        it tries that channel again with the rest until it is stored, and
        meanwhile the topic's ring fills and publishers get E_PUB_FAILED.
        Never dropped, never stored twice into a channel that has it.  False
        when the batch went away while the pump waited (emptied, closed)."""
        emptied = self._emptied
        done = {}
        while True:
            stalled = False
            for channel in list(self.channels.values()):
                k = done.get(channel, 0)
                if k < n:
                    left = channel.put_records(skip_records(batch, k) if k else batch,
                                               keep_rest=False)
                    channel.message_count += n - k - left
                    done[channel] = n - left
                    stalled = stalled or left > 0
            if not stalled:
                return True
            # consumers make room in the channel's ring, or the disk gets space
            self._wake.clear()
            self._wake.wait(0.25)
            if self.exiting or self._emptied != emptied:
                return False

    def _spill_excess(self):
        """Move what the ring holds past --mem-queue-size to the disk queue
        (ephemeral: drop it, as nsqd); returns how many moved."""
        excess = self.ring.depth - self.mem_limit
        if excess <= 0 or not self.owned:
            return 0
        with self.nsqd.scratch.borrow() as scratch:
            n, nbytes = self.ring.peek_many_into(scratch, excess)
            if not n:
                return 0
            done = n
            if not self.ephemeral:
                done, err = write_to_disk(self.backend, memoryview(scratch)[:nbytes])
                self.nsqd.set_health(err)
            self.ring.discard(done)
        if done and not self.ephemeral:
            self.nsqd.backend_written(self.backend)
        return done

    # -- pause, empty, delete --------------------------------------------------------

    def pause(self):
        self.paused = True
        self.nsqd.notify_change()
        self.nsqd.broadcast_change("topic_pause", self.name)

    def unpause(self):
        self.paused = False
        self._wake.set()
        self.nsqd.notify_change()
        self.nsqd.broadcast_change("topic_unpause", self.name)

    @property
    def published(self):
        """(messages, body bytes) published into this topic through this
        worker, and by local producers when this worker owns the topic."""
        if not self.owned:
            return self.message_count, self.message_bytes
        msgs, body = self.ring.local_published
        return (self.message_count + msgs - self._local_base[0],
                self.message_bytes + body - self._local_base[1])

    @property
    def depth(self):
        return self.ring.depth + self.backend.depth + self.overflow.depth

    @property
    def backend_depth(self):
        """The disk queue's depth; on a worker without it, its overflow's."""
        return self.backend.depth + self.overflow.depth

    def empty(self):
        self._emptied += 1
        with self.nsqd.scratch.borrow() as scratch:
            while self.ring.pop_many_into(scratch)[0]:
                pass
        self.backend.empty()
        self.overflow.empty()
        self._drop_waiting()
        self.nsqd.broadcast_change("topic_empty", self.name)

    def close(self, delete=False, keep=()):
        """Stop the pump.  delete: drop everything but the channels named in
        `keep`, which are left whole (NSQD.delete_topic).  Otherwise
        (shutdown) every message in memory goes to the disk queue, which is
        synced and closed, and the rings are removed (ephemeral messages are
        dropped, as nsqd)."""
        self.exiting = True
        if self._pump is not None:
            self._pump.kill(block=False)
        for channel in list(self.channels.values()):
            if channel.name in keep:
                channel.leave()
            else:
                channel.close(delete=delete)
        if delete:
            self.channels.clear()
            self._drop_waiting()
            if self.nsqd.arena is not None:  # its entry in the arena's queue table: free
                self.nsqd.arena.forget_queue(f"{self.name}:")
            self.backend.delete()
            for overflow in [self.overflow, *self.adopted]:
                overflow.delete()
            self.ring.unlink()
        else:
            for overflow in [self.overflow, *self.adopted]:
                overflow.close()  # drained at the next start
            # a local producer's push after the flush would land in a ring nobody reads
            # again: refused from now on (it pushes into the next broker's ring)
            self.ring.retire()
            with self.nsqd.scratch.borrow() as scratch:
                if flush_ring(self.ring, self.backend, scratch, self.nsqd):
                    while True:  # waiting DPUB messages: on disk, due now (as before a restart)
                        n, nbytes = self.deferred_waiting.drain(scratch)
                        if not n:
                            break
                        self.backend.put_packed(memoryview(scratch)[:nbytes])
                        self.deferred_waiting.release()
                    self.backend.close()
                    self.ring.unlink()
        self._release()

    def _release(self):
        """Drop what ties this topic to the loop and to memory (its greenlets
        are killed, its ring closed): a deleted topic is freed whole."""
        self._waker.close()
        self.ring.close()

    def stop_overflow(self):
        """Graceful stop, phase 1: no more pushes into the ring from disk."""
        for overflow in [self.overflow, *self.adopted]:
            overflow.stop()

    def close_handles(self, sync=False):
        """Stop using the topic, leaving its rings for the other workers (and
        the disk queues, synced, for the next owner)."""
        self.exiting = True
        if self._pump is not None:
            self._pump.kill(block=False)
        for channel in list(self.channels.values()):
            channel.close_handles(sync)
        if sync:
            self.backend.close()
        for overflow in [self.overflow, *self.adopted]:
            overflow.close()
        self._release()


__all__ = ["FULL", "Topic", "TopicError", "TopicFull"]
