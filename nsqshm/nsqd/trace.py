"""Message tracing: what happened to one message, asked of the broker itself.

Youzan's fork traces a message published with a trace ID (PUB_TRACE,
MPUB_TRACE, /pubtrace, the "##trace_id" header) and every message of a
topic or channel whose tracing is switched on (POST /message/trace/enable,
/message/trace/disable ?topic=T[&channel=C]); its search needs an
Elasticsearch side.  Here each worker appends the events to its own log in
the data path, one JSON object a line:

    <data-path>/nsqshm.trace/w<index>.log      (the older part: w<index>.log.1)

    {"ts":<ns>,"event":"PUB","topic":"t","id":"<16 hex>","trace_id":7,"client":"h:p","worker":0}
    {"ts":..,"event":"DELIVERED","topic":"t","channel":"c","id":"..","attempt":1,"client":"h:p",..}
    {"ts":..,"event":"FIN"|"TOUCH"|"TIMEOUT","topic":"t","channel":"c","id":"..",..}
    {"ts":..,"event":"REQ","topic":"t","channel":"c","id":"..","delay_ms":0,..}

An append is one write(2) of whole lines on an O_APPEND descriptor, so a
killed worker leaves whole lines behind it (a torn last line is skipped when
read).  Retention: a log past MAX_LOG_BYTES is renamed to .1 (the older .1
goes), so a worker keeps at most twice that.
GET /message/trace?topic=T&id=<16 hex>|trace_id=<n> reads every worker's
log and answers the message's events in time order (with trace_id: every
message published with it).

Events cost Python per message, so they are recorded only while tracing is
on for the topic or channel (or for a message published with a trace ID);
the FIN batches of a traced channel then go one by one (protocol_v2).  The
switches are kept in <data-path>/nsqshm.trace/switches.json and sent to the
other workers ({"op": "trace"}) before the answer.
"""

import json
import os
import struct
import time

import gevent.local

from nsqshm._core.logcursor import log_message_id

MAX_LOG_BYTES = 64 << 20
TRACE_DIR = "nsqshm.trace"
SWITCHES = "switches.json"
MAX_ANSWER = 10_000  # events in one answer


def _dir(nsqd):
    return os.path.join(nsqd.data_path, TRACE_DIR)


class TraceLog:
    """One worker's append-only trace log."""

    def __init__(self, nsqd):
        self.nsqd = nsqd
        self.path = os.path.join(_dir(nsqd), f"w{nsqd.index}.log")
        self.fd = None
        self.size = 0

    def append(self, events):
        if not events:
            return
        data = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events).encode()
        try:
            if self.fd is None:
                os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                                  0o600)
                self.size = os.fstat(self.fd).st_size
            os.write(self.fd, data)
            self.size += len(data)
            if self.size > MAX_LOG_BYTES:
                os.replace(self.path, self.path + ".1")
                os.close(self.fd)
                self.fd = None
        except OSError as err:
            self.nsqd.logf("error", f"TRACE: failed to write {self.path} - {err}")


def _log(nsqd):
    log = getattr(nsqd, "trace_log", None)
    if log is None:
        log = nsqd.trace_log = TraceLog(nsqd)
    return log


# -- the switches ----------------------------------------------------------------------------

def switches(nsqd):
    """{(topic, channel or "")} with tracing on, loaded once from the data path."""
    on = getattr(nsqd, "trace_switches", None)
    if on is None:
        on = set()
        try:
            with open(os.path.join(_dir(nsqd), SWITCHES)) as f:
                on = {(t, c) for t, c in json.load(f)}
        except (OSError, ValueError, TypeError):
            pass
        nsqd.trace_switches = on
    return on


def traced(nsqd, topic_name, channel_name=""):
    on = switches(nsqd)
    return bool(on) and ((topic_name, "") in on or (topic_name, channel_name) in on)


