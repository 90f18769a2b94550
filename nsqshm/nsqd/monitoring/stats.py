"""nsqd's /stats: the JSON document and the text report (nsqd's stats.go,
http.go doStats/printStats, client_v2.go ClientV2Stats), plus the JSON
encoding Go's encoding/json produces (compact, keys in struct order,
<, >, & and U+2028/U+2029 escaped, floats as Go formats them).

Shape rules that matter for byte compatibility:
- `topics` is [] when there are none, but null when ?topic= names a topic
  that does not exist;
- `channels` is always an array; `clients` is null without include_clients;
- `producers` is null without include_clients or when no TCP client has
  published;
- `memory` is left out without include_mem;
- client entries leave out authed/auth_identity/auth_identity_url/pub_counts
  when false/empty (Go's omitempty), and carry at most one pub_counts entry.
"""

import decimal
import gc
import json
import json.encoder
import math
import os
import sys
import time
from datetime import datetime

from nsqshm import NSQD_COMPAT_VERSION, __version__
from nsqshm.nsqd.options import format_duration
from nsqshm.nsqd.policies import policy

VERSION_STRING = f"nsqd v{NSQD_COMPAT_VERSION} (built w/nsqshm-{__version__})"

# ---------------------------------------------------------------------------
# Go's encoding/json


def go_float(value):
    """A float64 as encoding/json writes it ('f' format unless tiny or huge)."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"json: unsupported value: {value!r}")
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    text = repr(value)
    a = abs(value)
    if a < 1e-6 or a >= 1e21:
        mant, _, exp = text.partition("e")
        sign = exp[0] if exp[:1] in "+-" else "+"
        digits = exp.lstrip("+-").lstrip("0") or "0"
        if len(digits) < 2 and sign == "+":
            digits = digits.rjust(2, "0")
        if mant.endswith(".0"):
            mant = mant[:-2]
        return f"{mant}e{sign}{digits}"
    text = format(decimal.Decimal(text), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
            ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def _go_string_fixups(text):
    for raw, esc in _ESCAPES:
        if raw in text:
            text = text.replace(raw, esc)
    return text


def _clean_str(s):
    """Undecodable bytes (lone surrogates) become U+FFFD, as Go does for invalid UTF-8."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        pass
    try:
        raw = s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raw = s.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "replace")


def _encode_str(s):
    return json.encoder.encode_basestring(_clean_str(s))


_go_iterencode = None


def go_json(obj):
    """Go's json.Marshal of obj (dicts keep their order) as bytes."""
    global _go_iterencode
    if _contains_float(obj):
        if _go_iterencode is None:
            _go_iterencode = json.encoder._make_iterencode(
                None, _no_default, _encode_str, None, go_float, ":", ",", False, False, True)
        return _go_string_fixups("".join(_go_iterencode(obj, 0))).encode("utf-8")
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return _go_string_fixups(text).encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(_clean(obj), ensure_ascii=False, separators=(",", ":"))
        return _go_string_fixups(text).encode("utf-8")


def _no_default(o):
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


def _contains_float(obj):
    if isinstance(obj, float):
        return True
    if isinstance(obj, dict):
        return any(_contains_float(v) for v in obj.values() if isinstance(v, (float, dict, list)))
    if isinstance(obj, list):
        return any(_contains_float(v) for v in obj if isinstance(v, (float, dict, list)))
    return False


def _clean(obj):
    if isinstance(obj, str):
        return _clean_str(obj)
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


# ---------------------------------------------------------------------------
# end-to-end processing latency (internal/quantile Result)


SKETCH_POINTS = 128  # values per worker's window when workers' streams are merged


def e2e_result(stream, percentiles=(), sketch=False):
    """quantile.Result of a latency stream.  Without a stream: count 0 and, as
    nsqd's empty stream answers, each configured percentile with value 0, or
    {"count":0,"percentiles":null} when none is configured.  With sketch, the
    result carries "sketch" for merge_stats (which removes it)."""
    if stream is not None:
        if callable(getattr(stream, "result", None)):
            result = stream.result(SKETCH_POINTS) if sketch else stream.result()
        else:
            result = stream
        if isinstance(result, dict):
            ps = result.get("percentiles")
            if ps is not None:
                ps = [{"quantile": float(p["quantile"]), "value": float(p["value"])} for p in ps]
            out = {"count": int(result.get("count", 0)), "percentiles": ps}
            if sketch and "sketch" in result:
                out["sketch"] = result["sketch"]
            return out
    if percentiles:
        return {"count": 0, "percentiles": [{"quantile": float(p), "value": 0.0}
                                            for p in percentiles]}
    return {"count": 0, "percentiles": None}


