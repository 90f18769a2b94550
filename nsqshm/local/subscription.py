"""A local consumer's hold on a log topic's channel (Consumer, BulkConsumer):
the channel's cursors, one per partition, attached so that its FINs mark them;
and its place among the channel ring's subscribers, which makes the partitions'
owners feed the ring for it (nsqd/logchannel.py, LogChannel._room).  The
broker's recovery of a dead consumer's arena gives the place back
(nsqd/recovery.py, _unsubscribe: the arena's ready_count says it holds one)."""

from nsqshm._core.logcursor import Cursor, CursorError, CursorSet
from nsqshm._core.ring import SUBSCRIBERS_RETIRED
from nsqshm.local.broker import LocalError


def attach_cursors(names, queue, log=True):
    """A CursorSet of the channel's cursor segments `names` (by partition);
    None for a classic channel (log False).  A log topic's channel whose
    cursors are not there (not made yet, or deleted) is refused."""
    if not log:
        return None
    if not names:
        raise LocalError(f"{queue}: a log topic's channel without its cursors (is the channel "
                         "created on the broker?)")
    cursors = CursorSet(len(names))
    try:
        for partition, name in enumerate(names):
            cursors[partition] = Cursor.attach(name)
    except CursorError as err:
        raise LocalError(f"{queue}: {err} (was the channel deleted?)") from None
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
