"""Message tracing: what happened to one message, asked of the broker itself.

Youzan's fork traces a message published with a trace ID (PUB_TRACE,
MPUB_TRACE, /pubtrace, the "##trace_id" header) and every message of a
topic or channel whose tracing is switched on (POST /message/trace/enable,
/message/trace/disable ?topic=T[&channel=C]); its search needs an
Elasticsearch side.  Here each worker appends the events to its own log in
the data path, fixed-size binary records written in C by the delivery paths
themselves, a batch per write(2) (_core/tracelog.pyx has the layout):

    <data-path>/nsqshm.trace/w<index>.events    (the older part: w<index>.events.1)
    <data-path>/nsqshm.trace/w<index>.streams   {"stream":n,"topic":"t","channel":"c"} a line

A record names its topic and channel by the worker's number for the pair
(the .streams table, appended before the first record that uses a number)
and its client by address.  Events: PUB (by which client, with its trace
ID), DISK (written to a disk queue), DELIVERED (to which client, attempt n),
REQ (delay), TIMEOUT, TOUCH, FIN, DROPPED (why).  Retention: a log past
MAX_LOG_BYTES becomes .1 (the older .1 goes), so a worker keeps at most
twice that.  GET /message/trace?topic=T&id=<16 hex>|trace_id=<n> reads every
worker's log and answers the message's events in time order (with trace_id:
every message published with it), as JSON objects:

    {"ts":<ns>,"event":"DELIVERED","topic":"t","channel":"c","id":"<16 hex>",
     "attempt":1,"client":"h:p","worker":0}

Events are recorded only while tracing is on for the topic or channel (or
for a message published with a trace ID).  The switches are kept in
<data-path>/nsqshm.trace/switches.json and sent to the other workers
({"op": "trace"}) before the answer.  Local consumers (nsqshm.local) of a
traced channel write logs of their own beside the workers', l<pid>.*
(tracefiles.py; nsqshm/local/tracing.py), which a search reads too.
"""

import fcntl
import functools
import ipaddress
import json
import os
import socket
import struct

import gevent.local

from nsqshm._core import tracelog
from nsqshm._core.tracelog import DROP_CODES, EVENT_CODES, EVENTS, RECORD_SIZE, TraceWriter
from nsqshm.nsqd.tracing.tracefiles import (
    MAX_LOG_BYTES,
    SWITCHES,
    append_stream,
    log_files,
    read_streams,
    read_switches,
    trace_dir,
)

MAX_ANSWER = 10_000  # events in one answer
MAX_STREAMS = 1 << 20  # (topic, channel) numbers of one worker's table
# DROPPED's value (tracelog.pxd's DROP_*) and its text in answers
DROP_REASONS = ("", "ephemeral channel past --mem-queue-size", "expired (time to live)",
                "sampled out (sample_rate)", "refused by the consumer's ext_filter",
                "drop-oldest (max_depth, max_bytes)", "max attempts: to the dead-letter topic")
assert [DROP_REASONS[code][:4] for code in sorted(DROP_CODES.values())] == \
    ["ephe", "expi", "samp", "refu", "drop", "max "]
DROP_EPHEMERAL = DROP_CODES["ephemeral"]
DROP_BOUND = DROP_CODES["bound"]
DROP_DEAD_LETTER = DROP_CODES["dead_letter"]
DROP_SAMPLED = DROP_CODES["sampled"]

# [trace record] (_core/tracelog.pyx): ts, event, attempt, stream, id, value, address, port
RECORD = struct.Struct("=qBxHI16sQ16s2sxxxxxx")
assert RECORD.size == RECORD_SIZE


def _dir(nsqd):
    return trace_dir(nsqd.data_path)


class TraceLog:
    """One worker's trace log: the C writer and its (topic, channel) table."""

    def __init__(self, nsqd):
        self.nsqd = nsqd
        directory = _dir(nsqd)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.streams_path = os.path.join(directory, f"w{nsqd.index}.streams")
        self.writer = TraceWriter(os.fsencode(os.path.join(directory, f"w{nsqd.index}.events")),
                                  MAX_LOG_BYTES)
        self.refs = {key: ref for ref, key in read_streams(self.streams_path).items()}
        self.errors_seen = 0

    def stream(self, topic, channel=""):
        """The worker's number for (topic, channel), added to the table once."""
        key = (topic, channel or "")
        ref = self.refs.get(key)
        if ref is None:
            ref = len(self.refs) + 1
            if ref > MAX_STREAMS:
                raise OSError(f"more than {MAX_STREAMS} traced topics and channels")
            append_stream(self.streams_path, ref, *key)
            self.refs[key] = ref
        return ref

    def checked(self, status):
        """Log a failed write (a full disk) once per new failure."""
        if status and self.writer.failed != self.errors_seen:
            self.errors_seen = self.writer.failed
            self.nsqd.logf("error", f"TRACE: failed to write {self.streams_path[:-8]}.events - "
                                    f"{os.strerror(status)} ({self.writer.failed} events lost)")