def nanoseconds_to_human(v):
    """internal/quantile NanoSecondToHuman."""
    suffix = "ns"
    if v > 1e9:
        v /= 1e9
        suffix = "s"
    elif v > 1e6:
        v /= 1e6
        suffix = "ms"
    elif v > 1e3:
        v /= 1e3
        suffix = "us"
    return f"{v:0.1f}{suffix}"


def e2e_text(result):
    return ", ".join(nanoseconds_to_human(p["value"]) for p in result["percentiles"] or ())


# ---------------------------------------------------------------------------
# clients


def client_stats(client, topic_name=""):
    """ClientV2Stats of a TCP client, keys in Go's order, omitempty applied."""
    auth_state = getattr(client, "auth_state", None)
    if auth_state is not None:
        authed = bool(getattr(auth_state, "authorizations", None))
    else:
        authed = bool(getattr(client, "authed", False))
    identity = getattr(client, "auth_identity", "") or ""
    identity_url = getattr(client, "auth_identity_url", "") or ""
    pub_counts = []
    for topic, count in getattr(client, "pub_counts", {}).items():
        if topic_name and topic != topic_name:
            continue
        pub_counts.append({"topic": topic, "count": count})
        break  # nsqd keeps at most one entry
    out = {
        "client_id": client.client_id,
        "hostname": client.hostname,
        "version": "V2",
        "remote_address": client.remote_address,
        "state": client.state,
        "ready_count": client.ready_count,
        "in_flight_count": client.in_flight,
        "message_count": client.message_count,
        "finish_count": client.finish_count,
        "requeue_count": client.requeue_count,
        "connect_ts": int(client.connect_time),
        "sample_rate": client.sample_rate,
        "deflate": bool(client.deflate),
        "snappy": bool(client.snappy),
        "user_agent": client.user_agent,
    }
    if authed:
        out["authed"] = True
    if identity:
        out["auth_identity"] = identity
    if identity_url:
        out["auth_identity_url"] = identity_url
    if pub_counts:
        out["pub_counts"] = pub_counts
    tls = bool(getattr(client, "tls", False))
    out["tls"] = tls
    out["tls_cipher_suite"] = getattr(client, "tls_cipher_suite", "") if tls else ""
    out["tls_version"] = getattr(client, "tls_version", "") if tls else ""
    out["tls_negotiated_protocol"] = getattr(client, "tls_negotiated_protocol", "") if tls else ""
    out["tls_negotiated_protocol_is_mutual"] = (
        bool(getattr(client, "tls_negotiated_protocol_is_mutual", False)) if tls else False)
    return out


def _is_producer(client):
    return bool(getattr(client, "pub_counts", None))


def client_text(stats, now=None):
    """ClientV2Stats.String()."""
    now = time.time() if now is None else now
    connected = format_duration(int(now - stats["connect_ts"]))
    port = stats["remote_address"].rpartition(":")[2]
    ident = f"{stats['hostname']}:{port} {stats['user_agent']}"
    pub_counts = stats.get("pub_counts")
    if pub_counts:
        total = sum(p["count"] for p in pub_counts)
        topics = ",".join(f"{p['topic']}={p['count']}" for p in pub_counts)
        return (f"[{stats['version']} {ident:<21}] msgs: {total:<8d} topics: {topics} "
                f"connected: {connected}")
    return (f"[{stats['version']} {ident:<21}] state: {stats['state']} "
            f"inflt: {stats['in_flight_count']:<4d} rdy: {stats['ready_count']:<4d} "
            f"fin: {stats['finish_count']:<8d} re-q: {stats['requeue_count']:<8d} "
            f"msgs: {stats['message_count']:<8d} connected: {connected}")


# ---------------------------------------------------------------------------
# topics and channels (nsqd's GetStats)


