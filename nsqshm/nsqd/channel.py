"""A channel: its shared-memory ring, in-flight table, deferred queue and
subscribed clients (nsqd's channel.go).

Every message the topic pumps in lands in the channel's ring.  One
dispatcher greenlet per channel moves messages from the ring to ready
clients, each client getting at most RDY minus in-flight, in one C call per
client per round (pop_many_into + InFlight.deliver: frames built, attempts
counted and the message put in flight without a Python object per
message).  Timeouts and deferrals are found by the broker's scan loop
through next_deadline(), never by a timer per message.

Messages are taken from the ring under its consumer lock into the in-flight
table, whose blocks live in the worker's arena in shared memory; a message
leaving the table (requeue, timeout, shutdown) is stored elsewhere before
its block is released.  So no instant of a worker's death loses a message.

With several workers every worker with subscribers runs a dispatcher on
the same ring; only the topic's owner has the disk queue and refills the
ring from it, when its own clients wait, and after any pop or nudge from
another process (a worker's dispatcher, a local consumer) while the disk
queue holds messages.
"""

import os
import random
import struct
import time

import gevent
import gevent.event

from nsqshm._core.inflight import (
    NOT_IN_FLIGHT,
    NOT_OWNER,
    DeferredQueue,
    InFlight,
    latency_percentiles,
)
from nsqshm._core.inflight import count_records as count_packed
from nsqshm._core.ring import SUBSCRIBERS_RETIRED
from nsqshm.nsqd.backend import (
    RingOnly,
    count_records,
    flush_ring,
    memory_first,
    new_backend,
    skip_records,
    write_to_disk,
)
from nsqshm.nsqd.names import is_ephemeral
from nsqshm.nsqd.policies import bounds, policy
from nsqshm.nsqd.tcp import fairshare
from nsqshm.nsqd.tracing import trace
from nsqshm.nsqd.workers.waiting import RingWaker

DELIVER_BATCH = 1024
RETIRED = SUBSCRIBERS_RETIRED  # (see _delete_if_unused)
STATUS_TEXT = {NOT_IN_FLIGHT: "ID not in flight", NOT_OWNER: "client does not own message"}


class ChannelError(Exception):
    pass


class LatencyStream:
    """e2e processing latency (publish to FIN) over --e2e-processing-latency-window-time,
    at the --e2e-processing-latency-percentile quantiles; the samples are kept in C by
    each channel's in-flight table (the last 65536 finishes)."""

    def __init__(self, opts, tables):
        self.opts = opts
        self.tables = tables

    def result(self, sketch_points=0):
        tables = self.tables()
        if not tables:  # a topic without channels has no stream to merge, as in nsqd
            return {"count": 0, "percentiles": None}
        return latency_percentiles(tables, time.time_ns(),
                                   int(self.opts.e2e_processing_latency_window_time * 1e9),
                                   self.opts.e2e_processing_latency_percentile, sketch_points)


