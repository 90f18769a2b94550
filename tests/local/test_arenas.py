"""nsqshm/local/arenas.py's put_back: a local consumer's arena back into its
channel's ring and lanes, gathered and grouped in C (localbatch.arena_gather)."""

import os
import random
import struct
import uuid

import pytest

from nsqshm._core.inflight import InFlight
from nsqshm._core.localbatch import GATHER_DROP, GATHER_RING, arena_gather
from nsqshm._core.logcursor import Cursor, CursorSet, log_message_id
from nsqshm.local.arenas import put_back
from nsqshm.ring import Ring

QUEUE = "lt:c"


@pytest.fixture
def rings():
    made = []

    def make():
        r = Ring.create(f"nsqshm-test-ar-{os.getpid()}-{uuid.uuid4().hex[:8]}", capacity=1 << 16)
        made.append(r)
        return r
    yield make
    for r in made:
        r.unlink()
        r.close()


@pytest.fixture
def cursors(tmp_path):
    """Partition 0's cursor (3 finished: confirmed 3) and partition 1's (confirmed 0)."""
    made = []
    cs = CursorSet(2)
    for p in range(2):
        name = f"nsqshm-test-ar-cur-{os.getpid()}-{random.getrandbits(32):08x}"
        made.append(name)
        cs[p] = Cursor.open(name, str(tmp_path / f"{p}.cursor"), start_offset=0,
                            window_bits=256)
    for o in range(3):
        cs[0].finish(o)
    yield cs
    for p, name in enumerate(made):
        cs[p].close()
        os.unlink(f"/dev/shm/{name}")


def message(partition, offset, body=b"body", attempts=1):
    return struct.pack(">qH", 1, attempts) + log_message_id(partition, offset) + body


def hold(arena, messages, queue=QUEUE):
    table = InFlight()
    table.use_arena(arena, queue)
    for m in messages:
        table.add(m, 1, 1 << 62)
    return table


def records(packed):
    out, pos = [], 0
    while pos < len(packed):
        (n,) = struct.unpack_from("=I", packed, pos)
        out.append(bytes(packed[pos + 4:pos + 4 + n]))
        pos += 4 + n
    return out


def test_gather_groups_by_destination_and_frees_the_finished(arena, cursors):
    """Below the confirmed offset: freed and counted; a lane's partition: its
    lane; an ordered lane's: the head alone, the rest to drop; the rest (no
    lane, not a log message): the ring.  Offsets are the blocks', in order."""
    held = [message(0, 1), message(0, 3), message(0, 4), message(1, 0), message(1, 5),
            b"\0" * 10 + b"not-a-log-id-xxx" + b"plain"]
    table = hold(arena, held)
    blocks = {bytes(m): off for off, _, _, _, m in arena.blocks()}
    finished, groups = arena_gather(arena, arena.find_queue(QUEUE), cursors, bytes([2, 1]))
    assert finished == 1  # (0, 1): below partition 0's confirmed 3
    got = {dest: (records(packed), list(struct.unpack(f"={len(offs) // 8}Q", offs)))
           for dest, packed, offs in groups}
    assert got == {
        0: ([held[1]], [blocks[held[1]]]),                 # its ordered lane's head
        1: ([held[3], held[4]], [blocks[held[3]], blocks[held[4]]]),  # its lane
        GATHER_DROP: ([held[2]], [blocks[held[2]]]),       # read from the log again
        GATHER_RING: ([held[5]], [blocks[held[5]]]),
    }
    assert arena.live_blocks == 5  # (only the finished one freed)
    # no lanes: everything unfinished to the ring; no cursors: nothing finished
    _, groups = arena_gather(arena, arena.find_queue(QUEUE), cursors)
    assert [(d, len(records(p))) for d, p, _ in groups] == [(GATHER_RING, 5)]
    finished, groups = arena_gather(arena, -1, None, bytes([2, 1]))
    assert finished == 0 and [(d, len(records(p))) for d, p, _ in groups] == [(GATHER_RING, 5)]
    # another queue's blocks are not gathered for this one
    hold(arena, [message(1, 9)], queue="lt:other")
    assert [len(records(p)) for _, p, _ in arena_gather(arena, 0, None)[1]] == [5]
    assert [len(records(p)) for _, p, _ in arena_gather(arena, -1, None)[1]] == [6]
    del table


