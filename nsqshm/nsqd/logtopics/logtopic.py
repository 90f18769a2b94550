"""A log topic: a topic whose messages are appended to partition logs on
disk (commitlog.pyx) and whose channels are cursors into them
(logchannel.py), after the Youzan fork of NSQ.

Made only by `POST /topic/create?topic=T&partition_num=N` (Youzan's
parameter names, with retention_days and retention_bytes); a PUB to an
unknown name still makes a classic topic, and a classic topic stays one.
What kind a topic is, its partition count and retention are kept in
<data-path>/nsqshm.logtopics.json (logspecs.py; worker 0 writes it, atomically; nsqd.dat
stays as nsqd writes it, the log topics listed there as topics with their
channels, so that a Go nsqd can still read it):

    {"topics": [{"name": "T", "partition_num": 4, "retention_days": 7,
                 "retention_bytes": -1}], "version": 1}

Publishing: a plain PUB or MPUB on a worker goes to a partition that
worker owns, round-robin over them, so each worker appends to its own logs
with no hop between processes; a worker that owns none (fewer partitions
than workers) hands the records to an owner through the partition's
inbound ring (partition.py), round-robin over all partitions.  `PUB T p`
and `MPUB T p` (Youzan's) name the partition.  OK is sent once the records
are in the log (written: in the page cache, so a process's death keeps
them) or in the inbound ring (shared memory, as a classic topic's ring).

Retention: every RETENTION_INTERVAL the owner of a partition deletes whole
old segments past retention_days or retention_bytes, then moves a channel
whose cursor fell below the log start to the start (logged, counted in its
stats), and checkpoints the cursors that moved.
"""

import base64
import time

import gevent
import gevent.event

from nsqshm._core.commitlog import MESSAGE_HEADER
from nsqshm._core.commitlog import RECORD_HEADER as LOG_RECORD_HEADER
from nsqshm._core.inflight import DeferredQueue
from nsqshm._core.logcursor import log_message_id
from nsqshm.nsqd.backend import DummyBackend
from nsqshm.nsqd.channel import LatencyStream
from nsqshm.nsqd.logtopics.logchannel import LogChannel
from nsqshm.nsqd.logtopics.partition import Partition
from nsqshm.nsqd.topic import Topic, TopicError
from nsqshm.nsqd.tracing import trace
from nsqshm.youzan.go_strconv import atoi

MAX_PARTITIONS = 255  # Youzan's MAX_PARTITION_NUM: partition ids 0..254 (its lookupd's too)
RETENTION_INTERVAL = 1.0   # seconds between retention passes (on partition owners)
MAX_RETENTION_DAYS = 36500
MAX_RETENTION_BYTES = (1 << 63) - 1  # PartitionLog.apply_retention's long long
MAX_SYNC_EVERY = (1 << 63) - 1  # a partition log's sync_every, a long long
DEFERRED_RETRY = 0.1       # seconds: a due DPUB message that could not be appended waits this


class LogTopicError(Exception):
    """A /topic/create that cannot be done: .code is the HTTP error text."""

    def __init__(self, code, status=400):
        super().__init__(code)
        self.code = code
        self.status = status


class PartitionError(TopicError):
    """A PUB naming a partition the topic does not have."""


class NoSuchPartition(PartitionError):
    """A PUB naming a partition number the topic does not have: Youzan's preparePub
    finds no such topic partition on the node (E_TOPIC_NOT_EXIST, no text)."""
    youzan_code, youzan_text = "E_TOPIC_NOT_EXIST", ""


class PartitionNeeded(PartitionError):
    """A PUB without a partition on an ordered topic (Youzan's preparePub)."""
    youzan_text = "topic partition is not valid for multi partition: -1"

    def __init__(self):
        super().__init__("an ordered topic takes a PUB to a partition only")


def partition_word(word):
    """A PUB's partition as Youzan reads it (Go's strconv.Atoi, on the wire and in
    HTTP's `partition=`): the number, None for -1 (any partition), or the word as
    it came when Atoi does not take it (LogTopic.partition refuses it with Atoi's
    error; a classic topic ignores it)."""
    try:
        number = atoi(word)
    except ValueError:
        return word
    return None if number == -1 else number