def channel_stats(channel, clients, percentiles=(), sketch=False):
    out = {
        "channel_name": channel.name,
        "depth": channel.depth,
        "backend_depth": channel.backend_depth,
        "in_flight_count": len(channel.inflight),
        "deferred_count": len(channel.deferred),
        # (a log channel's local consumers that read the logs themselves too)
        "message_count": channel.message_count + getattr(channel, "direct_count", 0),
        "requeue_count": channel.requeue_count + _local_count(channel, "local_requeues"),
        "timeout_count": channel.timeout_count + _local_count(channel, "local_timeouts"),
        "client_count": len(channel.clients),
        "clients": clients,
        "paused": bool(channel.paused),
        "e2e_processing_latency": e2e_result(getattr(channel, "e2e", None), percentiles,
                                             sketch),
        **_log_channel_stats(channel),
        **policy.channel_stats(channel),  # only with a policy: nsqd's keys otherwise
        **_ext_channel_stats(channel),
    }
    if sketch:  # a part to merge: the ring is everyone's, the disk queue the owner's
        # (a log channel's lanes are everyone's too: logchannel.shared_depth)
        out["ring_depth"] = getattr(channel, "shared_depth", channel.ring.depth)
        out["ring_owner"] = bool(getattr(channel, "owned", False))
    return out


def _local_count(channel, counter):
    """What local consumers (nsqshm.local) of the channel put back or let time
    out: counted in its ring's header, reported by the topic's owner alone
    (/stats sums the workers' parts)."""
    ring = getattr(channel, "ring", None)
    if ring is None or not getattr(channel.topic, "owned", False):
        return 0
    return getattr(ring, counter)


def _ext_channel_stats(channel):
    """An ext topic's channel (nsqd/ext.py): the messages its consumers'
    ext_filter confirmed without sending them."""
    if not getattr(getattr(channel, "topic", None), "ext", False):
        return {}
    views = (getattr(c, "ext_view", None) for c in channel.clients.values())
    return {"ext_filtered_count": getattr(channel, "ext_filtered", 0)
            + sum(v.filtered for v in views if v is not None)}


def _log_channel_stats(channel):
    """A log topic's channel: its cursor in each partition (shared memory:
    any worker's part tells the broker's) and the retention moves."""
    if getattr(channel, "cursors", None) is None:
        return {}
    return {"partitions": channel.partition_stats(),
            "retention_moves": channel.retention_moves}


def topic_stats(topic, channels, percentiles=(), sketch=False):
    # DPUB/defer messages published before the first channel wait in the topic
    # (nsqd keeps them in the topic's queue, so they count in its depth)
    waiting = len(getattr(topic, "deferred_waiting", ()))
    messages, body_bytes = topic.published  # local producers' too
    out = {
        "topic_name": topic.name,
        "channels": channels,
        "depth": topic.depth + waiting,
        "backend_depth": topic.backend_depth,
        "message_count": messages,
        "message_bytes": body_bytes,
        "paused": bool(topic.paused),
        # nsqd merges the channels' streams: none without channels
        "e2e_processing_latency": e2e_result(getattr(topic, "e2e", None),
                                             percentiles if topic.channels else (), sketch),
        **policy.topic_stats(topic),
        **({"is_ext": True} if getattr(topic, "ext", False) else {}),  # Youzan's key (nsqd/stats.go)
    }
    if getattr(topic, "is_log", False):  # a log topic: its partitions' logs (logtopic.py)
        out["partitions"] = topic.partition_stats()
        out["retention"] = {"days": topic.spec["retention_days"],
                            "bytes": topic.spec["retention_bytes"]}
        out["ordered"] = topic.ordered
    if sketch:  # a part to merge: the waiting DPUBs and the overflow are this worker's,
        # the disk queue the owner's, the rings everyone's (a log topic's: its inbound rings)
        out["ring_depth"] = topic.depth - topic.backend_depth
        out["ring_owner"] = bool(getattr(topic, "owned", False))
        out["deferred_waiting"] = waiting
    return out


