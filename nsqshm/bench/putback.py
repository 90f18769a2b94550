"""A local consumer's put-back (issue 15: REQ and close of a BulkConsumer, a
Consumer's close, a Spark reader's arena left behind), in one process, no broker.

    nsqshm bench putback [--messages N] [--runs 5]

put_back: N messages of 200-byte bodies held in an arena (nsqshm._core.arena),
of a log channel of 2 partitions with a lane for partition 1, back through
nsqshm.local.arenas.put_back: one C walk groups them (localbatch.arena_gather),
their attempts are noted in the cursors' retry tables, each group is pushed
into its ring and its blocks freed (Arena.release_many).  Against the ceiling:
ring.push_packed of the same packed records into the same two rings, which any
put-back does at least.

notes: N REQs of consecutive offsets of one partition noted in a retry table of
4,096 slots that is full of live entries (every note is dropped, and counted),
against notes into the same table with room (runs of 3,072, emptied between).  A full table once cost a walk
of one run of 3,072 entries and a compaction of the whole table per note.
"""

import os
import shutil
import statistics
import struct
import tempfile
import time
import uuid

from nsqshm._core.arena import Arena
from nsqshm._core.inflight import InFlight
from nsqshm._core.localbatch import arena_reset
from nsqshm._core.logcursor import RETRY_SLOTS, Cursor, CursorSet, log_message_id
from nsqshm.local.arenas import put_back
from nsqshm.ring import Ring

TITLE = "A local consumer's put-back, and retry notes over a full table (issue 15)"
ISSUE = "15"
HELP = "a local consumer's put-back against a ring push of the same records (issue 15)"
SERVER = False  # shared memory in this process, no broker
BODY = 200
QUEUE = "bench:c"


def add_arguments(ap):
    ap.add_argument("--messages", type=int, default=100_000, help="messages per run")


class _Setup:
    """An arena, two rings, two cursors: shared memory made for the run."""

    def __init__(self, n):
        tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.dir = tempfile.mkdtemp(prefix="nsqshm-bench-putback-")
        self.arena = self.ring = self.lane = None
        self.names = [f"nsqshm-bench-pb-c{p}-{tag}" for p in range(2)]
        self.cursors = CursorSet(2)
        self.buf = bytearray(1 << 24)
        self.dropped = 0  # retry notes the last put_back's full tables dropped
        try:
            self.arena = Arena.create(f"nsqshm-bench-pb-{tag}", size=1 << 31, max_queues=4)
            size = 4 * n * (4 + 26 + BODY) + (1 << 20)
            self.ring = Ring.create(f"nsqshm-bench-pb-r-{tag}", capacity=size,
                                    max_record=1 << 16)
            self.lane = Ring.create(f"nsqshm-bench-pb-l-{tag}", capacity=size,
                                    max_record=1 << 16)
            for p, name in enumerate(self.names):
                self.cursors[p] = Cursor.open(name, os.path.join(self.dir, f"{p}.cursor"),
                                              start_offset=0, window_bits=1 << 20)
        except BaseException:
            self.close()
            raise

    def drain(self):
        for ring in (self.ring, self.lane):
            while ring.pop_many_into(self.buf)[0]:
                pass

    def close(self):
        """Unlink what was made, whatever failed before (each step on its own)."""
        steps = [(ring.unlink, ring.close) for ring in (self.ring, self.lane) if ring]
        if self.arena is not None:
            steps.append((self.arena.unlink, self.arena.close))
        for p, name in enumerate(self.names):
            if self.cursors[p] is not None:
                steps.append((self.cursors[p].close, lambda n=name: os.unlink(f"/dev/shm/{n}")))
        steps.append((lambda: shutil.rmtree(self.dir, ignore_errors=True),))
        for step in steps:
            for call in step:
                try:
                    call()
                except OSError:
                    pass


