"""Delivery policies of topics and channels (issue 18; nsqd has none).

    time to live    topic and channel (`ttl_ms`): a message published that
                    long ago is never delivered.  The channel's in-flight
                    table checks it in C as it takes messages from the ring
                    (InFlight.deliver, ttl_ns: the smaller of the topic's and
                    the channel's), so messages expire wherever they waited:
                    ring, disk queue, deferred queue.  Dropped, counted in
                    `expired_count` (InFlight.expired, per worker, summed).
    max attempts    channel (`max_attempts`, `dead_letter_topic`): a message
                    whose attempts reached the limit when it is requeued
                    (REQ) or times out goes to the dead-letter topic, default
                    `<topic>.<channel>.dead`, instead of back into the
                    channel.  Split per batch in C (inflight.take_dead).
                    Counted in `dead_letter_count`.

With `dead_letter_expired`, a channel sends its expired messages to its
dead-letter topic instead of dropping them: deliver() appends them to
InFlight.expired_out, published by the dispatcher after each round
(flush_expired).

A dead letter is the message as it was: same ID, timestamp and body, and
its attempts field keeps the deliveries it had on its channel (a consumer
of the dead-letter topic sees that count plus its own deliveries).  Its
reason, requeued or timed out, has no field in nsqd's message encoding, so
it is counted per channel (`dead_letter_requeued_count`,
`dead_letter_timed_out_count` in /stats) and logged.
A redrive (redrive()) moves dead letters back into their channel with
attempts reset to 0: the next n, all, or those with the IDs given (the
others stay, in order).

    bounded queue   topic and channel (`max_depth`, `overflow`: reject or
                    drop-oldest): bounds.py.

A topic or channel without a policy has `policy` None, and the delivery
paths check nothing else (Channel.requeue and process_timeouts test
`channel.policy`, once per REQ or batch; deliver() tests ttl_ns once per
call).

Policies are set over HTTP (policy_api.py) on any worker, which applies
them, sends them to every other worker ({"op": "policy"} over cluster.py)
and answers once they all have (Cluster.flush), as topology changes.  They
are kept in nsqd.dat as extra keys of the topic's and channel's objects,
which a Go nsqd reading the file ignores:

    {"name": "t", "paused": false, "ttl_ms": 60000,
     "channels": [{"name": "c", "paused": false, "max_attempts": 5,
                   "dead_letter_topic": "t.c.dead"}]}
"""

import gevent

from nsqshm._core.inflight import count_records, reset_attempts, take_dead, take_ids
from nsqshm.nsqd.names import is_ephemeral, is_valid_name
from nsqshm.nsqd.policies import bounds
from nsqshm.nsqd.tracing import trace

MAX_ATTEMPTS_LIMIT = 0xFFFF  # the attempts field is a u16
TTL_MS_LIMIT = 1 << 40       # about 34 years
MAX_DEPTH_LIMIT = 1 << 40
MAX_BYTES_LIMIT = 1 << 50
KEYS = ("ttl_ms", "max_attempts", "dead_letter_topic", "dead_letter_expired", "max_depth",
        "max_bytes", "overflow")
TOPIC_KEYS = ("ttl_ms", "max_depth", "max_bytes", "overflow")
REASONS = ("requeued", "timed_out", "expired")
REDRIVE_TIMEOUT = 60.0  # a redrive asked of the dead-letter topic's owner
REDRIVE_BATCH = 1024
REDRIVE_IDS_MAX = 100    # IDs in one redrive
BOOLS = {"true": True, "1": True, "false": False, "0": False}
HEX = frozenset("0123456789abcdefABCDEF")


class PolicyError(ValueError):
    """A bad policy value: its text is nsqd-style, e.g. INVALID_TTL."""