def get_stats(nsqd, topic_name="", channel_name="", include_clients=True, local=False,
              sketches=False):
    """(topics, producers) as nsqd's GetStats: both None when topic_name
    names no topic; producers None unless include_clients and some client
    has published.  With several workers, the whole broker's (every
    worker's part merged), unless local (a worker's part; with sketches,
    its e2e windows summarised for merging)."""
    if local or getattr(nsqd, "cluster", None) is None:
        return _local_stats(nsqd, topic_name, channel_name, include_clients, sketches)
    part = broker_stats(nsqd, topic_name, channel_name, include_clients)
    return part["topics"], part["producers"]


def worker_stats(nsqd, topic_name="", channel_name="", include_clients=True, include_mem=False,
                 sketches=False):
    """This worker's part of the broker's stats (the reply to a peer's
    {"op": "stats"}): topics and producers as get_stats, its memory
    (mem_stats, with include_mem), its index and pid, and how many TCP
    clients and producers it has."""
    topics, producers = _local_stats(nsqd, topic_name, channel_name, include_clients, sketches)
    clients = list(getattr(nsqd, "clients", {}).values())
    return {"topics": topics, "producers": producers,
            "memory": mem_stats() if include_mem else None,
            "worker": [getattr(nsqd, "index", 0), os.getpid()],
            "client_count": len(clients),
            "producer_count": sum(1 for c in clients if _is_producer(c))}


def broker_stats(nsqd, topic_name="", channel_name="", include_clients=True, include_mem=False):
    """The whole broker's stats, whichever worker asks: worker_stats of every
    worker, merged (topics and producers by merge_stats, memory by
    merge_memory, counts summed, "workers" every worker's [index, pid]).  A worker that
    does not answer within cluster.TIMEOUT is left out."""
    cluster = getattr(nsqd, "cluster", None)
    if cluster is None:
        part = worker_stats(nsqd, topic_name, channel_name, include_clients, include_mem)
        part["workers"] = [part.pop("worker")]
        return part
    parts = [worker_stats(nsqd, topic_name, channel_name, include_clients, include_mem, True)]
    parts += [p for p in cluster.gather({"op": "stats", "topic": topic_name,
                                         "channel": channel_name, "clients": include_clients,
                                         "mem": include_mem, "sketches": True})
              if isinstance(p, dict)]
    topics, producers = merge_stats([(p["topics"], p["producers"]) for p in parts])
    return {"topics": topics, "producers": producers,
            "memory": merge_memory([p["memory"] for p in parts]) if include_mem else None,
            "workers": sorted(p["worker"] for p in parts),
            "client_count": sum(p["client_count"] for p in parts),
            "producer_count": sum(p["producer_count"] for p in parts)}


# what each worker counts for itself (summed: backend_depth is the owner's
# disk queue and each worker's overflow) and what they all see (a ring,
# shared: the owner's reading, else the largest); a depth is then ring +
# backend (+ waiting).  The owner's: it reads the ring and its disk queue in
# one go, with no yield between, and it alone moves messages from one to the
# other (Topic._spill_excess, in one C write), so its two readings never
# count a message on the move twice, as another worker's ring reading taken
# a moment before the owner's disk depth could.
_SUMMED = ("message_count", "message_bytes", "in_flight_count", "deferred_count",
           "requeue_count", "timeout_count", "client_count", "deferred_waiting",
           "backend_depth", "retention_moves", "ext_filtered_count", *policy.SUMMED_STATS)
_SHARED = ("ring_depth",)


def _merge_into(into, part):
    for key in part.keys() - into.keys():  # (a policy's keys: where messages expired)
        into[key] = 0 if key in _SUMMED else part[key]
    for key in _SUMMED:
        if key in into:
            into[key] += part.get(key, 0)  # (a policy's counts: where it is set)
    for key in _SHARED:
        if key not in into:
            continue
        if part.get("ring_owner"):
            into[key] = part[key]
            into["ring_owner"] = True
        elif not into.get("ring_owner"):
            into[key] = max(into[key], part[key])
    into["paused"] = into["paused"] or part["paused"]
    mine, theirs = into.get("e2e_processing_latency"), part.get("e2e_processing_latency")
    if mine and theirs and "sketch" in mine and "sketch" in theirs:
        into["e2e_processing_latency"] = merge_e2e(mine, theirs)
    elif theirs and (not mine or theirs.get("count", 0) > mine.get("count", 0)):
        into["e2e_processing_latency"] = theirs  # no sketches: the worker that saw most


