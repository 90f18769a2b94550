"""The in-flight arenas of local clients: their names, and putting their
messages back into the rings.

A local consumer keeps every message it holds in an arena of its own
(nsqshm._core.arena, mode 0600), so when it dies the broker finds them:

    <prefix>.f.l<pid>.<n>               a local consumer (Consumer, BulkConsumer)
    <prefix>.f.s<reader>.<seq>.<part>   one partition of a Spark micro-batch
    <prefix>.f.s<reader>.c              a Spark stream reader's client counters

The broker lists these for /stats and, when an arena's owner is gone, puts
its messages back into their channels and unlinks it
(nsqshm.nsqd.local.clients).  A client unlinks only its own arena, and only
after every message in it went back or was finished.
"""

import itertools
import os
import re
import struct

from nsqshm._core.arena import DEFERRED, LIVE, Arena
from nsqshm._core.logcursor import decode_message_id

LOCAL_TAG = "f.l"
SPARK_TAG = "f.s"
_READER_ID = re.compile(r"[0-9a-f]{8,32}\Z")
_counter = itertools.count()


def local_name(prefix):
    """A new arena name for a local consumer of this process."""
    return f"{prefix}.{LOCAL_TAG}{os.getpid()}.{next(_counter)}"


def check_reader_id(reader):
    if not isinstance(reader, str) or not _READER_ID.match(reader):
        raise ValueError(f"invalid Spark reader id {reader!r}")
    return reader


def spark_batch_name(prefix, reader, seq, part):
    return f"{prefix}.{SPARK_TAG}{check_reader_id(reader)}.{int(seq)}.{int(part)}"


def spark_client_name(prefix, reader):
    return f"{prefix}.{SPARK_TAG}{check_reader_id(reader)}.c"


def spark_batch_arenas(prefix, reader):
    """{seq: [names]} of a Spark reader's batch arenas in /dev/shm."""
    head = f"{prefix}.{SPARK_TAG}{check_reader_id(reader)}."
    out = {}
    for name in Arena.list(head):
        seq, _, part = name[len(head):].partition(".")
        if seq.isdigit() and part.isdigit():
            out.setdefault(int(seq), []).append(name)
    return out


def pack_blocks(blocks, queue=None):
    """Packed [u32 native size][message] records of an arena's blocks (all,
    or those of `queue`), with their offsets."""
    parts, offsets = [], []
    for offset, q, state, _due, msg in blocks:
        if state in (LIVE, DEFERRED) and (queue is None or q == queue):
            parts.append(struct.pack("=I", len(msg)))
            parts.append(msg)
            offsets.append(offset)
    return b"".join(parts), offsets


def put_back(arena, ring, queue, timeout=None, cursors=None, lanes=None):
    """Push the messages `arena` holds for `queue` back into `ring` and free
    their blocks (each only once it is in the ring: a death in between
    repeats it, never loses it).  Waits up to `timeout` seconds for room
    (None: no wait).  cursors: a log channel's, whose retry tables note what
    goes back (with its attempts).  lanes: {partition: (ordered, Ring)} of a
    log channel's lanes: a message of such a partition goes back into its
    lane, as the broker puts it back (LogChannel._put_back), and into an
    ordered lane only the partition's head (its offset the confirmed one);
    the others are freed (the lane's feeder reads them from the log again).
    A log message below its cursor's confirmed offset is finished (held
    across a /channel/empty): freed, counted as put back, not pushed.
    Returns (put back, left in the arena)."""
    blocks = list(arena.blocks())
    finished = 0
    if cursors is not None:
        blocks, finished = _release_finished(arena, blocks, queue, cursors)
    packed, offsets = pack_blocks(blocks, queue)
    if cursors is not None and packed:
        cursors.note_retries(packed)
    if not lanes:
        done = _push(arena, ring, packed, offsets, timeout)
    else:
        done = 0
        for dest, own in _by_ring(blocks, ring, lanes, cursors):
            packed, own_offsets = pack_blocks(own, queue)
            if dest is None:  # (not a head of an ordered lane: read again from the log)
                for offset in own_offsets:
                    arena.release(offset)
                done += len(own_offsets)
            else:
                done += _push(arena, dest, packed, own_offsets, timeout)
    return done + finished, len(offsets) - done


def _release_finished(arena, blocks, queue, cursors):
    """Free the blocks (of `queue`) whose log message lies below its
    cursor's confirmed offset: finished, not to go back.  -> (the other
    blocks, how many were freed)."""
    kept = []
    for block in blocks:
        offset, q, state, _due, msg = block
        if state in (LIVE, DEFERRED) and (queue is None or q == queue):
            where = decode_message_id(msg[10:26])  # [8 timestamp][2 attempts][16 ID]
            cursor = cursors[where[0]] if where and where[0] < len(cursors) else None
            if cursor is not None and where[1] < cursor.confirmed:
                arena.release(offset)
                continue
        kept.append(block)
    return kept, len(blocks) - len(kept)


def _by_ring(blocks, ring, lanes, cursors):
    """[(ring, blocks)]: each block with the lane of its message's partition,
    or `ring` (not a log message, or no lane of it); None: not to go back."""
    out = {}
    for block in blocks:
        where = decode_message_id(block[4][10:26])  # [8 timestamp][2 attempts][16 ID]
        lane = lanes.get(where[0]) if where else None
        if lane is None:
            dest = ring
        elif lane[0] and where[1] != cursors[where[0]].confirmed:
            dest = None
        else:
            dest = lane[1]
        out.setdefault(id(dest), (dest, []))[1].append(block)
    return list(out.values())


def _push(arena, ring, packed, offsets, timeout):
    """Push packed records into ring, freeing each one's block once it is
    in; how many went (the rest stay in the arena)."""
    view = memoryview(packed)
    done = 0
    while done < len(offsets):
        n, used = ring.push_packed(view)
        if not n and timeout:
            n, used = ring.push_packed_wait(view, timeout=timeout)
        if not n:
            break
        for offset in offsets[done:done + n]:
            arena.release(offset)
        done += n
        view = view[used:]
    return done
