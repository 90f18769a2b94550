"""Peek: the next messages of a topic or channel, read without being taken
(issue 18; nsqd has no such thing).

A queue's messages are delivered ring first, then disk queue (the ring
always holds the oldest: backend.memory_first), so its next n messages are
the ring's head, then the disk queue from its read position.  Both are read
by copying: Ring.peek_many_into (under the ring's consumer lock, nothing
popped) and DiskQueue.peek_into (the read position does not move).  The
disk queue is the topic owner's, so the queued part is read on the owner,
in one greenlet step with no yield between ring and disk: a worker that
does not own the topic asks the owner ({"op": "peek_queued"} over
cluster.py).  Messages in flight and deferred are held per worker, in its
in-flight table and deferred queue (arena blocks): every worker lists its
own ({"op": "peek_held"}), merged by deadline.

A message as peek answers it (JSON, nsqd's names):

    {"id": "0a1b...", "body": "<base64>", "timestamp": <ns>, "attempts": n}

The body is base64, as Go's encoding/json writes a []byte: a body is any
bytes and a JSON string must be text.  The ID is nsqd's 16 hex digits, as
clients see it.  In flight ones add "deadline" (ns since the epoch) and
"worker" (the index of the worker holding it); deferred ones add "due".
"""

import base64
import time

from nsqshm.nsqd.policies.message_ttl import EXPIRY_BIT, EXPIRY_SIZE

PEEK_MAX = 1000       # n is 1..PEEK_MAX
PEEK_DEFAULT = 10
BUFFER_MAX = 64 << 20  # one answer copies at most this many bytes of messages
HELD_HEADER = 4 + 8 + 8  # snapshot(): u32 size, i64 deadline, u64 client ID


def message_json(msg):
    """A message (nsqd's encoding: timestamp, attempts, ID, body) as JSON;
    one with a time to live of its own (message_ttl.py) adds "expires" (ns
    since the epoch)."""
    msg = bytes(msg)
    attempts = int.from_bytes(msg[8:10], "big")
    end, expires = len(msg), None
    if attempts & EXPIRY_BIT and end >= 26 + EXPIRY_SIZE:
        attempts &= ~EXPIRY_BIT
        end -= EXPIRY_SIZE
        expires = int.from_bytes(msg[end:], "big", signed=True)
    doc = {"id": msg[10:26].decode("ascii", "replace"),
           "body": base64.b64encode(msg[26:end]).decode("ascii"),
           "timestamp": int.from_bytes(msg[:8], "big", signed=True),
           "attempts": attempts}
    if expires is not None:
        doc["expires"] = expires
    return doc


def _unpack(buf, nbytes):
    """Packed [u32 native size][message] records as a list of messages."""
    out, pos = [], 0
    view = memoryview(buf)
    while pos < nbytes:
        size = int.from_bytes(view[pos:pos + 4], "little")
        out.append(view[pos + 4:pos + 4 + size])
        pos += 4 + size
    return out


def _copy_head(peek, n, depth, start):
    """Up to n records from peek(buffer, n), growing the buffer while the
    queue (depth messages) has more than it held: (messages, whether
    BUFFER_MAX cut the answer short)."""
    size = start
    while True:
        buf = bytearray(size)
        count, nbytes = peek(buf, n)
        if count >= min(n, depth()):
            return _unpack(buf, nbytes), False
        if size >= BUFFER_MAX:
            return _unpack(buf, nbytes), True
        size *= 2


def queued(nsqd, ring, backend, n):
    """The next n messages of a queue (the owner's view: ring, then disk)."""
    start = max(1 << 20, 2 * (nsqd.max_record + 4))
    msgs, cut = _copy_head(ring.peek_many_into, n, lambda: ring.depth, start)
    if len(msgs) < n and backend.depth and not cut:
        more, _ = _copy_head(backend.peek_into, n - len(msgs), lambda: backend.depth, start)
        msgs += more
    return [message_json(m) for m in msgs]