class Policy:
    """A topic's or channel's settings (0 / "" for unset) and counters."""

    __slots__ = ("ttl_ms", "max_attempts", "dead_letter_topic", "dead_letter_count",
                 "reasons", "max_depth", "max_bytes", "overflow", "rejected_count",
                 "dropped_count", "dead_letter_expired")

    def __init__(self):
        self.ttl_ms = 0
        self.max_attempts = 0
        self.dead_letter_topic = ""
        self.dead_letter_count = 0
        self.reasons = dict.fromkeys(REASONS, 0)
        self.max_depth = 0
        self.max_bytes = 0
        self.overflow = "reject"
        self.rejected_count = 0
        self.dropped_count = 0
        self.dead_letter_expired = False


def default_dead_letter_topic(topic_name, channel_name):
    return f"{topic_name}.{channel_name}.dead"


def dead_letter_topic(channel):
    policy = channel.policy
    if policy is not None and policy.dead_letter_topic:
        return policy.dead_letter_topic
    return default_dead_letter_topic(channel.topic.name, channel.name)


# -- values: parsed from HTTP, nsqd.dat, peers -----------------------------------------


def parse_values(raw, channel_level, topic_name="", channel_name=""):
    """{key: value} from raw {key: text or number} (only the keys given);
    PolicyError on a bad one."""
    values = {}
    if "ttl_ms" in raw:
        values["ttl_ms"] = _int(raw["ttl_ms"], 0, TTL_MS_LIMIT, "INVALID_TTL")
    if "max_depth" in raw:
        values["max_depth"] = _int(raw["max_depth"], 0, MAX_DEPTH_LIMIT, "INVALID_MAX_DEPTH")
    if "max_bytes" in raw:
        values["max_bytes"] = _int(raw["max_bytes"], 0, MAX_BYTES_LIMIT, "INVALID_MAX_BYTES")
    if "overflow" in raw:
        if raw["overflow"] not in bounds.OVERFLOWS:
            raise PolicyError("INVALID_OVERFLOW")
        values["overflow"] = raw["overflow"]
    if not channel_level:
        extra = set(raw) - set(TOPIC_KEYS)
        if extra:
            raise PolicyError(f"INVALID_ARG_{sorted(extra)[0].upper()}")
        return values
    if "max_attempts" in raw:
        values["max_attempts"] = _int(raw["max_attempts"], 0, MAX_ATTEMPTS_LIMIT,
                                      "INVALID_MAX_ATTEMPTS")
    if "dead_letter_topic" in raw:
        name = raw["dead_letter_topic"]
        if not isinstance(name, str) or name and (not is_valid_name(name) or is_ephemeral(name)
                                                   or name == topic_name):
            raise PolicyError("INVALID_DEAD_LETTER_TOPIC")
        values["dead_letter_topic"] = name
    if "dead_letter_expired" in raw:
        value = raw["dead_letter_expired"]
        value = BOOLS.get(value) if isinstance(value, str) else value
        if not isinstance(value, bool):
            raise PolicyError("INVALID_DEAD_LETTER_EXPIRED")
        values["dead_letter_expired"] = value
    return values


def _int(value, low, high, error):
    if isinstance(value, str):
        value = int(value) if value.isascii() and value.isdigit() and len(value) < 20 else None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise PolicyError(error)
    return value


def check_dead_letter_name(topic_name, channel_name, values, current):
    """The dead-letter topic a channel would use must be a valid name."""
    max_attempts = values.get("max_attempts", current.max_attempts if current else 0)
    expired = values.get("dead_letter_expired", current.dead_letter_expired if current else False)
    name = values.get("dead_letter_topic", current.dead_letter_topic if current else "")
    if (max_attempts or expired) and not name:
        default = default_dead_letter_topic(topic_name, channel_name)
        if not is_valid_name(default) or is_ephemeral(default):
            raise PolicyError("INVALID_DEAD_LETTER_TOPIC")
        return default
    return name


# -- applying ----------------------------------------------------------------------------