def merge_e2e(a, b):
    """Two workers' e2e results as one: each sketch value stands for
    count / len(sketch) finishes, and the percentiles are read off the merged
    weights at the rank a single window's would be (floor(q * count))."""
    pairs = sorted(_weighted(a) + _weighted(b))
    count = a["count"] + b["count"]
    out = {"count": count, "percentiles": None, "sketch": pairs}
    quantiles = a["percentiles"] if a["percentiles"] is not None else b["percentiles"]
    if quantiles is not None:
        out["percentiles"] = []
        for p in quantiles:
            value, seen = 0.0, 0.0
            for v, w in pairs:
                value, seen = v, seen + w
                if seen > p["quantile"] * count:
                    break
            out["percentiles"].append({"quantile": p["quantile"], "value": float(value)})
    return out


def _weighted(e2e):
    sketch, count = e2e.get("sketch") or [], e2e.get("count", 0)
    if sketch and isinstance(sketch[0], list | tuple):
        return [tuple(x) for x in sketch]  # merged already
    return [(float(v), count / len(sketch)) for v in sketch] if count else []


def _drop_sketches(topics):
    for t in topics or ():
        t.get("e2e_processing_latency", {}).pop("sketch", None)
        for c in t["channels"]:
            c.get("e2e_processing_latency", {}).pop("sketch", None)


def merge_stats(parts):
    """Merge the (topics, producers) of several workers into one."""
    topics, producers, found = {}, None, False
    for part_topics, part_producers in parts:
        if part_topics is None:
            continue
        found = True
        for t in part_topics:
            merged = topics.get(t["topic_name"])
            if merged is None:
                topics[t["topic_name"]] = dict(t, channels=[dict(c) for c in t["channels"]])
                continue
            _merge_into(merged, t)
            channels = {c["channel_name"]: c for c in merged["channels"]}
            for c in t["channels"]:
                have = channels.get(c["channel_name"])
                if have is None:
                    merged["channels"].append(dict(c))
                    continue
                _merge_into(have, c)
                if c.get("clients") is not None:
                    have["clients"] = (have.get("clients") or []) + c["clients"]
        if part_producers:
            producers = (producers or []) + part_producers
    if not found:
        return None, None
    ordered = sorted(topics.values(), key=lambda t: t["topic_name"].encode())
    for t in ordered:
        for x in (t, *t["channels"]):
            if "ring_depth" in x:
                x["depth"] = x.pop("ring_depth") + x["backend_depth"]
                x.pop("ring_owner", None)
        t["depth"] += t.pop("deferred_waiting", 0)  # every worker's, on top of the ring's
        t["channels"].sort(key=lambda c: c["channel_name"].encode())
    _drop_sketches(ordered)
    return ordered, producers


def _local_stats(nsqd, topic_name, channel_name, include_clients, sketches=False):
    if topic_name:
        topic = nsqd.topics.get(topic_name)
        if topic is None:
            return None, None  # nsqd returns before looking at producers
        real_topics = [topic]
    else:
        real_topics = sorted(nsqd.topics.values(), key=lambda t: t.name.encode())
    opts = getattr(nsqd, "opts", None)
    percentiles = getattr(opts, "e2e_processing_latency_percentile", None) or ()
    local = _local_clients(nsqd)
    topics = []
    for topic in real_topics:
        if channel_name:
            channel = topic.channels.get(channel_name)
            if channel is None:
                continue
            real_channels = [channel]
        else:
            real_channels = sorted(topic.channels.values(), key=lambda c: c.name.encode())
        channels = []
        for channel in real_channels:
            clients = None
            if include_clients:
                clients = [client_stats(c, topic_name) for c in list(channel.clients.values())]
                _tag_worker(nsqd, clients)
            entry = channel_stats(channel, clients, percentiles, sketches)
            _add_local_clients(entry, local.get((topic.name, channel.name)), include_clients)
            channels.append(entry)
        topics.append(topic_stats(topic, channels, percentiles, sketches))
    producers = None
    if include_clients:
        for client in list(nsqd.clients.values()):
            if _is_producer(client):
                if producers is None:
                    producers = []
                producers.append(client_stats(client, topic_name))
    _tag_worker(nsqd, producers or ())
    return topics, producers