def _messages(n):
    """n messages (attempts 1: delivered once) alternating over 2 partitions."""
    return [struct.pack(">qH", time.time_ns(), 1) + log_message_id(i % 2, i // 2) + b"b" * BODY
            for i in range(n)]


def _time_put_back(s, msgs):
    table = InFlight()
    table.use_arena(s.arena, QUEUE)
    for m in msgs:
        table.add(m, 1, 1 << 62)
    dropped = sum(s.cursors[p].retry_stats[2] for p in range(2))
    t0 = time.perf_counter()
    done, left = put_back(s.arena, s.ring, QUEUE, cursors=s.cursors,
                          lanes={1: (False, s.lane)})
    took = time.perf_counter() - t0
    if (done, left) != (len(msgs), 0):
        raise RuntimeError(f"put_back: {done} back, {left} left of {len(msgs)}")
    s.dropped = sum(s.cursors[p].retry_stats[2] for p in range(2)) - dropped
    s.drain()
    del table
    arena_reset(s.arena)
    for p in range(2):  # (the retry tables emptied: every run notes into the same room)
        s.cursors[p].set_retries(b"", 0)
    return took


def _time_ring_push(s, msgs):
    parts = [b"".join(struct.pack("=I", len(m)) + m for m in msgs[p::2]) for p in range(2)]
    t0 = time.perf_counter()
    for ring, packed in ((s.lane, parts[1]), (s.ring, parts[0])):
        view = memoryview(packed)
        while view:
            _, used = ring.push_packed(view)
            view = view[used:]
    took = time.perf_counter() - t0
    s.drain()
    return took


def _time_notes(dirname, n, full):
    """The time of a note of a new offset (a REQ's), over n notes of
    consecutive offsets: into a table full of live entries (offsets n.. noted
    first, up to three quarters of its slots: every note is dropped), or into
    room (runs of as many as fit, the table emptied between runs, untimed)."""
    name = f"nsqshm-bench-pb-n-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    cur = Cursor.open(name, os.path.join(dirname, "n.cursor"), start_offset=0,
                      window_bits=1 << 20)
    cursors = CursorSet(1)
    cursors[0] = cur
    fit = RETRY_SLOTS * 3 // 4
    try:
        if full:
            for o in range(fit):
                cur.note_retry(n + o, 1)
        run = n if full else min(fit, n)
        packed = b"".join(struct.pack("=I", 26 + BODY) + struct.pack(">qH", 1, 1)
                          + log_message_id(0, o) + b"b" * BODY for o in range(run))
        took = 0.0
        for _ in range(n // run):
            t0 = time.perf_counter()
            noted = cursors.note_retries(packed)
            took += time.perf_counter() - t0
            if noted != (0 if full else run):
                raise RuntimeError(f"{noted} of {run} notes taken ({'full' if full else 'room'})")
            if not full:
                cur.set_retries(b"", 0)
        return took / (n // run * run)
    finally:
        cur.close()
        os.unlink(f"/dev/shm/{name}")


def measure(n, runs, settle=lambda: None, say=print):
    msgs = _messages(n)
    s = _Setup(n)
    try:
        settle()
        _time_put_back(s, msgs)  # (the arena's and the rings' pages touched once)
        _time_ring_push(s, msgs)
        back, ceiling = [], []
        for k in range(runs):  # taking turns
            for case in ("back", "ceiling") if k % 2 == 0 else ("ceiling", "back"):
                (back if case == "back" else ceiling).append(
                    _time_put_back(s, msgs) if case == "back" else _time_ring_push(s, msgs))
        dropped = s.dropped
        notes_full = statistics.median(_time_notes(s.dir, n, True) for _ in range(runs))
        notes_room = statistics.median(_time_notes(s.dir, n, False) for _ in range(runs))
    finally:
        s.close()
    b, c = statistics.median(back), statistics.median(ceiling)
    res = {"params": {"messages": n, "body": BODY, "runs": runs, "retry_slots": RETRY_SLOTS},
           "put_back_msgs_per_s": n / b, "ring_push_msgs_per_s": n / c, "ratio": c / b,
           "put_back_notes_dropped": dropped,
           "note_full_us": notes_full * 1e6, "note_room_us": notes_room * 1e6,
           "note_ratio": notes_full / notes_room}
    say(f"put_back of {n:,} messages: {res['put_back_msgs_per_s'] / 1e6:.2f} M msg/s "
        f"({dropped:,} retry notes dropped by full tables); the ring push of the same records "
        f"{res['ring_push_msgs_per_s'] / 1e6:.2f} M msg/s: ratio {res['ratio']:.2f}")
    say(f"a retry note over a full table {res['note_full_us'] * 1e3:.0f} ns, into room "
        f"{res['note_room_us'] * 1e3:.0f} ns: {res['note_ratio']:.2f}x")
    return res


def run(ctx):
    n = min(ctx.args.messages, 20_000) if ctx.quick else ctx.args.messages
    return measure(n, ctx.runs(default=5), ctx.settle, ctx.say)


def render(res):
    p = res["params"]
    dropped = res.get("put_back_notes_dropped")
    return [f"{p['messages']:,} messages of {p['body']} B held by a local consumer of a log "
            f"channel of 2 partitions (a lane for one), put back; medians of {p['runs']} runs, "
            "the cases taking turns."
            + ("" if dropped is None else
               f" Each partition's retry table ({p['retry_slots']:,} slots) takes "
               f"{p['retry_slots'] * 3 // 4:,} notes: {dropped:,} of the put-back's "
               f"{p['messages']:,} notes are dropped (counted), as in any put-back of more "
               "than that of one partition."), "",
            "| | msg/s or time | of the ceiling |", "|---|---:|---:|",
            f"| `arenas.put_back` (grouped in C, retry notes, pushes, blocks freed) | "
            f"{res['put_back_msgs_per_s'] / 1e6:.2f} M msg/s | {res['ratio']:.2f} |",
            f"| ceiling: `push_packed` of the same records into the same rings | "
            f"{res['ring_push_msgs_per_s'] / 1e6:.2f} M msg/s | 1.00 |",
            f"| a retry note of a new offset, table of {p['retry_slots']:,} slots full of live "
            f"entries | {res['note_full_us'] * 1e3:.0f} ns | {res['note_ratio']:.2f}x the "
            "time of one into room |",
            f"| a retry note into a table with room | {res['note_room_us'] * 1e3:.0f} ns | 1.00 |"]


if __name__ == "__main__":
    measure(100_000, 5)
