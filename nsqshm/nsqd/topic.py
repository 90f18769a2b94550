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
channel takes it), waiting a little for room when the ring is full.
"""

import time

import gevent
import gevent.event

from nsqshm._core.inflight import DeferredQueue
from nsqshm._core.wire import pack_message
from nsqshm.nsqd.backend import DiskQueueError, RingOnly, memory_first, new_backend
from nsqshm.nsqd.channel import Channel, LatencyStream
from nsqshm.nsqd.names import is_ephemeral, is_valid_name
from nsqshm.nsqd.waiting import RingWaker
from nsqshm.ring import FULL, Ring


class TopicError(Exception):
    pass


class Topic:
    def __init__(self, nsqd, name):
        self.nsqd = nsqd
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.ring = nsqd.make_ring(f"t.{name}")
        self.owned = nsqd.owns(name)
        self.backend = new_backend(nsqd, name, self.ephemeral) if self.owned else RingOnly()
        self.mem_limit = nsqd.opts.mem_queue_size
        self.channels = {}
        self.paused = False
        self.exiting = False
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
        self._scratch = bytearray(max(1 << 20, 2 * (self.ring.max_record + 4)))
        self._pump = gevent.spawn(self._pump_loop) if self.owned else None

    def __repr__(self):
        return f"<Topic {self.name}>"

    # -- publishing -----------------------------------------------------------------

    def put_packed(self, packed, count, body_bytes):
        """Append `count` packed records (from nsqshm._core.wire) to the ring."""
        if self.exiting:
            raise TopicError("exiting")
        view = memory_first(self.ring, self.backend, packed, self.mem_limit)
        if view and not self.owned:
            self._push_waiting(view)
        elif view:
            try:
                self.backend.put_packed(view)
            except DiskQueueError as err:
                self.nsqd.set_health(err)
                raise TopicError(str(err)) from None
            self.nsqd.set_health()
            self.nsqd.backend_written(self.backend)
            self._wake.set()
        self.message_count += count
        self.message_bytes += body_bytes

    def wake(self):
        self._wake.set()

    def _push_waiting(self, view, timeout=5.0):
        """A worker without the disk queue: into the ring as far as its bytes
        allow, waiting for the owner's pump to make room."""
        ring = self.ring
        deadline = time.monotonic() + timeout
        while True:
            _, used = ring.push_packed(view)
            view = view[used:]
            if not view:
                return
            if time.monotonic() > deadline:
                raise TopicError("queue full")
            self.nsqd.tell_owner(self.name)
            self._wake.clear()
            self._waker.arm(for_space=True)
            try:
                self._wake.wait(0.05)
            finally:
                ring.disarm(for_space=True)

    def put_message(self, body):
        out = bytearray()
        pack_message(body, self.nsqd.ids, time.time_ns(), out)
        self.put_packed(out, 1, len(body))

    def put_deferred(self, body, delay_s):
        """DPUB: a message due in delay_s seconds, for every channel."""
        if self.exiting:
            raise TopicError("exiting")
        out = bytearray()
        pack_message(body, self.nsqd.ids, time.time_ns(), out)
        msg = bytes(out[4:])
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
            channel = Channel(self, name)
            self.channels[name] = channel
            self._hand_over_waiting(channel)
            self._wake.set()
            self.nsqd.notify_change(topic=self.name, channel=name)
            self.nsqd.broadcast_change("channel_create", self.name, name)
        return channel

    def _hand_over_waiting(self, channel):
        """The first channel takes the DPUB messages that waited for it."""
        waiting = self.deferred_waiting
        while True:
            due = waiting.next_due()
            if due < 0:
                return
            n, _ = waiting.pop_due(due, self._scratch)
            pos = 0
            for _ in range(n):
                size = int.from_bytes(self._scratch[pos:pos + 4], "little")
                channel.put_deferred(bytes(self._scratch[pos + 4:pos + 4 + size]), due)
                pos += 4 + size
            waiting.release()

    def _drop_waiting(self):
        while self.deferred_waiting.drain(self._scratch)[0]:
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
        channel.close(delete=True)
        self.nsqd.notify_change(topic=self.name, channel=name, deleted=True)
        self.nsqd.broadcast_change("channel_delete", self.name, name)
        if not self.channels and self.ephemeral:
            self.nsqd.delete_topic(self.name)

    # -- the pump ---------------------------------------------------------------------

    def _pump_loop(self):
        ring = self.ring
        scratch = self._scratch
        backend = self.backend
        while not self.exiting:
            if self.paused or not self.channels:
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
            from_disk = False
            n, nbytes = ring.peek_many_into(scratch)
            if not n and backend.depth:
                n, nbytes = backend.peek_into(scratch, 1024)
                from_disk = True
            if not n:
                self._wake.clear()
                self._waker.arm()
                if ring.depth == 0 and not backend.depth:
                    self._wake.wait()
                ring.disarm()
                continue
            batch = memoryview(scratch)[:nbytes]
            for channel in list(self.channels.values()):
                channel.put_records(batch, new=n)
            if from_disk:
                backend.advance(n)
                self.nsqd.backend_written(backend)
            else:
                ring.discard(n)
            if ring.depth or backend.depth:
                gevent.idle()  # more to move: let clients run first

    def _spill_excess(self):
        """Move what the ring holds past --mem-queue-size to the disk queue
        (ephemeral: drop it, as nsqd); returns how many moved."""
        excess = self.ring.depth - self.mem_limit
        if excess <= 0 or not self.owned:
            return 0
        n, nbytes = self.ring.peek_many_into(self._scratch, excess)
        if not n:
            return 0
        done = n
        if not self.ephemeral:
            try:
                done, _ = self.backend.put_packed(memoryview(self._scratch)[:nbytes])
            except DiskQueueError as err:
                self.nsqd.set_health(err)
                done = getattr(err, "written", 0)
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
        return self.ring.depth + self.backend.depth

    @property
    def backend_depth(self):
        return self.backend.depth

    def empty(self):
        while self.ring.pop_many_into(self._scratch)[0]:
            pass
        self.backend.empty()
        self._drop_waiting()
        self.nsqd.broadcast_change("topic_empty", self.name)

    def close(self, delete=False):
        """Stop the pump.  delete: drop everything.  Otherwise (shutdown) every
        message in memory goes to the disk queue, which is synced and closed,
        and the rings are removed (ephemeral messages are dropped, as nsqd)."""
        self.exiting = True
        if self._pump is not None:
            self._pump.kill(block=False)
        for channel in list(self.channels.values()):
            channel.close(delete=delete)
        if delete:
            self.channels.clear()
            self._drop_waiting()
            self.backend.delete()
            self.ring.unlink()
        elif flush_ring(self.ring, self.backend, self._scratch, self.nsqd):
            while True:  # waiting DPUB messages: on disk, due now (as before a restart)
                n, nbytes = self.deferred_waiting.drain(self._scratch)
                if not n:
                    break
                self.backend.put_packed(memoryview(self._scratch)[:nbytes])
                self.deferred_waiting.release()
            self.backend.close()
            self.ring.unlink()
        self._waker.close()
        self.ring.close()

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
        self._waker.close()
        self.ring.close()


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
            ring.push_packed(rest)
            return False


__all__ = ["FULL", "Topic", "TopicError"]