def _log(nsqd):
    log = getattr(nsqd, "trace_log", None)
    if log is None:
        log = nsqd.trace_log = TraceLog(nsqd)
    return log


@functools.lru_cache(maxsize=4096)  # (a traced topic's publishers: parsed once each)
def address_bytes(remote):
    """The 18 bytes of a "host:port" in a trace record (None: not an IP address)."""
    host, _, port = (remote or "").rpartition(":")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
        port = int(port)
    except ValueError:
        return None
    if not 0 <= port <= 0xFFFF:
        return None
    if ip.version == 4:
        ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    return ip.packed + port.to_bytes(2, "big")


def _address_text(raw, port):
    if raw == bytes(16) and port == 0:
        return None
    ip = ipaddress.IPv6Address(raw)
    if ip.ipv4_mapped is not None:
        return f"{ip.ipv4_mapped}:{port}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw)}]:{port}"


def client_address(client):
    """A client's address bytes, worked out once per client."""
    address = getattr(client, "trace_address", False)
    if address is False:
        address = client.trace_address = address_bytes(client.remote_address)
    return address


# -- the switches ----------------------------------------------------------------------------

def switches(nsqd):
    """{(topic, channel or "")} with tracing on, loaded once from the data path."""
    on = getattr(nsqd, "trace_switches", None)
    if on is None:
        on = nsqd.trace_switches = read_switches(_dir(nsqd))
    return on


def traced(nsqd, topic_name, channel_name=""):
    on = switches(nsqd)
    return bool(on) and ((topic_name, "") in on or (topic_name, channel_name) in on)


