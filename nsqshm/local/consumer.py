"""Consumer: one channel's messages through shared memory, with NSQ's
semantics: a message is in flight from delivery until finished; a requeue
(with an optional delay) or a passed timeout puts it back in the channel
with its attempts counted; TOUCH moves the timeout.

Delivery is the broker's own C path (InFlight.deliver_from_ring): messages
move from the channel ring into this consumer's in-flight table under the
ring's consumer lock, each in a block of the consumer's arena in shared
memory, so if this process dies the broker puts them back.  A timer thread
requeues messages whose timeout passed and deferred messages that came due.

Time to live applies as to TCP clients: a message past its own deadline or
the channel's (the ring header's ttl_ns, set by the broker) is dropped, and
counted in the ring for the broker's expired_count.  A channel's max
attempts is not applied here: a local requeue goes back to the ring.

A log topic's channel (docs/logtopics.md) is consumed by cursor: on a
standalone broker this consumer reads the partitions' logs itself, as the
broker's workers do for their TCP clients (_deliver_direct: a run of unread,
unfinished messages claimed under the partition cursor's lock, read from the
mmap'd segments straight into flight, read_pos moved past it), after what
the channel ring holds (put back by a REQ or a timeout); it counts itself
among the ring's subscribers and direct subscribers, so the owners do not
copy the partitions into the ring for it.  A partition it cannot read so
(retention removed what the cursor would read, a seek holds it) it leaves
to the owners, asking them to fill the ring (ring_wanted).  It takes the
channel's lanes too (lanes.py), as a plain SUB does; with partition= it
takes one partition's lane alone (and that partition's log), with ordered=
the ordered lanes alone.  A partition in an ordered lane has one message
out at a time: its head is claimed from the log here, under the cursor's
lock, once the one before it is finished (read_pos at confirmed), as the
owner's feeder would push it into the lane (a FIN needs no round trip
through the broker).  Otherwise (an ext topic, a broker in cluster mode,
direct=False) the owners of its partitions feed the channel ring from their
logs while this consumer is subscribed (the ring's subscriber count, given
back at close or, if it dies, by the broker's recovery of its arena).  A FIN marks the message's
offset in its partition's cursor (shared memory, attached here) before the
message leaves the in-flight table, as the broker's FIN does, and a message
a time to live drops is marked too; so the channel's cursors, its lag in
/stats and what a restart delivers again are those of a TCP consumer's FINs.

Fork safety: every entry point checks the pid.  A forked child (a Spark
worker) never touches its parent's arena or table; it gets its own on
first use, and batches fetched by the parent cannot be finished there.
"""

import atexit
import os
import socket
import struct
import threading
import time
import weakref

from nsqshm import __version__
from nsqshm._core.arena import Arena
from nsqshm._core.commitlog import LogError, LogReader, partition_dir
from nsqshm._core.ext import ExtView
from nsqshm._core.inflight import NOT_IN_FLIGHT, DeferredQueue, InFlight
from nsqshm._core.localbatch import finish_frames
from nsqshm._core.logcursor import (
    CLAIM_RETENTION,
    SEEK_HOLDS,
    SEEKS_MOVED,
    split_by_partition,
)
from nsqshm.local import arenas, tracing
from nsqshm.local.batch import Batch
from nsqshm.local.broker import Broker, LocalError, check_name
from nsqshm.local.lanes import LANE_LOOK, Lanes, disarm, sleep_on
from nsqshm.local.subscription import attach_cursors, leave, open_channel, subscribe
from nsqshm.nsqd.local.clients import DIRECT_LABEL, LOCAL_LABEL

CLIENT = 1                      # the one client id of this consumer's table
MAX_MSG_TIMEOUT = 15 * 60.0     # nsqd's default --max-msg-timeout caps TOUCH
RETRY_NS = 100_000_000          # a full channel ring: retry a requeue after 0.1 s
HELD_UNTIL_FINISHED = 2**63 - 1  # a deadline no timeout reaches (a log FIN's hold check)
NEVER = 2**63 - 1               # the timer thread's next wake when nothing is due
USER_AGENT = f"nsqshm.local/{__version__}"
STATUS_TEXT = {NOT_IN_FLIGHT: "ID not in flight"}

