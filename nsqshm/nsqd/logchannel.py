"""A channel of a log topic: a cursor per partition over the log, in front
of the classic channel machinery.

The channel is a classic Channel (channel.py): its shared-memory ring, the
arena in flight, timeouts, REQ with a delay, TOUCH, pause, stats and the
recovery of a dead worker's messages all work as for a classic topic.  What
differs is the source of the ring: not a topic pump, but a feeder on each
worker that owns partitions of the topic, which reads the partition logs at
the channel's read position (LogReader.read_into: whole records, one call
per batch) and pushes them into the ring, at most FEED_AHEAD messages ahead
of the consumers.  Nothing is ever written to a channel disk queue: the log
is the disk.

Each (channel, partition) has a Cursor (logcursor.pyx, shared memory,
checkpointed to <partition dir>/<channel>.cursor):

    confirmed   every msg offset below it is finished
    window      the offsets finished out of order above it
    read_pos    what the feeder pushed into the ring so far

A FIN marks the message's offset in the cursor, then frees it in flight:
the message ID is its position ((partition << 48) | offset, stamped at
append), so wire.fin_lines does it in C for a window of FINs.  A worker's
death keeps ring, arena and cursor (all shared memory): nothing is read
twice or skipped.  A graceful stop of the broker drops the ring (what it
held is in the log, unfinished) and the cursor segment after a checkpoint;
the next start reads from confirmed again, stepping over what was finished
(Cursor.unfinished_run): at least once, and only what was not finished.
A new channel starts at the end of the log, as nsqd's new channels see only
new messages; `empty` moves every cursor to the end.
"""

import os
import time

import gevent

from nsqshm._core.commitlog import OffsetOutOfRange
from nsqshm._core.logcursor import Cursor, CursorSet, checkpoint_path, decode_message_id
from nsqshm.nsqd.channel import Channel

FEED_AHEAD = 8192       # messages a feeder keeps in the ring ahead of the consumers (at most)
FEED_BATCH = 4096       # messages read from the log and pushed in one go
HELD_UNTIL_FINISHED = 2**63 - 1  # a deadline no timeout reaches
SEEK_HOLD_LIMIT = 30.0  # seconds a seek may hold a cursor (_check_hold)
WINDOW_RETRY = 0.5      # a cursor's window is full: look again after this (FINs move it)


