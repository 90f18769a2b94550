"""Putting back the messages a dead process held.

A worker's in-flight and deferred messages live in its arena
(`<prefix>.f.w<index>.<pid>.<random>`, nsqshm._core.arena).  When the worker dies,
its replacement (the same index) finds the arena, sees the owner gone, and
puts every message back: in-flight ones into their channel (attempts as
delivered), deferred ones into its own deferred queue with their due time.
Each block is released only after its message is stored again, so a death
during recovery repeats messages and loses none.  Worker 0 also takes the
arenas of indexes no longer running (fewer --workers than before) and of
local clients (nsqshm.local) that died.

When the channel a message belonged to was deleted meanwhile, the message
goes with it, as in nsqd.

A channel ring counts the clients of every worker subscribed to it
(--max-channel-consumers); a dead worker's clients are gone, so a starting
worker sets every channel's count to what the running peers report.

A worker's overflow disk queues (overflow.py: publishes for topics it does
not own that the topic's ring had no room for) are drained by the worker
of the same index, or worker 0 for indexes that no longer run; when this
worker now owns the topic, they go into the topic at once.
"""

import os
import time

from nsqshm._core.arena import Arena, ArenaError
from nsqshm._core.localbatch import GATHER_RING, arena_gather
from nsqshm._core.logcursor import decode_message_id
from nsqshm._core.ring import Ring
from nsqshm.nsqd import overflow
from nsqshm.nsqd.local import clients as local_clients
from nsqshm.nsqd.topic import TopicError


def _worker_index(name, prefix):
    # <prefix>.f.w<index>.<pid>.<6 hex digits>
    index, _, rest = name[len(prefix) + 4:].partition(".")
    return int(index) if index.isdigit() and rest else None


def orphan_arenas(nsqd):
    """Names of dead processes' arenas this worker should recover."""
    prefix = nsqd.shm_prefix
    own = nsqd.arena.name if nsqd.arena is not None else None
    names = []
    for name in Arena.list(f"{prefix}.f."):
        if name == own:
            continue
        kind = name[len(prefix) + 3:len(prefix) + 4]
        if kind == "w":
            index = _worker_index(name, prefix)
            if index is None:
                continue
            mine = index == nsqd.index or (index >= nsqd.nworkers and nsqd.index == 0)
        else:  # local clients and Spark readers: worker 0
            mine = nsqd.index == 0
        if mine:
            names.append(name)
    return names


def remove_stale_fifos(nsqd):
    """Worker 0 at start: waiter FIFOs of rings that are gone (Ring.remove_stale_fifos)."""
    if nsqd.index == 0:
        gone = Ring.remove_stale_fifos(nsqd.shm_prefix)
        if gone:
            nsqd.logf("info", f"RECOVERY: removed {gone} waiter FIFOs of rings that are gone")


def recover_orphans(nsqd):
    clients = f"{nsqd.shm_prefix}.f.w"
    # a Spark batch not yet due waits (local_watch.py takes it when it is)
    ready = set(local_clients.dead_arenas(nsqd.shm_prefix)) if nsqd.index == 0 else set()
    total = 0
    for name in orphan_arenas(nsqd):
        if name.startswith(clients) or name in ready:
            total += recover_arena(nsqd, name)
    return total


def recover_arena(nsqd, name):
    """Put back the messages of arena `name` if its owner is dead; returns how many."""
    try:
        arena = Arena.attach(name)
    except (ArenaError, OSError, ValueError) as err:
        nsqd.logf("error", f"RECOVERY: cannot read {name} - {err}")
        return 0
    try:
        if arena.owner_alive():
            return 0
        label, pid = arena.label, arena.owner_pid
        own = _own_channel(nsqd, arena)
        _unsubscribe(arena, own)
        # the ordered lanes it took from, of a queue's channel (None: every copy goes
        # back): a local consumer's, of its own channel; a broker worker's, per channel
        own_lanes = arena.ordered_lanes() if own is not None else None

        def marked(index):
            return own_lanes if own is not None else _queue_lanes(arena, index)

        counts = {"moved": 0, "dropped": 0, "stale": 0, "finished": 0}
        now_wall = time.time_ns()
        channels = {}  # queue name -> (topic, channel), as found once
        left_out = {}  # queue name -> its _lanes_left_out, as found once
        for offset, queue, _, due_wall, msg in arena.blocks(-1, now_wall):
            pair = _channel_of(nsqd, queue, channels)
            lanes = left_out.get(queue)
            if lanes is None:
                lanes = left_out[queue] = _lanes_left_out(pair[1],
                                                          marked(arena.find_queue(queue)))
            if lanes and _partition_left_out(lanes, msg):  # (as its drop would have)
                arena.release(offset)
                counts["stale"] += 1
                continue
            _defer_again(nsqd, arena, offset, pair, due_wall, now_wall, msg, counts)
        for index, offsets in sorted(arena.blocks_by_queue().items()):
            try:
                queue = arena.queue_name(index)
            except (IndexError, ArenaError):
                queue = ""  # (a block of no queue: of no channel, dropped)
            _recover_queue(nsqd, arena, index, offsets, _channel_of(nsqd, queue, channels),
                           marked(index), now_wall, counts)
        moved, dropped, stale, finished = (counts[k] for k in ("moved", "dropped", "stale",
                                                                 "finished"))
        nsqd.logf("info", f"RECOVERY: {moved} messages held by {label or name} (pid {pid}) put "
                          f"back" + (f", {dropped} of deleted channels dropped" if dropped else "")
                  + (f", {finished} finished meanwhile dropped" if finished else "")
                  + (f", {stale} taken before their partition's move into an ordered lane "
                     f"left to the lane" if stale else ""))
        if own is not None:  # (a local consumer may have died between its FIN and its nudge)
            own.next_ordered()
        arena.unlink()
        return moved
    finally:
        arena.close()