def set_traced(nsqd, topic_name, channel_name, enable):
    """POST /message/trace/enable|disable: here, persisted, then every worker."""
    _apply(nsqd, topic_name, channel_name, enable)
    path = os.path.join(_dir(nsqd), SWITCHES)
    os.makedirs(_dir(nsqd), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(sorted(switches(nsqd)), f)
    os.replace(tmp, path)
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

def _event(nsqd, event, topic, channel, msg_id, **extra):
    e = {"ts": time.time_ns(), "event": event, "topic": topic}
    if channel:
        e["channel"] = channel
    e["id"] = bytes(msg_id).decode("ascii", "replace")
    e.update(extra)
    e["worker"] = nsqd.index
    return e


def _records(packed, count):
    """(ID, attempts) of packed records ([u32 native size][message])*."""
    pos = 0
    for _ in range(count):
        size = struct.unpack_from("=I", packed, pos)[0]
        yield bytes(packed[pos + 14:pos + 30]), struct.unpack_from(">H", packed, pos + 12)[0]
        pos += 4 + size


# who publishes, set around a put by the commands that know (PUB_TRACE, PUB_EXT, ...)
publisher = gevent.local.local()


def wanted(nsqd, topic):
    """A publish now is recorded: the topic is traced or the messages carry trace IDs."""
    return bool(getattr(publisher, "trace_ids", None)) or traced(nsqd, topic)


def stamp_log_ids(packed, count, partition, first):
    """Write into packed the IDs a log's append gave its records (the log keeps
    its own copy): the trace and a traced answer then name what consumers see."""
    pos = 0
    for k in range(count):
        size = struct.unpack_from("=I", packed, pos)[0]
        packed[pos + 14:pos + 30] = log_message_id(partition, first + k)
        pos += 4 + size


def published(nsqd, topic, packed, count):
    """A publish of `count` packed records (Topic.put_packed): recorded when the
    topic is traced or the messages carry trace IDs (publisher.trace_ids)."""
    trace_ids = getattr(publisher, "trace_ids", None)
    client = getattr(publisher, "client", None)
    if not trace_ids and not traced(nsqd, topic):
        return
    extra = {"client": client} if client else {}
    events = []
    pos = 0
    for k, (msg_id, _) in enumerate(_records(packed, count)):
        e = _event(nsqd, "PUB", topic, "", msg_id, **extra)
        # the message's own timestamp (taken as it was packed, before it was stored): another
        # worker may deliver it before this line runs, and a history is sorted by time
        e["ts"] = min(e["ts"], struct.unpack_from(">q", packed, pos + 4)[0])
        pos += 4 + struct.unpack_from("=I", packed, pos)[0]
        if trace_ids and trace_ids[k]:
            e["trace_id"] = trace_ids[k]
        events.append(e)
    _log(nsqd).append(events)


def delivered(channel, client, out, base):
    """The message frames a dispatcher round appended to client.out from base."""
    nsqd = channel.nsqd
    events = []
    pos = base
    while pos + 8 <= len(out):
        size, kind = struct.unpack_from(">II", out, pos)
        if kind == 2:
            attempt = struct.unpack_from(">H", out, pos + 16)[0]
            events.append(_event(nsqd, "DELIVERED", channel.topic.name, channel.name,
                                 out[pos + 18:pos + 34], attempt=attempt,
                                 client=client.remote_address))
        pos += 4 + size
    _log(nsqd).append(events)


def message_event(channel, event, msg_id, client=None, **extra):
    if client is not None:
        extra["client"] = client.remote_address
    _log(channel.nsqd).append([_event(channel.nsqd, event, channel.topic.name, channel.name,
                                      msg_id, **extra)])


def timed_out(channel, packed, count):
    _log(channel.nsqd).append([
        _event(channel.nsqd, "TIMEOUT", channel.topic.name, channel.name, msg_id,
               attempt=attempts) for msg_id, attempts in _records(packed, count)])


# -- search ----------------------------------------------------------------------------------

def _read_all(nsqd, topic):
    directory = _dir(nsqd)
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("w") and ".log" in n)
    except OSError:
        return
    for name in names:
        try:
            with open(os.path.join(directory, name), "rb") as f:
                for line in f:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue  # a torn last line of a killed worker
                    if isinstance(e, dict) and e.get("topic") == topic:
                        yield e
        except OSError:
            continue


def search(nsqd, topic, msg_id=None, trace_id=None):
    """A message's events (by ID), or those of every message published with
    trace_id, in time order."""
    events = list(_read_all(nsqd, topic))
    if trace_id is not None:
        ids = {e["id"] for e in events if e.get("trace_id") == trace_id}
    else:
        ids = {msg_id}
    found = sorted((e for e in events if e.get("id") in ids), key=lambda e: e["ts"])
    return found[:MAX_ANSWER]