def set_traced(nsqd, topic_name, channel_name, enable):
    """POST /message/trace/enable|disable: here, persisted, then every worker."""
    _apply(nsqd, topic_name, channel_name, enable)
    directory = _dir(nsqd)
    path = os.path.join(directory, SWITCHES)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    # the file as written last, under a lock, with this change: another
    # worker's switch it has not applied here yet is not lost from it
    lock = os.open(os.path.join(directory, f"{SWITCHES}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        on = read_switches(directory)
        (on.add if enable else on.discard)((topic_name, channel_name or ""))
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(sorted(on), f)
        os.replace(tmp, path)
    finally:
        os.close(lock)
    if nsqd.cluster is not None:
        nsqd.cluster.broadcast({"op": "trace", "topic": topic_name, "channel": channel_name,
                                "enable": enable})
        nsqd.cluster.flush()


def _apply(nsqd, topic_name, channel_name, enable):
    on = switches(nsqd)
    (on.add if enable else on.discard)((topic_name, channel_name or ""))


def _peer_trace(nsqd, msg):
    _apply(nsqd, msg.get("topic", ""), msg.get("channel", ""), bool(msg.get("enable")))
    return None


PEER_OPS = {"trace": _peer_trace}


# -- events ----------------------------------------------------------------------------------

# who publishes, set around a put by the commands that know (PUB, MPUB, PUB_TRACE, PUB_EXT,
# ...); a log partition's owner sets queue_offset, the virtual offset of the first record
publisher = gevent.local.local()


def queue_offset():
    """The virtual offset the last put on this greenlet appended at (0: not
    appended here: a classic topic, or a log partition another worker owns)."""
    return getattr(publisher, "queue_offset", 0)


def wanted(nsqd, topic):
    """A publish now is recorded: the topic is traced or the messages carry trace IDs."""
    return bool(getattr(publisher, "trace_ids", None)) or traced(nsqd, topic)


def published(nsqd, topic, packed, count, partition=-1, first=0):
    """A publish of `count` packed records (Topic.put_packed): recorded when the
    topic is traced or the messages carry trace IDs (publisher.trace_ids).
    With a partition, the records were appended to that log partition from
    msg offset `first`: their IDs in packed become the log's (a traced answer
    and the trace then name what consumers see)."""
    trace_ids = getattr(publisher, "trace_ids", None)
    if not trace_ids and not traced(nsqd, topic):
        return
    log = _log(nsqd)
    if partition >= 0 and not isinstance(packed, bytearray):
        partition = -1
    log.checked(log.writer.published(packed, count, log.stream(topic),
                                     address_bytes(getattr(publisher, "client", None)),
                                     list(trace_ids) if trace_ids else None, partition, first))


def delivered(channel, client, out, base):
    """The message frames a dispatcher round appended to client.out from base."""
    log = _log(channel.nsqd)
    log.checked(log.writer.delivered(out, base, log.stream(channel.topic.name, channel.name),
                                     client_address(client)))


def message_event(channel, event, msg_id, client=None, delay_ms=0):
    """A FIN, REQ or TOUCH of the Python path."""
    log = _log(channel.nsqd)
    log.checked(log.writer.event(EVENT_CODES[event], msg_id,
                                 log.stream(channel.topic.name, channel.name),
                                 client_address(client) if client is not None else None,
                                 delay_ms))


def records_event(nsqd, event, topic, channel, packed, count, reason=0):
    """TIMEOUT, DISK or DROPPED (reason: an index of DROP_REASONS) of packed records."""
    log = _log(nsqd)
    log.checked(log.writer.records(packed, count, EVENT_CODES[event], log.stream(topic, channel),
                                   reason))


def timed_out(channel, packed, count):
    records_event(channel.nsqd, "TIMEOUT", channel.topic.name, channel.name, packed, count)


def drop_tracing(channel):
    """The arguments of InFlight.trace_drops for a traced channel."""
    log = _log(channel.nsqd)
    return log.writer, log.stream(channel.topic.name, channel.name)


def queue_names(queue):
    """(topic, channel) of a topic ("" for the channel) or of a channel."""
    topic = getattr(queue, "topic", None)  # a channel's
    return (topic.name, queue.name) if topic is not None else (queue.name, "")


def queue_traced(queue):
    return traced(queue.nsqd, *queue_names(queue))


def queue_dropped(queue, packed, count, reason):
    """DROPPED of packed records a topic or a channel let go, if it is traced."""
    if count and queue_traced(queue):
        records_event(queue.nsqd, "DROPPED", *queue_names(queue), packed, count, reason)


def parser_tracing(channel, client):
    """The arguments of CommandParser.trace_to for a traced channel's consumer."""
    log = _log(channel.nsqd)
    return log.writer, log.stream(channel.topic.name, channel.name), client_address(client)


# -- search ----------------------------------------------------------------------------------

def _decode(data, pos, table, worker):
    ts, code, attempt, stream, msg_id, value, raw, port = RECORD.unpack_from(data, pos)
    topic, channel = table.get(stream, ("", ""))
    event = EVENTS.get(code, str(code))
    e = {"ts": ts, "event": event, "topic": topic}
    if channel:
        e["channel"] = channel
    e["id"] = msg_id.decode("ascii", "replace")
    if event in ("DELIVERED", "TIMEOUT", "DISK", "DROPPED"):
        e["attempt"] = attempt
    if event == "PUB" and value:
        e["trace_id"] = value
    elif event == "REQ":
        e["delay_ms"] = value
    elif event == "DROPPED":
        e["reason"] = DROP_REASONS[value] if value < len(DROP_REASONS) else str(value)
    address = _address_text(raw, int.from_bytes(port, "big"))
    if address:
        e["client"] = address
    elif isinstance(worker, str):  # a local consumer's own log: "shm:<pid>", as in /stats
        e["client"] = worker
    e["worker"] = worker
    return e


def _logs(nsqd, topic):
    """(bytes, stream table, worker, the topic's stream numbers) of each events
    file holding the topic, read once for a search."""
    logs = []
    for path, table, worker in log_files(_dir(nsqd)):
        refs = {ref for ref, (t, _) in table.items() if t == topic}
        if not refs:
            continue
        try:
            with open(path, "rb") as f:
                logs.append((f.read(), table, worker, refs))
        except OSError:
            continue
    return logs


def _scan(logs, ids=None, trace_id=0):
    """The events of the logs' records with an ID in ids (or PUBs with trace_id)."""
    joined = b"".join(sorted(ids)) if ids is not None else None
    for data, table, worker, refs in logs:
        for pos in tracelog.find(data, joined, trace_id):
            if RECORD.unpack_from(data, pos)[3] in refs:
                yield _decode(data, pos, table, worker)


def trace_id_of(nsqd, topic, msg_id):
    """The trace ID a message was published with (PUB_TRACE, /pubtrace, ...),
    from its PUB event in the trace logs; 0 when none was recorded.  (Youzan
    carries it in the binary message ID; nsqshm's IDs are nsqd's hex.)"""
    for e in search(nsqd, topic, msg_id=msg_id):
        if e["event"] == "PUB" and e.get("trace_id"):
            return e["trace_id"]
    return 0


def search(nsqd, topic, msg_id=None, trace_id=None):
    """A message's events (by ID), or those of every message published with
    trace_id, in time order."""
    logs = _logs(nsqd, topic)
    if trace_id is not None:
        ids = {e["id"].encode() for e in _scan(logs, trace_id=trace_id)}
        ids = set(sorted(ids)[:MAX_ANSWER])
    else:
        ids = {msg_id.encode() if isinstance(msg_id, str) else bytes(msg_id)}
    if not ids or any(len(i) != 16 for i in ids):
        return []
    found = sorted(_scan(logs, ids), key=lambda e: e["ts"])
    return found[:MAX_ANSWER]
