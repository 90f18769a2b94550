"""A channel of a log topic: a cursor per partition over the log, in front
of the classic channel machinery.

The channel is a classic Channel (channel.py): its shared-memory ring, the
arena in flight, timeouts, REQ with a delay, TOUCH, pause, stats and the
recovery of a dead worker's messages all work as for a classic topic.  What
differs is where messages come from: each worker's dispatcher reads the
partition logs at the channel's read position straight into flight
(_deliver_direct; a partition another worker owns through a LogReader of
its files), and a feeder on each owner pushes into the ring what clients
that cannot take that path need (LogReader.read_into: whole records, one
call per batch), at most FEED_AHEAD messages ahead of the consumers.  Every
reader claims its run under the cursor's lock (Cursor.lock: the read, the
hand-off, the move of read_pos as one step).  Nothing is ever written to a
channel disk queue: the log is the disk.

Each (channel, partition) has a Cursor (logcursor.pyx, shared memory,
checkpointed to <partition dir>/<channel>.cursor):

    confirmed   every msg offset below it is finished
    window      the offsets finished out of order above it
    read_pos    what the feeder pushed into the ring so far

A FIN marks the message's offset in the cursor, then frees it in flight:
the message ID is its position ((partition << 48) | offset, stamped at
append), so the C command parser (_core/commands.pyx) does it for a window
of FINs.  A worker's death keeps ring, arena and cursor (all shared
memory): nothing is read twice or skipped.  A graceful stop of the broker drops the ring (what it
held is in the log, unfinished) and the cursor segment after a checkpoint;
the next start reads from confirmed again, stepping over what was finished
(Cursor.unfinished_run): at least once, and only what was not finished.
A new channel starts at the end of the log, as nsqd's new channels see only
new messages; `empty` moves every cursor to the end.

A consumer that names a partition gets it through a lane (loglane.py): the
owner's feeder pushes that partition into the lane's ring rather than the
channel's, and the dispatcher gives a client the rings of what it asked for
(the lane of its partition; a plain SUB: the channel ring and every lane).
An ordered lane (SUB_ORDERED) holds one message of its partition at a time:
the feeder pushes the next only once read_pos == confirmed, i.e. the one
out was finished; a REQ or a timeout puts it back into the lane, so it is
delivered again before anything later.
"""

import itertools
import os
import time

import gevent

from nsqshm._core.commitlog import LogError
from nsqshm._core.logcursor import (
    CLAIM_RETENTION,
    Cursor,
    CursorSet,
    checkpoint_path,
    decode_message_id,
    segment_name,
    split_by_partition,
)
from nsqshm._core.ring import Ring
from nsqshm.nsqd.channel import DELIVER_BATCH, Channel
from nsqshm.nsqd.logtopics.loglane import Lane, lane_suffix
from nsqshm.nsqd.policies import policy
from nsqshm.nsqd.tcp import fairshare
from nsqshm.nsqd.tracing import trace

FEED_AHEAD = 8192       # messages a feeder keeps in the ring ahead of the consumers (at most)
FEED_BATCH = 4096       # messages read from the log and pushed in one go
HELD_UNTIL_FINISHED = 2**63 - 1  # a deadline no timeout reaches
SEEK_HOLD_LIMIT = 30.0  # seconds a seek may hold a cursor (_check_hold)
WINDOW_RETRY = 0.5      # a cursor's window is full: look again after this (FINs move it)
RETENTION = CLAIM_RETENTION  # Cursor.claim_read: retention removed what it would read next
RING_FULL = -4          # _feed_once: the ring took nothing (full by bytes before by records)


