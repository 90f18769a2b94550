"""A local consumer's hold on a log topic's channel (Consumer, BulkConsumer):
the channel's cursors, one per partition, attached so that its FINs mark them;
and its place among the channel ring's subscribers, which makes the partitions'
owners feed the ring for it (nsqd/logtopics/logchannel.py, LogChannel._room).  The
broker's recovery of a dead consumer's arena gives the place back
(nsqd/workers/recovery.py, _unsubscribe: the arena's ready_count says it holds one)."""

from nsqshm._core.logcursor import Cursor, CursorError, CursorSet
from nsqshm._core.ring import SUBSCRIBERS_RETIRED
from nsqshm.local import arenas
from nsqshm.local.broker import LocalError
from nsqshm.nsqd.errors import E_SUB_ORDER_IS_MUST, SUB_ORDER_IS_MUST_TEXT

ORDERED_ONLY = f"{E_SUB_ORDER_IS_MUST} {SUB_ORDER_IS_MUST_TEXT}"  # nsqd's refusal of a SUB


def open_channel(broker, topic, channel, create, ordered=False, partition=None):
    """The channel's cursor names, one per partition ([]: a classic topic's),
    the channel made first with `create`.  Refused before a channel is made:
    a consumer of one partition or `ordered` on a topic that is no log topic
    (or not made yet), a partition the topic does not have, and a consumer
    not `ordered` of Youzan's orderedmulti topic (which takes SUB_ORDERED
    only), as nsqd refuses a plain SUB.  Refused after: a log topic's
    channel whose cursors are not there (not made yet, or deleted)."""
    spec = broker.log_topic_spec(topic)
    if partition is not None or ordered:
        if spec is None:
            raise LocalError(f"{topic}: partition= and ordered= are for a log topic's "
                             "channel")
        count = spec.get("partition_num", 0)
        if partition is not None and (isinstance(partition, bool)
                                      or not isinstance(partition, int)
                                      or not 0 <= partition < count):
            raise LocalError(f"{topic}: no partition {partition!r} (it has {count})")
    if spec is not None and spec.get("ordered") and not ordered:
        raise LocalError(ORDERED_ONLY)
    if create:
        broker.create_channel(topic, channel)
    names = broker.channel_cursors(topic, channel)
    if spec is not None and not names:
        raise LocalError(f"{topic}:{channel}: a log topic's channel without its cursors (is "
                         "the channel created on the broker?)")
    return names


def attach_cursors(names, queue):
    """A CursorSet of the channel's cursor segments `names` (by partition),
    guarded against seeks (CursorSet.guard_seeks: what a local consumer took
    before a seek is its own to drop, as the workers drop their clients');
    None for a classic channel (no names)."""
    if not names:
        return None
    cursors = CursorSet(len(names))
    try:
        for partition, name in enumerate(names):
            cursors[partition] = Cursor.attach(name)
    except CursorError as err:
        raise LocalError(f"{queue}: {err} (was the channel deleted?)") from None
    cursors.guard_seeks()
    return cursors


def subscribe(ring, queue, direct=False):
    """Count a consumer among the channel's subscribers (every worker's, in
    the ring's header), and with `direct` among those that read the logs
    themselves (first: the owners never see it as one the ring must be filled
    for); nudged, a sleeping owner looks at once."""
    if direct:
        ring.add_direct_subscribers(1)
    try:
        if ring.add_subscribers(1) >= SUBSCRIBERS_RETIRED:  # an ephemeral channel being deleted
            ring.add_subscribers(-1)
            raise LocalError(f"channel {queue} is being deleted")
        try:
            ring.nudge()
        except BaseException:
            ring.add_subscribers(-1)  # (not subscribed after all: nothing to give back later)
            raise
    except BaseException:
        if direct:
            ring.add_direct_subscribers(-1)
        raise


def unsubscribe(ring, arena, direct=False):
    """Give the place back: ready 0 first, so that the broker's recovery of the
    arena knows it has nothing to give back (a death in between leaves the
    counts one high, which only costs ring copies), then the direct one."""
    arena.set_client_info(ready_count=0)
    if direct:
        ring.add_direct_subscribers(-1)
    ring.add_subscribers(-1)
    ring.nudge()  # the owners look again: maybe nobody needs the ring now


def leave(arena, ring, queue, timeout, cursors, subscribed, direct=False, lanes=None):
    """A consumer's close: what it holds back into the ring, or into the lane
    of its partition (`lanes`, {partition: (ordered, Ring)}), noted in the retry tables
    with its attempts, as a broker client's when it goes; then,
    whatever happened, its subscriber place given back and its cursors closed.
    -> how many messages are left in the arena (kept for the broker's
    recovery: 1 when the put back failed)."""
    left = 1
    try:
        _, left = arenas.put_back(arena, ring, queue, timeout=timeout, cursors=cursors,
                                  lanes=lanes)
        arena.set_client_info(in_flight=left)
    finally:
        if subscribed:
            unsubscribe(ring, arena, direct)
        if cursors is not None:
            for index in range(len(cursors)):
                if cursors[index] is not None:
                    cursors[index].close()
    return left
