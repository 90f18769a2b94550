"""Bounded queues (issue 18; nsqd has none): a maximum depth per topic and
per channel (`max_depth`, in messages), and what happens when a publish
would pass it (`overflow`):

    reject        backpressure: the publish fails (PUB E_PUB_FAILED, MPUB
                  E_MPUB_FAILED, HTTP 503 {"message": "QUEUE_FULL"}) and
                  nothing accepted is ever dropped; counted in
                  `rejected_count` of the full queue
    drop-oldest   the publish is taken and the queue's oldest messages make
                  room; counted in `dropped_count`

A publish is checked once per PUB / MPUB / HTTP publish (admit(), from
Topic.put_packed), only when the topic or one of its channels has a reject
bound (topic.bounded lists them).  A channel's depth there counts what its topic still holds
for it (not yet pumped).  Depths are the shared rings plus the disk queue as
the answering worker sees it: the owner's, or none on another worker, so a
bound above --mem-queue-size is exact only on the topic's owner (messages
past it are on the owner's disk).

Dropping happens where it cannot race a reader that peeks and then
discards:

    channel   Channel.put_records (trim_channel): before a batch is stored
              its oldest messages leave the ring (a pop, safe from any
              worker), then, on the owner, the disk queue's head
    topic     the owner's pump while the topic holds messages (no channel,
              paused: trim_topic, before it spills to disk); with its pump
              running, messages move on to the channels and their bounds
              apply
"""

OVERFLOWS = ("reject", "drop-oldest")


class QueueFull(Exception):
    """A publish refused by a reject bound; the text says which queue."""


def bound_of(queue):
    policy = queue.policy
    return policy.max_depth if policy is not None else 0


def _rejects(queue):
    policy = queue.policy
    return policy is not None and policy.max_depth and policy.overflow == "reject"


def update_topic(topic):
    """topic.bounded: the channels with a reject bound, the topic first (as
    None) if it has one; empty: publishes into it are not checked."""
    topic.bounded = ([None] if _rejects(topic) else []) + \
        [c for c in topic.channels.values() if _rejects(c)]


def admit(topic, count):
    """Before `count` messages are published into topic: QueueFull if a
    reject bound would be passed (of the topic, or of one of its channels)."""
    held = topic.depth
    for channel in topic.bounded:
        queue = topic if channel is None else channel
        policy = queue.policy
        if policy is None or not policy.max_depth or policy.overflow != "reject" \
                or channel is not None and channel.exiting:
            continue  # changed or deleted since update_topic
        depth = held if channel is None else channel.depth + held
        if depth + count > policy.max_depth:
            policy.rejected_count += count
            what = f"topic {topic.name}" if channel is None else \
                f"channel {topic.name}:{channel.name}"
            raise QueueFull(f"{what} is full (max_depth {policy.max_depth})")


def trim_channel(channel, incoming):
    """drop-oldest: make room for `incoming` messages about to be stored."""
    policy = channel.policy
    excess = channel.depth + incoming - policy.max_depth
    if excess <= 0:
        return
    dropped = channel.ring.discard(excess)
    if dropped < excess and channel.owned and channel.backend.depth:
        dropped += _advance(channel, min(excess - dropped, channel.backend.depth))
        if not channel.backend.depth:
            channel.ring.disk_backlog = False
    policy.dropped_count += dropped


def trim_topic(topic):
    """drop-oldest on the owner, while the pump holds the topic's messages."""
    policy = topic.policy
    excess = topic.ring.depth + topic.backend.depth - policy.max_depth
    if excess <= 0:
        return
    dropped = topic.ring.discard(excess)
    if dropped < excess and topic.backend.depth:
        dropped += _advance(topic, min(excess - dropped, topic.backend.depth))
    policy.dropped_count += dropped


def _advance(queue, n):
    """Drop the disk queue's first n messages (the owner's)."""
    before = queue.backend.depth
    queue.backend.advance(n)
    queue.nsqd.backend_written(queue.backend)
    return before - queue.backend.depth