def _local_clients(nsqd):
    """nsqshm.local and Spark clients of the broker (shared-memory arenas),
    listed by worker 0 alone so that merged /stats count them once."""
    prefix = getattr(nsqd, "shm_prefix", None)
    if prefix is None or getattr(nsqd, "index", 0) != 0:
        return {}
    from nsqshm.nsqd.local.clients import local_client_stats

    return local_client_stats(prefix)


def _add_local_clients(entry, clients, include_clients):
    """A channel's local clients: counted like TCP clients, their held messages in flight."""
    if not clients:
        return
    entry["client_count"] += len(clients)
    entry["in_flight_count"] += sum(c["in_flight_count"] for c in clients)
    if include_clients:
        entry["clients"] = (entry["clients"] or []) + clients


def _tag_worker(nsqd, clients):
    """With several workers, each client says whose it is (nsqshm_worker;
    clients and nsqadmin ignore keys they do not know)."""
    if getattr(nsqd, "nworkers", 1) > 1:
        for c in clients:
            c["nsqshm_worker"] = nsqd.index


# ---------------------------------------------------------------------------
# memory (Go's runtime.MemStats, filled from what CPython and Linux expose)

_GC_PAUSES = []  # ring of the last 256 collection pauses, ns (Go keeps 256)
_GC_PAUSE_IDX = 0
_gc_started = None
_gc_hooked = False


def _gc_callback(phase, info):
    global _gc_started, _GC_PAUSE_IDX
    if phase == "start":
        _gc_started = time.perf_counter_ns()
    elif _gc_started is not None:
        pause = time.perf_counter_ns() - _gc_started
        _gc_started = None
        if len(_GC_PAUSES) < 256:
            _GC_PAUSES.append(pause)
        else:
            _GC_PAUSES[_GC_PAUSE_IDX] = pause
            _GC_PAUSE_IDX = (_GC_PAUSE_IDX + 1) % 256


def install_gc_hook():
    """Time garbage collections for gc_pause_usec_* (called by the HTTP server)."""
    global _gc_hooked
    if not _gc_hooked:
        gc.callbacks.append(_gc_callback)
        _gc_hooked = True


def _percentile(perc, arr):
    """nsqd's percentile() over a sorted list."""
    if not arr:
        return 0
    idx = int(math.floor(perc / 100.0 * len(arr) + 0.5))
    if idx >= len(arr):
        idx = len(arr) - 1
    return arr[idx]


_mallinfo2 = None


def _malloc_info():
    """(in use, free) heap bytes from glibc's mallinfo2, or None."""
    global _mallinfo2
    if _mallinfo2 is None:
        try:
            import ctypes

            class MallInfo2(ctypes.Structure):
                _fields_ = [(name, ctypes.c_size_t) for name in (
                    "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                    "uordblks", "fordblks", "keepcost")]

            libc = ctypes.CDLL(None)
            fn = libc.mallinfo2
            fn.restype = MallInfo2
            fn.argtypes = []
            _mallinfo2 = fn
        except (OSError, AttributeError):
            _mallinfo2 = False
    if not _mallinfo2:
        return None
    info = _mallinfo2()
    return info.uordblks + info.hblkhd, info.fordblks


def _proc_status_bytes(key):
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def mem_stats():
    """nsqd's memStats keys: heap objects are CPython's allocated blocks, heap
    bytes come from malloc (or VmRSS), pauses from timed collections."""
    info = _malloc_info()
    if info is None:
        in_use, idle = _proc_status_bytes("VmRSS"), 0
    else:
        in_use, idle = info
    pauses = sorted(_GC_PAUSES)
    threshold = gc.get_threshold()[0]
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": idle,
        "heap_in_use_bytes": in_use,
        "heap_released_bytes": 0,
        "gc_pause_usec_100": _percentile(100.0, pauses) // 1000,
        "gc_pause_usec_99": _percentile(99.0, pauses) // 1000,
        "gc_pause_usec_95": _percentile(95.0, pauses) // 1000,
        "next_gc_bytes": max(0, threshold - gc.get_count()[0]),
        "gc_total_runs": sum(s["collections"] for s in gc.get_stats()) & 0xFFFFFFFF,
    }


MEM_KEYS = ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
            "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes",
            "gc_total_runs")
