"""A lane: one partition's own ring in a log topic's channel.

A log channel's feeders push every partition into the channel's ring, which
all its consumers share.  Once a consumer names a partition (Youzan's
`SUB T C p`, `SUB_ADVANCED T C p ...`, `SUB_ORDERED T C [p]`), that
partition gets a lane: the partition's owner pushes its records into the
lane instead, and only the consumers of that partition (and the plain
`SUB T C` ones, which take every partition) deliver from it.  A lane is
shared memory like the channel ring, so a consumer on any worker takes from
it, and it outlives a worker's death; a graceful stop drops it with the
channel ring (what it held is in the log, unfinished).

Its kind is in its ring's name, so every worker finds it by looking:

    <prefix>.c.<topic>:<channel>:p<partition>   a lane
    <prefix>.c.<topic>:<channel>:o<partition>   an ordered lane: the owner
                                                pushes one message at a time,
                                                the next only once it is
                                                finished (SUB_ORDERED)

(':' is in no topic or channel name, so a lane never meets a channel's
ring.)  A lane stays for the channel's life: a consumer leaving does not
move its partition back to the shared ring.  Each new lane, and a lane
turned ordered, is made once the partitions' cursors are held for the
move, and bumps the channel ring's lanes_version (in its header) then,
before their drop, so that local consumers (nsqshm/local/lanes.py) and the
broker's workers (LogChannel.look_for_lanes) look for lanes again only
then.
"""

from nsqshm.nsqd.workers.waiting import RingWaker

PLAIN = "p"
ORDERED = "o"


def lane_suffix(topic, channel, partition, ordered):
    return f"c.{topic}:{channel}:{ORDERED if ordered else PLAIN}{partition}"


class Lane:
    def __init__(self, ring, ordered, data_event, space_event):
        self.ring = ring
        self.ordered = ordered
        # pushes wake the channel's dispatcher, pops and nudges its feeder
        self.waker = RingWaker(ring, data_event, space_event)

    def __repr__(self):
        return f"<Lane {self.ring.name}{' ordered' if self.ordered else ''}>"

    def close(self):
        self.waker.close()
        self.ring.close()
