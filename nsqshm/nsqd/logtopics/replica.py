"""A log topic's partition as a replica in a cluster (issue 17): what the broker
offers the coordination layer (nsqshm/consistence/), which drives it.  The broker
knows no etcd: it only holds, per partition it owns, a *gate* the coordinator sets,
and lets the coordinator read and append its log.

    gate None (standalone)      PUB appends, OK at once (as before)
    NotLeaderGate               PUB answers E_FAILED_ON_NOT_LEADER (a follower, a
                                catch-up replica, a deposed leader, or not known yet)
    a leader's gate             PUB appends, then gate.committed(end) waits until every
                                ISR member has the records (consistence/replicator.py);
                                gate.committed_end(): what channels may deliver

A follower's log is written by append_at only: the leader's records, at the offsets
the leader gave them, so every replica holds the same message at the same offset.
"""

import zlib

import gevent
import gevent.lock

from nsqshm._core.commitlog import PartitionLog, make_log_anew, prepare_cut, swap_in
from nsqshm._core.logcursor import window_offsets
from nsqshm.nsqd.ext import make_ext
from nsqshm.nsqd.logtopics.partition import MAX_RECORD, remove_later
from nsqshm.nsqd.names import is_ephemeral, is_valid_name
from nsqshm.nsqd.topic import TopicError


class NotLeader(TopicError):
    """A write to a partition this node does not lead."""


class NotLeaderGate:
    """The gate of a partition this node does not lead: refuses every write."""
    writable = False

    def __init__(self, why="not the leader"):
        self.why = why

    def check_writable(self, partition):
        raise NotLeader(f"{partition.topic.name}-{partition.index} {self.why}")

    def committed(self, partition, end_offset):
        raise NotLeader(f"{partition.topic.name}-{partition.index} {self.why}")

    def committed_end(self, partition):
        """A partition this worker does not lead delivers nothing (a follower's
        channels push nothing of it): no limit of its own."""
        return partition.log.end_offset


UNKNOWN = NotLeaderGate("has no known leader here yet")


class ForwardGate(NotLeaderGate):
    """The gate of a partition another worker of this node owns: a PUB that lands
    here is handed to the owner worker (ReplicaHost.forward, set by the coordinator),
    which appends and replicates it and answers; the inbound ring would acknowledge
    before the replicas have it."""

    def __init__(self, host):
        super().__init__("is owned by another worker")
        self.host = host
        self.writable = False  # this node leads it (the coordinator says): PUBs go there

    def forward(self, partition, packed):
        self.host.forward(partition.topic.name, partition.index, packed)


class OffsetMismatch(Exception):
    """append_at: the records do not start at the log's end.  .end is the log's end."""

    def __init__(self, end):
        super().__init__(f"log ends at {end}")
        self.end = end


CUTS_AT_ONCE = 2  # cuts prepared on the hub's thread pool at a time (it runs the syncs too)


def _log_settings(log):
    """What a log made in a partition log's place is opened with: its own."""
    return {"segment_bytes": log.segment_bytes, "max_msg_size": log.max_msg_size,
            "sync_every": log.sync_every, "sync_timeout": log.sync_timeout}


