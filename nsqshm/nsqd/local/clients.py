"""Local shared-memory clients as the broker sees them (nsqshm.local, the
Spark source): each holds its messages in an arena in /dev/shm,

    <prefix>.f.l<pid>.<n>               a local consumer
    <prefix>.f.s<reader>.<seq>.<part>   a Spark micro-batch partition
    <prefix>.f.s<reader>.c              a Spark stream reader's counters

whose header carries a client description (Arena.client_info).  This module
turns those into /stats client entries and finds the arenas whose owner
died, for the broker's /stats and for recovery.recover_arena, which puts
their messages back.
"""

import socket
import time

import posix_ipc

from nsqshm._core.arena import Arena, ArenaError
from nsqshm._core.localbatch import arena_due

TAGS = ("f.l", "f.s")
LOCAL_LABEL = "local"  # the label of a Consumer's arena (nsqshm/local/consumer.py)
BULK_LABEL = "local-bulk"  # a BulkConsumer's (nsqshm/local/bulk.py)
# a Consumer of a log channel that reads the partitions' logs itself: counted among
# the ring's direct_subscribers too (the owners' feeders need not fill the ring for it)
DIRECT_LABEL = "local-direct"
SUBSCRIBER_LABELS = (LOCAL_LABEL, BULK_LABEL, DIRECT_LABEL)


def local_arenas(prefix):
    """Names of the local and Spark client arenas of broker `prefix`."""
    names = []
    for tag in TAGS:
        names.extend(Arena.list(f"{prefix}.{tag}"))
    return names


def local_subscribers(prefix):
    """{"topic:channel": [n, of them direct]}: the local Consumers (and
    BulkConsumers) of broker `prefix` counted among a log channel's subscribers
    (ready_count > 0: close() and the recovery of a dead one's arena set it to 0
    as they give the count back), and of them those that read the logs
    themselves (DIRECT_LABEL).  A dead one not recovered yet counts too: its
    recovery takes it out."""
    counts = {}
    for name in Arena.list(f"{prefix}.f.l"):
        arena = _attach(name)
        if arena is None:
            continue
        try:
            if arena.label in SUBSCRIBER_LABELS:
                info = arena.client_info()
                if info["ready_count"] > 0:
                    count = counts.setdefault(info["queue"], [0, 0])
                    count[0] += 1
                    count[1] += arena.label == DIRECT_LABEL
        except ArenaError:
            pass
        finally:
            arena.close()
    return counts


def _attach(name):
    """The arena, or None if it is gone or not initialised yet."""
    try:
        return Arena.attach(name)
    except (posix_ipc.Error, ArenaError, ValueError):
        return None


def client_entry(info, pid, in_flight=None):
    """One client in nsqd's /stats shape (ClientV2Stats; keys in Go's order)."""
    return {
        "client_id": info["client_id"] or f"local-{pid}",
        "hostname": info["hostname"] or socket.gethostname(),
        "version": "V2",
        "remote_address": f"shm:{pid}",
        "state": 3,  # stateSubscribed
        "ready_count": int(info["ready_count"]),
        "in_flight_count": int(info["in_flight"] if in_flight is None else in_flight),
        "message_count": int(info["message_count"]),
        "finish_count": int(info["finish_count"]),
        "requeue_count": int(info["requeue_count"]),
        "connect_ts": int(info["connect_ts"]),
        "sample_rate": 0,
        "deflate": False,
        "snappy": False,
        "user_agent": info["user_agent"],
        "tls": False,
        "tls_cipher_suite": "",
        "tls_version": "",
        "tls_negotiated_protocol": "",
        "tls_negotiated_protocol_is_mutual": False,
    }


def local_client_stats(prefix):
    """{(topic, channel): [client dicts]} of the live local clients of broker
    `prefix`.  The arenas of one client (a Spark reader's batch partitions
    and counters) are merged into one entry: counters summed, in_flight the
    messages its arenas hold."""
    groups = {}
    for name in local_arenas(prefix):
        arena = _attach(name)
        if arena is None:
            continue
        try:
            if not arena.owner_alive():
                continue
            info = arena.client_info()
            queue = info.get("queue")
            if not queue or ":" not in queue:
                continue
            key = (queue, arena.owner_pid, info["client_id"])
            held = arena.live_blocks
            entry = groups.get(key)
            if entry is None:
                groups[key] = (info, arena.owner_pid, held)
            else:
                old, pid, old_held = entry
                merged = dict(old)
                for field in ("message_count", "finish_count", "requeue_count", "ready_count"):
                    merged[field] = old[field] + info[field]
                merged["connect_ts"] = min((x for x in (old["connect_ts"], info["connect_ts"])
                                            if x), default=0)
                groups[key] = (merged, pid, old_held + held)
        except (ArenaError, IndexError):
            continue
        finally:
            arena.close()
    out = {}
    for (queue, _pid, _cid), (info, pid, held) in sorted(groups.items(), key=lambda kv: kv[0][:2]):
        topic, _, channel = queue.partition(":")
        out.setdefault((topic, channel), []).append(client_entry(info, pid, held))
    return out


def dead_arenas(prefix, now_ns=None):
    """Names of local and Spark client arenas of broker `prefix` whose owner
    process is gone, for recover_arena.  A Spark micro-batch's arena is
    held until its messages' due time (taken + the reader's msgTimeout) has
    passed as well: a query restarted from its checkpoint within that time
    adopts the batch and finishes it, without repeating it."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    dead = []
    for name in local_arenas(prefix):
        arena = _attach(name)
        if arena is None:
            continue
        try:
            if arena.owner_alive():
                continue
            if name.startswith(f"{prefix}.f.s"):
                live, due = arena_due(arena)
                if live and due > now_ns:
                    continue
            dead.append(name)
        except (ArenaError, ValueError):
            dead.append(name)  # unreadable: recover_arena unlinks what it cannot read
        finally:
            arena.close()
    return dead


__all__ = ["client_entry", "dead_arenas", "local_arenas", "local_client_stats"]