def _go_int(value):
    """An int as stored, or a query's text as Go's strconv.Atoi reads it (ASCII
    digits and a sign only, within int64: "1_0", " 2" and other digits are not)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"not a number: {value!r}")
    return atoi(value) if isinstance(value, str) else value


def make_spec(name, partition_num, retention_days=-1, retention_bytes=-1, sync_every=0,
              ordered=False):
    """A log topic's definition, validated (LogTopicError with the HTTP text).
    sync_every: Youzan's syncdisk, an fsync of a partition's log every that
    many messages (0: the broker's --sync-every).  ordered: Youzan's
    orderedmulti, a topic consumed with SUB_ORDERED only, published to by
    partition only."""
    try:
        partitions = _go_int(partition_num)
    except (TypeError, ValueError):
        raise LogTopicError("INVALID_PARTITION_NUM") from None
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise LogTopicError("INVALID_PARTITION_NUM")  # 1..MAX_PARTITIONS
    try:
        days = _go_int(retention_days)
        size = _go_int(retention_bytes)
    except (TypeError, ValueError):
        raise LogTopicError("INVALID_RETENTION") from None
    if days == 0 or days > MAX_RETENTION_DAYS or days < -1 or size == 0 or size < -1 \
            or size > MAX_RETENTION_BYTES:
        raise LogTopicError("INVALID_RETENTION")
    try:  # (a query's text within int64 by Atoi; a number stored by an older build,
        # which took any, kept as the most there is: an fsync as good as never)
        every = min(_go_int(sync_every), MAX_SYNC_EVERY)
    except (TypeError, ValueError):
        raise LogTopicError("INVALID_ARG_TOPIC_SYNC_DISK") from None
    if every < 0:
        raise LogTopicError("INVALID_ARG_TOPIC_SYNC_DISK")
    return {"name": name, "partition_num": partitions, "retention_days": days,
            "retention_bytes": size, "sync_every": every, "ordered": bool(ordered)}


class _NoOverflow:
    """A log topic never overflows to a worker's disk queue (the log takes it)."""
    depth = 0

    def stop(self):
        pass

    def close(self):
        pass

    def delete(self):
        pass

    def empty(self):
        pass


def append_for_peer(nsqd, msg):
    """Peer op "log_append": a traced publish another worker took for a
    partition this worker owns (LogTopic._append_on_owner)."""
    topic = nsqd.topics.get(msg.get("topic"))
    if not isinstance(topic, LogTopic):
        return {"moved": "no such log topic here"}
    try:
        target = topic.partition(int(msg["partition"]))
        records = bytearray(base64.b64decode(msg["records"], validate=True))
        count, body_bytes = int(msg["count"]), int(msg["bytes"])
    except (KeyError, TypeError, ValueError, PartitionError) as err:
        return {"error": f"bad log_append: {err}"}
    if not target.owned or topic.exiting:
        return {"moved": "not the owner"}
    trace.publisher.client = msg.get("client")
    trace.publisher.trace_ids = msg.get("trace_ids")
    first = -1
    try:
        target.drain_inbound()  # what that worker pushed before goes first
        first = target.log.end_offset if target.log is not None else 0
        topic.append_here(target, records, count, body_bytes)
        return {"first": first, "queue_offset": trace.queue_offset()}
    except TopicError as err:
        return {"error": str(err)}
    except Exception as err:  # (say, the trace's table unwritable) after the append?
        if first >= 0 and target.log is not None and target.log.end_offset > first:
            nsqd.logf("warn", f"TOPIC({topic.name}): traced publish stored, not traced - {err}")
            return {"first": first, "queue_offset": trace.queue_offset()}
        return {"error": str(err)}
    finally:
        trace.publisher.client = trace.publisher.trace_ids = None
        trace.publisher.queue_offset = 0


class LogTopic(Topic):
    channel_class = LogChannel
    is_log = True
    stored_overhead = LOG_RECORD_HEADER  # a log record's size, CRC and offset

    def __init__(self, nsqd, name, spec):
        # not Topic.__init__: no topic ring, disk queue nor pump; the partitions
        # take what they did
        self.nsqd = nsqd
        self.name = name
        self.spec = spec
        self.ephemeral = False
        self.owned = nsqd.owns(name)   # the ring and deferred files of its channels
        self.backend = DummyBackend()
        self.overflow = _NoOverflow()
        self.adopted = []
        self.mem_limit = nsqd.opts.mem_queue_size
        self.channels = {}
        self._paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        # DPUB messages waiting for their time, in the worker's arena as queue
        # "<topic>:" (put_deferred); appended to a partition's log when due
        self.deferred_waiting = DeferredQueue()
        if nsqd.arena is not None:
            self.deferred_waiting.use_arena(nsqd.arena, f"{name}:")
        self._deferred_wake = gevent.event.Event()
        self._deferred = None
        # delivery policies (policy.py) apply to a log topic's channels only: a
        # bound or a TTL of the topic would need the topic ring it has not
        self.policy = None
        self.bounded = []
        self.e2e = None
        if nsqd.opts.e2e_processing_latency_percentile:
            self.e2e = LatencyStream(nsqd.opts, lambda: [c.inflight for c in self.channels.values()])
        self._wake = gevent.event.Event()
        self._emptied = 0
        self._pump = None
        self.partitions = [Partition(self, i) for i in range(spec["partition_num"])]
        self._owned = [p for p in self.partitions if p.owned]
        self._turn = 0
        self._retention = gevent.spawn(self._retention_loop) if self._owned else None

    def __repr__(self):
        return f"<LogTopic {self.name} ({len(self.partitions)} partitions)>"

    @property
    def ordered(self):
        """Youzan's ordered topic (orderedmulti): SUB_ORDERED only, PUB by partition."""
        return self.spec.get("ordered", False)

    # -- publishing -----------------------------------------------------------------

    def partition(self, index):
        """The partition `index` names: an int, or the text of one that Go's
        strconv.Atoi did not take (PartitionError with Atoi's error, as Youzan's);
        NoSuchPartition for a number out of range."""
        if isinstance(index, str):
            try:
                index = atoi(index)
            except ValueError as err:
                raise PartitionError(str(err)) from None
        if not 0 <= index < len(self.partitions):
            raise NoSuchPartition(f"partition {index} out of range 0-{len(self.partitions) - 1}")
        return self.partitions[index]

    def put_packed(self, packed, count, body_bytes, partition=None):
        if self.exiting:
            raise TopicError("exiting")
        packed = self.ext_records(packed, count)
        if partition is not None:
            target = self.partition(partition)
        elif self.ordered:  # (the publisher keeps its order by choosing the partition)
            raise PartitionNeeded()
        else:
            # (cluster mode: the partitions this node leads, this worker's first)
            led = [p for p in self.partitions if p.replica is not None and p.writable]
            pool = [p for p in led if p.owned] or led or self._owned or self.partitions
            target = pool[self._turn % len(pool)]
            self._turn += 1
        if target.owned:
            self.append_here(target, packed, count, body_bytes)
            return
        if target.replica is not None:  # cluster mode: the owner replicates (replica.py)
            target.replica.forward(target, packed)
        elif trace.wanted(self.nsqd, self.name) and self._append_on_owner(
                target, packed, count, body_bytes):
            return
        elif not target.push_inbound(packed):
            raise TopicError(f"partition {target.index} inbound ring is full")
        self.message_count += count
        self.message_bytes += body_bytes
        trace.published(self.nsqd, self.name, packed, count)

    def append_here(self, target, packed, count, body_bytes):
        """Append to a partition this worker owns; its IDs in packed become
        the log's (a traced answer's and the trace's).  What other workers
        pushed into the partition's inbound ring goes first: they answered OK
        for it already, so a publisher that got that OK from one worker and
        then publishes through this one keeps its order in the partition."""
        try:
            target.drain_inbound()
            first = target.log.end_offset if target.log is not None else 0
            # Youzan's traced answer names where the first message went: its
            # virtual (byte) offset in the partition, BackendOffset
            trace.publisher.queue_offset = (target.log.virtual_end if target.log is not None
                                            else 0)
            target.append(packed)
        except ValueError as err:  # a message larger than a segment takes
            raise TopicError(str(err)) from None
        except OSError as err:
            self.nsqd.set_health(err)
            raise TopicError(str(err)) from None
        self.message_count += count
        self.message_bytes += body_bytes
        trace.published(self.nsqd, self.name, packed, count, target.index, first)

    def _append_on_owner(self, target, packed, count, body_bytes):
        """A traced publish to a partition another worker owns: the owner
        appends it now (peer op "log_append", append_for_peer), so the answer
        names the log's ID and queue offset, as on the owner, and the trace
        its log IDs.  False when the owner says it no longer has the partition
        (a worker restarting): the inbound ring takes it (offset 0 in the
        answer).  No answer at all is an error (TopicError): the owner may have
        appended it, and the ring would store it twice; the client publishes
        again, as after any failed PUB."""
        ids = getattr(trace.publisher, "trace_ids", None)
        reply = self.nsqd.cluster.call(target.owner, {
            "op": "log_append", "topic": self.name, "partition": target.index,
            "records": base64.b64encode(packed).decode(), "count": count,
            "bytes": body_bytes, "client": getattr(trace.publisher, "client", None),
            "trace_ids": [int(i) for i in ids] if ids else None})
        if reply is None:
            raise TopicError(f"partition {target.index}'s owner did not answer")
        if not isinstance(reply, dict) or "moved" in reply:
            self.nsqd.logf("warn", f"TOPIC({self.name}): partition {target.index}'s owner "
                                   f"did not append a traced publish ({reply}); inbound ring")
            return False
        if "error" in reply:
            raise TopicError(str(reply["error"]))
        trace.publisher.queue_offset = int(reply["queue_offset"])
        if isinstance(packed, bytearray):  # the first ID as the log's (the traced answer's)
            packed[14:30] = log_message_id(target.index, int(reply["first"]))
        return True

    # -- DPUB -----------------------------------------------------------------------------

    def put_deferred(self, body, delay_s, expires_at=0):
        """DPUB: the message waits in this worker's arena (so a dead worker's
        replacement takes it back: recovery.recover_arena, defer_waiting) and
        is appended to a partition's log when due, as a PUB then: every
        channel's cursor meets it there, as each of nsqd's channels gets a
        DPUB message after its delay.  Counted in the topic when appended."""
        if self.exiting:
            raise TopicError("exiting")
        if any(p.replica is not None for p in self.partitions):
            raise TopicError("deferred publish is not supported on a replicated log topic")
        self.defer_waiting(bytes(self.pack_one(body, expires_at)[4:]),
                           time.monotonic_ns() + int(delay_s * 1e9))

    def defer_waiting(self, msg, due):
        """A DPUB message (a recovered one too) waits until `due` (monotonic ns)."""
        self.deferred_waiting.push(msg, due)
        if self._deferred is None or self._deferred.dead:
            self._deferred = gevent.spawn(self._deferred_loop)
        self._deferred_wake.set()

    def _hand_over_waiting(self, channel):
        """(Topic's: a classic topic's first channel takes the DPUB messages
        that waited for a channel.  A log topic's wait for their time, then
        go into the log, where every channel meets them.)"""

    def _deferred_loop(self):
        """Append the DPUB messages that came due.  Each is appended on its
        own (a DPUB is a command of its own anyway), so one the log refuses
        (an inbound ring full, a disk error) waits DEFERRED_RETRY more
        without holding back the others, and a batch half pushed into an
        inbound ring is never pushed back whole.  The popped blocks are
        released only once each message is appended or pushed back: a death
        in between repeats messages, never loses one."""
        waiting = self.deferred_waiting
        while not self.exiting:
            self._deferred_wake.clear()
            due = waiting.next_due()
            now = time.monotonic_ns()
            if due < 0 or due > now:
                self._deferred_wake.wait(None if due < 0 else (due - now) / 1e9)
                continue
            with self.nsqd.scratch.borrow() as scratch:
                n, nbytes = waiting.pop_due(now, scratch)
                if not n:
                    continue
                self._append_due(memoryview(scratch)[:nbytes], now)
                waiting.release()

    def _append_due(self, records, now):
        waiting = self.deferred_waiting
        retry = now + int(DEFERRED_RETRY * 1e9)
        pos = 0
        while pos < len(records):
            size = int.from_bytes(records[pos:pos + 4], "little")
            one = records[pos:pos + 4 + size]
            pos += 4 + size
            if self.exiting:  # (kept in the arena: the next start takes it back)
                waiting.push(one[4:], now)
                continue
            try:
                self.put_packed(one, 1, size - MESSAGE_HEADER)
            except Exception as err:  # whatever refused it, the message stays
                self.nsqd.logf("warn", f"TOPIC({self.name}): a deferred message waits "
                                       f"{DEFERRED_RETRY}s more - {err}")
                waiting.push(one[4:], retry)

    def appended(self, partition):
        for channel in self.channels.values():
            channel.feed_wake()

    def wake(self):
        """A peer asks (op "want"): a seek on it released a cursor of a
        partition this worker feeds."""
        for channel in self.channels.values():
            channel.feed_wake()

    @property
    def paused(self):
        return self._paused

    @paused.setter
    def paused(self, value):
        """Also in each channel ring's header (Ring.topic_paused): a local
        consumer that reads the logs itself honours it (nsqshm/local)."""
        self._paused = bool(value)
        for channel in list(self.channels.values()):
            if not channel.exiting:
                channel.ring.topic_paused = self._paused

    def unpause(self):
        super().unpause()
        for channel in self.channels.values():
            channel.feed_wake()

    def empty(self):
        """nsqd's topic empty drops what the topic holds for its channels:
        a log topic holds nothing apart from its channels' cursors."""
        self.nsqd.broadcast_change("topic_empty", self.name)

    # -- stats --------------------------------------------------------------------------

    @property
    def published(self):
        """(messages, body bytes) published through this worker, and by local
        producers into the partitions it owns."""
        msgs, body = self.message_count, self.message_bytes
        for partition in self._owned:
            local_msgs, local_body = partition.published_locally
            msgs += local_msgs
            body += local_body
        return msgs, body

    @property
    def depth(self):
        """What waits in the inbound rings for the owners' pumps."""
        return sum(p.inbound.depth for p in self.partitions if p.inbound is not None)

    @property
    def backend_depth(self):
        return 0

    def partition_stats(self):
        out = []
        for p in self.partitions:
            start, end = p.offsets()
            out.append({"partition": p.index, "owner": p.owner, "start_offset": start,
                        "end_offset": end, "synced_offset": p.synced_offset()})
        return out

    # -- retention ---------------------------------------------------------------------

    def _retention_loop(self):
        days, size = self.spec.get("retention_days", -1), self.spec.get("retention_bytes", -1)
        max_age = days * 86400.0 if days > 0 else -1
        while not self.exiting:
            gevent.sleep(RETENTION_INTERVAL)
            for p in self._owned:
                try:
                    p.apply_retention(max_age, size)
                except OSError as err:
                    self.nsqd.logf("error", f"{p}: retention failed - {err}")
                start = p.offsets()[0]
                for channel in list(self.channels.values()):
                    if channel.exiting:
                        continue
                    channel.move_to_start(p, start)
                    channel.checkpoint(p)

    # -- the end ------------------------------------------------------------------------

    def stop_overflow(self):
        pass

    def _stop(self):
        self.exiting = True
        if self._retention is not None:
            self._retention.kill(block=False)
            self._retention = None
        if self._deferred is not None:
            # what still waits stays in the worker's arena: the next start's
            # recovery takes it back with its due time (nsqd.close_arena keeps it)
            self._deferred.kill(block=False)
            self._deferred = None
        for p in self.partitions:
            p.stop()

    def close(self, delete=False):
        """delete: the channels, cursors and logs go.  Otherwise the broker
        stops as a whole (every worker calls this): see LogChannel.close."""
        self._stop()
        for channel in list(self.channels.values()):
            channel.close(delete=delete)
        if delete:
            self.channels.clear()
            self._drop_waiting()
            if self.nsqd.arena is not None:  # its entry in the arena's queue table: free
                self.nsqd.arena.forget_queue(f"{self.name}:")
            for p in self.partitions:
                p.delete()
        else:
            for p in self.partitions:
                p.close(unlink_inbound=True)

    def close_handles(self, sync=False):
        self._stop()
        for channel in list(self.channels.values()):
            channel.close_handles(sync)
        for p in self.partitions:
            p.close()
