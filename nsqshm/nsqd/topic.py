"""A topic: its shared-memory ingress ring, its channels, and the pump that
copies each message into every channel (nsqd's topic.go messagePump).

PUB, MPUB and HTTP publishes append packed records to the ring in one call
each.  The pump moves a batch at a time: one pop_many_into from the topic
ring, then one push_packed into each channel's ring; no Python object per
message.  Until the first channel exists the pump does not run, so the
topic keeps its messages, as nsqd does.  DPUB messages skip the ring and go
straight to every channel's deferred queue (kept here until a channel
exists).
"""

import time

import gevent
import gevent.event
from gevent.socket import wait_read

from nsqshm._core.wire import pack_message
from nsqshm.nsqd.channel import Channel
from nsqshm.nsqd.names import is_ephemeral
from nsqshm.ring import FULL

PUB_WAIT = 5.0  # seconds a publish waits for room in a full ring before it fails


class TopicError(Exception):
    pass


class Topic:
    def __init__(self, nsqd, name):
        self.nsqd = nsqd
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.ring = nsqd.make_ring(f"t.{name}")
        self.channels = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        self.deferred_waiting = []  # (message, due_ns) for DPUB before any channel
        self._wake = gevent.event.Event()
        self._scratch = bytearray(max(1 << 20, 2 * (self.ring.max_record + 4)))
        self._pump = gevent.spawn(self._pump_loop)

    def __repr__(self):
        return f"<Topic {self.name}>"

    # -- publishing -----------------------------------------------------------------

    def put_packed(self, packed, count, body_bytes):
        """Append `count` packed records (from nsqshm._core.wire) to the ring."""
        if self.exiting:
            raise TopicError("exiting")
        view = memoryview(packed)
        while view:
            done, used = self.ring.push_packed(view)
            if not done:
                done, used = self.ring.push_packed_wait(view, timeout=PUB_WAIT)
                if not done:
                    raise TopicError("queue full")
            view = view[used:]
        self.message_count += count
        self.message_bytes += body_bytes

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
            self.deferred_waiting.append((msg, due))
            return
        for channel in list(self.channels.values()):
            channel.put_deferred(msg, due)

    # -- channels ---------------------------------------------------------------------

    def get_channel(self, name):
        channel = self.channels.get(name)
        if channel is None:
            channel = Channel(self, name)
            self.channels[name] = channel
            for msg, due in self.deferred_waiting:
                channel.put_deferred(msg, due)
            self.deferred_waiting = []
            self._wake.set()
            self.nsqd.notify_change()
        return channel

    def get_existing_channel(self, name):
        return self.channels.get(name)

    def delete_channel(self, name):
        channel = self.channels.pop(name, None)
        if channel is None:
            raise TopicError("channel does not exist")
        channel.close(delete=True)
        self.nsqd.notify_change()
        if not self.channels and self.ephemeral:
            self.nsqd.delete_topic(self.name)

    # -- the pump ---------------------------------------------------------------------

    def _pump_loop(self):
        ring = self.ring
        scratch = self._scratch
        while not self.exiting:
            if self.paused or not self.channels:
                self._wake.clear()
                self._wake.wait()
                continue
            n, nbytes = ring.pop_many_into(scratch)
            if not n:
                ring.arm()
                if ring.depth == 0:
                    wait_read(ring.fileno())
                ring.drain()
                ring.disarm()
                continue
            batch = memoryview(scratch)[:nbytes]
            for channel in list(self.channels.values()):
                channel.put_records(batch)
            gevent.idle()

    # -- pause, empty, delete --------------------------------------------------------

    def pause(self):
        self.paused = True
        self.nsqd.notify_change()

    def unpause(self):
        self.paused = False
        self._wake.set()
        self.nsqd.notify_change()

    @property
    def depth(self):
        return self.ring.depth

    def empty(self):
        while self.ring.pop_many_into(self._scratch)[0]:
            pass
        self.deferred_waiting = []

    def close(self, delete=False):
        self.exiting = True
        self._pump.kill(block=False)
        for channel in list(self.channels.values()):
            channel.close(delete=delete)
        if delete:
            self.channels.clear()
            self.ring.unlink()
        self.ring.close()


__all__ = ["FULL", "Topic", "TopicError"]
