"""BulkConsumer: a channel's messages in large lots, as Arrow record batches,
finished or requeued only as a whole (the Spark source's read path).

take() moves messages from the channel ring straight into this consumer's
arena and into Arrow column buffers in one C pass under the ring's consumer
lock (Columns.take); finish() forgets every message held at once
(arena_reset) and requeue() pushes them all back.  There is no ID table and
no per-message timeout: a bulk consumer holds what it took until it
finishes or requeues the lot, closes (which requeues), or dies (the broker
recovers its arena).  Use Consumer for per-message FIN/REQ/TOUCH.

A log topic's channel is taken the same way, from the ring its partitions'
owners feed while this consumer is subscribed (subscription.py, as a
Consumer); finish() marks every message held in its partition's cursor
first (arena_finish_logged, one C pass), then forgets them, so the
channel's cursors, lag and what a restart delivers again are those of a
TCP consumer's FINs.  requeue() notes what goes back in the cursors'
retry tables (with its attempts), as the broker's put-backs.  It takes the
channel's lanes too (lanes.py: partitions a `SUB T C p`, `SUB_ORDERED` or a
local Consumer(partition=) moved out of the ring), as a plain SUB does, and
puts back into them what is theirs.
"""

import os
import socket
import time

from nsqshm import __version__
from nsqshm._core.arena import Arena
from nsqshm._core.localbatch import Columns, arena_finish_logged, arena_reset
from nsqshm._core.logcursor import SEEK_HOLDS, SEEKS_MOVED, decode_message_id
from nsqshm.local import arenas
from nsqshm.local.broker import Broker, LocalError, check_name
from nsqshm.local.lanes import LANE_LOOK, Lanes, disarm, sleep_on
from nsqshm.local.subscription import attach_cursors, leave, open_channel, subscribe
from nsqshm.nsqd.local.clients import BULK_LABEL

USER_AGENT = f"nsqshm.local.bulk/{__version__}"