def test_put_back_pushes_each_group_and_frees_what_went(arena, cursors, rings):
    ring, lane0, lane1 = rings(), rings(), rings()
    held = [message(0, 1), message(0, 3), message(0, 4), message(1, 0), message(1, 5)]
    hold(arena, held)
    done, left = put_back(arena, ring, QUEUE, cursors=cursors,
                          lanes={0: (True, lane0), 1: (False, lane1)})
    assert (done, left) == (5, 0) and arena.live_blocks == 0
    assert lane0.pop_many(10) == [held[1]]
    assert lane1.pop_many(10) == [held[3], held[4]]
    assert ring.depth == 0
    # the retry tables note the attempts of what went back, and of what the ordered
    # lane reads again (a head and the one after it; the lane's two)
    assert (cursors[0].retry_stats[1], cursors[1].retry_stats[1]) == (2, 2)


def test_put_back_leaves_what_a_full_ring_cannot_take(arena, rings):
    ring = Ring.create(f"nsqshm-test-ar-small-{uuid.uuid4().hex[:8]}", capacity=4096)
    try:
        held = [message(9, i, body=b"x" * 900) for i in range(8)]
        hold(arena, held)
        done, left = put_back(arena, ring, QUEUE)
        assert done + left == 8 and 0 < done < 8
        assert arena.live_blocks == left
        assert ring.pop_many(100) == held[:done]
        assert put_back(arena, ring, QUEUE) == (left, 0) and arena.live_blocks == 0
        assert put_back(arena, ring, "never:held") == (0, 0)
    finally:
        ring.unlink()
        ring.close()


def test_release_many_checks_first_and_frees_once(arena):
    hold(arena, [message(0, i) for i in range(4)])
    offs = [off for off, _, _, _, _ in arena.blocks()]
    buf = struct.pack("=4Q", *offs)
    with pytest.raises(ValueError, match="outside"):
        arena.release_many(struct.pack("=2Q", offs[0], 1 << 40))
    for bad in (offs[0] + 8, (1 << 64) - 8):  # off the blocks' grid; wrapping round
        with pytest.raises(ValueError, match="outside"):
            arena.release_many(struct.pack("=Q", bad))
    with pytest.raises(ValueError, match="outside a buffer"):
        arena.release_many(buf, 3, 2)
    assert arena.live_blocks == 4  # (nothing freed by a refused call)
    assert arena.release_many(buf, 1, 2) == 2
    assert arena.release_many(buf) == 2  # (two were free already)
    assert arena.live_blocks == 0
    assert arena.blocks_by_queue() == {}


def test_blocks_by_queue_and_a_gather_of_given_blocks(arena, cursors):
    """The recovery's way through an arena: the block offsets of each queue in
    one walk, then a gather of a slice of them; a deferred block due later is
    left out (deferred_after), as is another queue's."""
    hold(arena, [message(0, i) for i in range(3, 8)])
    hold(arena, [message(1, i) for i in range(4)], queue="lt:other")
    by_queue = arena.blocks_by_queue()
    assert sorted(by_queue) == [arena.find_queue(QUEUE), arena.find_queue("lt:other")]
    mine = by_queue[arena.find_queue(QUEUE)]
    assert len(mine) == 5 * 8
    offs = struct.unpack("=5Q", mine)
    assert list(offs) == sorted(offs)
    finished, groups = arena_gather(arena, arena.find_queue(QUEUE), cursors, b"", -1, mine, 1, 3)
    assert finished == 0
    assert [(d, records(p), list(struct.unpack("=3Q", o))) for d, p, o in groups] == [
        (GATHER_RING, [message(0, i) for i in range(4, 7)], list(offs[1:4]))]
    with pytest.raises(ValueError, match="outside a buffer"):
        arena_gather(arena, 0, None, b"", -1, mine, 4, 2)
    with pytest.raises(ValueError, match="outside"):
        arena_gather(arena, 0, None, b"", -1, struct.pack("=Q", offs[0] + 8))
    # kind 3: every record of the partition left out
    _, groups = arena_gather(arena, arena.find_queue(QUEUE), cursors, bytes([3]))
    assert [(d, len(records(p))) for d, p, _ in groups] == [(GATHER_DROP, 5)]
    assert arena.live_blocks == 9  # (nothing freed: nothing was below a confirmed offset)