class ReplicaHost:
    """One worker's side of the cluster: the coordinator's only handle on the broker."""

    def __init__(self, nsqd):
        self.nsqd = nsqd
        # what a partition made from now on starts with: the coordinator sets the
        # owner's; the others forward to the owner
        nsqd.replica_gate = ForwardGate(self)
        self.forwarder = None  # (topic, partition, packed): the coordinator's
        self._crc_buffer = None  # tail_crc's read buffer, made at its first use
        self._cutting = {}  # a partition log's path -> the lock its cut holds
        self._cut_slots = gevent.lock.BoundedSemaphore(CUTS_AT_ONCE)

    def forward(self, topic, partition, packed):
        """A PUB's records to the worker that owns the partition; NotLeader or
        TopicError as the owner answers."""
        if self.forwarder is None:
            raise NotLeader(f"{topic}-{partition} has no known leader here yet")
        self.forwarder(topic, partition, packed)

    @property
    def worker(self):
        return self.nsqd.index

    @property
    def workers(self):
        return self.nsqd.nworkers

    def ensure_topic(self, name, partition_num, sync_every=0, ordered=False, ext=False,
                     retention_days=0, retention_bytes=-1):
        """The log topic on every worker of this node (as POST /topic/create would);
        sync_every: the topic's syncdisk; ordered: its orderedmulti; ext: made ext
        (headers), as /topic/create?ext=true makes it; retention_days: its
        RetentionDay (0: none), and retention_bytes (-1: none), applied by each
        replica to its own log."""
        topic = self.nsqd.create_log_topic(name, partition_num, sync_every=sync_every,
                                           ordered=ordered,
                                           retention_days=retention_days or -1,
                                           retention_bytes=retention_bytes)
        self.nsqd.replicated_topics.add(name)  # deleted only through the cluster
        if ext and not topic.ext:
            make_ext(self.nsqd, topic)
        return topic

    def delete_topic(self, name, here=True):
        """A replicated log topic deleted in the cluster: no longer refused to nsqd's
        own /topic/delete; with here, deleted on every worker of the node now (as
        that delete does).  -> whether this deleted it."""
        if name not in self.nsqd.replicated_topics:
            return False  # (placed elsewhere: a log topic of that name here is local)
        self.nsqd.replicated_topics.discard(name)
        topic = self.nsqd.topics.get(name)
        if not here or topic is None or not topic.is_log:
            return False
        try:
            self.nsqd.delete_topic(name)
        except KeyError:  # (deleted meanwhile)
            return False
        return True

    def partition(self, name, index):
        """The Partition if its log is owned by this worker, else None."""
        topic = self.nsqd.topics.get(name)
        if topic is None or not topic.is_log or not 0 <= index < len(topic.partitions):
            return None
        p = topic.partitions[index]
        return p if p.owned and p.log is not None else None

    def set_gate(self, partition, gate):
        old = partition.replica  # (a fenced leader's gate stays writable: it refuses)
        promoted = gate.writable and not (old is not None and old.writable
                                          and getattr(old, "fenced", None) is None)
        partition.replica = gate
        # a follower's channels push nothing of it (LogChannel._feedable); a new
        # leader's start from the cursors the old one sent (adopt_cursors), first
        # taking up what it had put back (its retry tables), before any delivery
        for channel in list(partition.topic.channels.values()):
            if promoted and not channel.exiting:
                try:
                    channel.take_up_retries(partition)
                except Exception as err:  # (a cursor, a log, the arena: delivered as usual then)
                    self.nsqd.logf("warn", f"{partition}: channel {channel.name}: the old "
                                           f"leader's put-back messages not taken up: {err}")
            channel.feed_wake()

    # -- channel cursors (rpc CURSORS) ------------------------------------------------

    def cursor_states(self, partition):
        """The leader: {channel name: (confirmed, window bytes, retry table,
        delivered)} of the partition's durable channels (an ephemeral one is not
        kept across a failover; the retry table: Cursor.retries, what was put
        back; delivered: Cursor.delivered, below which what is unfinished was
        in flight)."""
        out = {}
        for channel in list(partition.topic.channels.values()):
            if not channel.ephemeral and not channel.exiting:
                cursor = channel.cursors[partition.index]
                out[channel.name] = (*cursor.snapshot(), cursor.retries(), cursor.delivered)
        return out

    def adopt_cursors(self, partition, cursors):
        """A follower: the leader's cursors [(channel, confirmed, window, retry table,
        delivered)] become its channels' (made here when missing), so that if it
        leads next, consumers go on from there: what the old leader's consumers had
        finished by its last send is not delivered again, what it had put back goes
        out with its attempts and when due, and what it had in flight with the
        attempts of one delivery (LogChannel.take_up_retries).  A confirmed offset past this log's end waits for the
        records (the leader sends it again); finished offsets are taken below the end
        only (an offset this log lacks may hold another message after a failover).
        A follower delivers nothing of the partition (LogChannel._following), so its
        cursor is only the leader's: set when nothing of it was pushed here, else a
        seek that takes back what was (this node led it before)."""
        topic = partition.topic
        end = partition.log.end_offset
        for name, confirmed, window, retries, delivered in cursors:
            if not is_valid_name(name) or is_ephemeral(name) or confirmed > end:
                continue
            try:
                finished = window_offsets(confirmed, window, end) if window else b""
                channel = topic.channels.get(name) or topic.get_channel(name)
                cursor = channel.cursors[partition.index]
                if cursor.read_pos != cursor.confirmed:
                    channel.seek([(partition, confirmed)])
                elif cursor.confirmed != confirmed or cursor.finished_above:
                    cursor.set(confirmed)
                if finished:
                    cursor.finish_many(finished)
                cursor.set_retries(retries, end)
                cursor.set_delivered(min(delivered, end))
            except Exception as err:  # (a channel being deleted, a bad window): the next send
                self.nsqd.logf("warn", f"{partition}: channel {name}'s cursor from the "
                                       f"leader not taken: {err}")

    def drop_channels(self, partition, names):
        """A follower: channels the leader deleted are deleted here (on every worker,
        as /channel/delete does).  A channel of this node covers every partition of
        the topic, so its cursors in partitions this node leads go too, and their
        followers are told in turn: a channel deleted on one node goes on all."""
        topic = partition.topic
        for name in names:
            if not is_valid_name(name) or topic.get_existing_channel(name) is None:
                continue
            try:
                topic.delete_channel(name)
            except TopicError:
                continue  # (deleted meanwhile)
            self.nsqd.logf("info", f"{partition}: channel {name} deleted, as on the leader")

    def forward_gate(self, name, index):
        """The gate of a partition another worker of this node owns, its own (so that
        the coordinator can say whether this node leads it), or None."""
        topic = self.nsqd.topics.get(name)
        if topic is None or not topic.is_log or not 0 <= index < len(topic.partitions):
            return None
        p = topic.partitions[index]
        if p.owned:
            return None
        if not isinstance(p.replica, ForwardGate) or p.replica is self.nsqd.replica_gate:
            p.replica = ForwardGate(self)
        return p.replica

    def end_offset(self, partition):
        return partition.log.end_offset

    def read(self, partition, offset, buffer, max_bytes=-1):
        """Records from msg offset `offset` packed [u32 native size][message]... into
        buffer, as the log holds them (IDs already the positions): (count, bytes, next)."""
        return partition.log.reader.read_into(offset, buffer, -1, max_bytes)

    def tail_crc(self, partition, end):
        """crc32 of the record at msg offset end - 1 (0 when the log holds none
        there): two replicas hold the same record before `end` only if these agree."""
        if not partition.log.start_offset < end <= partition.log.end_offset:
            return 0
        if self._crc_buffer is None:  # (once: a record may be MAX_RECORD long)
            self._crc_buffer = bytearray(MAX_RECORD + 4)
        _, nbytes, _ = partition.log.reader.read_into(end - 1, self._crc_buffer, 1)
        return zlib.crc32(memoryview(self._crc_buffer)[:nbytes])

    def start_offset(self, partition):
        return partition.log.start_offset

    def start_virtual(self, partition):
        return partition.log.start_virtual

    def reset_log(self, partition, start=0, start_virtual=0):
        """A replica whose log diverged from the leader's (it led before and kept
        records nobody acknowledged), or ends below the leader's start (it was away
        while retention removed the rest): its log is removed and made again, empty,
        beginning at the leader's start (msg offset `start`, virtual offset
        `start_virtual`), to be copied from the leader.  Only for a replica out of the
        ISR (the coordinator checks): what it held is on every ISR member or was never
        acknowledged."""
        with self._cut_lock(partition):  # (not under a cut running on a thread)
            self._replace_log(partition, lambda path, settings: make_log_anew(
                path, start, start_virtual, **settings))
        self.nsqd.logf("warn", f"{partition}: log removed, to be copied again from the "
                               f"leader from offset {start}")

    def truncate_log(self, partition, keep):
        """A replica whose log diverged from the leader's at msg offset `keep` (it
        led before and kept records nobody acknowledged): what it holds from there
        on goes, the rest stays (commitlog.cut_log: the whole segments below are
        not copied), and it is copied from the leader from `keep`.  Only for a
        replica out of the ISR (the coordinator checks).  -> whether it was cut
        (not if the log holds nothing below `keep` or nothing from it)."""
        with self._cut_lock(partition):  # (a leader that reconnected may ask again
            old = partition.log             # meanwhile: it waits here)
            end = old.end_offset
            if not old.start_offset < keep < end:
                return False
            # the copy of the segment holding the cut (up to --max-bytes-per-file) and
            # its recovery on a thread: this worker's loop goes on (its etcd keep-alive,
            # its other partitions' replication); the log's writer stays open meanwhile,
            # idle (this replica is out of the ISR: the leader's APPENDs wait for this
            # answer), and nothing below keep changes.  A few at a time: the hub's pool
            # also runs the syncs
            with self._cut_slots:
                cut = gevent.get_hub().threadpool.apply(
                    prepare_cut, (partition.path, keep), _log_settings(old))
            if partition.log is not old or old.end_offset != end:
                # (the topic deleted, or the log written meanwhile: the copy is stale)
                remove_later(cut)
                raise OSError(f"{partition}: the log changed during its cut at {keep}")
            self._replace_log(partition, lambda path, settings: swap_in(path, cut))
        self.nsqd.logf("warn", f"{partition}: log cut at offset {keep} (it held "
                               f"{end - keep} messages the leader has not): copied from "
                               f"the leader from there")
        return True

    def _cut_lock(self, partition):
        return self._cutting.setdefault(partition.path, gevent.lock.Semaphore())

    def _replace_log(self, partition, make):
        """Close the partition's log, have make(path, settings) put another in its
        place (commitlog.cut_log, make_log_anew: -> the old log's directory, set
        aside), open that one with the same settings, and remove the old on a
        thread.  Made or not, the partition has an open log after."""
        old = partition.log
        settings = _log_settings(old)
        partition._wait_sync()
        old.close()
        gone = None
        try:
            gone = make(partition.path, settings)
        finally:
            partition.log = PartitionLog(partition.path, logf=self.nsqd.logf, **settings)
            remove_later(gone)

    def append_at(self, partition, offset, packed):
        """A follower: the leader's records, which start at msg offset `offset`.  The
        log gives them the next offsets, so they land at the leader's only if the log
        ends at `offset` (else OffsetMismatch, nothing written).  -> the new end."""
        end = partition.log.end_offset
        if offset != end:
            raise OffsetMismatch(end)
        if packed:
            partition.append_replica(packed)
        return partition.log.end_offset