def apply(target, values):
    """Set values on a topic's or channel's policy (made on first use), then
    the channels' C settings."""
    if not values:
        return
    if target.policy is None:
        target.policy = Policy()
    for key, value in values.items():
        setattr(target.policy, key, value)
    channels = target.channels.values() if hasattr(target, "channels") else (target,)
    for channel in channels:
        update_channel(channel)
    bounds.update_topic(target if hasattr(target, "channels") else target.topic)


def update_channel(channel):
    """A channel's in-flight table takes the smaller of its topic's and its
    own time to live (0 for none); a channel whose topic has a policy gets
    one too, so that /stats shows what applies to it."""
    topic_policy = channel.topic.policy
    if topic_policy is not None and topic_policy.ttl_ms and channel.policy is None:
        channel.policy = Policy()
    ttls = [p.ttl_ms for p in (topic_policy, channel.policy) if p is not None and p.ttl_ms]
    channel.inflight.ttl_ns = min(ttls) * 1_000_000 if ttls else 0
    ring = getattr(channel, "ring", None)
    if ring is not None:  # for local consumers (nsqshm.local), which read the ring themselves
        ring.ttl_ns = channel.inflight.ttl_ns
    # (a message may have a time to live of its own: message_ttl.py)
    keep = channel.policy is not None and channel.policy.dead_letter_expired
    if not keep:
        channel.inflight.expired_out = None
    elif channel.inflight.expired_out is None:
        channel.inflight.expired_out = bytearray()


def set_policy(nsqd, topic, channel, values):
    """An HTTP request's change: applied here, then on every other worker
    before the answer, then written to nsqd.dat (worker 0)."""
    if channel is not None and (values.get("max_attempts") or values.get("dead_letter_expired")):
        # the dead-letter topic exists from now on: visible, consumable
        name = check_dead_letter_name(topic.name, channel.name, values, channel.policy)
        nsqd.get_topic(name)
    apply(channel if channel is not None else topic, values)
    if nsqd.cluster is not None:
        nsqd.cluster.broadcast({"op": "policy", "topic": topic.name,
                                "channel": channel.name if channel is not None else "",
                                "values": values})
        nsqd.cluster.flush()
    nsqd.notify_change()


def _peer_policy(nsqd, msg):
    """{"op": "policy", "topic", "channel", "values"} from the worker that took it."""
    topic = nsqd.get_existing_topic(str(msg.get("topic")))
    if topic is None:
        return None
    channel_name = str(msg.get("channel") or "")
    target = topic.get_existing_channel(channel_name) if channel_name else topic
    if target is None:
        return None
    try:
        values = parse_values(msg.get("values") or {}, bool(channel_name), topic.name,
                              channel_name)
    except PolicyError as err:
        nsqd.logf("error", f"WORKER: bad policy from a peer - {err}")
        return None
    apply(target, values)
    nsqd.notify_change()
    return None


# -- nsqd.dat and the topology --------------------------------------------------------


def meta(target):
    """The extra keys of a topic's or channel's object in nsqd.dat."""
    policy = target.policy
    if policy is None:
        return {}
    out = {}
    if policy.ttl_ms:
        out["ttl_ms"] = policy.ttl_ms
    if policy.max_attempts:
        out["max_attempts"] = policy.max_attempts
    if policy.dead_letter_topic:
        out["dead_letter_topic"] = policy.dead_letter_topic
    if policy.dead_letter_expired:
        out["dead_letter_expired"] = True
    depth, nbytes, overflow = default_bound(target.nsqd)
    if (policy.max_depth, policy.max_bytes, policy.overflow) != (depth, nbytes, overflow) \
            and (policy.max_depth or policy.max_bytes or depth or nbytes):
        if policy.max_depth or depth:
            out["max_depth"] = policy.max_depth  # (0: a default bound taken off)
        if policy.max_bytes or nbytes:
            out["max_bytes"] = policy.max_bytes
        out["overflow"] = policy.overflow
    return out