class LogChannel(Channel):
    disk_queue = False
    # a local consumer (nsqshm.local) counts itself among the ring's
    # subscribers: the owners feed the ring for it (_room)
    local_subscribers = True

    def __init__(self, topic, name):
        self.lanes = {}             # partition -> Lane (loglane.py), on every worker
        self._filling = set()       # rings being topped up: -1 the channel's, else a partition's lane
        self._direct_ids = set()    # clients here counted in the ring's direct_subscribers
        super().__init__(topic, name)
        self.cursors = CursorSet(len(topic.partitions))
        # a sample rate's skips are finished there; what goes out raises their delivered marks
        self.inflight.log_cursors = self.cursors
        self.retention_moves = 0    # times a cursor fell below the log start (retention)
        self._checkpointed = {}     # partition -> confirmed at the last checkpoint
        self._held_since = {}       # partition -> when the feeder first found it held
        self._full_windows = set()  # partitions whose cursor window the feeder saw full
        # the dispatcher sleeps while a ready client's partition waits at its cursor's full
        # window: a FIN here that moves it needs a round (refill_finisher)
        self._window_blocked = False
        self.feed_target = max(1, min(self.mem_limit, FEED_AHEAD))
        self.feed_low = max(1, self.feed_target // 2)
        restored = []  # partitions whose cursor was made from its checkpoint here
        for partition in topic.partitions:
            self.cursors[partition.index] = self._open_cursor(partition, restored)
        self._owned = [p for p in topic.partitions if p.owned]
        # what a dispatcher here may read straight from the logs (_direct): the
        # partitions this worker owns, and standalone the others' too (their files,
        # through a LogReader); a replica's committed end is known to its owner only
        self._readable = [p for p in topic.partitions if p.owned or p.replica is None]
        # the ordered lanes attached here with nothing held of their partitions from
        # before their moves (_mark_ordered_lanes): at creation, every one
        self._lanes_clean = set()
        self._lanes_seen = -1  # the channel ring's lanes_version _find_lanes last looked at
        self._find_lanes()
        self._lanes_clean = {lane for lane in self.lanes.values() if lane.ordered}
        self._mark_ordered_lanes()
        self.ring.topic_paused = topic.paused  # (LogTopic.paused keeps it after)
        for partition in restored:
            # what was put back before a graceful stop (the checkpoint's retry table):
            # with its attempts, once due, by whichever worker made the cursor (held
            # until then).  (Standalone only: in cluster mode the partition's role
            # decides, ReplicaHost.set_gate.)
            self.take_up_retries(partition, held=True)
        self._feeder = gevent.spawn(self._feed_loop) if self._owned else None

    def __repr__(self):
        return f"<LogChannel {self.topic.name}:{self.name}>"

    def _cursor_name(self, partition):
        return segment_name(self.nsqd.shm_prefix, self.topic.name, self.name, partition.index)

    def _open_cursor(self, partition, restored):
        """Attach to the cursor, or make it: from its checkpoint, else at the
        log's end -- a new channel sees only new messages -- or, for the
        topic's first channel, at its start: nsqd's topic keeps what is
        published before any channel exists for the first one.  A partition
        whose cursor this worker made from a checkpoint with messages put
        back, standalone, is added to `restored` (take_up_retries)."""
        name = self._cursor_name(partition)
        ckpt = checkpoint_path(partition.path, self.name)
        fresh = not os.path.exists(f"/dev/shm/{name}")
        if fresh and self.ephemeral:  # an ephemeral channel's cursor is not kept
            _remove(ckpt)
        start, end = partition.offsets()
        first = not any(c is not self for c in self.topic.channels.values())
        standalone = partition.replica is None
        cursor = Cursor.open(name, ckpt, start if first else end, hold_retries=standalone)
        if fresh and not self.ephemeral and partition.owned and not os.path.exists(ckpt):
            cursor.checkpoint()  # a restart finds where it started
        elif cursor.created and standalone and cursor.held:
            restored.append(partition)  # (made held: its checkpoint's retry table holds some)
        # (None: no checkpoint yet; the owner's retention pass writes one)
        self._checkpointed[partition.index] = cursor.confirmed if os.path.exists(ckpt) else None
        return cursor

    # -- lanes ----------------------------------------------------------------------------

    def _lane_name(self, index, ordered):
        return f"{self.nsqd.shm_prefix}.{lane_suffix(self.topic.name, self.name, index, ordered)}"

    def _find_lanes(self, release=True):
        """Attach to the lanes that exist, whichever worker made them (an
        ordered one first: a partition turned ordered keeps its old lane
        until the worker that turned it removes it).

        An ordered lane first attached here was made by a move that holds
        its partition's cursor, or held it (use_lanes makes a lane only once
        its move holds the cursor, and the move releases it last): what this
        worker holds of the partition then was all taken before the move (it
        could take nothing from a lane it had not attached, and nothing is
        read while the cursor is held), and the lane delivers it again from
        the confirmed offset.  So it is dropped now, and the lane noted clean
        (_drop_late), before anything is taken from it -- as the move's drop
        would (_drop_moved), whether or not this worker applies the move's
        broadcast in time (FLUSH_TIMEOUT): one that does not finds the cursor
        no longer held, and is "late".  Every take and push looks first
        whether a move made lanes since (look_for_lanes), and a claim checks
        it again under the cursor's lock, so a worker late for a move takes
        nothing of the partition after it before it attached the lane."""
        self._lanes_seen = self.ring.lanes_version  # (read first: a bump after it looks again)
        first = []
        late = False
        for partition in self.topic.partitions:
            index = partition.index
            lane = self.lanes.get(index)
            for ordered in (True, False):
                if Ring.exists(self._lane_name(index, ordered)):
                    if lane is None or lane.ordered != ordered:
                        if lane is not None:
                            lane.close()
                        ring = self.nsqd.make_ring(lane_suffix(self.topic.name, self.name,
                                                               index, ordered))
                        self.lanes[index] = Lane(ring, ordered, self._ready, self._refill_wake)
                        if ordered:
                            first.append(index)
                            cursor = self.cursors[index]
                            late = late or (cursor is not None and not cursor.held)
                    break
            else:
                if lane is not None:
                    lane.close()
                    del self.lanes[index]
        if first:
            self._drop_late(first, late, release)
        return first

    def look_for_lanes(self, release=True):
        """Attach the lanes a move made since the last look, if any (the
        channel ring's lanes_version, which use_lanes bumps once the move's
        cursors are held): before a dispatcher round, a finisher's refill, a
        feeder's pass and a put-back, so that a worker that applies a move's
        broadcast late neither reads the moved partition from its log nor
        pushes it into the channel ring after the move (and _find_lanes'
        drop of what it holds then is of copies from before the move).  One
        atomic load.  -> the partitions whose ordered lanes it attached first
        (_find_lanes).  release: free the blocks of what it drops now and
        note the lanes (not in a put-back, which does both once it stored
        what it puts back)."""
        if self.ring.lanes_version != self._lanes_seen:
            return self._find_lanes(release)
        return ()

    def _drop_late(self, indices, late, release=True):
        """_find_lanes' ordered lanes attached here for the first time: drop
        what this worker holds of their partitions (in flight and deferred,
        unfinished: a late FIN fails as of a message not in flight), then
        note the lanes clean in the arena (after the blocks are freed: a
        death in between leaves no copy from before a move noted as its
        lane's; in a put-back, put_records does both once it stored what it
        puts back: release False).  late: some move was over (logged)."""
        dropped = 0
        with self.scratch.borrow() as scratch:
            for index in indices:
                for store in (self.inflight, self.deferred):
                    while True:
                        n = store.drain_partition(index, scratch)[0]
                        if not n:
                            break
                        dropped += n
        self._lanes_clean |= {self.lanes[index] for index in indices}
        if release:  # (else put_records does, once what it puts back is stored)
            self._release_and_mark()
        if dropped:
            for client in self.clients.values():
                client.in_flight = self.inflight.client_count(client.id)
            self.wake()  # (their room: the dispatcher looks again)
        if dropped and late:
            self.nsqd.logf("warn", f"CHANNEL({self.topic.name}:{self.name}): partitions "
                                   f"{sorted(indices)} moved into ordered lanes before this "
                                   f"worker applied the moves: dropped {dropped} messages "
                                   f"taken before them (the lanes deliver them again)")

    def _release_and_mark(self):
        """Free the blocks of what was dropped, then note the lanes."""
        self.inflight.release()
        self.deferred.release()
        self._mark_ordered_lanes()

    def _mark_ordered_lanes(self):
        """Note in this worker's arena the ordered lanes attached here with
        nothing held of their partitions from before their moves into them
        (_lanes_clean: at creation nothing is held; _drop_late drops it as a
        lane is first attached, and _drop_moved while the move holds the
        cursor).  If this worker dies, the recovery of its
        arena puts back its copies of those partitions (heads it took from
        their lanes) and leaves out its copies of a partition moved into an
        ordered lane since (taken from the ring before the move; the lane
        delivers them again from the confirmed offset):
        recovery._lanes_left_out."""
        arena = self.nsqd.arena
        if arena is not None:
            arena.set_queue_lanes(arena.queue_index(f"{self.topic.name}:{self.name}"),
                                  [i for i, lane in self.lanes.items()
                                   if lane in self._lanes_clean])

    def _held_lanes(self):
        """The ordered lanes attached here whose partition's cursor a move holds."""
        return {lane for i, lane in self.lanes.items()
                if lane.ordered and self.cursors[i] is not None and self.cursors[i].held}

    def ordered_lane_partitions(self):
        """The partitions that have an ordered lane now, whichever worker made
        it (in /dev/shm: this worker may not have attached it yet)."""
        return frozenset(partition.index for partition in self.topic.partitions
                         if Ring.exists(self._lane_name(partition.index, True)))

    def use_lanes(self, indices, ordered):
        """A consumer names partitions (SUB T C p; SUB_ORDERED: ordered):
        give each a lane of that kind if it has none.  The partition's
        records already pushed into the channel's ring (or the old lane) are
        taken back as a seek takes them (_move, to the confirmed offset,
        keeping what was finished above it): the owner then pushes again,
        into the lane, what is unfinished.  What was in flight of those
        partitions is delivered again (at least once)."""
        self._find_lanes()
        todo = [i for i in indices
                if i not in self.lanes or (ordered and not self.lanes[i].ordered)]
        if not todo:
            return
        # made and announced once the cursors are held, before the drop.  A local
        # consumer that sees the announcement looks again (nsqshm/local/lanes.py) and
        # drops what it holds of a partition now ordered, and until the release it
        # takes nothing from a ring (CursorSet.seek_state), so nothing from before the
        # move reaches it after its look (and its arena's mark of the lane:
        # recovery._lanes_left_out).  A worker drops what it holds of the partition
        # when it first attaches the lane, whether the move still holds the cursor or
        # is over (_find_lanes).
        self._move([(self.topic.partitions[i], None) for i in todo],
                   make_lanes=(todo, ordered))
        if ordered:  # every worker now delivers from the ordered lane: the old one goes
            for index in todo:
                Ring.unlink_segment(self._lane_name(index, False))

    def _close_lanes(self, unlink=False):
        for lane in self.lanes.values():
            if unlink:
                lane.ring.unlink()
            lane.close()
        self.lanes.clear()

    # -- FIN, REQ, putting back ----------------------------------------------------------

    def finish(self, client, msg_id):
        # The cursor first, then the in-flight block (as the C parser): a
        # death in between delivers an already-finished message again, never
        # leaves an offset that nothing finishes.  touch checks that the client
        # holds the message, so a stray FIN marks nothing; its deadline only
        # moves the node in this process's heap, and the finish removes it.
        status = self.inflight.touch(msg_id, client.id, HELD_UNTIL_FINISHED)
        if status:
            raise self._failed(status, msg_id)
        self.cursors.finish(msg_id)
        super().finish(client, msg_id)
        self.next_ordered()

    def refill_finisher(self, client, finished, freed, full):
        """Channel.refill_finisher for a log channel: after FINs, ordered
        lanes' next messages (next_ordered, the finisher's first); then, if
        the client was full before, what a dispatcher round would give it of
        the rest, from its rings and straight from the logs
        (_serve_finisher), but not after a REQ (Channel.refill_finisher).
        No round is needed if it got back as many as were freed, unless
        this worker's dispatcher sleeps at a cursor's full window, which the
        FINs may have moved (_window_blocked).  (An ordered lane's head
        REQ'd goes back to the finisher first: its partition's next.)"""
        sent = self.next_ordered(client) if finished else 0
        if not self._ordered_only(client):
            if not full or freed > finished:
                return False
            sent += self._serve_finisher(client)
        return sent >= freed and not self._window_blocked

    def _serve_finisher(self, client):
        """A dispatcher round's work for one client, from its reader
        (refill_finisher): its rings (_sources, but ordered lanes': theirs
        is next_ordered's), then its partitions straight from the logs
        (_direct), up to its RDY; sent at once if that fills it.  How many
        went out."""
        if self.paused or client.ext_view is not None or not client.is_ready():
            return 0  # (an ext client may leave a head for another's tag: the dispatcher's)
        self.look_for_lanes()
        ordered = {id(lane.ring) for lane in self.lanes.values() if lane.ordered}
        deadline = time.monotonic_ns() + client.msg_timeout_ns
        sent = 0
        self._trace_drops(self.traced)  # (as a round begins: the C calls' drops are events)
        with self.scratch.borrow() as scratch:
            for ring in self._sources(client):
                room = client.ready_count - client.in_flight
                if room <= 0:
                    break
                if not ring.depth or id(ring) in ordered:
                    continue
                sent += max(self.ring_to_client(ring, client, room, scratch, deadline), 0)
            for partition in self._direct(client):
                room = client.ready_count - client.in_flight
                if room <= 0:
                    break
                n = self._deliver_direct(partition, client, room, scratch, deadline, kick=False)
                if n > 0:
                    sent += n
        if self.inflight.expired_out:
            self.wake()  # (the dispatcher finishes them: _expired)
        if sent:
            self.nsqd.schedule_scan(deadline)
            fairshare.delivered(self.nsqd)  # (publishers yield to it, as to a round)
            client.send_or_hold()
        return sent

    def _ordered_only(self, client):
        """Whether all a client takes (_sources) is ordered lanes, the
        channel's ring empty."""
        lanes = self.lanes
        if not lanes:
            return False
        if client.partition is not None:
            lane = lanes.get(client.partition)
            return lane is not None and lane.ordered
        return not self.ring.depth and len(lanes) == len(self.topic.partitions) \
            and all(lane.ordered for lane in lanes.values())

    def next_ordered(self, finisher=None):
        """A FIN may let an ordered lane's next message go out: to a ready
        client of this worker that takes the lane (the one that sent the FIN
        first, `finisher`, in its own reader: commands_applied), straight
        from the log and at once (_deliver_ordered: no other process wakes,
        no round of the dispatcher); else its owner's feeder pushes it into
        the lane (here: the feeder; on another worker: a nudge, as a pop
        wakes it), for a consumer on any worker.  Heads already waiting in
        their lanes go to the finisher first (_deliver_waiting), so that the
        partitions it just finished do not take its room from the others.
        So a finisher that stays ready keeps its partitions (Youzan's
        consumers take them as their pumps come; here another consumer gets
        one when the finisher is not ready: RDY 0, gone, at its RDY).  Also after a dead local consumer's
        recovery (recovery.recover_arena: it may have died between its FIN
        and its nudge).  Returns how many went to the finisher."""
        if not self.lanes:
            return 0
        to_finisher = 0
        lanes = list(self.lanes.items())  # (a send below may yield: lanes may move meanwhile)
        if finisher is not None:
            # heads waiting in their lanes first (pushed by the owners' feeders while the
            # finisher was at its RDY): claimed from the logs first, the partitions the
            # finisher just finished would take its room for as long as they have more
            for index, lane in lanes:
                if self.lanes.get(index) is lane and lane.ordered and lane.ring.depth \
                        and self._deliver_waiting(index, lane, finisher):
                    to_finisher += 1
                    finisher.send_now()
        for index, lane in lanes:
            if self.lanes.get(index) is not lane or not lane.ordered:
                continue  # (moved while a send yielded: gone)
            cursor = self.cursors[index]
            if lane.ring.depth or cursor.read_pos > cursor.confirmed:
                continue  # its one is out, or waits in the lane: its FIN, REQ or timeout comes back here
            client = self._deliver_ordered(index, lane, finisher)
            if client is None:
                if self.topic.partitions[index].owned:
                    self._refill_wake.set()
                else:
                    lane.ring.nudge()
            elif client is finisher:
                to_finisher += 1
                # (each at once: the client answers one partition while this claims the next)
                client.send_now()  # (this is its reader: no wake of its writer)
            else:
                client.flush()
        return to_finisher

    def _takes_ordered(self, client, index):
        """Whether a client may be given partition `index`'s ordered lane's
        next message here, outside the dispatcher (next_ordered): the channel
        and topic not paused, ready, of that partition or all, and on the
        plain path (no sample rate, no ext view, no delivery policy: theirs
        is the dispatcher's ring path)."""
        return client is not None and not (self.paused or self.topic.paused) \
            and self.policy is None and client.is_ready() \
            and client.partition in (None, index) and not client.sample_rate \
            and client.ext_view is None

    def _deliver_waiting(self, index, lane, client):
        """The head waiting in an ordered lane, to a client (the finisher,
        in its reader: next_ordered) that takes it: one pop of the lane's
        ring, framed into its output buffer, as the dispatcher delivers from
        a ring.  Whether one went out."""
        if not self._takes_ordered(client, index):
            return False
        deadline = time.monotonic_ns() + client.msg_timeout_ns
        with self.scratch.borrow() as scratch:
            n = self.ring_to_client(lane.ring, client, 1, scratch, deadline)
        if n <= 0:
            return False
        self.nsqd.schedule_scan(deadline)
        return True

    def _deliver_ordered(self, index, lane, finisher=None):
        """An ordered lane's next message, claimed from the log under the
        cursor's lock (one out: InFlight.deliver_from_log's one_out) for the
        finisher or else the first ready client here that takes the lane,
        framed into its output buffer, to be sent at once (Youzan's
        messagePump flushes every message of an ordered channel:
        next_ordered).  The client, or None: no such client here, or it took
        nothing (the feeder's path then)."""
        partition = self.topic.partitions[index]
        if partition not in self._readable or self._following(partition):
            return None
        for client in itertools.chain((finisher,), self.clients.values()):  # (lazily)
            if self._takes_ordered(client, index):
                break
        else:
            return None
        deadline = time.monotonic_ns() + client.msg_timeout_ns
        with self.scratch.borrow() as scratch:
            n = self._deliver_direct(partition, client, 1, scratch, deadline, one_out=True,
                                     kick=False)
        if n <= 0:
            return None
        self.nsqd.schedule_scan(deadline)
        return client

    def requeue(self, client, msg_id, delay):
        """As nsqd's; but on an ordered lane a REQ with a delay is ignored, as
        Youzan's nsqd does (the message stays in flight, so nothing later of
        its partition goes out before it; it times out or is finished)."""
        if delay > 0 and self.lanes:
            where = decode_message_id(msg_id)
            lane = self.lanes.get(where[0]) if where else None
            if lane is not None and lane.ordered and self.inflight.get_deadline(msg_id) >= 0:
                return
        super().requeue(client, msg_id, delay)

    def put_records(self, packed, keep_rest=True):
        """Requeues, timeouts, deferred messages coming due, what a dead
        worker or local consumer held: noted in their cursors' retry tables
        (with their attempts, for a partition's next leader:
        take_up_retries), then put back (_put_back).  One below its cursor's
        confirmed offset is finished (a /channel/empty moved the cursor past
        it while it was held): dropped, in C (CursorSet.unconfirmed).  One
        of a partition whose ordered lane this worker attaches here for the
        first time (look_for_lanes) was taken before the move: dropped too,
        the lane delivers it again.  (The recovery looks before it puts back another
        process's copies: not dropped here.)"""
        first = self.look_for_lanes(release=False)
        if first:
            parts = split_by_partition(packed, len(self.topic.partitions))
            packed = b"".join(records for index, records in enumerate(parts)
                              if index not in first)  # (the last: no partition's)
        stored = False
        try:
            packed = self.cursors.unconfirmed(packed)
            if not packed:
                stored = True
                return 0
            self.cursors.note_retries(packed)
            n = self._put_back(packed, keep_rest)
            stored = True
            return n
        finally:
            if first and stored:  # (what it took out is stored: the blocks can go)
                self._release_and_mark()
            elif first:  # (failed: its blocks stay; the lanes are noted all the same)
                self._mark_ordered_lanes()

    def defer(self, msg, delay_s):
        """A REQ with a delay: noted with its due time in its cursor's retry
        table (for a partition's next leader: take_up_retries)."""
        super().defer(msg, delay_s)
        self.cursors.note_retries(len(msg).to_bytes(4, "little") + bytes(msg),
                                  int((time.time() + delay_s) * 1000))

    def take_up_retries(self, partition, held=False):
        """This node now leads the partition: what the old leader had put back
        and told this node (its retry table, ReplicaHost.adopt_cursors) goes out
        as the old leader would have sent it, with its attempts, and not before
        it is due; what it had in flight (unfinished below its delivered mark,
        not in the table) with the attempts of one delivery (CursorSet.retry_of).
        The unfinished records from read_pos (the confirmed offset, after an
        adopt) up to the table's last or that mark are claimed as a feeder claims a
        run (_claim: against every other reader of the partition), and each is
        deferred here until it is due (DeferredQueue.take_retries) or put back
        into the channel now.  Runs before the partition's first delivery here
        (ReplicaHost.set_gate), or, standalone at the start after a graceful
        stop, by the worker that made the cursor from its checkpoint, held
        (`held`: no reader took anything of it since) and released here; the
        cursor's lock is held throughout.  How many records it took.  Not for
        an ordered lane: its feeder delivers from the confirmed offset, one at
        a time (attempts start again)."""
        self.look_for_lanes()  # (a lane move meanwhile: into its lane, not the ring)
        cursor = self.cursors[partition.index]
        lane = self.lanes.get(partition.index)
        total = 0
        cursor.lock()
        try:
            if held:
                if not cursor.held:
                    return 0  # (released meanwhile: _check_hold)
                cursor.release(cursor.confirmed)
            if self.topic.ordered or (lane is not None and lane.ordered):
                return 0  # (an ordered lane holds one message at a time: the feeder's)
            # (below the delivered mark: what was in flight, given one delivery's attempts)
            high = max(cursor.retry_high(), cursor.delivered)
            view = self._log_view(partition) if high > cursor.read_pos else None
            if view is None:
                return 0
            view = (view[0], min(view[1], high))
            with self.scratch.borrow() as scratch:
                while cursor.read_pos < view[1]:
                    taken, _ = self._claim(partition, view, FEED_BATCH, scratch,
                                           self._take_up)
                    if taken == 0:
                        break  # (the window is full, or the log reads short: as usual then)
                    total += max(taken, 0)
        finally:
            cursor.unlock()
        return total

    def _take_up(self, records, n):
        now, deferred, due = self.deferred.take_retries(
            self.cursors, records, int(time.time() * 1000), time.monotonic_ns(),
            int(self.nsqd.opts.max_req_timeout * 1000))
        if deferred:
            self.nsqd.schedule_scan(due)
        if now:
            self._put_back(now)
        return n, None

    def _put_back(self, packed, keep_rest=True):
        """Each record back into its partition's lane, the rest into the
        channel's ring (Channel.put_records), split in C
        (split_by_partition); into an ordered lane only the partition's head
        (CursorSet.heads_only).  A lane with no room left: deferred 0.1 s and
        tried again (in the arena: kept)."""
        if not self.lanes:
            return super().put_records(packed, keep_rest)
        parts = split_by_partition(packed, len(self.topic.partitions))
        rest = parts.pop()
        for index, records in enumerate(parts):
            lane = self.lanes.get(index) if records else None
            if lane is None:
                rest += records
                continue
            if lane.ordered:  # its head alone: the rest is read from the log again (a
                records = self.cursors.heads_only(records)  # copy taken before the move)
            _, used = lane.ring.push_packed(records)
            if used < len(records):
                self._defer_packed(memoryview(records)[used:], 0.1)
        return super().put_records(rest, keep_rest) if rest else 0

    def open_detail_readers(self):
        """A SUB_ADVANCED or SUB_ORDERED client's frames carry each message's
        byte offset in its partition's log, as Youzan's (a position
        `virtual_queue:<it>` finds the message again): InFlight.deliver asks
        each partition's LogReader in C.  Taken again at each such SUB: a log
        not made by its owner before is tried again, and one made anew (a
        replica's reset) is read from then on."""
        readers = self.inflight.detail_readers or [None] * len(self.topic.partitions)
        for partition in self.topic.partitions:
            try:
                readers[partition.index] = partition.reader
            except (OSError, LogError, ValueError):
                pass  # not made by its owner yet: offsets 0 until the next such SUB
        self.inflight.detail_readers = readers

    # -- the dispatcher -------------------------------------------------------------------

    # -- clients --------------------------------------------------------------------

    def add_client(self, client):
        """Channel.add_client; a client that takes every partition straight
        from the logs (_needs_no_ring) also counts in the ring's
        direct_subscribers, so that the owners' feeders, on any worker, fill
        the ring only while some subscriber needs it (_room)."""
        super().add_client(client)
        # an ordered lane's head may wait for a consumer here: a local ordered consumer
        # alone before claimed each head itself and woke no feeder (Consumer._next_ordered)
        self.next_ordered()
        if client.id in self._direct_ids:
            return
        if self._needs_no_ring(client):
            self._direct_ids.add(client.id)
            self.ring.add_direct_subscribers(1)
        else:  # the feeders may be asleep with every other client reading the logs: fill now
            self._refill_wake.set()
            self.ring.nudge()

    def remove_client(self, client):
        if client.id in self._direct_ids:
            self._direct_ids.discard(client.id)
            if not self.exiting:  # (a closed ring: the next worker's start recounts)
                self.ring.add_direct_subscribers(-1)
        super().remove_client(client)

    def leave(self):
        if self._direct_ids and not self.exiting:
            self.ring.add_direct_subscribers(-len(self._direct_ids))
        self._direct_ids.clear()
        super().leave()

    @property
    def direct_clients(self):
        return len(self._direct_ids)

    def _needs_no_ring(self, client):
        """Whether a client will never take anything from the channel's ring,
        whatever happens later (_direct's lasting conditions; a delivery
        policy set later is looked at by _room itself): one that named a
        partition (it takes that partition's lane, which the feeder fills
        whatever the counts); a plain SUB without a sample rate, on a topic
        neither ordered-only nor ext (whose filters and tags work on the
        ring's path), every partition readable here (standalone; in cluster
        mode a worker reads its own alone), takes every partition straight
        from the logs."""
        topic = self.topic
        return client.partition is not None or (
            not client.sample_rate and not topic.ordered and not topic.ext
            and len(self._readable) == len(topic.partitions))

    def _sources(self, client):
        """The rings a client takes from: its partition's lane, or (a plain
        SUB) the channel's ring and every lane."""
        if client.partition is None:
            return [self.ring, *(lane.ring for lane in self.lanes.values())]
        lane = self.lanes.get(client.partition)
        return [lane.ring] if lane is not None else []

    def _dispatch(self):
        """Channel._dispatch over each client's rings (_sources): one C call
        (InFlight.deliver_from_ring) per client and ring per round."""
        while not self.exiting:
            ready = [] if self.paused else [c for c in self.clients.values() if c.is_ready()]
            if not ready:
                self._ready.clear()
                self._ready.wait()
                continue
            self.look_for_lanes()
            now = time.monotonic_ns()
            wakes = self.wakes
            earliest = None
            delivered = False
            left_for_tag = False
            popped = {}  # id(ring) -> its pops when a client left its head for a tag
            traced = self.traced
            self._trace_drops(traced)
            if self.inflight.ttl_ns and self.inflight.expired_out is None:
                self.inflight.expired_out = bytearray()  # kept, to finish them (_expired)
            ordered = {id(lane.ring) for lane in self.lanes.values() if lane.ordered}
            with self.scratch.borrow() as scratch:
                for client in ready:
                    deadline = now + client.msg_timeout_ns
                    # the rings first: what the owner's feeder pushed was claimed before
                    # anything still unread, so a client gets each partition in log order
                    for ring in self._sources(client):
                        room = client.ready_count - client.in_flight
                        if room <= 0 or client.closed:
                            break
                        if not ring.depth:
                            continue
                        base = len(client.out)
                        taken, n = self.inflight.deliver_from_ring(
                            ring, min(room, DELIVER_BATCH), scratch, client.out,
                            client.id, deadline, client.sample_rate, client.ext_view,
                            client.detail, client.detail_log)
                        if n and traced:
                            trace.delivered(self, client, client.out, base)
                        if not taken:
                            if client.ext_view is not None:
                                left_for_tag = True  # its head waits for another's tag (ext.py)
                                popped[id(ring)] = ring.popped
                            continue
                        delivered = True
                        client.in_flight += n
                        client.message_count += n
                        if id(ring) in ordered:
                            # sent now, not held in the output buffer: the partition's next
                            # message waits for this one's FIN (Youzan's messagePump flushes
                            # every message of an ordered channel)
                            client.flush()
                        else:
                            client.kick()
                        if earliest is None or deadline < earliest:
                            earliest = deadline
                    for partition in self._direct(client):
                        room = client.ready_count - client.in_flight
                        if room <= 0 or client.closed:
                            break
                        n = self._deliver_direct(partition, client, room, scratch, deadline)
                        if n:
                            delivered = True
                        if n > 0:
                            if earliest is None or deadline < earliest:
                                earliest = deadline
            if earliest is not None:
                self.nsqd.schedule_scan(earliest)
            if self.inflight.expired_out:
                self._expired()
            if delivered:
                fairshare.delivered(self.nsqd)  # (publishers yield to it)
                gevent.idle()  # let writers and readers run between rounds
                continue
            if left_for_tag:
                # as Channel._dispatch: until a client comes, goes or is ready again here,
                # or any process pops from one of these rings (another worker's consumer
                # of the tag); a pop since a head was left (before the arm): another round
                wakers = self._wakers(ready)
                self._ready.clear()
                if self.wakes != wakes:  # woken during the round: another round
                    continue
                for waker in wakers:
                    waker.arm(for_space=True)
                try:
                    moved = any(w.ring.popped != popped[id(w.ring)] for w in wakers
                                if id(w.ring) in popped)
                    if not self.exiting and not moved and any(w.ring.depth for w in wakers):
                        self._ready.wait()
                finally:
                    for waker in wakers:
                        _disarm(waker.ring, for_space=True)
                continue
            self._wait_for_data(ready)

    def _expired(self):
        """Messages a time to live dropped in this round's C calls: consumed
        from the channel without a FIN, so finished in the cursor (or its
        confirmed offset would stay below them); then to the dead-letter
        topic if the policy says so (policy.flush_expired), else dropped."""
        buf = self.inflight.expired_out
        self.records_gone(buf)
        if self.policy is not None and self.policy.dead_letter_expired:
            policy.flush_expired(self)
        else:
            del buf[:]

    def records_gone(self, packed):
        """Packed records that left the channel without a FIN (expired, or
        moved to the dead-letter topic at max attempts: policy.dead_letter):
        finished in their cursors, in one C loop; an ordered lane's head may
        have gone so (its owner's feeder pushes the next)."""
        self.cursors.finish_records(packed)
        self.next_ordered()

    def _direct(self, client):
        """The partitions this worker owns that the client takes straight
        from their logs (no ring): all but ordered lanes', for a client
        without a sample rate on a channel without delivery policies (both
        consume messages without a FIN, which the cursor would wait for)."""
        if client.sample_rate or self.policy is not None or self.topic.paused \
                or client.ext_view is not None or self.topic.ordered:
            # (a paused topic passes nothing on to its channels; an ext topic's filters and
            # tags are applied on the ring's path, channel.py; an ordered-only topic's
            # partitions go through their ordered lanes alone)
            return ()
        if client.partition is None:
            return [p for p in self._readable if not self._following(p)
                    and (p.index not in self.lanes or not self.lanes[p.index].ordered)]
        lane = self.lanes.get(client.partition)
        if lane is not None and lane.ordered:
            return ()
        return [p for p in self._readable if p.index == client.partition
                and not self._following(p)]

    def _log_view(self, partition):
        """(reader, readable end) of a partition's log, the owner's own or,
        on another worker, a LogReader of the same files.  None: the owner
        has not made the log yet."""
        try:
            return partition.reader, partition.readable_end
        except (OSError, LogError, ValueError):
            return None

    def _deliver_direct(self, partition, client, room, scratch, deadline, one_out=False,
                        kick=True):
        """Deliver up to `room` unread, unfinished messages of a partition to
        a client straight from the log, whichever worker owns it, never
        copied into a ring: one C call (InFlight.deliver_from_log) claims
        the run under the cursor's lock, against the owner's feeder and the
        other workers' dispatchers (as _claim does), reads it from the
        mmap'd segments, frames it, puts it in flight and moves read_pos
        past it.  Returns how many went out (-1: read_pos moved on without
        any).  one_out: the partition's lane is ordered (_deliver_ordered):
        one out at a time.  kick: hold or send what went out (ClientV2.kick);
        else the caller sends it (next_ordered, _serve_finisher)."""
        cursor = self.cursors[partition.index]
        view = self._log_view(partition)
        if view is None:
            return 0
        reader, end = view
        base = len(client.out)
        # (lanes: nothing is claimed once a lane move held the cursor since the last
        # look_for_lanes; the round that wake() brings looks again)
        n, added, at = self.inflight.deliver_from_log(
            cursor, reader, end, self._feed_ring(partition), room, scratch, client.out,
            client.id, deadline, client.detail, client.detail_log, one_out,
            self.ring, self._lanes_seen)
        if n <= 0:
            if self.ring.lanes_version != self._lanes_seen:
                self.wake()
            return self._claimed_none(partition, n, at)
        if self.traced:
            trace.delivered(self, client, client.out, base)
        self.message_count += n
        client.in_flight += added
        client.message_count += n
        if kick:
            client.kick()
        return n

    def _direct_unread(self, ready, at_window=False):
        """Whether a ready client could take something straight from a log;
        at_window: could, but for its cursor's full window (a FIN here that
        moves it needs a round: _window_blocked)."""
        for client in ready:
            for partition in self._direct(client):
                cursor = self.cursors[partition.index]
                view = None if cursor.held else self._log_view(partition)
                if view is None:
                    continue
                pos = cursor.read_pos
                if pos < view[1] and (pos >= cursor.window_end) == at_window:
                    return True
        return False

    def _wakers(self, ready, rings=None):
        """The wakers of the rings the ready clients take from (_sources)."""
        if rings is None:
            rings = {id(ring): ring for client in ready for ring in self._sources(client)}
        wakers = [self._waker] if id(self.ring) in rings else []
        return wakers + [lane.waker for lane in self.lanes.values() if id(lane.ring) in rings]

    def _wait_for_data(self, ready):
        """Nothing to deliver to the ready clients: wait for a push into one
        of their rings or an append to a log they take straight from (armed
        before the last look, so none is missed)."""
        rings = {}
        for client in ready:
            for ring in self._sources(client):
                rings[id(ring)] = ring
        wakers = self._wakers(ready, rings)
        self._ready.clear()
        for waker in wakers:
            waker.arm()
        if id(self.ring) in rings and len(self._owned) < len(self.topic.partitions) \
                and len(self.lanes) < len(self.topic.partitions):
            # (a partition in a lane is pushed into its lane, never the ring: with every
            # one in a lane, a nudge would only wake the owners for nothing)
            if len(self.clients) > len(self._direct_ids) and not self.ring.depth:
                self.ring.ring_wanted = True  # a client here takes from the ring (_room)
            self.ring.nudge()  # the owners' feeders: a consumer here waits (see _room)
        try:
            # (a lane move since the round's look: a claim took nothing, look again)
            if not any(ring.depth for ring in rings.values()) \
                    and self.ring.lanes_version == self._lanes_seen \
                    and not self._direct_unread(ready):
                self._window_blocked = self._direct_unread(ready, at_window=True)
                self._ready.wait()
        finally:
            self._window_blocked = False
            for waker in wakers:
                _disarm(waker.ring)

    # -- the feeder -----------------------------------------------------------------------

    def feed_wake(self):
        """The log grew, the topic was unpaused: the feeder looks again, and
        the dispatchers (their clients take partitions straight from the log):
        this worker's, and the others' (asleep on the channel's ring, which
        the feeder may leave empty: _room)."""
        self._refill_wake.set()
        self.wake()
        if not self.exiting:
            # unconditionally: a fence, then one load when nobody sleeps; a test of
            # direct_subscribers first could read it before a new client's add and
            # miss that client's wait for this append
            self.ring.wake_consumers()

    def _room(self, partition):
        """How many records the feeder may push of a partition now: into an
        ordered lane one, once the one out is finished; else up to
        feed_target in its ring, topped up only once below feed_low (half),
        so that a refill is a few large reads, not one per consumer's pop."""
        lane = self.lanes.get(partition.index)
        if lane is not None and lane.ordered:
            cursor = self.cursors[partition.index]
            return 1 if not lane.ring.depth and cursor.read_pos <= cursor.confirmed else 0
        if lane is None and self.policy is None and len(self.clients) <= len(self._direct_ids) \
                and self.ring.subscribers <= self.ring.direct_subscribers \
                and not self.ring.ring_wanted:
            # every client of the channel, on any worker, takes the partition
            # straight from the log (_direct): a ring would only add copies.  (A
            # client that needs the ring and was missed from the counts, at a
            # worker's start, asks for it when it waits: ring_wanted.)
            self._filling.discard(-1)
            return 0
        key = partition.index if lane is not None else -1
        depth = self._feed_ring(partition).depth
        if depth < self.feed_low:
            self._filling.add(key)
        elif depth >= self.feed_target:
            self._filling.discard(key)
        return min(self.feed_target - depth, FEED_BATCH) if key in self._filling else 0

    def _feed_ring(self, partition):
        """The ring the owner's feeder fills with a partition: its lane's, or
        the channel's."""
        lane = self.lanes.get(partition.index)
        return lane.ring if lane is not None else self.ring

    def _feed_once(self, partition, room, scratch):
        """Push up to `room` unread, unfinished messages of a partition into
        its lane or the channel's ring (its cursor not held: the feed loop
        looks first); how many were pushed (-1: moved on without pushing;
        RING_FULL: the ring took none, full by bytes)."""
        if partition.log is None:
            return 0
        lane = self.lanes.get(partition.index)
        ring = lane.ring if lane is not None else self.ring
        ordered = lane is not None and lane.ordered  # (its head alone, into an empty lane)
        pushed, consumed = self._claim(partition, self._log_view(partition), room, scratch,
                                       lambda records, n: ring.push_packed(records),
                                       before=ring if ordered else None, one_out=ordered,
                                       lanes_seen=self._lanes_seen)
        if pushed == 0 and consumed is not None:
            return RING_FULL  # records read, none taken: the ring is full by bytes
        if pushed > 0:
            self.message_count += pushed  # (nsqd counts what the topic pumps into the channel)
            if ring is self.ring and ring.ring_wanted:
                ring.ring_wanted = False  # (asked again by a client that empties it and waits)
        return pushed

    def _claim(self, partition, view, room, scratch, hand_off, before=None, one_out=False,
               lanes_seen=None):
        """Take a partition's next run of unread, unfinished messages, as one
        step against every other reader of it (the owner's feeder, each
        worker's dispatcher), under the cursor's lock: read it
        (Cursor.claim_read), hand it on (hand_off(records, n) -> (how many it
        took, its result)), move read_pos past what was taken.  Returns
        (taken, the hand-off's result); taken 0: nothing now, -1: read_pos
        moved on without any.  before: a ring the owner's feeder fills with
        this partition; while it holds records (claimed earlier, so older),
        nothing is read past them (they go out first, at the next round: the
        partition's log order).  one_out: an ordered lane's, one message at a
        time: nothing while one is out (read_pos past confirmed), looked at
        under the lock (_room looked before it: a local ordered consumer may
        have claimed the head itself meanwhile, Consumer._claim_run).
        lanes_seen: the channel ring's lanes_version as the feeder last looked
        (look_for_lanes); nothing while it moved: a lane move held this
        cursor since, and this worker pushes nothing of the partition before
        it attached the lane (the feed loop looks again at once).  (A
        dispatcher's delivery does all of it in C: InFlight.deliver_from_log.)"""
        cursor = self.cursors[partition.index]
        reader, end = view
        cursor.lock()
        try:
            if before is not None and before.depth:
                return 0, None
            if lanes_seen is not None and self.ring.lanes_version != lanes_seen:
                return 0, None
            if one_out and cursor.read_pos > cursor.confirmed:
                return 0, None
            first, n, nbytes = cursor.claim_read(reader, end, room, scratch)
            if n > 0:
                taken, result = hand_off(memoryview(scratch)[:nbytes], n)
                cursor.read_pos = first + taken
        finally:
            cursor.unlock()
        if n <= 0:
            return self._claimed_none(partition, n, first), None
        return taken, result

    def _claimed_none(self, partition, n, at):
        """After a claim that took nothing (Cursor.claim_read's n and first):
        the cursor moved to the log's start if retention passed it (then -1);
        the owner's feeder woken if the window is full (it watches for the
        FINs that move it, _watch_window, wherever they come).  -> n."""
        if n == RETENTION:
            self.move_to_start(partition, at)
            return -1
        if n == 0 and at >= self.cursors[partition.index].window_end:
            if partition.owned:
                self._refill_wake.set()
            else:
                self.ring.nudge()
        return n

    def _check_hold(self, partition, cursor):
        """A seek holds the cursor for the length of a broadcast; one held
        for SEEK_HOLD_LIMIT was left by a worker that died inside a seek:
        read on from the confirmed offset.  Records pushed before the seek
        may then come twice (at least once), but the partition does not stall."""
        since = self._held_since.setdefault(partition.index, time.monotonic())
        if time.monotonic() - since < SEEK_HOLD_LIMIT:
            return
        self._held_since.pop(partition.index, None)
        self.nsqd.logf("warn", f"CHANNEL({self.topic.name}:{self.name}): partition "
                               f"{partition.index}: a seek left the cursor held for "
                               f"{SEEK_HOLD_LIMIT:.0f}s; reading on from {cursor.confirmed}")
        cursor.release(cursor.confirmed)

    def _following(self, partition):
        """A partition this node follows (cluster mode): its leader's node
        delivers it, so the feeder here pushes nothing of it (consumers find
        leaders through /lookup, as Youzan's), and the cursors the leader sends
        (ReplicaHost.adopt_cursors) find nothing pushed from another position.
        Promoted (ReplicaHost.set_gate), it delivers from there."""
        return not partition.writable

    def _feedable(self):
        """Whether an owned partition has something the feeder could push now."""
        for partition in self._owned:
            log = partition.log
            if log is None or self._following(partition):
                continue
            cursor = self.cursors[partition.index]
            pos = cursor.read_pos
            if pos < partition.readable_end and pos < cursor.window_end and self._room(partition) > 0:
                return True
        return False

    def _watch_window(self, partition, cursor):
        """A partition the feeder pushes nothing of now (its clients read the log):
        while its cursor's window is full (read_pos at window_end), the dispatchers
        can read nothing, and a FIN on another worker that moves the window wakes
        none of them; so the feeder looks every WINDOW_RETRY (returns True: stalled),
        and wakes them all once it has moved."""
        index = partition.index
        if cursor.read_pos >= cursor.window_end and cursor.read_pos < partition.readable_end:
            self._full_windows.add(index)
            return True
        if index in self._full_windows:
            self._full_windows.discard(index)
            self.wake()
            self.ring.wake_consumers()
        return False

    def _feed_loop(self):
        wake = self._refill_wake
        turn = 0
        while not self.exiting:
            stalled = False
            moved = False
            full = {}  # id(ring) -> (ring, its pop count) of rings that took nothing
            if not self.topic.paused:
                self.look_for_lanes()
                with self.scratch.borrow() as scratch:
                    for i in range(len(self._owned)):
                        partition = self._owned[(turn + i) % len(self._owned)]
                        if self._following(partition):
                            continue
                        cursor = self.cursors[partition.index]
                        if cursor.held:  # (released here if a dead worker's seek left it)
                            self._check_hold(partition, cursor)
                            continue
                        self._held_since.pop(partition.index, None)
                        room = self._room(partition)
                        if room <= 0:
                            stalled = self._watch_window(partition, cursor) or stalled
                            continue
                        n = self._feed_once(partition, room, scratch)
                        if n == RING_FULL:
                            ring = self._feed_ring(partition)
                            full[id(ring)] = (ring, ring.popped)
                            continue
                        moved = moved or n != 0
                        stalled = stalled or (n == 0 and cursor.read_pos >= cursor.window_end)
                turn += 1
            # a held cursor (a seek) is looked at again too (_check_hold)
            stalled = stalled or bool(self._held_since)
            if moved:
                gevent.idle()  # let consumers run between batches
                continue
            if not self.topic.paused and self.ring.lanes_version != self._lanes_seen:
                continue  # (a lane move since the pass's look: _claim took nothing; look)
            # wait for: an append (local event), room in a ring (a pop on any
            # worker: the ring's wake FIFO), an unpause, FINs (window full; an
            # ordered lane's FIN nudges it)
            wake.clear()
            wakers = [self._waker, *(lane.waker for lane in self.lanes.values())]
            for waker in wakers:
                waker.arm(for_space=True)
            try:
                if any(ring.popped != popped for ring, popped in full.values()):
                    continue  # a pop before the arm: room again (the finally disarms)
                if self.topic.paused or not self._feedable() or full:
                    # (a full ring: a pop from it, on any worker, wakes this; its
                    # partition stays feedable, so no wait at all would spin)
                    wake.wait(WINDOW_RETRY if stalled else None)
                elif stalled:
                    wake.wait(WINDOW_RETRY)
            finally:
                for waker in wakers:
                    _disarm(waker.ring, for_space=True)

    def move_to_start(self, partition, start):
        """Retention removed what the cursor had not confirmed: on to the log start."""
        cursor = self.cursors[partition.index]
        if cursor.confirmed >= start:
            if cursor.read_pos < start:
                cursor.read_pos = start
            return
        self.nsqd.logf("warn", f"CHANNEL({self.topic.name}:{self.name}): partition "
                               f"{partition.index}: messages {cursor.confirmed}..{start - 1} "
                               f"were removed by retention before they were finished; "
                               f"moving to {start}")
        cursor.lock()  # (nests: one step, against a local consumer's claim between them)
        try:
            pushed = cursor.read_pos
            cursor.set(start)
            cursor.read_pos = max(pushed, start)  # what the ring holds is delivered, not again
        finally:
            cursor.unlock()
        self.retention_moves += 1
        self.feed_wake()

    def checkpoint(self, partition):
        """Write the cursor's checkpoint if it moved (the partition's owner)."""
        if self.ephemeral or self.exiting:
            return
        cursor = self.cursors[partition.index]
        confirmed = cursor.confirmed
        if self._checkpointed.get(partition.index) != confirmed or cursor.finished_above:
            try:
                cursor.checkpoint()
            except OSError as err:
                self.nsqd.logf("error", f"CHANNEL({self.topic.name}:{self.name}): "
                                        f"checkpoint failed - {err}")
                return
            self._checkpointed[partition.index] = confirmed

    # -- depth, empty, stats ----------------------------------------------------------

    @property
    def backend_depth(self):
        """Messages of the logs this worker owns not yet taken from them (into
        a ring or straight to a client).  Only the owned partitions: the
        broker's /stats sums the workers' backend_depth (as the owner's disk
        queue of a classic channel), so each partition counts once."""
        total = 0
        for partition in self._owned:
            cursor = self.cursors[partition.index]
            total += max(0, partition.offsets()[1] - cursor.read_pos)
        return total

    @property
    def shared_depth(self):
        """What waits in the rings, the channel's and its lanes' (shared
        memory: any worker tells the broker's)."""
        return self.ring.depth + sum(lane.ring.depth for lane in self.lanes.values())

    @property
    def depth(self):
        return self.shared_depth + self.backend_depth

    @property
    def direct_count(self):
        """What local consumers (nsqshm.local) took straight from the logs of
        the partitions this worker owns: no worker pushed those into the
        channel, so message_count never saw them.  Each partition's count is
        reported by its owner only (/stats sums the workers' parts)."""
        return sum(self.cursors[p.index].direct_total for p in self.topic.partitions
                   if p.owned)

    def partition_stats(self):
        out = []
        for partition in self.topic.partitions:
            cursor = self.cursors[partition.index]
            end = partition.offsets()[1]
            lane = self.lanes.get(partition.index)
            out.append({"partition": partition.index, "confirmed_offset": cursor.confirmed,
                        "read_offset": cursor.read_pos, "finished_above": cursor.finished_above,
                        "lag": max(0, end - cursor.confirmed),
                        # messages put back (REQ, timeout) still unfinished, as the retry
                        # table knows them (sent to the followers: take_up_retries)
                        "put_back": cursor.retry_count(),
                        # one past the highest offset put in flight (a follower: its
                        # leader's, as last sent; a new leader gives what is unfinished
                        # below it one delivery's attempts)
                        "delivered_offset": cursor.delivered,
                        # its own ring (loglane.py): "partition" (SUB T C p) or
                        # "ordered" (SUB_ORDERED), and what waits there
                        "lane": None if lane is None else ("ordered" if lane.ordered
                                                           else "partition"),
                        "lane_depth": 0 if lane is None else lane.ring.depth})
        return out

    def empty(self):
        """Every cursor to the end of its log; the ring and what this worker
        holds are dropped.  The worker that takes the request moves the
        cursors; the others, applying the change after it, drop only what
        lies below the new confirmed offsets: a feeder may already have
        pushed (and a dispatcher delivered) messages published since, which
        must not be lost (nothing would deliver them again)."""
        if getattr(self.nsqd._remote, "active", False):
            self._drop_moved()
            return
        for partition in self.topic.partitions:
            self.cursors[partition.index].set(partition.offsets()[1])
        with self.scratch.borrow() as scratch:
            for lane in self.lanes.values():
                while lane.ring.pop_many_into(scratch)[0]:
                    pass
        super().empty()

    def seek(self, offsets):
        """Move the channel's cursor in each given partition to a msg offset
        (offsets: [(partition, offset)]; SUB_ADVANCED's position,
        /channel/setoffset): confirmed = read position = offset, nothing
        above it finished; the consumers then receive that partition from
        exactly there.

        Whichever worker takes the request does it, in this order:
        1. hold each cursor at its offset (set(hold=True)): the partition's
           feeder (on its owner) pushes nothing of it meanwhile; a batch it
           read before the hold ends before its worker applies step 3;
        2. drop every record of those partitions from the channel ring and
           from this worker's in flight and deferred messages (they were
           pushed from the old position);
        3. the same on every other worker: `empty`'s broadcast, which they
           apply as _drop_moved (below) and which returns once all did;
        4. release the holds and wake the owners' feeders.
        What a worker holds in flight of the seeked partitions is dropped
        (a late FIN answers E_FIN_FAILED); the other partitions' messages stay
        in flight with their clients (_drop_moved)."""
        self._move(offsets)

    def _move(self, moves, make_lanes=None):
        """seek's steps for [(partition, offset)]; an offset of None rewinds
        to the confirmed offset and keeps what was finished above it
        (Cursor.hold; use_lanes, whose lanes are made once the cursors are
        held, and the channel's lanes_version bumped then: make_lanes, the
        partitions and their kind)."""
        held = []
        try:
            for partition, offset in moves:
                cursor = self.cursors[partition.index]
                if offset is None:
                    cursor.hold()
                else:
                    cursor.set(offset, hold=True)
                held.append((partition, offset))
            if make_lanes is not None:
                indices, ordered = make_lanes
                made = []
                try:
                    for index in indices:
                        self.nsqd.make_ring(lane_suffix(self.topic.name, self.name, index,
                                                        ordered)).close()
                        made.append(index)
                except BaseException:
                    # none kept: a lane left without its move's drop would let the copies
                    # from before it (in the channel ring) go out beside it
                    for index in made:
                        Ring.unlink_segment(self._lane_name(index, ordered))
                    if made:  # (a worker that attached one looks again: gone)
                        self.ring.bump_lanes_version()
                    raise
                self.ring.bump_lanes_version()
            self._drop_moved()
            self.nsqd.broadcast_change("channel_empty", self.topic.name, self.name)
        finally:
            for partition, offset in held:
                cursor = self.cursors[partition.index]
                cursor.release(cursor.confirmed if offset is None else offset)
        owners = {p.owner for p, _ in moves if not p.owned}
        if any(p.owned for p, _ in moves):
            self.feed_wake()
        if self.nsqd.cluster is not None:  # the owners' LogTopic.wake: their feeders look again
            for owner in sorted(owners):
                self.nsqd.cluster.tell(owner, {"op": "want", "topic": self.topic.name})

    def _drop_moved(self):
        """What a cursor move leaves stale, from the rings and what this worker
        holds: below a cursor's confirmed offset (`empty`), and every record of
        a partition whose cursor a seek holds.  First the lanes made since
        are attached (use_lanes moves a partition to one this way).  The
        rings are emptied and what is not stale pushed back (into its lane);
        in flight and deferred, only the stale messages are taken out, in C
        (drain_stale): the others stay with their clients, whose FINs still
        hold."""
        self._find_lanes()
        held = self._held_lanes()  # (their moves' copies go below; another's move may
        kept = bytearray()         # have made a lane here not held yet: not clean)
        rings = [self.ring, *(lane.ring for lane in self.lanes.values())]
        with self.scratch.borrow() as scratch:
            for ring in rings:
                while True:
                    n, nbytes = ring.pop_many_into(scratch)
                    if not n:
                        break
                    # not below their cursor's confirmed offset, nor of a held one
                    kept += self.cursors.unconfirmed(memoryview(scratch)[:nbytes],
                                                     skip_held=True)
            for store in (self.inflight, self.deferred):
                while store.drain_stale(self.cursors, scratch)[0]:
                    pass
            held &= self._held_lanes()  # (held all through the drain)
        if kept:
            self.put_records(kept)  # stored again before the blocks are released
        self.inflight.release()
        self.deferred.release()
        # once the dropped copies are freed, and before a yield (a head taken from a
        # lane attached above is noted with it)
        self._lanes_clean = {lane for lane in self.lanes.values()
                             if lane.ordered and (lane in self._lanes_clean or lane in held)}
        self._mark_ordered_lanes()
        for client in self.clients.values():
            client.in_flight = self.inflight.client_count(client.id)
        self.wake()

    # -- the end ----------------------------------------------------------------------

    def _stop_greenlets(self):
        super()._stop_greenlets()
        if self._feeder is not None:
            self._feeder.kill(block=False)
            self._feeder = None

    def _close_cursors(self, unlink=False, segments=False):
        for partition in self.topic.partitions:
            cursor = self.cursors[partition.index]
            if cursor is None:
                continue
            if unlink:
                cursor.unlink()
            elif segments and partition.owned:
                if self.ephemeral:
                    cursor.unlink()
                else:
                    try:
                        cursor.checkpoint()
                    except OSError as err:
                        self.nsqd.logf("error", f"CHANNEL({self.topic.name}:{self.name}): "
                                                f"checkpoint failed - {err}")
                    else:  # the next start reads from the checkpoint
                        _remove(f"/dev/shm/{cursor.name}")
            cursor.close()
            self.cursors[partition.index] = None

    def close(self, delete=False):
        """delete: as a classic channel, and the cursors go.  Otherwise the
        broker stops as a whole (phase 2, on every worker): the owners of
        partitions checkpoint the cursors and remove their segments; the
        topic's owner drops the ring and the deferred files (all of it is
        in the log, unfinished: read again from the cursors at the start)."""
        if delete:
            super().close(delete=True)
            self._close_lanes(unlink=True)
            self._close_cursors(unlink=True)
            return
        self.exiting = True
        self._stop_greenlets()
        if self.topic.owned:
            self._drop_held()
            for path in self._deferred_files():
                _remove(path)
            self.ring.unlink()
            self._close_lanes(unlink=True)
        self._close_lanes()
        self._close_cursors(segments=True)
        self._waker.close()
        self.ring.close()

    def close_handles(self, sync=False):
        super().close_handles(sync)
        self._close_lanes()
        self._close_cursors()


def _disarm(ring, for_space=False):
    if not ring.closed:  # (a lane replaced meanwhile: _find_lanes closed it)
        ring.disarm(for_space)


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