_live = weakref.WeakSet()


class Consumer:
    def __init__(self, topic, channel, data_path=None, shm_prefix=None, *,
                 max_in_flight=10_000, msg_timeout=None, client_id=None, hostname=None,
                 user_agent=USER_AGENT, create=True, arena_size=1 << 30, broker=None,
                 headers=False, direct=True, partition=None, ordered=False):
        """partition: of a log topic's channel, that partition only, through
        its lane, as a TCP `SUB T C p` takes it (loglane.py; its messages go
        to this consumer and to the channel's plain consumers, none to
        another partition's).  ordered: one message of each partition (of
        `partition` alone, if given) in flight at a time, the next only once
        it is finished, in log order, as `SUB_ORDERED T C [p]` (a requeue or
        a timeout delivers it again before anything later); the only way to
        consume Youzan's orderedmulti topic.  Both ask the broker to make the
        lanes (POST /channel/lane).  headers: on a topic made with ext=true, frames keep Youzan's ext
        part (what IDENTIFY extend_support asks of nsqd), so each message
        has its headers (Message.headers; bodies still without it); without
        it the bodies are plain, cut in C, as a TCP client that did not ask
        gets them.  Ignored on other topics.  direct: a log topic's channel
        is read from the partitions' logs here where it can be (a
        standalone broker, a topic without ext); False: through the ring
        the owners fill, always."""
        self.topic = check_name("topic", topic)
        self.channel = check_name("channel", channel)
        self.queue = f"{topic}:{channel}"
        self.broker = broker or Broker(data_path, shm_prefix)
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.max_in_flight = int(max_in_flight)
        self.msg_timeout = float(msg_timeout or self.broker.msg_timeout)
        self.client_id = client_id or socket.gethostname().split(".")[0]
        self.hostname = hostname or socket.gethostname()
        self.user_agent = user_agent
        self.arena_size = arena_size
        self.closed = False
        # a log topic's channel: its cursors, one per partition (none: classic)
        self._cursor_names = open_channel(self.broker, topic, channel, create, ordered,
                                          partition)
        self.partition, self.ordered = partition, bool(ordered)
        if self.partition is not None or self.ordered:
            self.broker.use_lanes(topic, channel, self.partition, self.ordered)
        self.ext = self.broker.topic_kind(topic)[1]
        self.headers = bool(headers) and self.ext
        data_path = self.broker.info.get("data_path")
        self.direct = bool(direct and self._cursor_names and data_path and not self.ext
                           and self.broker.cluster is False)
        # whether the owners must fill the channel's ring for it: not when it
        # reads the logs itself or takes its partitions' lanes alone (the owners
        # fill a lane whatever the counts)
        self._takes_ring = bool(self._cursor_names) and not self.direct \
            and self.partition is None and not self.ordered
        self._partition_dirs = [partition_dir(data_path, topic, i)
                                for i in range(len(self._cursor_names))] if self.direct else []
        self._open()

    def _open(self):
        """This process's handles (again in a forked child)."""
        self._pid = os.getpid()
        self.ring = self.broker.attach(self.broker.channel_ring_name(self.topic, self.channel))
        label = LOCAL_LABEL if self._takes_ring or not self._cursor_names else DIRECT_LABEL
        self.arena = Arena.create(arenas.local_name(self.broker.prefix), size=self.arena_size,
                                  max_queues=4, label=label)
        self._inflight = InFlight()
        self._inflight.use_arena(self.arena, self.queue)
        # an ext topic's frames: the ext part cut (plain bodies) or kept (headers)
        self._ext_view = ExtView(strip=not self.headers) if self.ext else None
        self._trace_log = tracing.for_broker(self.broker)  # (this process's)
        self._deferred = DeferredQueue()
        self._deferred.use_arena(self.arena, self.queue)
        self._scratch = bytearray(max(4 << 20, 2 * (self.ring.max_record + 4)))
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._timer = None
        self._timer_due = -1  # when the timer thread wakes next (-1: not known; _start_timer)
        self._waiting = 0  # fetch calls asleep (threads): _next_ordered wakes them
        self._cursors = None
        self._subscribed = False
        self._readers = [None] * len(self._partition_dirs)  # LogReader by partition, when made
        self._lanes = Lanes(self.ring, self.broker.prefix, self.topic, self.channel,
                            len(self._cursor_names), self.partition, self.ordered)
        self._turn = 0  # the partition the next direct read starts at
        self._seek_held = False  # the last delivery met a seek's hold (its end pushes nothing)
        self.message_count = self.finish_count = self.requeue_count = self.timeout_count = 0
        self.connect_ts = int(time.time())
        # a log channel's consumer says it is subscribed (ready_count > 0) only
        # once it is: the broker's recovery gives back the count of a dead one
        # that says so (recovery._unsubscribe), so never one it did not add
        self.arena.set_client_info(
            client_id=self.client_id, hostname=self.hostname, user_agent=self.user_agent,
            queue=self.queue, ready_count=0 if self._cursor_names else self.max_in_flight,
            connect_ts=self.connect_ts, message_count=0, finish_count=0, requeue_count=0,
            in_flight=0)
        _live.add(self)
        if self._cursor_names:
            self._cursors = self._attach_cursors()
            self._subscribe()
            self.arena.set_client_info(ready_count=self.max_in_flight)

    def _attach_cursors(self):
        cursors = attach_cursors(self._cursor_names, self.queue)
        self._inflight.expired_out = bytearray()  # marked finished in their cursors
        self._inflight.log_cursors = cursors  # (what goes out raises the delivered marks)
        return cursors

    def _subscribe(self):
        """Count this consumer among the channel's subscribers: the
        partitions' owners then feed the ring for it (subscription.py), unless
        it reads the logs itself (a direct subscriber too)."""
        subscribe(self.ring, self.queue, not self._takes_ring)
        self._subscribed = True

    def _tracing(self):
        """(writer, stream) while tracing is on for this channel or its topic, else
        None (also when the trace log cannot be made: tracing never costs a message)."""
        if self._trace_log.traced(self.topic, self.channel):
            return self._trace_log.stream(self.topic, self.channel)
        return None

    @property
    def partition_count(self):
        """The log topic's partitions (0: a classic topic's channel)."""
        return len(self._cursor_names)

    @property
    def is_log(self):
        """Whether this consumes a log topic's channel (cursors per partition)."""
        return self._cursors is not None

    def _check(self):
        if self.closed:
            raise LocalError("consumer is closed")
        if os.getpid() != self._pid:
            self._open()  # the parent's handles stay the parent's

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<Consumer {self.queue} in_flight={self.in_flight}>"

    @property
    def in_flight(self):
        return len(self._inflight) if os.getpid() == self._pid else 0

    @property
    def deferred(self):
        return len(self._deferred) if os.getpid() == self._pid else 0

    def _publish_info(self):
        self.arena.set_client_info(message_count=self.message_count,
                                   finish_count=self.finish_count,
                                   requeue_count=self.requeue_count,
                                   in_flight=len(self._inflight))

    # -- fetching ----------------------------------------------------------------------

    def fetch(self, max_messages=None, timeout=0.0):
        """Up to max_messages (default: max_in_flight) messages as a Batch,
        waiting up to `timeout` seconds for the first; never more than
        max_in_flight in flight at once (an empty batch when the window is full)."""
        self._check()
        want = self.max_in_flight if max_messages is None else int(max_messages)
        batch = self._deliver(want)
        if batch or timeout <= 0:
            if not batch and self._takes_ring:
                self.ring.ring_wanted = True  # (filled whatever the counts say)
                self.ring.nudge()  # the owners' feeders: a consumer here waits
            return batch
        end = time.monotonic() + timeout
        ring = self.ring
        while True:
            rings = self._wait_rings()
            changes = self._lanes.changes
            for waiting in rings:
                waiting.arm()
            try:
                batch = self._deliver(want)
                remaining = end - time.monotonic()
                if batch or remaining <= 0:
                    return batch
                if self._lanes.changes != changes:
                    continue  # (lanes attached or let go: arm the ones there are now)
                paused = ring.paused or ring.topic_paused
                if not paused and (ring.disk_backlog or self._takes_ring):
                    if self._takes_ring:       # a log channel: filled whatever the
                        ring.ring_wanted = True  # subscriber counts say
                    ring.nudge()  # the owner refills the ring from disk, or from its logs
                # paused: an unpause does not push, so look again now and then; a
                # plain consumer of a log channel: a lane made meanwhile (by another
                # consumer) is found at the next look
                # a seek's hold (on any partition) ends without a push: look again soon
                cap = 0.1 if paused or self._seek_held else LANE_LOOK \
                    if self._cursors is not None and self.partition is None \
                    and not self.ordered else remaining
                self._waiting += 1
                try:
                    sleep_on(rings, min(remaining, cap))
                finally:
                    self._waiting -= 1
            finally:
                disarm(rings)

    def _wait_rings(self):
        """The rings a push into which (or, reading the logs, an owner's
        append: LogChannel.feed_wake wakes the channel ring's sleepers)
        wakes this consumer."""
        rings = self._sources()
        if self.direct and not any(r is self.ring for r in rings):
            rings = [self.ring, *rings]
        return rings or [self.ring]

    def _find_lanes(self):
        """Lanes.find (the lock held); what this consumer holds of a partition
        that moved into an ordered lane since it last looked is dropped:
        taken before the move, it is delivered again by the lane, in order
        (as the broker's workers drop theirs: LogChannel._drop_moved; a FIN
        of one then fails as of one not in flight).  Then the arena notes
        that it took them from their lanes since: the broker's recovery of
        this consumer's arena puts a head back into an ordered lane only if
        it came from it (recovery._lanes_left_out).  -> those
        partitions."""
        moved = self._lanes.find()
        self._settle_moved(moved)
        return moved

    def _settle_moved(self, moved):
        """_find_lanes' second half, for the partitions `moved` into ordered
        lanes: drop what is held of them, then mark the lanes in the arena
        (after: a death in between leaves no copy of them marked as the lane's)."""
        if moved:
            self._drop_partitions(moved)
            self.arena.mark_ordered_lanes(moved)

    def _drop_partitions(self, partitions):
        """Forget, unfinished, what this consumer holds (in flight and
        deferred) of these partitions: the broker delivers them again."""
        for partition in partitions:
            for store in (self._inflight, self._deferred):
                while store.drain_partition(partition, self._scratch)[0]:
                    pass
                store.release()

    def _check_seeks(self):
        """What this consumer holds of a partition whose cursor a seek moved
        since it took it (/channel/setoffset, SUB_ADVANCED's position; not a
        reset without a hold, as retention's) goes, unfinished: a seek
        delivers from its new offset again, and the workers take their own
        clients' copies out of flight as it holds the cursor, but cannot
        reach this process's table.  A FIN or
        REQ of such a copy then fails as of one not in flight, as a TCP
        client's does; one that crosses the seek marks nothing
        (CursorSet.guard_seeks).  (The lock held; a few atomic loads when
        nothing moved.)"""
        if self._cursors is not None:
            moved = self._cursors.seeks_moved()
            if moved:
                self._drop_partitions(moved)

    def _drop_moved(self):
        """Before FINs: the copies this consumer holds of a partition that
        moved into an ordered lane go first (_find_lanes), or their FINs
        would mark finished the head the lane gave another consumer, and the
        next would go out beside it.  (One load of the ring's lanes_version
        when nothing changed.)"""
        if self._lanes.stale():
            self._find_lanes()

    def _sources(self):
        """The rings this consumer takes from, in this order: its
        partition's lane (partition=), every ordered lane (ordered=), or the
        channel's ring and every lane (a plain consumer, as a plain SUB)."""
        if self.partition is not None or self.ordered:
            return self._lanes.rings()
        return [self.ring, *self._lanes.rings()]

    def _deliver(self, want):
        out = bytearray()
        added = 0
        if self.ring.paused:  # a paused channel delivers nothing, as to TCP clients
            return Batch(self, out, 0)
        with self._lock:
            if self._cursors is not None:
                self._find_lanes()
                self._check_seeks()
            n = min(want, self.max_in_flight - len(self._inflight))
            deadline = time.monotonic_ns() + int(self.msg_timeout * 1e9)
            self._inflight.ttl_ns = self.ring.ttl_ns  # the channel's time to live (policy.py)
            expired = self._inflight.expired
            taken = 0
            seek_held = False
            for ring in self._sources():
                while taken < n:
                    t, a = self._inflight.deliver_from_ring(ring, n - taken, self._scratch, out,
                                                            CLIENT, deadline, 0, self._ext_view,
                                                            seeks=self._cursors)
                    if t == -SEEKS_MOVED:  # (a seek since the last look: drop, take again)
                        self._check_seeks()
                        continue
                    if t == -SEEK_HOLDS:  # (a seek under way: the rings may hold stale
                        seek_held = True  # records until its drain; the next fetch looks)
                        break
                    if not t:
                        break
                    taken += t
                    added += a
                if seek_held:
                    break
            self._seek_held = seek_held
            if self.direct and taken < n and not self.ring.topic_paused:
                t, a = self._deliver_direct(n - taken, out, deadline)
                taken += t
                added += a
            if self._inflight.expired != expired:  # dropped, counted in the broker's /stats
                self.ring.count_local_expired(self._inflight.expired - expired)
                if self._cursors is not None:  # consumed without a FIN: finished
                    self._cursors.finish_records(self._inflight.expired_out)
                    del self._inflight.expired_out[:]
                    self._next_ordered()
            if added:
                self.message_count += added
                self._publish_info()
                tracing_on = self._tracing()
                if tracing_on is not None:
                    tracing_on[0].delivered(out, 0, tracing_on[1])
                self._start_timer(deadline)
        return Batch(self, out, added)

    def _deliver_direct(self, room, out, deadline):
        """Up to `room` unread, unfinished messages of the partitions, read
        from their logs into flight here (the lock held): a run of each
        partition in turn, each claimed under its cursor's lock as the
        broker's readers claim theirs (LogChannel._claim: read it, put it in
        flight, move read_pos past it, as one step).  (taken, added)."""
        indices = range(len(self._cursors)) if self.partition is None else (self.partition,)
        n = len(indices)
        taken = added = 0
        wanted = False
        for k in range(n):
            if taken >= room:
                break
            index = indices[(self._turn + k) % n]
            got, put, want = self._claim_run(index, room - taken, out, deadline)
            taken += got
            added += put
            wanted = wanted or want
        self._turn = (self._turn + 1) % n
        if wanted and not self.ring.ring_wanted:  # a partition left to the owners' feeders
            self.ring.ring_wanted = True
            self.ring.nudge()
        return taken, added

    def _claim_run(self, index, room, out, deadline):
        """One partition's next run -> (taken, added, whether the owners must
        feed it into the ring: this consumer cannot read it now).  Everything
        is looked at under the cursor's lock, as the broker's readers do
        (LogChannel._claim): an ordered lane made (use_lanes) or records
        pushed into the partition's ring (its lane's, or the channel's)
        meanwhile are seen, not overtaken."""
        reader = self._readers[index]
        if reader is None:
            try:
                reader = self._readers[index] = LogReader(self._partition_dirs[index])
            except (OSError, LogError):
                return 0, 0, False  # (the owner has not made the log yet)
        cursor = self._cursors[index]
        lane = self._lanes.ring(index)
        cursor.lock()
        try:
            # a seek since this consumer's copies were taken: they go, and the claim
            # reads from the new position (exact: a seek counts itself under this lock)
            self._drop_partitions(self._cursors.seeks_moved(index))
            if self._lanes.unseen(index):
                return 0, 0, False  # a lane made a moment ago: what comes back goes there
            if (lane if lane is not None else self.ring).depth:
                return 0, 0, False  # older records wait in the partition's ring
            if self._lanes.ordered(index):
                # its head, once the one before it is finished, as the owner's feeder
                # would push it (LogChannel._claim, one_out): one message out at a time
                if cursor.read_pos > cursor.confirmed:
                    return 0, 0, False
                room = 1
            elif self.ordered:
                return 0, 0, False  # (its ordered lane is not there: nothing in order)
            first, got, nbytes = cursor.claim_read(reader, reader.end_offset, room,
                                                   self._scratch)
            if got == CLAIM_RETENTION:
                return 0, 0, True  # retention went past the cursor: the owner moves it
            if got == 0 and first >= cursor.window_end:
                # the window is full: the owner's feeder watches it for the FINs that
                # move it, wherever they come, and wakes the ring's sleepers then
                self.ring.nudge()
            if got <= 0:  # (nothing now, a seek holds it, or moved past finished ones)
                return 0, 0, False
            put = self._inflight.deliver(memoryview(self._scratch)[:nbytes], got, out, CLIENT,
                                         deadline, 0, None)
            expired = self._inflight.expired_out
            if expired:  # consumed without a FIN (a time to live): finished before read_pos
                self._cursors.finish_records(expired)  # moves past them (counted by _deliver)
                del expired[:]
            cursor.read_pos = first + got
            cursor.count_direct(got)  # (the channel's message_count: no worker saw them)
            return got, put, False
        finally:
            cursor.unlock()

    # -- FIN / REQ / TOUCH -------------------------------------------------------------

    def _next_ordered(self):
        """After FINs: an ordered lane's owner may push a partition's next
        message, for the channel's other consumers: a nudge wakes its feeder
        (Lanes.nudge_ordered).  Not when this consumer is the channel's only
        subscriber and reads the logs itself: it claims each head itself
        (_claim_run), and a nudge would only wake a worker for nothing (a
        consumer that comes later is fed at its SUB: LogChannel.add_client)."""
        if not self.direct or self.ring.subscribers > 1:
            self._lanes.nudge_ordered()
        elif self._waiting:  # (a fetch waiting in another thread: its next head is claimable)
            self.ring.wake_consumers()

    def _own(self, batch):
        if batch._pid != os.getpid() or batch.consumer is not self:
            raise LocalError("this batch was fetched by another process or consumer")

    def finish(self, msg_id):
        self._check()
        with self._lock:
            if self._cursors is not None:
                self._drop_moved()
                self._check_seeks()
                # the cursor first, once the message is known to be held here
                # (touch checks it): a death in between delivers it again
                status = self._inflight.touch(msg_id, CLIENT, HELD_UNTIL_FINISHED)
                if not status:
                    self._cursors.finish(msg_id)
            status = self._inflight.finish(msg_id, CLIENT)
            if status:
                raise LocalError(f"E_FIN_FAILED FIN {_text(msg_id)} failed "
                                 f"{STATUS_TEXT.get(status, status)}")
            self._trace_event(tracing.FIN, msg_id)
            self.finish_count += 1
            self._publish_info()
            self._next_ordered()

    def _finish_batch(self, batch):
        self._check()
        self._own(batch)
        with self._lock:
            if self._cursors is not None:
                self._drop_moved()
                self._check_seeks()
            writer, stream = self._tracing() or (None, 0)
            done = finish_frames(self._inflight, batch._frames, batch._starts, len(batch), CLIENT,
                                 self._cursors, writer, stream)
            self.finish_count += done
            self._publish_info()
            self._next_ordered()
        return done

    def requeue(self, msg_id, delay=0.0):
        """REQ: back to the channel now, or after `delay` seconds (held here
        meanwhile, as nsqd holds a deferred message)."""
        if self._requeue_ids([msg_id], delay) != 1:
            raise LocalError(f"E_REQ_FAILED REQ {_text(msg_id)} failed ID not in flight")

    def _requeue_ids(self, ids, delay):
        self._check()
        now = time.monotonic_ns()
        packed = []
        deferred = []
        done = 0
        with self._lock:
            self._check_seeks()  # (a copy from before a seek does not go back)
            for msg_id in ids:
                msg = self._inflight.requeue(bytes(msg_id), CLIENT)
                if isinstance(msg, int):
                    continue
                self._trace_event(tracing.REQ, msg_id, int(delay * 1000))
                done += 1
                if delay > 0:
                    self._deferred.push(msg, now + int(delay * 1e9))
                    deferred.append(struct.pack("=I", len(msg)) + msg)
                else:
                    packed.append(struct.pack("=I", len(msg)) + msg)
            if deferred and self._cursors is not None:
                # a log channel: noted with when it is due, as the broker notes its REQs
                # (its cursor's retry table: a restart or a new leader keeps the delay)
                self._cursors.note_retries(b"".join(deferred), int((time.time() + delay) * 1000))
            if packed:
                self._store(b"".join(packed), len(packed), now)
            self._inflight.release()  # the copies are stored: free the blocks
            self.requeue_count += done
            if done:  # (the channel's requeue_count in /stats: the topic's owner adds them)
                self.ring.count_local_requeues(done)
            self._publish_info()
            if delay > 0 and done:
                self._start_timer(now + int(delay * 1e9))
        return done

    def touch(self, msg_id):
        if self._touch_ids([msg_id]) != 1:
            raise LocalError(f"E_TOUCH_FAILED TOUCH {_text(msg_id)} failed ID not in flight")

    def _touch_ids(self, ids):
        self._check()
        timeout_ns = int(self.msg_timeout * 1e9)
        now = time.monotonic_ns()
        done = 0
        with self._lock:
            for msg_id in ids:
                key = bytes(msg_id)
                first = self._inflight.get_first_deadline(key)
                if first < 0:
                    continue
                cap = first - timeout_ns + int(MAX_MSG_TIMEOUT * 1e9)
                deadline = min(now + timeout_ns, cap)
                if self._inflight.touch(key, CLIENT, deadline) == 0:
                    self._trace_event(tracing.TOUCH, key)
                    self._start_timer(deadline)  # (the cap may bring it forward)
                    done += 1
        return done

    def _trace_event(self, event, msg_id, value=0):
        """A FIN, REQ or TOUCH of one message (the per-message calls)."""
        tracing_on = self._tracing()
        if tracing_on is not None:
            tracing_on[0].event(event, bytes(msg_id), tracing_on[1], None, value)

    # -- putting messages back -----------------------------------------------------------

    def _store(self, packed, count, now):
        """Push packed records back into the channel ring, or into the lane
        of their partition (split in C: split_by_partition); what does not
        fit (a full ring) waits here as deferred and is retried shortly, so a
        requeue never blocks on a ring only this consumer would drain.  A log
        channel's are noted with their attempts in their cursors' retry tables,
        as the broker's put-backs are (LogChannel.put_records), and one below
        its cursor's confirmed offset is dropped (CursorSet.unconfirmed)."""
        moved = ()
        if self._cursors is not None:
            # a lane made since the delivery takes its partition's; what moved into
            # an ordered lane meanwhile goes nowhere (the lane delivers it again).  The
            # copies held of those are dropped once these records are stored: the drop
            # frees every block handed out, these among them (InFlight.release)
            moved = self._lanes.find()
            if moved:
                parts = split_by_partition(packed, len(self._cursor_names))
                packed = b"".join(records for index, records in enumerate(parts)
                                  if index not in moved)
        try:
            if self._cursors is not None:
                # one below its cursor's confirmed offset is finished (held across a
                # /channel/empty): it does not go out again
                packed = self._cursors.unconfirmed(packed)
                self._cursors.note_retries(packed)
            for ring, records in self._lanes.split(packed, self.ring, self._cursors):
                self._push_back(ring, records, now)
        finally:  # (find() will not name them again: the drop must happen whatever)
            self._settle_moved(moved)

    def _push_back(self, ring, packed, now):
        view = memoryview(packed)
        _, pos = ring.push_packed(view)
        if pos < len(view):  # (a full ring: retried from the deferred queue)
            self._start_timer(now + RETRY_NS)
        while pos < len(view):
            (size,) = struct.unpack_from("=I", view, pos)
            self._deferred.push(view[pos + 4:pos + 4 + size], now + RETRY_NS)
            pos += 4 + size

    def process_timeouts(self, now=None):
        """Requeue expired in-flight messages and deferred ones now due;
        returns how many went back (the timer thread calls this)."""
        if os.getpid() != self._pid or self.closed:
            return 0
        now = time.monotonic_ns() if now is None else now
        total = 0
        with self._lock:
            self._check_seeks()  # (a copy from before a seek does not go back)
            for store, timed_out in ((self._inflight, True), (self._deferred, False)):
                while True:
                    n, nbytes = store.pop_expired(now, self._scratch) if timed_out else \
                        store.pop_due(now, self._scratch)
                    if not n:
                        break
                    records = bytes(self._scratch[:nbytes])
                    self._store(records, n, now)
                    if timed_out:
                        tracing_on = self._tracing()
                        if tracing_on is not None:
                            tracing_on[0].records(records, n, tracing.TIMEOUT, tracing_on[1])
                    store.release()
                    total += n
                    if timed_out:
                        self.timeout_count += n
                        self.ring.count_local_timeouts(n)  # (the channel's, in /stats)
            if total:
                self._publish_info()
        return total

    def _next_due(self):
        times = [t for t in (self._inflight.next_deadline(), self._deferred.next_due()) if t >= 0]
        return min(times) if times else -1

    def _start_timer(self, due_ns):
        """The timer thread is to look at a deadline or due time `due_ns`
        (the lock held): started, or woken unless it wakes before then
        anyway (_timer_due, which it sets under the lock before it sleeps:
        a wake per delivery cost the delivery a thread switch)."""
        if self._timer is not None and self._timer.is_alive():
            if 0 <= self._timer_due <= due_ns:
                return
        else:
            self._timer = threading.Thread(target=_run_timer, args=(weakref.ref(self),),
                                           name=f"nsqshm-timeouts-{self.queue}", daemon=True)
            self._timer.start()
        self._wake.set()

    # -- closing -------------------------------------------------------------------------

    def close(self, timeout=5.0):
        """Put every message still held back into the channel (waiting up to
        `timeout` s for room), then remove this consumer's arena.  Messages
        that cannot go back stay in the arena for the broker to recover."""
        if self.closed:
            return
        self.closed = True
        if os.getpid() != self._pid:
            return  # a forked child: the arena and rings are the parent's
        self._wake.set()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.join(1.0)
        with self._lock:
            if self._cursors is not None:
                self._find_lanes()  # (a lane made since the delivery takes its own)
                self._check_seeks()
            try:  # (a deferred one goes back now too)
                left = leave(self.arena, self.ring, self.queue, timeout, self._cursors,
                             self._subscribed, not self._takes_ring, self._lanes.by_partition())
            finally:
                self._subscribed = False
                for reader in self._readers:
                    if reader is not None:
                        reader.close()
                self._lanes.close()
            if not left:
                self.arena.unlink()
            # the tables point into the arena: drop them before unmapping it
            self._inflight = InFlight()
            self._deferred = DeferredQueue()
            self.arena.close()
            self.ring.close()
            if self._cursors is not None:
                for partition in range(len(self._cursors)):
                    self._cursors[partition].close()
        _live.discard(self)

    def __del__(self):
        try:
            self.close(timeout=1.0)
        except Exception:
            pass


def _run_timer(ref):
    """Requeue timed-out and due messages until the consumer is closed or gone."""
    while True:
        consumer = ref()
        if consumer is None or consumer.closed or os.getpid() != consumer._pid:
            return
        consumer.process_timeouts()
        with consumer._lock:
            due = consumer._next_due()
            consumer._timer_due = due if due >= 0 else NEVER
        wake = consumer._wake
        del consumer
        wait = None if due < 0 else max(0.0, (due - time.monotonic_ns()) / 1e9) + 0.001
        wake.wait(wait)
        wake.clear()


def _text(msg_id):
    return bytes(msg_id).decode("ascii", "replace")


@atexit.register
def _close_all():
    for consumer in list(_live):
        if consumer._pid == os.getpid():
            try:
                consumer.close(timeout=1.0)
            except Exception:
                pass