def load(nsqd, target, entry, channel_level):
    """Take the policy keys of an nsqd.dat (or peer topology) object."""
    raw = {k: entry[k] for k in (KEYS if channel_level else TOPIC_KEYS) if k in entry}
    if not raw:
        return
    try:
        values = parse_values(raw, channel_level)
    except PolicyError as err:
        nsqd.logf("warn", f"skipping the policy of {target!r} in nsqd.dat - {err}")
        return
    apply(target, values)


def default_bound(nsqd):
    """(max_depth, max_bytes, overflow) of --max-queue-depth, --max-queue-bytes
    and --queue-overflow."""
    opts = nsqd.opts
    return (getattr(opts, "max_queue_depth", 0), getattr(opts, "max_queue_bytes", 0),
            getattr(opts, "queue_overflow", "reject"))


def _with_default_bound(nsqd):
    depth, nbytes, overflow = default_bound(nsqd)
    if not depth and not nbytes:
        return None
    policy = Policy()
    policy.max_depth, policy.max_bytes, policy.overflow = depth, nbytes, overflow
    return policy


def for_topic(topic):
    """A new topic: the flags' default bound, if any."""
    topic.policy = _with_default_bound(topic.nsqd)
    bounds.update_topic(topic)


def inherit(channel):
    """A new channel: the flags' default bound, its topic's time to live."""
    channel.policy = _with_default_bound(channel.nsqd)
    if channel.policy is not None and channel.policy.overflow == "reject":
        channel.topic.bounded = [*channel.topic.bounded, channel]  # checked at publish
    if channel.topic.policy is not None:
        update_channel(channel)


# -- /stats ------------------------------------------------------------------------------


def expired_count(channel):
    """What this worker's consumers dropped as expired, and, on the topic's
    owner (once for the broker), what local consumers did (the ring's count)."""
    ring = getattr(channel, "ring", None)
    local = ring.local_expired if ring is not None and channel.topic.owned else 0
    return getattr(channel.inflight, "expired", 0) + local


def channel_stats(channel):
    policy = getattr(channel, "policy", None)
    if policy is None:
        if not expired_count(channel):
            return {}
        policy = Policy()  # messages with a time to live of their own expired (message_ttl.py)
    return {"ttl_ms": policy.ttl_ms, "max_attempts": policy.max_attempts,
            "dead_letter_topic": (dead_letter_topic(channel)
                                  if policy.max_attempts or policy.dead_letter_expired else ""),
            "dead_letter_count": policy.dead_letter_count,
            "dead_letter_requeued_count": policy.reasons["requeued"],
            "dead_letter_timed_out_count": policy.reasons["timed_out"],
            "dead_letter_expired": policy.dead_letter_expired,
            "dead_letter_expired_count": policy.reasons["expired"],
            "expired_count": expired_count(channel),
            **_bound_stats(policy)}


def _bound_stats(policy):
    return {"max_depth": policy.max_depth, "max_bytes": policy.max_bytes,
            "overflow": policy.overflow,
            "rejected_count": policy.rejected_count, "dropped_count": policy.dropped_count}


# per worker: the merged /stats sums them (stats._SUMMED)
SUMMED_STATS = ("dead_letter_count", "dead_letter_requeued_count",
                "dead_letter_timed_out_count", "dead_letter_expired_count", "expired_count",
                "rejected_count", "dropped_count")


def topic_stats(topic):
    policy = getattr(topic, "policy", None)
    if policy is None and not any(getattr(c, "policy", None) is not None or expired_count(c)
                                  for c in topic.channels.values()):
        return {}
    return {"ttl_ms": policy.ttl_ms if policy is not None else 0,
            "expired_count": sum(expired_count(c) for c in topic.channels.values()),
            **_bound_stats(policy or Policy())}


# -- dead letters ------------------------------------------------------------------------