RECOVERY_BATCH = 16384  # blocks put back per call: bounded memory, and a death repeats few


def _channel_of(nsqd, queue, found):
    """(topic, channel) of a queue name: (None, the channel) for "topic:channel",
    (the topic, None) for "topic:" (a DPUB before any channel); None for what
    is gone (its messages go with it, as in nsqd).  `found` caches them.

    A log channel first looks for lanes made since its last look
    (LogChannel.look_for_lanes), before any of the dead process's copies are
    put back or deferred here: a lane this worker attaches for the first
    time drops what the worker holds of its partition, as taken before the
    lane's move, which the dead process's copies (a head it took from the
    lane) need not be."""
    pair = found.get(queue)
    if pair is None:
        topic_name, _, channel_name = queue.partition(":")
        topic = nsqd.topics.get(topic_name)
        if channel_name:
            pair = (None, topic.channels.get(channel_name) if topic is not None else None)
            look = getattr(pair[1], "look_for_lanes", None)  # (a log channel's)
            if look is not None:
                look()
        else:
            pair = (topic, None)
        found[queue] = pair
    return pair


def _defer_again(nsqd, arena, offset, pair, due_wall, now_wall, msg, counts):
    """A deferred message not due yet: deferred here with its due time, then freed."""
    topic, channel = pair
    if channel is not None:
        channel.defer(msg, (due_wall - now_wall) / 1e9)
        counts["moved"] += 1
    elif topic is not None:  # a DPUB before any channel
        topic.defer_waiting(msg, time.monotonic_ns() + max(0, due_wall - now_wall))
        counts["moved"] += 1
    else:
        counts["dropped"] += 1
    arena.release(offset)


