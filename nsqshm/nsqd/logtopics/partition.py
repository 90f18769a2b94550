"""One partition of a log topic, as a worker sees it.

Partition p of topic T is owned by worker (crc32(T) + p) % N, so the
partitions of a topic spread over the workers.  Only the owner appends to
the partition's PartitionLog (commitlog.pyx: segment files
<data-path>/<T>-<p>.nsqlog/, flock'd by their writer) and runs its reader
side: each channel's feeder (logchannel.py) on the owner reads the log.
Any worker reads the log's committed positions (LogReader: the state block
is a shared mapping) for /stats.

A publish on a worker that owns no partition of the topic (partitions <
workers), a PUB naming a partition another worker owns, or a local
producer's publish (nsqshm.local, standalone) goes through the partition's
inbound ring, <prefix>.t.<T>:p<p> (':' is in no topic name, so
it never meets a topic's ring): shared memory, kept through any process's
death like a topic ring, and acknowledged once pushed.  The owner's pump
appends what it finds there to the log, then discards it (a death in
between appends the batch again at the next start: at least once).

Records reach the log as the rings carry them ([u32 size][message]);
append_packed gives each message its msg offset and replaces its ID by the
position, 16 hex digits of (p << 48) | offset, in C.
"""

import os
import shutil
import zlib

import gevent
import gevent.event

from nsqshm._core.commitlog import (
    STATE_FILE,
    LogError,
    LogNotMade,
    LogReader,
    PartitionLog,
    partition_dir,
    set_aside_logs,
)
from nsqshm.nsqd.names import inbound_ring_suffix
from nsqshm.nsqd.topic import TopicError
from nsqshm.nsqd.workers.waiting import RingWaker
from nsqshm.ring import RingRetired
from nsqshm.youzan.offset import MSGCOUNT, NOT_SUPPORTED, TIMESTAMP, VIRTUAL_QUEUE, offset_of_count

# the largest segment a partition log takes (commitlog.MAX_SEGMENT_BYTES)
MAX_SEGMENT_BYTES = 1 << 30
MAX_RECORD = 2 << 20     # the largest message a log takes (its staging buffer's half)
INBOUND_WAIT = 1.0       # a PUB waits at most this long for room in an inbound ring
MAX_SECONDS = (2**63 - 1) // 1_000_000_000  # a timestamp position in ns fits an int64
NEVER = 1 << 62          # PartitionLog's own sync policy: off


def partition_owner(topic_name, partition, workers):
    return (zlib.crc32(topic_name.encode()) + partition) % max(1, workers)


def remove_later(path):
    """Remove a log set aside (commitlog.cut_log, make_log_anew) on a thread of the
    hub's pool: a large log's unlinks would stall this worker (its clients, its etcd
    keep-alive, its replication RPC)."""
    if path is not None:
        gevent.get_hub().threadpool.spawn(shutil.rmtree, path, True)


