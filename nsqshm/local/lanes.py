"""The lanes of a log topic's channel that a local consumer takes from
(nsqd/logtopics/loglane.py): one ring per partition a consumer named (`SUB T C p`, a
local Consumer(partition=)), or an ordered one (`SUB_ORDERED`,
Consumer(ordered=True)), which the partition's owner fills instead of the
channel's ring.  Found by name, as the broker's workers find them, whoever
had them made; what a consumer puts back goes into its partition's lane, as
the broker puts it back (LogChannel._put_back)."""

import select

from nsqshm._core.logcursor import split_by_partition
from nsqshm._core.ring import RingError
from nsqshm.nsqd.logtopics.loglane import lane_suffix
from nsqshm.ring import Ring

LANE_LOOK = 1.0  # s: a consumer of every partition, waiting, looks for new lanes this often


class Lanes:
    def __init__(self, ring, prefix, topic, channel, partitions, only=None, ordered=False):
        """ring: the channel's (its header counts the changes to its lanes:
        lanes_version); partitions: how many the topic has; only: the one
        partition whose lane is wanted (None: every partition's); ordered:
        ordered lanes alone (an ordered consumer never takes a plain lane)."""
        self._ring = ring
        self.partitions = partitions
        self._kinds = (True,) if ordered else (True, False)
        self.changes = 0  # lanes attached or let go so far (a waiter looks again)
        self._seen = -1  # the lanes_version find last looked at
        # [plain, ordered] lane ring names by partition
        self._names = [[f"{prefix}.{lane_suffix(topic, channel, index, ordered)}"
                        for ordered in (False, True)] for index in range(partitions)]
        self._scope = range(partitions) if only is None else (only,)
        self._held = {}  # partition -> (ordered, Ring): the lanes attached

    def __bool__(self):
        return bool(self._held)

    def stale(self):
        """Whether the channel's lanes changed since find last looked."""
        return self._ring.lanes_version != self._seen

    def find(self):
        """Attach the lanes of the partitions in scope that exist now (an
        ordered one first, as the broker looks: LogChannel._find_lanes), and
        let go of those gone (closed: a caller that armed them counts
        `changes` and looks again before it sleeps).  -> the partitions
        whose ordered lane it attached now: what the caller holds of them was
        taken before their move into it (LogChannel.use_lanes rewound them:
        the lane delivers it all again, in order).  It looks in /dev/shm only
        when the channel's lanes_version moved (LogChannel.use_lanes bumps it
        after it made a lane, once the move holds the cursors)."""
        moved = []
        version = self._ring.lanes_version
        if version == self._seen:
            return moved
        self._seen = version  # (first: a change while it looks is looked at next time)
        for index in self._scope:
            held = self._held.get(index)
            for ordered in self._kinds:
                name = self._names[index][ordered]
                if not Ring.exists(name):
                    continue
                if held is None or held[0] != ordered:
                    try:
                        ring = Ring.attach(name)
                    except (OSError, RingError):
                        continue  # (removed meanwhile)
                    if held is not None:
                        held[1].close()
                    self._held[index] = (ordered, ring)
                    self.changes += 1
                    if ordered:
                        moved.append(index)
                break
            else:
                if held is not None:
                    held[1].close()
                    del self._held[index]
                    self.changes += 1
        return moved

    def unseen(self, index):
        """Whether the partition may have a lane that is not the one attached:
        the channel's lanes changed since find looked (under the cursor's lock,
        a lane whose move is under way is seen, and the partition left to it
        until the next find)."""
        held = self._held.get(index)
        if held is not None and held[0]:
            return False  # (an ordered lane is never replaced: it stays for the channel's life)
        return self.stale()

    def ordered(self, index):
        held = self._held.get(index)
        return held is not None and held[0]

    def ring(self, index):
        """The partition's lane ring, if attached, else None."""
        held = self._held.get(index)
        return None if held is None else held[1]

    def rings(self):
        return [ring for _, ring in self._held.values()]

    def by_partition(self):
        """{partition: (ordered, ring)} of the lanes attached."""
        return dict(self._held)

    def nudge_ordered(self):
        """A FIN may let an ordered lane's owner push the partition's next
        message: a nudge wakes its feeder (as the broker's FIN does:
        LogChannel.next_ordered)."""
        for ordered, ring in self._held.values():
            if ordered:
                ring.nudge()

    def split(self, packed, ring, cursors):
        """[(ring, records)]: packed [u32 size][message] records by where
        they go back, the lane of their partition or `ring` (split in C:
        split_by_partition); into an ordered lane only its partition's head
        (CursorSet.heads_only: the others are read from the log again)."""
        if not self._held:
            return [(ring, packed)]
        parts = split_by_partition(packed, self.partitions)
        rest = parts.pop()
        out = []
        for index, records in enumerate(parts):
            held = self._held.get(index) if records else None
            if held is None:
                rest += records
            else:
                out.append((held[1], cursors.heads_only(records) if held[0] else records))
        if rest:
            out.append((ring, rest))
        return out

    def close(self):
        for _, ring in self._held.values():
            ring.close()
        self._held = {}


def sleep_on(rings, timeout):
    """Wait (the GIL released) until a push wakes one of the armed rings, or
    `timeout` seconds pass; then take their wake bytes."""
    if len(rings) == 1:
        rings[0].sleep(timeout)
    else:
        poller = select.poll()
        for ring in rings:
            poller.register(ring.fileno(), select.POLLIN)
        poller.poll(max(0, int(timeout * 1000 + 0.999)))
    for ring in rings:
        ring.drain()


def disarm(rings):
    """Withdraw the wake requests of arm() (a ring closed meanwhile has none)."""
    for ring in rings:
        if not ring.closed:
            ring.disarm()