def _recover_queue(nsqd, arena, index, offsets, pair, marked, now_wall, counts):
    """Put back what `arena` holds of one queue (its block offsets, from
    Arena.blocks_by_queue) but the deferred messages not due yet
    (_defer_again): gathered in C (localbatch.arena_gather), RECOVERY_BATCH
    blocks at a time, each batch put back in one call and its blocks freed
    only once it is stored again."""
    topic, channel = pair
    if channel is None:
        if topic is not None:  # DPUBs before any channel (the due ones: at once)
            for offset, _, _, due_wall, msg in arena.blocks(index):
                _defer_again(nsqd, arena, offset, pair, due_wall, now_wall, msg, counts)
            return
        for first in range(0, len(offsets) // 8, RECOVERY_BATCH):  # deleted: gone with it
            for _, _, freed in arena_gather(arena, index, None, b"", now_wall, offsets, first,
                                            min(RECOVERY_BATCH, len(offsets) // 8 - first))[1]:
                counts["dropped"] += arena.release_many(freed)
        return
    cursors = getattr(channel, "cursors", None)  # (a log channel's)
    lanes = _lanes_left_out(channel, marked)
    for first in range(0, len(offsets) // 8, RECOVERY_BATCH):
        finished, groups = arena_gather(arena, index, cursors, lanes, now_wall, offsets, first,
                                        min(RECOVERY_BATCH, len(offsets) // 8 - first))
        counts["finished"] += finished
        for dest, packed, freed in groups:
            if dest == GATHER_RING:
                channel.put_records(packed)
                counts["moved"] += arena.release_many(freed)
            else:  # GATHER_DROP: _lanes_left_out's
                counts["stale"] += arena.release_many(freed)


def _queue_lanes(arena, index):
    """A broker worker's Arena.queue_lanes of a queue; None for an arena that
    does not keep them, or a queue it does not hold (-1: find_queue's)."""
    if index < 0:
        return None
    try:
        return arena.queue_lanes(index)
    except (IndexError, ArenaError):
        return None


def _partition_left_out(lanes, msg):
    """Whether a log channel's message (nsqd's encoding: its ID at bytes 10..25
    names its partition) is of a partition _lanes_left_out leaves out."""
    partition = decode_message_id(bytes(msg[10:26]))[0]
    return partition < len(lanes) and lanes[partition] == 3


def _lanes_left_out(channel, marked):
    """arena_gather's lanes for a dead process's copies of `channel`'s
    messages (`marked`: a local consumer's Arena.ordered_lanes, a broker
    worker's Arena.queue_lanes of the channel, None for an arena that keeps
    neither): 3, left out, for each partition with an ordered lane the process
    never attached.  It took its copies of those before the partition's move
    into the lane (a worker: before it applied the move's broadcast), which rewound
    the partition to its confirmed offset and delivers from there again, one
    at a time (LogChannel.use_lanes).  Put back, a copy of the head would go
    out a second time beside the lane's own (CursorSet.heads_only cannot tell
    them apart).  A head it took from the lane itself does go back."""
    lanes = getattr(channel, "ordered_lane_partitions", None)  # (a log channel's)
    if marked is None or lanes is None:
        return b""
    kinds = bytearray(len(channel.topic.partitions))
    for index in lanes():
        if index not in marked:
            kinds[index] = 3
    return bytes(kinds)


def _own_channel(nsqd, arena):
    """The channel a local consumer's arena names as its own (client info), or None."""
    if arena.label not in local_clients.SUBSCRIBER_LABELS:
        return None
    topic_name, _, channel_name = arena.client_info()["queue"].partition(":")
    topic = nsqd.topics.get(topic_name)
    return topic.channels.get(channel_name) if topic is not None else None


def _unsubscribe(arena, channel):
    """A dead local Consumer (or BulkConsumer) of a log channel (`channel`, its
    own: _own_channel) counted itself among the ring's subscribers
    (nsqshm/local/consumer.py): take it out.  Once: the count goes to 0 with it,
    before its messages go back."""
    if channel is None or not channel.local_subscribers:
        return
    if arena.client_info()["ready_count"] <= 0:  # closed: it took itself out
        return
    arena.set_client_info(ready_count=0)
    if arena.label == local_clients.DIRECT_LABEL:
        channel.ring.add_direct_subscribers(-1)
    channel.ring.add_subscribers(-1)


def recover_overflows(nsqd):
    """Take the overflow queues left by this index's previous process (or
    by indexes that no longer run); returns how many messages they hold."""
    total = 0
    for topic_name, index in overflow.found_on_disk(nsqd):
        topic = nsqd.topics.get(topic_name)
        if topic is None:  # deleted while its worker was gone: dropped with it
            for name in os.listdir(nsqd.data_path):
                if name.startswith(overflow.queue_name(topic_name, index) + ".diskqueue."):
                    os.unlink(os.path.join(nsqd.data_path, name))
            continue
        spill = topic.overflow if index == nsqd.index else overflow.Overflow(topic, index)
        spill.open()
        total += spill.depth
        if topic.owned:
            _store_all(nsqd, topic, spill)
        else:
            if spill is not topic.overflow:
                topic.adopted.append(spill)
            spill.start()
    if total:
        nsqd.logf("info", f"RECOVERY: {total} messages in overflow queues taken back")
    return total


def _store_all(nsqd, topic, spill):
    """This worker owns the topic now: the overflow goes into it as a PUB does."""
    queue = spill.queue
    while queue.depth:
        with nsqd.scratch.borrow() as scratch:
            n, nbytes = queue.peek_into(scratch, 1024)
            if not n:
                break
            try:
                topic.store(memoryview(scratch)[:nbytes])
            except TopicError as err:  # a full disk: the rest waits for the next start
                nsqd.logf("error", f"RECOVERY: overflow of {topic.name} kept - {err}")
                break
            queue.advance(n)
    if not queue.depth:
        spill.delete()
    else:
        spill.close()


def recount_subscribers(nsqd):
    """Every channel's subscriber count: the running peers' clients (this
    worker has none yet), and of them those a log channel's feeders need
    not fill its ring for (logchannel.py, direct_subscribers).  A peer that
    does not answer counts none.  A client that subscribes on a peer between
    its answer and the stores below is missed; one that needs a log channel's
    ring asks for it when it waits (ring_wanted, logchannel.py)."""
    counts = {}  # queue -> [clients, of them reading a log channel straight from the logs]
    if nsqd.cluster is not None:
        for reply in nsqd.cluster.gather({"op": "subscribers"}, timeout=2):
            for queue, pair in (reply or {}).items():
                if isinstance(pair, list) and len(pair) == 2 and all(
                        isinstance(n, int) for n in pair):
                    total = counts.setdefault(queue, [0, 0])
                    total[0] += pair[0]
                    total[1] += pair[1]
    local = local_clients.local_subscribers(nsqd.shm_prefix)
    for topic in nsqd.topics.values():
        for channel in topic.channels.values():
            queue = f"{topic.name}:{channel.name}"
            clients, direct = counts.get(queue, (0, 0))
            here, here_direct = local.get(queue, (0, 0)) if channel.local_subscribers else (0, 0)
            channel.ring.subscribers = clients + here
            channel.ring.direct_subscribers = direct + here_direct