class Partition:
    def __init__(self, topic, index):
        nsqd = topic.nsqd
        self.topic = topic
        self.nsqd = nsqd
        self.index = index
        self.owner = partition_owner(topic.name, index, nsqd.nworkers)
        self.owned = self.owner == nsqd.index
        self.path = partition_dir(nsqd.data_path, topic.name, index)
        self.log = None
        self._reader = None
        self._reader_inode = None
        # cluster mode: the gate the coordinator sets (nsqd/logtopics/replica.py); None standalone
        self.replica = getattr(nsqd, "replica_gate", None)
        self._syncing = None  # a sync running on a thread of the hub's pool
        if self.owned:
            opts = nsqd.opts
            segment = min(max(int(opts.max_bytes_per_file), 4096), MAX_SEGMENT_BYTES)
            self.log = PartitionLog(self.path, segment_bytes=segment,
                                    max_msg_size=min(opts.max_msg_size + 26, segment - 16,
                                                     MAX_RECORD),
                                    # the broker syncs (below), not append_packed
                                    sync_every=NEVER, sync_timeout=-1, logf=nsqd.logf)
            for gone in set_aside_logs(self.path):  # (its remover died: replica.py)
                remove_later(gone)
        # the inbound ring: the other workers' publishes, and local producers'
        # (nsqshm.local, standalone), which count into its header; the owner
        # reports what they published since it took the partition
        self._wake = gevent.event.Event()
        self.inbound = nsqd.make_ring(inbound_ring_suffix(topic.name, index))
        self._waker = RingWaker(self.inbound, self._wake)
        self._local_base = self.inbound.local_published
        self._pump = gevent.spawn(self._pump_loop) if self.owned else None

    def __repr__(self):
        return f"<Partition {self.topic.name}-{self.index} owner {self.owner}>"

    # -- positions (any worker) ----------------------------------------------------------

    @property
    def reader(self):
        if self.log is not None:
            return self.log.reader
        if self._reader is not None and self.replica is None:
            return self._reader  # (standalone, a log is made anew only with its topic)
        # the owner may have made the log anew (ReplicaHost.reset_log, a diverged
        # replica): a reader of the removed one would go on showing its old end
        state = os.path.join(self.path, STATE_FILE)
        if self._reader is not None:
            try:
                current = os.stat(state).st_ino == self._reader_inode
            except FileNotFoundError:
                current = False
            if not current:  # (not closed: a channel's detail readers may hold it)
                self._reader = None
        if self._reader is None:
            self._reader = LogReader(self.path)
            self._reader_inode = os.stat(state).st_ino
        return self._reader

    def synced_offset(self):
        """Every message below it is fdatasynced (0 before the owner made the log)."""
        try:
            return self.reader.synced_offset
        except (OSError, ValueError, LogNotMade):
            return 0

    def offsets(self):
        """(start, end) msg offsets; (0, 0) while the owner has not made the log."""
        try:
            reader = self.reader
            return reader.start_offset, reader.end_offset
        except (OSError, ValueError, LogNotMade):
            return 0, 0

    def position(self, where):
        """The msg offset a consume position (youzan.offset.ConsumeOffset,
        checked supported) names in this log; ValueError(text) when there
        is none: SUB_ADVANCED answers it E_INVALID, /channel/setoffset 500.

            special:-2        the log start (nsqshm's "earliest")
            special:-1        the log end: only new messages
            timestamp:<s>     the first message at or after that second
            virtual_queue:<b> the first message starting at or after byte b
            msgcount:<n>      the n-th message of the partition since its
                              first (Youzan counts from 1): msg offset n - 1

        As Youzan's searches (nsqdserver/context.go SetChannelOffset, the
        coordinator's SearchLogByMsgOffset/SearchLogByMsgCnt), a
        virtual_queue or msgcount before the log start gives the start and
        one past its end gives the end."""
        start, end = self.offsets()
        if where.is_earliest:
            return start
        if where.is_end:
            return end
        try:
            if where.kind == TIMESTAMP:
                if where.value < 0 or where.value > MAX_SECONDS:
                    # Youzan's SearchLogByMsgTimestamp text (for a value whose ns are < 0)
                    raise ValueError(f"Invalid timestamp {where.value}")
                return max(start, self.reader.find_offset_by_time(where.value * 1_000_000_000))
            if where.kind == VIRTUAL_QUEUE:
                return self.reader.find_by_virtual_offset(max(where.value, 0), next_record=True)
        except LogError as err:
            raise ValueError(str(err)) from None
        except OSError as err:  # the owner has not made the log yet
            raise ValueError(f"partition {self.index}: {err.strerror or err}") from None
        if where.kind == MSGCOUNT:
            return min(max(offset_of_count(where.value), start), end)
        raise ValueError(NOT_SUPPORTED)

    # -- appending ------------------------------------------------------------------------

    @property
    def writable(self):
        """Standalone, or this node leads the partition (nsqd/logtopics/replica.py)."""
        return self.replica is None or self.replica.writable

    @property
    def readable_end(self):
        """Where the channels deliver up to: the log's end standalone (read
        from its state block on a worker that does not own it); in cluster
        mode the end every in-sync replica has (the gate's committed_end,
        Kafka's high watermark, known to the owner), so no consumer gets a
        record a new leader may not hold (an ordered channel would see
        another message at that offset after a failover)."""
        end = self.log.end_offset if self.log is not None else self.reader.end_offset
        gate = self.replica
        return end if gate is None else min(end, gate.committed_end(self))

    def append(self, packed):
        """The owner: append packed records (IDs stamped with their
        position); committed and in the page cache when it returns, and in
        cluster mode on every in-sync replica (the gate waits for them)."""
        gate = self.replica
        if gate is None:
            return self._append(packed)
        gate.check_writable(self)
        count = self._append(packed)
        gate.committed(self, self.log.end_offset)
        return count

    def append_replica(self, packed):
        """A follower: the leader's records, at the offsets they get here
        (ReplicaHost.append_at checked the log ends where the leader's began)."""
        return self._append(packed)

    def _append(self, packed):
        count, _, _ = self.log.append_packed(packed, self.index)
        self._sync_when_due()
        self.topic.appended(self)
        return count

    def push_inbound(self, packed):
        """A worker that does not own the partition: into its inbound ring,
        waiting up to INBOUND_WAIT for room; False when it stays full."""
        view = memoryview(packed)
        waited = 0.0
        while True:
            try:
                _, used = self.inbound.push_packed(view)
            except RingRetired:  # (the owner's last drain: the broker stops)
                raise TopicError(f"partition {self.index} is closing") from None
            view = view[used:]
            if not view:
                return True
            if waited >= INBOUND_WAIT or self.topic.exiting:
                return False
            self._wake.clear()
            self._waker.arm(for_space=True)
            try:
                self._wake.wait(0.1)
            finally:
                self.inbound.disarm(for_space=True)
            waited += 0.1

    def _pump_once(self):
        """Append one batch of the inbound ring to the log (no yield between
        the peek and the discard); how many records (0: the ring is empty)."""
        ring = self.inbound
        with self.nsqd.scratch.borrow() as scratch:
            n, nbytes = ring.peek_many_into(scratch)
            if n:
                self.append(memoryview(scratch)[:nbytes])
                ring.discard(n)
            return n

    @property
    def published_locally(self):
        """(messages, body bytes) local producers pushed into the inbound ring since
        this worker took the partition (the owner's /stats count them)."""
        if self.inbound is None:
            return 0, 0
        msgs, body = self.inbound.local_published
        return msgs - self._local_base[0], body - self._local_base[1]

    def drain_inbound(self):
        """The owner, before it appends a publish (LogTopic.append_here: its
        own, or a traced one another worker took): what the other workers
        pushed before goes into the log first, so a publisher's order holds."""
        if self.inbound is not None and self.log is not None and self.inbound.depth:
            while self._pump_once():
                pass

    def _pump_loop(self):
        """The owner: the inbound ring into the log, a batch at a time."""
        ring = self.inbound
        while not self.topic.exiting:
            try:
                n = self._pump_once()
            except OSError as err:  # a full disk: the batch stays in the ring
                self.nsqd.set_health(err)
                gevent.sleep(0.25)
                continue
            except TopicError:  # cluster mode: not the leader (now); it stays
                gevent.sleep(0.25)
                continue
            if n:
                gevent.idle()
                continue
            self._wake.clear()
            self._waker.arm()
            if ring.depth == 0:
                self._wake.wait()
            ring.disarm()

    # -- syncs (NSQD.backend_written: as a disk queue) -----------------------------------

    @property
    def needs_sync(self):
        return self.log is not None and self.log.needs_sync

    def sync(self):
        """Every --sync-every messages or --sync-timeout, as nsqd syncs a disk
        queue; but the fdatasyncs run on a thread (PartitionLog.sync drops
        the GIL), so publishing goes on meanwhile: an OK means the page
        cache, whatever the sync policy, as for every other queue here."""
        if self.log is None or self._syncing is not None:
            return  # (closed meanwhile: close synced it; or a sync is running)
        self._syncing = gevent.get_hub().threadpool.spawn(self.log.sync)
        self._syncing.rawlink(self._synced)

    def _synced(self, result):
        self._syncing = None
        if not result.successful():
            self.nsqd.set_health(result.exception)
        elif self.log is not None:  # appended during the sync
            # (in a greenlet: this callback runs in the hub, where sync() could block
            # on a full thread pool)
            gevent.spawn(self._sync_when_due)

    def _sync_when_due(self):
        """A sync now after the topic's syncdisk (else --sync-every) messages;
        else, when there is something to sync, within --sync-timeout."""
        if self.log is None:
            return
        if self.log.unsynced >= (self.topic.spec.get("sync_every") or self.nsqd.opts.sync_every):
            self.sync()
        elif self.log.needs_sync:
            self.nsqd.backend_written(self)

    def _wait_sync(self):
        syncing = self._syncing
        if syncing is not None:
            try:
                syncing.get()
            except OSError:
                pass

    # -- retention -----------------------------------------------------------------------

    def apply_retention(self, max_age_s, max_bytes):
        """The owner: old segments go, never one that holds a message past the
        readable end (in cluster mode the committed end: a leader keeps what an
        in-sync replica may not have yet, as Kafka keeps what is above its high
        watermark, so that replica is caught up, not reset)."""
        if self.log is None or (max_age_s < 0 and max_bytes < 0):
            return []
        return self.log.apply_retention(max_age_s, max_bytes, keep_from=self.readable_end)

    # -- the end -------------------------------------------------------------------------

    def stop(self):
        if self._pump is not None:
            self._pump.kill(block=False)
            self._pump = None

    def close(self, unlink_inbound=False):
        """Stop; sync and close the log (its files stay).  unlink_inbound:
        the broker stops as a whole and the pump emptied the ring first."""
        self.stop()
        if self.inbound is not None and self.owned and unlink_inbound:
            # a local producer's (or another worker's) push after the last drain would
            # land in a ring nobody reads again: refused from now on
            self.inbound.retire()
            self._drain_inbound()
        if self._waker is not None:
            self._waker.close()
        if self.inbound is not None:
            if unlink_inbound and self.owned:
                if self.inbound.depth == 0:
                    self.inbound.unlink()
                else:  # (kept for the next start, which appends it)
                    self.inbound.unretire()
            self.inbound.close()
            self.inbound = None
        if self.log is not None:
            self._wait_sync()  # never close under a running sync
            self.log.close()
            self.log = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _drain_inbound(self):
        with self.nsqd.scratch.borrow() as scratch:
            while True:
                n, nbytes = self.inbound.peek_many_into(scratch)
                if not n:
                    return
                try:
                    self.log.append_packed(memoryview(scratch)[:nbytes], self.index)
                except OSError as err:
                    self.nsqd.logf("error", f"{self}: inbound messages stay in shared "
                                            f"memory - {err}")
                    return
                self.inbound.discard(n)

    def delete(self):
        """The topic is deleted: the owner removes the log's files."""
        owned = self.owned
        self.stop()
        if self.inbound is not None:
            if owned:
                self.inbound.unlink()
        self.close()
        if owned:
            shutil.rmtree(self.path, ignore_errors=True)