def dead_letter(channel, view, reason):
    """Of the packed records in the writable `view` (a batch leaving flight
    by REQ or timeout), send those at max attempts to the dead-letter topic;
    returns the rest, for the channel.  If the dead-letter topic cannot take
    them (a full disk), they all stay in the channel."""
    policy = channel.policy
    dead = bytearray()
    n_kept, kept_bytes, n_dead = take_dead(view, len(view), policy.max_attempts, dead)
    if not n_dead:
        return view
    if not _publish_dead(channel, dead, n_dead):
        return bytes(view[:kept_bytes]) + bytes(dead)
    gone = getattr(channel, "records_gone", None)  # a log channel's cursor (logchannel.py)
    if gone is not None:
        gone(dead)
    trace.queue_dropped(channel, dead, n_dead, trace.DROP_DEAD_LETTER)
    policy.dead_letter_count += n_dead
    policy.reasons[reason] += n_dead
    channel.nsqd.logf("info", f"CHANNEL({channel.topic.name}:{channel.name}): {n_dead} "
                              f"message(s) {reason} at {policy.max_attempts} attempts moved to "
                              f"{dead_letter_topic(channel)}")
    return view[:kept_bytes]


def _publish_dead(channel, records, n):
    """Put n packed records into the channel's dead-letter topic: whether it took them."""
    nsqd = channel.nsqd
    name = dead_letter_topic(channel)
    try:
        with nsqd.own_changes():  # a new dead-letter topic reaches every worker
            topic = nsqd.get_topic(name)
        topic.put_packed(records, n, len(records) - n * 30)
        return True
    except Exception as err:  # (TopicError: a full disk, a bound; the topic closing)
        nsqd.logf("error", f"CHANNEL({channel.topic.name}:{channel.name}): failed to put "
                           f"{n} dead letters to {name} - {err}")
        return False


def flush_expired(channel):
    """Publish what deliver() kept of the expired messages (dead_letter_expired)
    to the dead-letter topic; if it cannot take them they are dropped, as
    without the setting (they left the ring in the dispatcher's C call: a
    worker dying before this drops them too)."""
    buf = channel.inflight.expired_out
    if not buf:
        return
    n = count_records(buf, len(buf))
    records = bytes(buf)
    del buf[:]
    if _publish_dead(channel, records, n):  # (deliver recorded them DROPPED, expired)
        channel.policy.dead_letter_count += n
        channel.policy.reasons["expired"] += n


def redrive(nsqd, channel, n, ids=None):
    """Move up to n (None: all) messages queued in the channel's dead-letter
    topic back into the channel, attempts reset; on the dead-letter topic's
    owner (its disk queue).  With `ids` (message IDs, 16 hex digits each),
    only those, wherever they are in the queue (_redrive_ids).  Returns how
    many moved, or an error text."""
    name = dead_letter_topic(channel)
    topic = nsqd.topics.get(name)
    if topic is None:
        return 0
    if topic.channels:  # its pump takes what it holds: redrive could race it
        return "DEAD_LETTER_TOPIC_HAS_CHANNELS"
    if ids:
        moved = _redrive_ids(nsqd, channel, topic, ids)
    else:
        moved = _redrive_next(nsqd, channel, topic, n)
    if moved:
        nsqd.logf("info", f"CHANNEL({channel.topic.name}:{channel.name}): {moved} dead "
                          f"letter(s) redriven from {name}")
    return moved


def _peek_next(topic, scratch, want):
    """The dead-letter topic's next records, in its order (the ring holds the
    older ones, the disk queue what came once memory was full): (count,
    bytes, from the disk queue)."""
    k, nbytes = topic.ring.peek_many_into(scratch, want)
    if not k and topic.backend.depth:
        k, nbytes = topic.backend.peek_into(scratch, want)
        return k, nbytes, True
    return k, nbytes, False


def _consume(nsqd, topic, k, from_disk):
    if from_disk:
        topic.backend.advance(k)
        nsqd.backend_written(topic.backend)
    else:
        topic.ring.discard(k)