class Channel:
    # a log topic's channel (logchannel.py) has no disk queue (the log is its
    # disk) and finishes messages in its partitions' cursors too
    disk_queue = True
    local_subscribers = False  # (logchannel.py: local consumers count in the ring's subscribers)
    direct_clients = 0  # (logchannel.py: clients here that read the logs, not the ring)
    cursors = None

    def __init__(self, topic, name):
        self.topic = topic
        self.nsqd = topic.nsqd
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.ring = self.nsqd.make_ring(f"c.{topic.name}:{name}")
        self.owned = topic.owned and self.disk_queue
        self.backend = (new_backend(self.nsqd, f"{topic.name}:{name}", self.ephemeral)
                        if self.owned else RingOnly())
        self.mem_limit = self.nsqd.opts.mem_queue_size
        self.inflight = InFlight(64)  # grows with use: an idle channel stays small
        self._drops_traced = False  # the dispatcher told inflight to trace its drops
        self.deferred = DeferredQueue(16)
        if self.nsqd.arena is not None:
            self.inflight.use_arena(self.nsqd.arena, f"{topic.name}:{name}")
            self.deferred.use_arena(self.nsqd.arena, f"{topic.name}:{name}")
        policy.inherit(self)  # self.policy: None unless a TTL or max attempts applies
        self.clients = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.e2e = None
        if self.nsqd.opts.e2e_processing_latency_percentile:
            self.inflight.enable_latency()
            self.e2e = LatencyStream(self.nsqd.opts, lambda: [self.inflight])
        self._ready = gevent.event.Event()
        self.wakes = 0  # wake() calls (gevent's Event has no count)
        self._refill_wake = gevent.event.Event()
        # pushes wake the dispatcher, pops and nudges the refiller
        self._waker = RingWaker(self.ring, self._ready, self._refill_wake)
        self._refiller = None
        self.scratch = self.nsqd.scratch  # the worker's buffers (scratch.py)
        if self.owned:
            self.ring.disk_backlog = bool(self.backend.depth)
            self.ring.paused = False  # a peer's or nsqd.dat's pause comes right after
            if self.backend.depth:
                self._start_refiller()
        if not self.ephemeral and topic.owned:
            self._load_deferred()
        self._dispatcher = None  # from the first client on: a worker without clients runs none

    def __repr__(self):
        return f"<Channel {self.topic.name}:{self.name}>"

    # -- clients --------------------------------------------------------------------

    def add_client(self, client):
        if self.exiting:
            raise ChannelError("exiting")
        if client.id not in self.clients:
            # every worker's clients count, in the ring's header: the limit
            # holds for the broker, even for SUBs on two workers at once
            limit = self.nsqd.opts.max_channel_consumers
            count = self.ring.add_subscribers(1)
            if count >= RETIRED:  # an ephemeral channel another worker is deleting
                self.ring.add_subscribers(-1)
                raise ChannelError("exiting")
            if count > limit > 0:
                self.ring.add_subscribers(-1)
                raise ChannelError(
                    f"consumers for {self.topic.name}:{self.name} exceeds limit of {limit}")
        self.clients[client.id] = client
        if self._dispatcher is None:
            self._dispatcher = gevent.spawn(self._dispatch)
        self.wake()

    def clients_taking(self, partition):
        """How many of the channel's clients on this worker take `partition`:
        those that named it and those that named none (they take every
        partition); any client when `partition` is negative (none named)."""
        if partition < 0:
            return len(self.clients)
        return sum(1 for c in self.clients.values() if c.partition in (None, partition))

    def remove_client(self, client):
        if self.clients.pop(client.id, None) is None:
            return
        if not self.exiting:  # (a closed ring: the next worker's start recounts)
            self.ring.add_subscribers(-1)
        if not self.clients and self.ephemeral:
            if self.nsqd.cluster is None:
                self.topic.delete_channel(self.name)
            else:
                gevent.spawn(self._delete_if_unused)

    def _delete_if_unused(self):
        """An ephemeral channel goes when no worker has a client on it.  The
        broker's subscriber count (ring header) decides, atomically: adding
        RETIRED to a count of 0 claims the deletion, and a SUB on any worker
        that then adds 1 sees the mark and subscribes afresh; a SUB that came
        first makes the claim fail.  (Asking the workers was check-then-act:
        a SUB on another worker in between was closed with the channel.)"""
        if self.clients or self.exiting or self.topic.channels.get(self.name) is not self:
            return
        if self.ring.add_subscribers(RETIRED) != RETIRED:
            self.ring.add_subscribers(-RETIRED)
            return
        self.topic.delete_channel(self.name)

    def wake(self):
        """Something changed that may let the dispatcher deliver (counted: a
        dispatcher about to wait checks that nothing came since its round began)."""
        self.wakes += 1
        self._ready.set()

    # -- FIN / REQ / TOUCH --------------------------------------------------------------

    def _failed(self, status, msg_id):
        """A FIN, REQ or TOUCH that failed: a message in flight to a client of
        another worker is one this client does not own, as in one nsqd."""
        if status == NOT_IN_FLIGHT and self.nsqd.in_flight_elsewhere(self.topic.name, self.name,
                                                                      msg_id):
            status = NOT_OWNER
        return ChannelError(STATUS_TEXT[status])

    @property
    def traced(self):
        """Tracing is on for this channel or its topic (trace.py)."""
        return trace.traced(self.nsqd, self.topic.name, self.name)

    def _trace_drops(self, traced):
        """Tell the in-flight table whether to record what its deliver() drops
        (expired, sampled out, filtered out), when that changed."""
        if traced != self._drops_traced:
            if traced:
                self.inflight.trace_drops(*trace.drop_tracing(self))
            else:
                self.inflight.trace_drops(None)
            self._drops_traced = traced

    def finish(self, client, msg_id):
        status = self.inflight.finish(msg_id, client.id)
        if status:
            raise self._failed(status, msg_id)
        if self.traced:
            trace.message_event(self, "FIN", msg_id, client)
        client.in_flight -= 1
        client.finish_count += 1
        self.wake()

    def requeues_in_c(self):
        """Whether a REQ can be applied by the C command parser: not when a
        max-attempts policy may dead-letter it, nor on a log topic."""
        return self.cursors is None and (self.policy is None or not self.policy.max_attempts)

    def next_ordered(self, finisher=None):
        """A FIN may let an ordered lane move on (a log channel's lanes:
        logchannel.py); a classic channel has none.  How many went to the
        finisher."""
        return 0

    def commands_applied(self, client, parser):
        """What a CommandParser.parse applied for client (FIN, REQ, TOUCH),
        once per call: counted (count_applied); then the client, in its own
        reader, takes its next messages (refill_finisher) if the FINs and
        REQs left room in a client that had none, as nsqd's messagePump
        takes the next once its client is ready again (RDY 1, go-nsq's and
        pynsq's default, and any consumer at its RDY: no wake of the
        dispatcher nor of the writer, no round, a message a send).  A round
        of the dispatcher unless refill_finisher says none is needed: the
        client got back as many as were freed, so its in-flight count, and
        its readiness, are as before (a dispatcher with no ready client
        waits unarmed, so one must run when it is not)."""
        full = client.in_flight >= client.ready_count
        self.count_applied(client, parser)
        freed = parser.finished + parser.requeued
        if freed and not self.refill_finisher(client, parser.finished, freed, full):
            self.wake()

    def refill_finisher(self, client, finished, freed, full):
        """The client's next messages from the ring, delivered from its
        reader (commands_applied), if it was full before its FINs: what a
        dispatcher round would give it, and sent at once if that fills it
        again (else held as kick() holds them).  Whether it got back as many
        as were freed (no round needed).  Not after a REQ (freed past
        finished): the message put back would come straight back to it,
        where nsqd gives it to whichever consumer is ready (the round's)."""
        if not full or freed > finished or self.paused or client.ext_view is not None \
                or not client.is_ready():
            return False  # (an ext client may leave a head for another's tag: the dispatcher's)
        ring = self.ring
        if not ring.depth:
            return False
        deadline = time.monotonic_ns() + client.msg_timeout_ns
        with self.scratch.borrow() as scratch:
            n = self.ring_to_client(ring, client, client.ready_count - client.in_flight,
                                    scratch, deadline)
        if self.policy is not None and self.policy.dead_letter_expired:
            policy.flush_expired(self)  # what expired in the C call
        if n <= 0:
            return False
        self.nsqd.schedule_scan(deadline)
        if ring.depth:
            fairshare.delivered(self.nsqd)  # (publishers yield to it, as to a round)
        client.send_or_hold()
        return n >= freed

    def ring_to_client(self, ring, client, room, scratch, deadline):
        """Up to `room` of a ring's messages to one client, outside the
        dispatcher (refill_finisher; a log channel's lanes): one C call
        (InFlight.deliver_from_ring) frames them into its output buffer and
        puts them in flight; counted and traced.  How many; the caller sends
        them and schedules the timeout scan."""
        self._trace_drops(self.traced)  # (as a round begins: the C call's drops are events)
        base = len(client.out)
        _, n = self.inflight.deliver_from_ring(
            ring, min(room, DELIVER_BATCH), scratch, client.out, client.id, deadline,
            client.sample_rate, None, client.detail, client.detail_log)
        if n > 0:
            if self.traced:
                trace.delivered(self, client, client.out, base)
            client.in_flight += n
            client.message_count += n
        return n

    def count_applied(self, client, parser):
        """Account what a CommandParser.parse applied for client: REQs
        without a delay stored, then the in-flight blocks of every REQ
        released."""
        finished, requeued = parser.finished, parser.requeued
        client.in_flight -= finished + requeued
        client.finish_count += finished
        if requeued:
            client.requeue_count += requeued
            self.requeue_count += requeued
            records = parser.take_requeued()
            if records:
                self.put_records(records)
            self.inflight.release()  # stored again: the in-flight blocks can go
        if parser.scan_by >= 0:
            self.nsqd.schedule_scan(parser.scan_by)

    def requeue(self, client, msg_id, delay):
        msg = self.inflight.requeue(msg_id, client.id)
        if isinstance(msg, int):
            raise self._failed(msg, msg_id)
        client.in_flight -= 1
        client.requeue_count += 1
        self.requeue_count += 1
        if self.traced:
            trace.message_event(self, "REQ", msg_id, client, delay_ms=int(delay * 1000))
        if self.policy is not None and self.policy.max_attempts and not policy.dead_letter(
                self, bytearray(len(msg).to_bytes(4, "little") + msg), "requeued"):
            pass  # at max attempts: gone to the dead-letter topic
        elif delay > 0:
            self.defer(msg, delay)
        else:
            self.put_records(len(msg).to_bytes(4, "little") + msg)
        self.inflight.release()  # stored again: the in-flight block can go
        self.wake()

    def touch(self, client, msg_id):
        """Move the deadline to now + msg_timeout, but never past delivery +
        --max-msg-timeout (the deadline set at delivery tells when that was)."""
        first = self.inflight.get_first_deadline(msg_id)
        if first < 0:
            raise self._failed(NOT_IN_FLIGHT, msg_id)
        delivered = first - client.msg_timeout_ns
        new_deadline = min(time.monotonic_ns() + client.msg_timeout_ns,
                           delivered + int(self.nsqd.opts.max_msg_timeout * 1e9))
        status = self.inflight.touch(msg_id, client.id, new_deadline)
        if status:
            raise self._failed(status, msg_id)
        if self.traced:
            trace.message_event(self, "TOUCH", msg_id, client)
        self.nsqd.schedule_scan(new_deadline)

    # -- putting messages in -------------------------------------------------------------

    def put_records(self, packed, keep_rest=True):
        """Store packed records: the ring up to --mem-queue-size, then the
        owner's disk queue; what the disk cannot take (a full disk), or a
        worker without the disk queue, the ring past the limit as far as its
        bytes go.  What is still left: with keep_rest deferred for 0.1 s (in
        the arena: kept through a death) and tried again; else left to the
        caller (the topic's pump, which waits).  Returns how many records
        were left (0 with keep_rest).  The topic pump counts message_count;
        requeues, timeouts and deferred messages coming due do not count,
        as in nsqd."""
        if self.policy is not None and bounds.drops(self.policy):
            skip = bounds.trim_channel(self, packed, count_packed(packed, len(packed)))
            if skip:  # (oldest out first: the batch's own head too)
                packed = skip_records(packed, skip)
        _, view = memory_first(self.ring, self.backend, packed, self.mem_limit)
        if view and self.owned:
            if self.ephemeral:  # past the limit: dropped, as nsqd's dummy backend does
                if self.traced:
                    trace.records_event(self.nsqd, "DROPPED", self.topic.name, self.name, view,
                                        count_records(view), trace.DROP_EPHEMERAL)
                return 0
            done, err = write_to_disk(self.backend, view)
            if done and self.traced:
                trace.records_event(self.nsqd, "DISK", self.topic.name, self.name, view, done)
            if err is not None:
                self.nsqd.logf("error", f"TOPIC({self.topic.name}): failed to write message "
                                        f"to backend - {err}")
            self.nsqd.set_health(err)
            if done:
                self.nsqd.backend_written(self.backend)
                self.ring.disk_backlog = True  # then the waiter check: see _dispatch
                if self.ring.depth == 0 and self.ring.waiting_for_data:
                    self._refill(DELIVER_BATCH)  # consumers (of any worker) wait on the ring
                self._start_refiller()
                self.wake()
            if err is None:
                return 0
            view = skip_records(view, done)
        if view:
            _, used = self.ring.push_packed(view)
            view = view[used:]
        if not view:
            return 0
        if keep_rest:
            self._defer_packed(view, 0.1)  # a full ring: try again soon
            return 0
        return count_records(view)

    def _defer_packed(self, view, delay_s):
        pos = 0
        while pos < len(view):
            size = int.from_bytes(view[pos:pos + 4], "little")
            self.defer(view[pos + 4:pos + 4 + size], delay_s)
            pos += 4 + size

    def put_deferred(self, msg, due):
        """A DPUB message for this channel: counted now, delivered when due."""
        self.deferred.push(msg, due)
        self.message_count += 1
        self.nsqd.schedule_scan(due)

    def defer(self, msg, delay_s):
        due = time.monotonic_ns() + int(delay_s * 1e9)
        self.deferred.push(msg, due)
        self.nsqd.schedule_scan(due)

    # -- the dispatcher -----------------------------------------------------------------

    def _dispatch(self):
        ring = self.ring
        while not self.exiting:
            ready = [] if self.paused else [c for c in self.clients.values() if c.is_ready()]
            if not ready:
                self._ready.clear()
                self._ready.wait()
                continue
            if ring.depth == 0:
                if self.backend.depth:
                    self._refill(sum(c.ready_count - c.in_flight for c in ready))
                    continue
                self._ready.clear()
                self._waker.arm()  # before the flag check: the owner refills for armed waiters
                if not self.owned and ring.disk_backlog:
                    ring.nudge()  # wakes the owner's refiller, as a pop would
                if ring.depth == 0 and not self.backend.depth:
                    self._ready.wait()
                ring.disarm()
                continue
            now = time.monotonic_ns()
            wakes = self.wakes
            earliest = None
            left_for_tag = False  # a client left the head message for another's tag (ext.py)
            popped = 0  # the ring's pops when it was left so
            taken_any = False
            traced = self.traced
            self._trace_drops(traced)
            with self.scratch.borrow() as scratch:
                for client in ready:
                    room = client.ready_count - client.in_flight
                    if room <= 0 or client.closed:
                        continue
                    deadline = now + client.msg_timeout_ns
                    base = len(client.out)
                    taken, n = self.inflight.deliver_from_ring(
                        ring, min(room, DELIVER_BATCH), scratch, client.out, client.id, deadline,
                        client.sample_rate, client.ext_view,  # sampled-out: dropped, as nsqd
                        client.detail, client.detail_log)
                    if not taken:
                        if client.ext_view is not None and ring.depth:
                            left_for_tag = True
                            popped = ring.popped
                            continue
                        break
                    taken_any = True
                    if traced:
                        trace.delivered(self, client, client.out, base)
                    client.in_flight += n
                    client.message_count += n
                    client.kick()
                    if earliest is None or deadline < earliest:
                        earliest = deadline
            if earliest is not None:
                self.nsqd.schedule_scan(earliest)
            if self.policy is not None and self.policy.dead_letter_expired:
                policy.flush_expired(self)  # what expired in this round's C calls
            if left_for_tag and not taken_any:
                # the head waits for a consumer of its tag: until a client comes, goes or
                # is ready again here, or any process pops (another worker's consumer);
                # a wake during this round (another worker's consumer of the tag left),
                # or a pop by another process since the head was left (before the arm),
                # makes another round
                self._ready.clear()
                if self.wakes != wakes:
                    continue
                self._waker.arm(for_space=True)
                if ring.depth and not self.exiting and ring.popped == popped:
                    self._ready.wait()
                ring.disarm(for_space=True)
                continue
            if ring.depth:
                fairshare.delivered(self.nsqd)  # (publishers yield to it)
                gevent.idle()  # let writers and readers run between rounds

    def _start_refiller(self):
        if self._refiller is None and not self.exiting:
            self._refiller = gevent.spawn(self._refill_loop)

    def _refill_loop(self):
        """The owner, while its disk queue holds messages: after each pop or
        nudge from any process (a worker's dispatcher, a local consumer),
        top the ring up to a batch from disk.  Nothing moves while nobody
        consumes; nothing polls."""
        ring = self.ring
        try:
            while not self.exiting and self.backend.depth:
                self._waker.arm(for_space=True)
                try:
                    if not ring.waiting_for_data:
                        self._refill_wake.wait()
                finally:
                    ring.disarm(for_space=True)
                self._refill_wake.clear()
                # up to --mem-queue-size (at least a batch): a fast consumer should not
                # wait a round trip per batch
                target = max(DELIVER_BATCH, self.mem_limit)
                while self.backend.depth and ring.depth < target and not self.exiting:
                    before = ring.depth
                    self._refill(DELIVER_BATCH)
                    if ring.depth <= before:
                        break  # the ring is full (bytes)
                    gevent.idle()
        finally:
            self._refiller = None

    def _refill(self, wanted):
        """Move up to `wanted` messages from the disk queue into the ring,
        the disk's read position advancing only past what the ring took."""
        with self.scratch.borrow() as scratch:
            n, nbytes = self.backend.peek_into(scratch, max(1, min(wanted, DELIVER_BATCH)))
            if n:
                done, _ = self.ring.push_packed(memoryview(scratch)[:nbytes])
                self.backend.advance(done)
                self.nsqd.backend_written(self.backend)
        if not self.backend.depth:
            self.ring.disk_backlog = False

    # -- the scan loop's work ---------------------------------------------------------

    def process_timeouts(self, now):
        """Requeue messages whose in-flight deadline passed; returns how many."""
        total = 0
        with self.scratch.borrow() as scratch:
            while True:
                n, nbytes = self.inflight.pop_expired(now, scratch)
                if not n:
                    break
                total += n
                view = memoryview(scratch)[:nbytes]
                if self.traced:
                    trace.timed_out(self, view, n)
                if self.policy is not None and self.policy.max_attempts:
                    view = policy.dead_letter(self, view, "timed_out")  # per batch, in C
                if len(view):
                    self.put_records(view)
                self.inflight.release()
        if total:
            self.timeout_count += total
            for client in self.clients.values():
                client.in_flight = self.inflight.client_count(client.id)
            self.wake()
        return total

    def process_deferred(self, now):
        total = 0
        with self.scratch.borrow() as scratch:
            while True:
                n, nbytes = self.deferred.pop_due(now, scratch)
                if not n:
                    break
                total += n
                self.put_records(memoryview(scratch)[:nbytes])
                self.deferred.release()
        return total

    def next_deadline(self):
        deadlines = [d for d in (self.inflight.next_deadline(), self.deferred.next_due()) if d >= 0]
        return min(deadlines) if deadlines else -1

    # -- pause, empty, delete ------------------------------------------------------------

    def pause(self):
        self.paused = True
        self.ring.paused = True  # local consumers honour it
        self.nsqd.broadcast_change("channel_pause", self.topic.name, self.name)

    def unpause(self):
        self.paused = False
        self.ring.paused = False
        self.wake()
        self.nsqd.broadcast_change("channel_unpause", self.topic.name, self.name)

    @property
    def depth(self):
        return self.ring.depth + self.backend.depth

    @property
    def backend_depth(self):
        return self.backend.depth

    def empty(self):
        with self.scratch.borrow() as scratch:
            while self.ring.pop_many_into(scratch)[0]:
                pass
        self._drop_held()
        self.backend.empty()
        if self.owned:
            self.ring.disk_backlog = False
            self._refill_wake.set()
        for client in self.clients.values():
            client.in_flight = 0
        self.wake()
        self.nsqd.broadcast_change("channel_empty", self.topic.name, self.name)

    def _stop_greenlets(self):
        if self._dispatcher is not None:
            self._dispatcher.kill(block=False)
        if self._refiller is not None:
            self._refiller.kill(block=False)

    def _drop_held(self):
        """Forget this worker's in-flight and deferred messages (empty, delete)."""
        with self.scratch.borrow() as scratch:
            while self.inflight.drain(scratch)[0]:
                pass
            while self.deferred.drain(scratch)[0]:
                pass
        self.inflight.release()
        self.deferred.release()

    def close(self, delete=False):
        """Stop the dispatcher.  delete: drop everything and close the clients.
        Otherwise (shutdown): the ring's and the in-flight messages go to the
        disk queue, deferred ones to the deferred file with their due times."""
        self.exiting = True
        self._stop_greenlets()
        if delete:
            for client in list(self.clients.values()):
                client.close()
            self.clients.clear()
            self._drop_held()
            if self.nsqd.arena is not None:  # its entry in the arena's queue table: free
                self.nsqd.arena.forget_queue(f"{self.topic.name}:{self.name}")
            self.backend.delete()
            self._remove_deferred_file()
            self.ring.unlink()
        else:
            self.give_back()
            with self.scratch.borrow() as scratch:
                if flush_ring(self.ring, self.backend, scratch, self.nsqd):
                    self.backend.close()
                    self.ring.unlink()
        self._waker.close()
        self.ring.close()

    def leave(self):
        """Let go of a channel that stays (made again around its ring: a peer's
        delete, NSQD.delete_topic): its clients are closed and no longer
        counted in the ring; in-flight and deferred messages go back into the
        ring now (a deferred file would wait for the next start), which stays
        with its disk queue."""
        self.exiting = True
        self._stop_greenlets()
        held = len(self.clients)
        for client in list(self.clients.values()):
            client.close()
        self.clients.clear()
        if held:
            self.ring.add_subscribers(-held)
        self._return_in_flight()
        with self.scratch.borrow() as scratch:
            while True:  # deferred ones due now: delivered early rather than late
                due = self.deferred.next_due()
                if due < 0:
                    break
                n, nbytes = self.deferred.pop_due(due, scratch)
                if n:
                    self.put_records(memoryview(scratch)[:nbytes])
            self.deferred.release()
        self.close_handles(sync=True)

    def give_back(self):
        """Shutdown: in-flight messages back into the channel, deferred ones to
        this worker's deferred file, each block released once stored."""
        self._stop_greenlets()
        self._return_in_flight()
        if not self.ephemeral:
            self._save_deferred()

    def _return_in_flight(self):
        """Every in-flight message back into the channel, each block released
        once stored."""
        with self.scratch.borrow() as scratch:
            while True:
                n, nbytes = self.inflight.drain(scratch)
                if not n:
                    break
                self.put_records(memoryview(scratch)[:nbytes])
                self.inflight.release()

    def close_handles(self, sync=False):
        """Stop using the channel, its messages left where they are."""
        self.exiting = True
        self._stop_greenlets()
        if sync:
            self.backend.close()
        self._waker.close()
        self.ring.close()

    # -- deferred messages across a restart -------------------------------------------
    #
    # <data-path>/<topic>:<channel>.deferred.dat (worker 0; worker i writes
    # .deferred.w<i>.dat), written at shutdown, read by the topic's owner and
    # removed at start; per message, big-endian:
    #
    #   [ 8-byte due time, ns since the epoch ][ 4-byte size ][ message ]

    @property
    def deferred_path(self):
        worker = f".w{self.nsqd.index}" if self.nsqd.index else ""
        return os.path.join(self.nsqd.data_path,
                            f"{self.topic.name}:{self.name}.deferred{worker}.dat")

    def _deferred_files(self):
        prefix = f"{self.topic.name}:{self.name}.deferred"
        try:
            names = os.listdir(self.nsqd.data_path)
        except OSError:
            return []
        return [os.path.join(self.nsqd.data_path, n) for n in sorted(names)
                if n.startswith(prefix) and n.endswith(".dat")
                and (n == prefix + ".dat" or n[len(prefix):len(prefix) + 2] == ".w"
                     and n[len(prefix) + 2:-4].isdigit())]  # not channel "<c>.deferred.w1"'s

    def _save_deferred(self):
        wall_minus_mono = time.time_ns() - time.monotonic_ns()
        parts = []
        with self.scratch.borrow() as scratch:
            while True:
                due = self.deferred.next_due()
                if due < 0:
                    break
                n, nbytes = self.deferred.pop_due(due, scratch)
                pos = 0
                for _ in range(n):
                    size = int.from_bytes(scratch[pos:pos + 4], "little")
                    parts.append(struct.pack(">qI", due + wall_minus_mono, size)
                                 + scratch[pos + 4:pos + 4 + size])
                    pos += 4 + size
        if not parts:  # (a file written earlier in this shutdown stays)
            return
        self._write_deferred(parts)
        self.deferred.release()  # on disk now

    def _write_deferred(self, parts):
        try:  # a second save in one shutdown adds to the first
            with open(self.deferred_path, "rb") as f:
                parts.insert(0, f.read())
        except FileNotFoundError:
            pass
        tmp = f"{self.deferred_path}.{random.getrandbits(31)}.tmp"
        with open(tmp, "wb") as f:
            f.write(b"".join(parts))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.deferred_path)

    def _load_deferred(self):
        for path in self._deferred_files():
            self._load_deferred_file(path)

    def _load_deferred_file(self, path):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        mono_minus_wall = time.monotonic_ns() - time.time_ns()
        pos = 0
        while pos + 12 <= len(data):
            due, size = struct.unpack_from(">qI", data, pos)
            if pos + 12 + size > len(data) or size < 26:
                self.nsqd.logf("error", f"{path}: truncated at byte {pos}")
                break
            due_mono = due + mono_minus_wall
            self.deferred.push(data[pos + 12:pos + 12 + size], due_mono)
            self.nsqd.schedule_scan(due_mono)
            pos += 12 + size
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def _remove_deferred_file(self):
        try:
            os.unlink(self.deferred_path)
        except FileNotFoundError:
            pass