def held(nsqd, store, n, key):
    """The first n messages (by deadline) of an InFlight or DeferredQueue of
    this worker, each with its deadline (wall clock) under `key`."""
    size = max(1 << 20, 2 * (nsqd.max_record + HELD_HEADER))
    while True:
        buf = bytearray(size)
        count, nbytes, total = store.snapshot(buf)
        if count >= total or size >= BUFFER_MAX:
            break
        size *= 2
    wall_minus_mono = time.time_ns() - time.monotonic_ns()
    out, pos = [], 0
    for _ in range(count):
        size = int.from_bytes(buf[pos:pos + 4], "little")
        deadline = int.from_bytes(buf[pos + 4:pos + 12], "little", signed=True)
        entry = message_json(buf[pos + HELD_HEADER:pos + HELD_HEADER + size])
        entry[key] = deadline + wall_minus_mono
        if key == "deadline":
            entry["worker"] = nsqd.index
        out.append(entry)
        pos += HELD_HEADER + size
    out.sort(key=lambda e: e[key])
    return out[:n]


def _target(nsqd, topic_name, channel_name):
    topic = nsqd.topics.get(topic_name)
    if topic is None or not channel_name:
        return topic, None
    return topic, topic.channels.get(channel_name)


def local_queued(nsqd, topic_name, channel_name, n):
    """The owner's answer: {"depth": d, "messages": [...]}, or None without
    the queue."""
    topic, channel = _target(nsqd, topic_name, channel_name)
    queue = channel if channel_name else topic
    if queue is None:
        return None
    return {"depth": queue.depth, "messages": queued(nsqd, queue.ring, queue.backend, n)}


def local_held(nsqd, topic_name, channel_name, n):
    """This worker's in-flight and deferred messages of the queue (a topic:
    its DPUB messages waiting for a first channel)."""
    topic, channel = _target(nsqd, topic_name, channel_name)
    if channel_name:
        if channel is None:
            return {"in_flight": [], "deferred": []}
        return {"in_flight": held(nsqd, channel.inflight, n, "deadline"),
                "deferred": held(nsqd, channel.deferred, n, "due")}
    if topic is None:
        return {"deferred": []}
    return {"deferred": held(nsqd, topic.deferred_waiting, n, "due")}


def peek(nsqd, topic, channel, n):
    """The broker's peek of a topic (channel None) or channel: a dict for
    the HTTP answer, or None when the owner did not answer."""
    channel_name = channel.name if channel is not None else ""
    if topic.owned or nsqd.cluster is None:
        part = local_queued(nsqd, topic.name, channel_name, n)
    else:
        part = nsqd.cluster.call(nsqd.owner_of(topic.name),
                                 {"op": "peek_queued", "topic": topic.name,
                                  "channel": channel_name, "n": n})
    if not isinstance(part, dict) or not isinstance(part.get("messages"), list):
        return None
    parts = [local_held(nsqd, topic.name, channel_name, n)]
    if nsqd.cluster is not None:
        parts += [p for p in nsqd.cluster.gather({"op": "peek_held", "topic": topic.name,
                                                  "channel": channel_name, "n": n})
                  if isinstance(p, dict)]
    doc = {"topic_name": topic.name}
    if channel is not None:
        doc["channel_name"] = channel.name
    doc["depth"] = part.get("depth", 0)  # the owner's: ring and disk queue
    doc["messages"] = part["messages"]
    keys = (("in_flight", "deadline"), ("deferred", "due")) if channel is not None \
        else (("deferred", "due"),)
    for key, order in keys:
        doc[key] = sorted((m for p in parts for m in p.get(key) or ()),
                          key=lambda m: m[order])[:n]
    return doc


def _peer_queued(nsqd, msg):
    return local_queued(nsqd, str(msg.get("topic")), str(msg.get("channel") or ""),
                        _peer_n(msg))


def _peer_held(nsqd, msg):
    return local_held(nsqd, str(msg.get("topic")), str(msg.get("channel") or ""), _peer_n(msg))


def _peer_n(msg):
    n = msg.get("n")
    return n if isinstance(n, int) and 1 <= n <= PEEK_MAX else PEEK_DEFAULT


# cluster.py ops this module answers (NSQD.handle_peer)
PEER_OPS = {"peek_queued": _peer_queued, "peek_held": _peer_held}
