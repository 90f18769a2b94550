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

from nsqshm._core.arena import Arena
from nsqshm._core.localbatch import GATHER_DROP, GATHER_RING, arena_gather

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
    Gathered and grouped in C (localbatch.arena_gather), freed in C
    (Arena.release_many).  Returns (put back, left in the arena)."""
    index = -1 if queue is None else arena.find_queue(queue)
    if index < 0 and queue is not None:
        return 0, 0  # (nothing was ever held for it)
    kinds = bytearray()
    for partition, (ordered, _) in (lanes or {}).items():
        if partition >= len(kinds):
            kinds += bytes(partition + 1 - len(kinds))
        kinds[partition] = 2 if ordered else 1
    finished, groups = arena_gather(arena, index, cursors, kinds)
    done = held = 0
    for dest, packed, offsets in groups:
        n = len(offsets) // 8
        held += n
        if cursors is not None:
            cursors.note_retries(packed)
        if dest == GATHER_DROP:  # (not a head of an ordered lane: read again from the log)
            arena.release_many(offsets)
            done += n
        else:
            done += _push(arena, ring if dest == GATHER_RING else lanes[dest][1], packed,
                          offsets, timeout)
    return done + finished, held - done


def _push(arena, ring, packed, offsets, timeout):
    """Push packed records into ring, freeing each one's block once it is
    in (offsets: their blocks', native u64); how many went (the rest stay in
    the arena)."""
    view = memoryview(packed)
    count = len(offsets) // 8
    done = 0
    while done < count:
        n, used = ring.push_packed(view)
        if not n and timeout:
            n, used = ring.push_packed_wait(view, timeout=timeout)
        if not n:
            break
        arena.release_many(offsets, done, n)
        done += n
        view = view[used:]
    return done