class BulkConsumer:
    def __init__(self, topic, channel, data_path=None, shm_prefix=None, *, create=True,
                 client_id=None, user_agent=USER_AGENT, arena_size=1 << 32, since_ns=0,
                 broker=None, label=BULK_LABEL, ext=False, headers=False):
        """ext: the topic was made with ext=true (its records carry Youzan's
        ext part, cut from the bodies); headers: a headers column too.
        label: the arena's, on a classic channel; on a log topic's channel it
        is BULK_LABEL, by which the broker's recovery of a dead consumer's
        arena knows to give its place among the ring's subscribers back."""
        self.topic = check_name("topic", topic)
        self.channel = check_name("channel", channel)
        self.queue = f"{topic}:{channel}"
        self.broker = broker or Broker(data_path, shm_prefix)
        # a log topic's channel: its cursors, one per partition (None: classic)
        self.cursors = attach_cursors(open_channel(self.broker, topic, channel, create),
                                      self.queue)
        if self.cursors is not None:
            label = BULK_LABEL
        self.ring = self.broker.attach(self.broker.channel_ring_name(topic, channel))
        # the channel's lanes, every one (a plain SUB's rings: the channel's and the lanes)
        self.lanes = Lanes(self.ring, self.broker.prefix, topic, channel,
                           len(self.cursors) if self.cursors is not None else 0)
        self.arena = Arena.create(arenas.local_name(self.broker.prefix), size=arena_size,
                                  max_queues=4, label=label)
        self._pid = os.getpid()
        self._qidx = self.arena.queue_index(self.queue)
        self.columns = Columns(ext=ext, headers=headers)
        self.headers = headers
        self.columns.since_ns = since_ns
        self.held = 0
        self._seek_held = False  # the last take met a seek's or a lane move's hold
        self.message_count = self.finish_count = self.requeue_count = 0
        self.closed = False
        self.arena.set_client_info(
            client_id=client_id or socket.gethostname().split(".")[0],
            hostname=socket.gethostname(), user_agent=user_agent, queue=self.queue,
            connect_ts=int(time.time()), ready_count=0, message_count=0, finish_count=0,
            requeue_count=0, in_flight=0)
        self._subscribed = False
        if self.cursors is not None:
            subscribe(self.ring, self.queue)
            self._subscribed = True
            self.arena.set_client_info(ready_count=1)  # (recovery: a place to give back)

    def _check(self):
        if self.closed:
            raise LocalError("consumer is closed")
        if os.getpid() != self._pid:
            raise LocalError("a BulkConsumer belongs to the process that made it")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def depth(self):
        """Messages in the channel ring (and its lanes) now."""
        return self.ring.depth + sum(lane.depth for lane in self.lanes.rings())

    def take(self, max_messages, max_bytes=1 << 62, timeout=0.0):
        """Take up to max_messages (about max_bytes of bodies) now, waiting up
        to `timeout` s for the first; a pyarrow.RecordBatch (maybe empty)."""
        self._check()
        n = self._take(max_messages, max_bytes)
        if not n and timeout > 0:
            end = time.monotonic() + timeout
            while not n:
                rings = [self.ring, *self.lanes.rings()]
                changes = self.lanes.changes
                for ring in rings:
                    ring.arm()
                try:
                    n = self._take(max_messages, max_bytes)
                    remaining = end - time.monotonic()
                    if n or remaining <= 0:
                        break
                    if self.lanes.changes != changes:
                        continue  # (lanes attached or let go: arm the ones there are now)
                    if (self.ring.disk_backlog or self.cursors is not None) \
                            and not self.ring.paused:
                        if self.cursors is not None:  # a log channel: filled whatever
                            self.ring.ring_wanted = True  # the subscriber counts say
                        self.ring.nudge()  # the owner refills the ring from disk or its logs
                    # paused: an unpause does not push, so look again now and then; a
                    # log channel: a lane made meanwhile is found at the next look
                    cap = 0.1 if self.ring.paused or self._seek_held else \
                        LANE_LOOK if self.cursors is not None else remaining
                    sleep_on(rings, min(remaining, cap))
                finally:
                    disarm(rings)
        return self.export()

    def _take(self, max_messages, max_bytes):
        if max_messages <= 0 or self.ring.paused:  # a paused channel delivers nothing
            return 0
        if self.cursors is not None and not self.ring.depth:
            self.ring.ring_wanted = True  # (the owners' feeders: a consumer here takes)
            self.ring.nudge()
        due = time.time_ns()  # no timeout: the due time only records when it was taken
        n = 0
        self._seek_held = False
        self._drop_moved()
        start = self.columns.nbytes
        rings = [self.ring, *self.lanes.rings()]
        while rings and n < max_messages and self.columns.nbytes - start < max_bytes:
            got = self.columns.take(rings[0], self.arena, self._qidx, max_messages - n,
                                    max_bytes - (self.columns.nbytes - start), due,
                                    seeks=self.cursors)
            if got == -SEEKS_MOVED:  # (a seek since the last look: drop, take again)
                self._drop_moved()
                continue
            if got == -SEEK_HOLDS:  # (a seek under way: the next take looks again)
                self._seek_held = True
                break
            n += got
            del rings[0]
        if n:
            self.held += n
            self.message_count += n
            self.arena.set_client_info(message_count=self.message_count, in_flight=self.held)
        return n

    def _drop_moved(self):
        """What it holds of a partition that moved into an ordered lane since
        it took it goes, unfinished (the lane delivers it again, in order),
        before a finish would mark it (finished past the head the lane gave
        another consumer) or a requeue put it back: as a Consumer drops its
        copies (_find_lanes).  So does what it holds of a partition whose
        cursor a seek moved since (the seek delivers from its new offset
        again: Consumer._check_seeks).  A Python step per message held, on
        those rare paths only (the ring's lanes_version or a cursor's seek
        count moved).  -> how many."""
        if self.cursors is None:
            return 0
        moved = set(self.cursors.seeks_moved())
        ordered = self.lanes.find() if self.lanes.stale() else []
        moved.update(ordered)
        dropped = 0
        if moved:
            for offset, _queue, _state, _due, msg in self.arena.blocks():
                where = decode_message_id(msg[10:26])  # [8 timestamp][2 attempts][16 ID]
                if where is not None and where[0] in moved:
                    self.arena.release(offset)
                    dropped += 1
            self.held -= dropped
        if ordered:  # (after the drop: what it holds of them now came from their lanes)
            self.arena.mark_ordered_lanes(ordered)
        return dropped

    def export(self):
        """The messages taken since the last export, as a RecordBatch."""
        from nsqshm.local.arrow import with_headers

        return with_headers(self.columns.export(), self.topic, self.channel, self.headers)

    @property
    def skipped(self):
        """Messages taken but left out of the batches (older than since_ns)."""
        return self.columns.skipped

    def finish(self):
        """FIN every message held; returns how many."""
        self._check()
        if self.cursors is not None:  # the cursors first: a death before the reset repeats
            self._drop_moved()
            arena_finish_logged(self.arena, self.cursors)
        n = arena_reset(self.arena)
        self.finish_count += n
        self.held = 0
        self.arena.set_client_info(finish_count=self.finish_count, in_flight=0)
        self.lanes.nudge_ordered()  # (an ordered lane's owner pushes the next one)
        return n

    def requeue(self, timeout=5.0):
        """Put every message held back into the channel; returns how many went
        back (the rest stay held: LocalError if some could not)."""
        self._check()
        self._drop_moved()  # (and a lane made since the take takes its own)
        done, left = arenas.put_back(self.arena, self.ring, self.queue, timeout=timeout,
                                     cursors=self.cursors, lanes=self.lanes.by_partition())
        self.requeue_count += done
        if done:  # (the channel's requeue_count in /stats: the topic's owner adds them)
            self.ring.count_local_requeues(done)
        self.held = left
        if not left:
            arena_reset(self.arena)  # reuse the space
        self.arena.set_client_info(requeue_count=self.requeue_count, in_flight=left)
        if left:
            raise LocalError(f"{left} messages could not go back into the full channel ring")
        return done

    def close(self, timeout=5.0):
        """Requeue what is held, then remove the arena (kept, for the broker to
        recover, if some messages could not go back)."""
        if self.closed:
            return
        self.closed = True
        if os.getpid() != self._pid:
            return
        self._drop_moved()
        left = leave(self.arena, self.ring, self.queue, timeout, self.cursors, self._subscribed,
                     lanes=self.lanes.by_partition())
        self._subscribed = False
        if not left:
            self.arena.unlink()
        self.arena.close()
        self.lanes.close()
        self.ring.close()

    def __del__(self):
        try:
            self.close(timeout=1.0)
        except Exception:
            pass