class LogChannel(Channel):
    disk_queue = False

    def __init__(self, topic, name):
        super().__init__(topic, name)
        self.cursors = CursorSet(len(topic.partitions))
        self.retention_moves = 0    # times a cursor fell below the log start (retention)
        self._checkpointed = {}     # partition -> confirmed at the last checkpoint
        self._held_since = {}       # partition -> when the feeder first found it held
        self.feed_target = max(1, min(self.mem_limit, FEED_AHEAD))
        self.feed_low = max(1, self.feed_target // 2)
        for partition in topic.partitions:
            self.cursors[partition.index] = self._open_cursor(partition)
        self._owned = [p for p in topic.partitions if p.owned]
        self._feeder = gevent.spawn(self._feed_loop) if self._owned else None

    def __repr__(self):
        return f"<LogChannel {self.topic.name}:{self.name}>"

    def _cursor_name(self, partition):
        return f"{self.nsqd.shm_prefix}.k.{self.topic.name}:{self.name}:p{partition.index}"

    def _open_cursor(self, partition):
        """Attach to the cursor, or make it: from its checkpoint, else at the
        log's end -- a new channel sees only new messages -- or, for the
        topic's first channel, at its start: nsqd's topic keeps what is
        published before any channel exists for the first one."""
        name = self._cursor_name(partition)
        ckpt = checkpoint_path(partition.path, self.name)
        fresh = not os.path.exists(f"/dev/shm/{name}")
        if fresh and self.ephemeral:  # an ephemeral channel's cursor is not kept
            _remove(ckpt)
        start, end = partition.offsets()
        first = not any(c is not self for c in self.topic.channels.values())
        cursor = Cursor.open(name, ckpt, start if first else end)
        if fresh and not self.ephemeral and partition.owned and not os.path.exists(ckpt):
            cursor.checkpoint()  # a restart finds where it started
        # (None: no checkpoint yet; the owner's retention pass writes one)
        self._checkpointed[partition.index] = cursor.confirmed if os.path.exists(ckpt) else None
        return cursor

    # -- FIN ------------------------------------------------------------------------------

    def finish(self, client, msg_id):
        # The cursor first, then the in-flight block (as wire.fin_lines): a
        # death in between delivers an already-finished message again, never
        # leaves an offset that nothing finishes.  touch checks that the client
        # holds the message, so a stray FIN marks nothing; its deadline only
        # moves the node in this process's heap, and the finish removes it.
        status = self.inflight.touch(msg_id, client.id, HELD_UNTIL_FINISHED)
        if status:
            raise self._failed(status, msg_id)
        self.cursors.finish(msg_id)
        super().finish(client, msg_id)

    # -- the feeder -----------------------------------------------------------------------

    def feed_wake(self):
        """The log grew, the topic was unpaused: the feeder looks again."""
        self._refill_wake.set()

    def _feed_once(self, partition, room, scratch):
        """Push up to `room` unread, unfinished messages of a partition into
        the ring; how many were pushed (-1: moved on without pushing)."""
        cursor = self.cursors[partition.index]
        log = partition.log
        if log is None:
            return 0
        if cursor.held:
            self._check_hold(partition, cursor)
            return 0
        self._held_since.pop(partition.index, None)
        end = log.end_offset
        pos = cursor.read_pos
        if pos >= end:
            return 0
        if pos < log.start_offset:
            self.move_to_start(partition, log.start_offset)
            return -1
        first, run = cursor.unfinished_run(pos, end)
        if first < 0:  # all finished up to the window's end (or the log's)
            to = min(end, cursor.window_end)
            if to > pos:
                cursor.read_pos = to
                return -1
            return 0  # the window is full: wait for FINs
        try:
            n, nbytes, _ = log.reader.read_into(first, scratch, max_records=min(run, room))
        except OffsetOutOfRange as err:
            self.move_to_start(partition, err.start_offset)
            return -1
        if not n:
            return 0
        pushed, _ = self.ring.push_packed(memoryview(scratch)[:nbytes])
        if pushed or first > pos:
            cursor.read_pos = first + pushed
        self.message_count += pushed  # (nsqd counts what the topic pumps into the channel)
        return pushed

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

    def _unread(self):
        """Whether an owned partition has something the feeder could push."""
        for partition in self._owned:
            log = partition.log
            if log is None:
                continue
            cursor = self.cursors[partition.index]
            pos = cursor.read_pos
            if pos < log.end_offset and pos < cursor.window_end:
                return True
        return False

    def _feed_loop(self):
        """Top the ring up to feed_target once it holds fewer than feed_low
        (half): a refill is a few large reads, not one per consumer's pop."""
        ring = self.ring
        wake = self._refill_wake
        turn = 0
        filling = True
        while not self.exiting:
            stalled = False
            moved = False
            depth = ring.depth
            if depth < self.feed_low:
                filling = True
            if not self.topic.paused and filling and depth < self.feed_target:
                with self.scratch.borrow() as scratch:
                    for i in range(len(self._owned)):
                        room = min(self.feed_target - ring.depth, FEED_BATCH)
                        if room <= 0:
                            break
                        partition = self._owned[(turn + i) % len(self._owned)]
                        n = self._feed_once(partition, room, scratch)
                        moved = moved or n != 0
                        cursor = self.cursors[partition.index]
                        stalled = stalled or (n == 0 and cursor.read_pos >= cursor.window_end)
                turn += 1
            # a held cursor (a seek) is looked at again too (_check_hold)
            stalled = stalled or bool(self._held_since)
            if moved:
                gevent.idle()  # let consumers run between batches
                continue
            filling = ring.depth < self.feed_low  # topped up (or nothing to read): wait
            # wait for: an append (local event), room in the ring (a pop on any
            # worker: the ring's wake FIFO), an unpause, FINs (window full)
            wake.clear()
            self._waker.arm(for_space=True)
            try:
                if self.topic.paused or ring.depth >= self.feed_low or not self._unread():
                    wake.wait(WINDOW_RETRY if stalled else None)
                elif stalled:
                    wake.wait(WINDOW_RETRY)
            finally:
                ring.disarm(for_space=True)

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
        pushed = cursor.read_pos
        cursor.set(start)
        cursor.read_pos = max(pushed, start)  # what the ring holds is delivered, not pushed again
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
        """Messages of the log not pushed into the ring yet."""
        total = 0
        for partition in self.topic.partitions:
            cursor = self.cursors[partition.index]
            total += max(0, partition.offsets()[1] - cursor.read_pos)
        return total

    @property
    def depth(self):
        return self.ring.depth + self.backend_depth

    def partition_stats(self):
        out = []
        for partition in self.topic.partitions:
            cursor = self.cursors[partition.index]
            end = partition.offsets()[1]
            out.append({"partition": partition.index, "confirmed_offset": cursor.confirmed,
                        "read_offset": cursor.read_pos, "finished_above": cursor.finished_above,
                        "lag": max(0, end - cursor.confirmed)})
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
        As with `empty`, what a worker holds in flight is taken back: the
        seeked partitions' messages are dropped (their FIN answers
        E_FIN_FAILED), the others' go back into the ring and are delivered
        again (at least once)."""
        for partition, offset in offsets:
            self.cursors[partition.index].set(offset, hold=True)
        try:
            self._drop_moved()
            self.nsqd.broadcast_change("channel_empty", self.topic.name, self.name)
        finally:
            for partition, offset in offsets:
                self.cursors[partition.index].release(offset)
        owners = {p.owner for p, _ in offsets if not p.owned}
        if any(p.owned for p, _ in offsets):
            self.feed_wake()
        if self.nsqd.cluster is not None:  # the owners' LogTopic.wake: their feeders look again
            for owner in sorted(owners):
                self.nsqd.cluster.tell(owner, {"op": "want", "topic": self.topic.name})

    def _drop_moved(self):
        """What a cursor move leaves stale, from the ring and what this worker
        holds: below a cursor's confirmed offset (`empty`), and every record of
        a partition whose cursor a seek holds."""
        kept = bytearray()
        with self.scratch.borrow() as scratch:
            for source in (self.ring.pop_many_into, self.inflight.drain, self.deferred.drain):
                while True:
                    n, nbytes = source(scratch)
                    if not n:
                        break
                    kept += self._unconfirmed(memoryview(scratch)[:nbytes])
        if kept:
            self.put_records(kept)  # stored again before the blocks are released
        self.inflight.release()
        self.deferred.release()
        for client in self.clients.values():
            client.in_flight = self.inflight.client_count(client.id)
        self._ready.set()

    def _unconfirmed(self, view):
        """The packed records of view whose offset is not below their
        cursor's confirmed one and whose cursor no seek holds (an admin
        path: a Python step per message)."""
        out = bytearray()
        pos = 0
        while pos < len(view):
            size = int.from_bytes(view[pos:pos + 4], "little")
            where = decode_message_id(view[pos + 14:pos + 30])
            cursor = self.cursors[where[0]] if where and where[0] < len(self.cursors) else None
            if cursor is None or (where[1] >= cursor.confirmed and not cursor.held):
                out += view[pos:pos + 4 + size]
            pos += 4 + size
        return out

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
            self._close_cursors(unlink=True)
            return
        self.exiting = True
        self._stop_greenlets()
        if self.topic.owned:
            self._drop_held()
            for path in self._deferred_files():
                _remove(path)
            self.ring.unlink()
        self._close_cursors(segments=True)
        self._waker.close()
        self.ring.close()

    def close_handles(self, sync=False):
        super().close_handles(sync)
        self._close_cursors()


def _remove(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