# the worst pause any worker had; every other figure is a total over the workers
_MEM_WORST = ("gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95")


def merge_memory(parts):
    """The broker's memory section from every worker's mem_stats: heap
    objects and bytes, next_gc_bytes and gc_total_runs are summed (what the
    broker's workers hold, and collect, together); the gc pause percentiles
    are the worst worker's (what a client may wait).  The supervisor holds
    no queue and is left out; shared-memory rings are in no process's heap."""
    parts = [p for p in parts if p]
    merged = {}
    for key in MEM_KEYS:
        values = [p[key] for p in parts]
        merged[key] = max(values) if key in _MEM_WORST else sum(values)
    merged["gc_total_runs"] &= 0xFFFFFFFF  # Go's uint32 NumGC
    return merged


# ---------------------------------------------------------------------------
# the two formats


def stats_document(nsqd, topic_name="", channel_name="", include_clients=True,
                   include_mem=True):
    part = broker_stats(nsqd, topic_name, channel_name, include_clients, include_mem)
    topics, producers = part["topics"], part["producers"]
    doc = {
        "version": NSQD_COMPAT_VERSION,
        "health": nsqd.health,
        "start_time": int(nsqd.start_time),
        "topics": topics,
    }
    if include_mem:
        doc["memory"] = part["memory"]
    doc["producers"] = producers
    return doc


def stats_json(nsqd, topic_name="", channel_name="", include_clients=True, include_mem=True):
    return go_json(stats_document(nsqd, topic_name, channel_name, include_clients, include_mem))


def rfc3339(ts):
    dt = datetime.fromtimestamp(int(ts)).astimezone()
    text = dt.isoformat(timespec="seconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def stats_text(nsqd, topic_name="", channel_name="", include_clients=True, include_mem=True):
    """printStats."""
    part = broker_stats(nsqd, topic_name, channel_name, include_clients, include_mem)
    topics, producers = part["topics"], part["producers"]
    now = time.time()
    out = [
        f"{VERSION_STRING}\n",
        f"start_time {rfc3339(nsqd.start_time)}\n",
        f"uptime {format_duration(now - nsqd.start_time)}\n",
        f"\nHealth: {nsqd.health}\n",
    ]
    if include_mem:
        ms = part["memory"]
        out.append("\nMemory:\n")
        for key in MEM_KEYS:
            out.append(f"   {key:<25}\t{ms[key]}\n")
    out.append("\nTopics: None\n" if not topics else "\nTopics:")
    for t in topics or ():
        prefix = "*P " if t["paused"] else "   "
        out.append(f"\n{prefix}[{t['topic_name']:<15}] depth: {t['depth']:<5d} "
                   f"be-depth: {t['backend_depth']:<5d} msgs: {t['message_count']:<8d} "
                   f"e2e%: {e2e_text(t['e2e_processing_latency'])}\n")
        for p in t.get("partitions") or ():  # a log topic's (nsqshm)
            out.append(f"      partition {p['partition']:<3d} start: {p['start_offset']:<8d} "
                       f"end: {p['end_offset']:<8d} owner: {p['owner']}\n")
        for c in t["channels"]:
            prefix = "   *P " if c["paused"] else "      "
            out.append(f"{prefix}[{c['channel_name']:<25}] depth: {c['depth']:<5d} "
                       f"be-depth: {c['backend_depth']:<5d} inflt: {c['in_flight_count']:<4d} "
                       f"def: {c['deferred_count']:<4d} re-q: {c['requeue_count']:<5d} "
                       f"timeout: {c['timeout_count']:<5d} msgs: {c['message_count']:<8d} "
                       f"e2e%: {e2e_text(c['e2e_processing_latency'])}\n")
            for p in c.get("partitions") or ():
                out.append(f"          partition {p['partition']:<3d} confirmed: "
                           f"{p['confirmed_offset']:<8d} lag: {p['lag']}\n")
            for client in c["clients"] or ():
                out.append(f"        {client_text(client, now)}\n")
    if not producers:
        out.append("\nProducers: None\n")
    else:
        out.append("\nProducers:\n")
        for client in producers:
            out.append(f"   {client_text(client, now)}\n")
    return "".join(out).encode("utf-8", "surrogateescape")