def _redrive_next(nsqd, channel, topic, n):
    moved = 0
    while (n is None or moved < n) and not topic.channels and not topic.exiting:
        want = REDRIVE_BATCH if n is None else min(REDRIVE_BATCH, n - moved)
        with nsqd.scratch.borrow() as scratch:
            k, nbytes, from_disk = _peek_next(topic, scratch, want)
            if not k:
                break
            reset_attempts(scratch, nbytes)
            channel.put_records(memoryview(scratch)[:nbytes])  # stored (or deferred 0.1 s)
            _consume(nsqd, topic, k, from_disk)
        moved += k
        gevent.idle()  # a long redrive lets the worker serve between batches
    return moved


def _redrive_ids(nsqd, channel, topic, ids):
    """The dead letters with these IDs back into the channel.  The queue is
    rotated once, batch by batch: the records of each batch that are not
    wanted are stored again at its tail before the batch leaves the head, so
    the others keep their order, and a failure (a full disk) loses none (it
    stops the redrive; what was stored twice is there twice).  Costs a pass
    over the whole queue.  Dead letters that arrive meanwhile may land
    between the rotated ones."""
    wanted = b"".join(i.encode() for i in ids)
    left = topic.ring.depth + topic.backend.depth  # each record of the queue looked at once
    moved = 0
    while left > 0 and not topic.channels and not topic.exiting:
        with nsqd.scratch.borrow() as scratch:
            k, nbytes, from_disk = _peek_next(topic, scratch, min(REDRIVE_BATCH, left))
            if not k:
                break
            taken = bytearray()
            n_kept, kept_bytes, n_taken = take_ids(scratch, nbytes, wanted, taken)
            try:
                if n_kept:
                    topic.store(memoryview(scratch)[:kept_bytes])
            except Exception as err:  # (TopicError: a full disk; topic.py imports this module)
                nsqd.logf("error", f"CHANNEL({channel.topic.name}:{channel.name}): redrive "
                                   f"stopped - {err}")
                break
            if n_taken:
                reset_attempts(taken, len(taken))
                channel.put_records(memoryview(taken))
            _consume(nsqd, topic, k, from_disk)
        moved += n_taken
        left -= k
        gevent.idle()
    return moved


def _peer_redrive(nsqd, msg):
    """{"op": "redrive", "topic", "channel", "n", "ids"}: to the dead-letter topic's owner."""
    topic = nsqd.get_existing_topic(str(msg.get("topic")))
    channel = topic.get_existing_channel(str(msg.get("channel"))) if topic else None
    if channel is None:
        return {"error": "CHANNEL_NOT_FOUND"}
    n, ids = msg.get("n"), msg.get("ids")
    if not (isinstance(ids, list) and all(is_message_id(i) for i in ids)):
        ids = None
    result = redrive(nsqd, channel, n if isinstance(n, int) and n > 0 else None, ids)
    return {"error": result} if isinstance(result, str) else {"moved": result}


def is_message_id(text):
    """16 hex digits, as a message ID is written."""
    return isinstance(text, str) and len(text) == 16 and all(c in HEX for c in text)


def redrive_anywhere(nsqd, channel, n, ids=None):
    """redrive() on the dead-letter topic's owner, whichever worker asks:
    (moved, None) or (0, error text)."""
    name = dead_letter_topic(channel)
    if nsqd.cluster is None or nsqd.owns(name):
        result = redrive(nsqd, channel, n, ids)
    else:
        reply = nsqd.cluster.call(nsqd.owner_of(name),
                                  {"op": "redrive", "topic": channel.topic.name,
                                   "channel": channel.name, "n": n, "ids": ids},
                                  timeout=REDRIVE_TIMEOUT)
        if not isinstance(reply, dict):
            return 0, "INTERNAL_ERROR"
        result = reply.get("error") or reply.get("moved", 0)
    return (0, result) if isinstance(result, str) else (result, None)


# cluster.py ops this module answers (NSQD.handle_peer)
PEER_OPS = {"policy": _peer_policy, "redrive": _peer_redrive}
