"""Youzan's ext topics in the broker: message headers, tag dispatch, filters.

A topic created with `POST /topic/create?topic=T&ext=true` (Youzan's
`extend=true` too), classic or log (`partition_num`), keeps every message
with Youzan's ext part after nsqd's message header (layout in
nsqshm/_core/ext.pyx); a plain PUB gets an empty one ([0]).  The flag is
kept in nsqd.dat as an extra key of the topic's object (Go ignores it),
sent to the other workers ({"op": "ext"}) before the answer, and a topic
that already exists without it is refused (its stored messages have no
ext part): 400 TOPIC_EXISTS_WITHOUT_EXT.

    PUB_EXT  <topic> [<partition>]\\n[4 BE size][2 BE n][n bytes JSON][body]
    MPUB_EXT <topic> [<partition>]\\n[4 BE size][4 BE count]([4 BE size][2 BE n][JSON][body])*
    POST /pub_ext?topic=T[&partition=P]&ext=<JSON>   (and X-NSQEXT-<key>: <value> headers)
    POST /mpub_ext?topic=T[&binary=true]&ext=<JSON>  the same headers on every message

Parsing and error texts are Youzan's (nsqshm/youzan/bodies.py, commands.py,
http.py).  The topic must exist (Youzan's E_TOPIC_NOT_EXIST).  A header
longer than MAX_HEADER_BYTES, or a message whose stored form (1 + the
PUB_EXT body) is over --max-msg-size, is refused: E_BAD_BODY / 413.

A consumer's IDENTIFY (youzan/identify.py) sets extend_support,
desired_tag and ext_filter; after SUB its ExtView (C) is what the
channel's dispatcher hands to InFlight.deliver.  The tags every worker's
consumers of a channel want are kept in the channel's TagSet (each worker
tells the others its own: {"op": "ext_tags"}).
"""

import struct
import time

from nsqshm._core.ext import (
    ExtFilter,
    ExtRecords,
    ExtView,
    FilterError,
    TagSet,
    ext_body,
    pack_pub_ext,
    plain_to_ext,
    split_ext,
)
from nsqshm._core.wire import pack_message
from nsqshm.nsqd.errors import BAD_PARTITION, ClientErr, FatalClientErr
from nsqshm.nsqd.logtopics.logtopic import PartitionError
from nsqshm.nsqd.policies import message_ttl
from nsqshm.nsqd.tcp.reader import Disconnect
from nsqshm.nsqd.topic import TopicError
from nsqshm.nsqd.tracing import trace
from nsqshm.youzan import bodies, commands, identify
from nsqshm.youzan import http as youzan_http

MAX_HEADER_BYTES = 16 * 1024  # nsqshm's limit on one message's JSON headers
EXT_PARAMS = ("ext", "extend")
TRUE = ("true", "1")


class ExtError(Exception):
    def __init__(self, status, text):
        super().__init__(text)
        self.status = status
        self.text = text


# -- the topic flag ------------------------------------------------------------------------

def wants_ext(values):
    """/topic/create's ext=true or extend=true."""
    return any(values.get(k, [""])[0].lower() in TRUE for k in EXT_PARAMS)


def meta(topic):
    """The topic's keys in nsqd.dat and the topology sent to a starting worker."""
    return {"ext": True} if getattr(topic, "ext", False) else {}


def load(topic, entry):
    if entry.get("ext") is True:
        topic.ext = True


def check_new(topic):
    """/topic/create?ext=true of a topic that exists: only if it is ext already."""
    if topic is not None and not topic.ext:
        raise ExtError(400, "TOPIC_EXISTS_WITHOUT_EXT")


def make_ext(nsqd, topic):
    """Mark a topic just created as ext, here and on every other worker, persisted."""
    if topic.ext:
        return
    topic.ext = True
    try:
        nsqd.persist_metadata()
    except OSError as err:
        nsqd.set_health(err)
    if nsqd.cluster is not None:
        nsqd.cluster.broadcast({"op": "ext", "topic": topic.name})
        nsqd.cluster.flush()


def _peer_ext(nsqd, msg):
    topic = nsqd.topics.get(msg.get("topic", ""))
    if topic is None and msg.get("topic"):
        topic = nsqd.get_existing_topic(msg["topic"])
    if topic is not None and not topic.ext:
        topic.ext = True
        try:
            nsqd.persist_metadata()  # worker 0 writes nsqd.dat, whoever took the request
        except OSError as err:
            nsqd.set_health(err)
    return None


# -- publishing ----------------------------------------------------------------------------

def _stored(topic, published):
    """The packed record of one Published (bodies.py) for this topic."""
    out = bytearray()
    if not topic.ext:
        pack_message(published.body, topic.nsqd.ids, time.time_ns(), out)
        return out
    if published.headers is not None and len(published.headers) > MAX_HEADER_BYTES:
        raise FatalClientErr("E_BAD_BODY", f"ext json header too long "
                                           f"{len(published.headers)} > {MAX_HEADER_BYTES}")
    try:
        expires_at = message_ttl.from_headers(published.headers, topic.is_log)
    except message_ttl.MessageTTLError as err:
        raise FatalClientErr("E_BAD_BODY", f"invalid {message_ttl.HEADER} header "
                                           f"({err})") from None
    body = ext_body(published.headers, published.body)
    max_body = message_ttl.max_body(topic.nsqd.opts.max_msg_size, expires_at)
    if len(body) > max_body:
        raise FatalClientErr("E_BAD_MESSAGE", f"message too big for an ext topic "
                                              f"{len(body)} > {max_body}")
    pack_message(body, topic.nsqd.ids, time.time_ns(), out)
    if expires_at:  # the deadline after the body, the ext part before it
        out = message_ttl.add(out, expires_at)
    return ExtRecords(out)


def _existing(nsqd, pub):
    topic = nsqd.get_existing_topic(pub.topic)
    commands.check_pub_topic(pub, topic is not None,
                             topic is not None and topic.is_log and topic.ordered)
    return topic


def _partition(topic, pub):
    return pub.partition if topic.is_log and pub.partition != commands.NO_PARTITION else None


def _put(topic, packed, count, nbytes, partition, code, client=None, trace_ids=None):
    """Store the records: the queue offset of the first (trace.queue_offset)."""
    trace.publisher.client = client.remote_address if client is not None else None
    trace.publisher.trace_ids = trace_ids if trace_ids and any(trace_ids) else None
    trace.publisher.queue_offset = 0
    try:
        topic.put_packed(packed, count, nbytes, partition)
        return trace.queue_offset()
    except PartitionError as err:
        raise FatalClientErr(*BAD_PARTITION(err)) from None
    except TopicError as err:  # (Youzan's E_PUB_FAILED / E_MPUB_FAILED are not fatal)
        raise ClientErr(code, str(err)) from None
    finally:
        trace.publisher.client = trace.publisher.trace_ids = None
        trace.publisher.queue_offset = 0


def _traced_reply(topic, packed, trace_id, queue_offset):
    """Youzan's 30-byte answer: the first message's 64-bit ID (its 16 hex digits),
    the trace ID, its queue offset (a log partition's virtual offset where it
    was appended, else 0), its raw size in the queue (Topic.raw_size)."""
    size = struct.unpack_from("=I", packed)[0]
    return bodies.traced_reply(int(bytes(packed[14:30]), 16), trace_id, queue_offset,
                               topic.raw_size(size))


def _fast(protocol, topic, body, mpub):
    """The C path of a valid PUB_EXT / MPUB_EXT to an ext topic (pack_pub_ext):
    (records, count, trace IDs or None, traced), or None for Youzan's parser
    (an error to answer, or a topic without ext)."""
    if not topic.ext:
        return None
    opts = protocol.opts
    out = bytearray()
    done = pack_pub_ext(body, protocol.nsqd.ids, time.time_ns(), mpub, opts.max_msg_size,
                        opts.max_body_size, MAX_HEADER_BYTES, out, not topic.is_log)
    if done is None:
        return None
    count, trace_ids, traced = done
    return ExtRecords(out), count, trace_ids, traced


def pub_ext(protocol, client, params, reader):
    """PUB_EXT: OK, or Youzan's 30-byte traced answer with a ##trace_id header
    (ID: the message's 64-bit value; queue offset: _traced_reply)."""
    return _publish_ext(protocol, client, params, reader, mpub=False)


def mpub_ext(protocol, client, params, reader):
    return _publish_ext(protocol, client, params, reader, mpub=True)


def _publish_ext(protocol, client, params, reader, mpub):
    opts = protocol.opts
    verb, failed = ("MPUB", "E_MPUB_FAILED") if mpub else ("PUB", "E_PUB_FAILED")
    pub = commands.parse_pub(params)
    size = _read_size(reader)
    commands.check_body_size(size, opts.max_body_size if mpub else opts.max_msg_size, mpub=mpub)
    body = _read(reader, size)
    topic = _existing(protocol.nsqd, pub)
    protocol.check_auth(client, verb, topic.name, "")
    fast = _fast(protocol, topic, body, mpub=mpub)  # valid bodies: checked and packed in C
    if fast is not None:
        packed, count, trace_ids, traced = fast
        at = _put(topic, packed, count, size, _partition(topic, pub), failed, client, trace_ids)
        protocol._count_pub(client, topic.name, count)
        return _traced_reply(topic, packed, trace_ids[0], at) if traced and not mpub else b"OK"
    # the rest: Youzan's parser, for its exact error texts
    if mpub:
        messages = bodies.parse_mpub(body, opts.max_msg_size, opts.max_body_size,
                                     bodies.MPUB_EXT, topic.name, topic.ext)
    else:
        messages = [bodies.parse_pub_ext(body, topic.name, topic.ext)]
    packed = ExtRecords() if topic.ext else bytearray()
    for published in messages:
        packed += _stored(topic, published)
    at = _put(topic, packed, len(messages), sum(len(m.body) for m in messages),
              _partition(topic, pub), failed, client, [m.trace_id for m in messages])
    protocol._count_pub(client, topic.name, len(messages))
    if not mpub and messages[0].traced:
        return _traced_reply(topic, packed, messages[0].trace_id, at)
    return b"OK"


def pub_trace(protocol, client, params, reader):
    """PUB_TRACE <topic> [<partition>]\\n[4 BE size][8 BE trace id][body]: the
    message (an ext topic's with an empty ext part), recorded in the trace
    log with its trace ID; Youzan's 30-byte answer."""
    opts = protocol.opts
    pub = commands.parse_pub(params)
    size = _read_size(reader)
    commands.check_body_size(size, opts.max_msg_size, mpub=False)
    body = _read(reader, size)
    topic = _existing(protocol.nsqd, pub)
    protocol.check_auth(client, "PUB", topic.name, "")
    published = bodies.parse_pub_trace(body)
    packed = _stored(topic, published)
    at = _put(topic, packed, 1, len(published.body), _partition(topic, pub), "E_PUB_FAILED",
              client, [published.trace_id])
    protocol._count_pub(client, topic.name, 1)
    return _traced_reply(topic, packed, published.trace_id, at)


def mpub_trace(protocol, client, params, reader):
    """MPUB_TRACE: each message [8 BE trace id][body]; the answer's trace ID is
    0 and its ID, offset and size the first message's."""
    opts = protocol.opts
    pub = commands.parse_pub(params)
    size = _read_size(reader)
    commands.check_body_size(size, opts.max_body_size, mpub=True)
    body = _read(reader, size)
    topic = _existing(protocol.nsqd, pub)
    protocol.check_auth(client, "MPUB", topic.name, "")
    messages = bodies.parse_mpub(body, opts.max_msg_size, opts.max_body_size, bodies.MPUB_TRACE)
    packed = ExtRecords() if topic.ext else bytearray()
    for published in messages:
        packed += _stored(topic, published)
    at = _put(topic, packed, len(messages), sum(len(m.body) for m in messages),
              _partition(topic, pub), "E_MPUB_FAILED", client, [m.trace_id for m in messages])
    protocol._count_pub(client, topic.name, len(messages))
    return _traced_reply(topic, packed, 0, at)


def _read_size(reader):
    try:
        return reader.read_len()
    except Disconnect:
        raise FatalClientErr("E_BAD_BODY", "failed to read body size") from None


def _read(reader, size):
    try:
        return reader.read(size)
    except Disconnect:
        raise FatalClientErr("E_BAD_BODY", "failed to read body") from None


def http_prefix(nsqd, topic, values, header_items):
    """/pub_ext's and /mpub_ext's ext part for every message: bytes, or
    ExtError with Youzan's 400 texts."""
    try:
        # no ext parameter: the X-NSQEXT-* headers alone (an empty ext= is Youzan's error)
        ext = youzan_http.http_ext(values.get("ext", ["{}"])[0], header_items, topic.ext)
    except youzan_http.HTTPError as err:
        raise ExtError(err.status, err.text) from None
    if ext.headers is not None and len(ext.headers) > MAX_HEADER_BYTES:
        raise ExtError(413, "HEADER_TOO_BIG")
    return ext, ext_body(ext.headers, b"")


def split_headers(stored):
    """(JSON headers or b"", body) of an ext topic's message after its header."""
    headers, body = split_ext(stored)
    return headers or b"", body


def http_records(nsqd, topic, packed, count, prefix):
    """Plain packed records of /pub_ext or /mpub_ext with the ext part."""
    if not topic.ext:
        return packed
    try:
        return plain_to_ext(packed, count, nsqd.opts.max_msg_size, prefix)
    except ValueError:
        raise ExtError(413, "MSG_TOO_BIG") from None


# -- consumers -----------------------------------------------------------------------------

def identify_client(nsqd, client, pairs):
    """IDENTIFY's Youzan fields (E_BAD_BODY on a wrong type or a long tag);
    a filter Youzan's NewExtFilter refuses is only logged, as Youzan.
    Returns the answer's extra fields."""
    data = {}
    for key, value in pairs:
        data[key.casefold()] = _plain(value)
    info = identify.parse_identify_ext(data)
    client.extend_support = info.extend_support
    client.desired_tag = info.desired_tag
    client.ext_filter = None
    if info.ext_filter:
        try:
            client.ext_filter = ExtFilter.from_identify(info.ext_filter)
        except FilterError as err:
            nsqd.logf("warn", f"PROTOCOL(V2): [{client}] invalid ext_filter {info.ext_filter!r}"
                              f" - {err}")
    return identify.identify_response_extra(info)


def _plain(value):
    """IDENTIFY's decoded JSON (objects as lists of pairs: protocol_v2's
    _Pairs) as dicts and lists."""
    if isinstance(value, list):
        if type(value) is not list:  # _Pairs
            return {k: _plain(v) for k, v in value}
        return [_plain(v) for v in value]
    return value


def check_sub(client, topic):
    """internalSUB's ext check: a client with extend_support only on an ext
    topic.  (A client without it on an ext topic gets plain bodies: Youzan's
    AllowSubExtCompatible, so nsqd's clients can consume an ext topic.)"""
    if getattr(client, "extend_support", False) and topic is not None and not topic.ext:
        commands.check_sub_topic(commands.Sub("", "", -1, False, False, None), True, False,
                                 False, True)


def tags_of(channel):
    tags = getattr(channel, "ext_tags", None)
    if tags is None:
        tags = channel.ext_tags = TagSet()
        channel.ext_peer_tags = {}
    return tags


def _refresh_tags(channel):
    local = {c.desired_tag.encode() for c in channel.clients.values()
             if getattr(c, "desired_tag", "")}
    peers = set().union(*channel.ext_peer_tags.values()) if channel.ext_peer_tags else set()
    tags_of(channel).set(local | peers)
    return local


def subscribed(nsqd, client, channel):
    """After SUB: the client's ExtView, and the channel's tags updated everywhere."""
    topic = channel.topic
    if not topic.ext:
        client.ext_view = None
        return
    tags = tags_of(channel)
    client.ext_view = ExtView(strip=not getattr(client, "extend_support", False),
                              filter=getattr(client, "ext_filter", None),
                              tag=getattr(client, "desired_tag", "") or "", tags=tags,
                              cursors=getattr(channel, "cursors", None))
    if getattr(client, "desired_tag", ""):
        _tell_tags(nsqd, channel)
    feed_wake = getattr(channel, "feed_wake", None)
    if feed_wake is not None:  # a log channel: its feeder fills the ring for this client now
        feed_wake()           # (logchannel.py: clients with an ExtView do not read the log)


def left(nsqd, client, channel):
    view = getattr(client, "ext_view", None)
    if view is not None:  # its count stays the channel's (/stats ext_filtered_count)
        channel.ext_filtered = getattr(channel, "ext_filtered", 0) + view.filtered
    if view is not None and getattr(client, "desired_tag", ""):
        _tell_tags(nsqd, channel)
        channel.wake()


def _tell_tags(nsqd, channel):
    local = _refresh_tags(channel)
    if nsqd.cluster is not None:
        nsqd.cluster.broadcast({"op": "ext_tags", "topic": channel.topic.name,
                                "channel": channel.name, "index": nsqd.index,
                                "tags": sorted(t.decode() for t in local)})
        if not nsqd.exiting:
            nsqd.cluster.flush()  # the SUB is answered once every worker knows the tag


def _peer_tags(nsqd, msg):
    topic = nsqd.topics.get(msg.get("topic", ""))
    channel = topic and topic.channels.get(msg.get("channel", ""))
    if channel is not None:
        tags_of(channel)
        channel.ext_peer_tags[msg.get("index")] = {t.encode() for t in msg.get("tags") or ()}
        _refresh_tags(channel)
        channel.wake()
    return None


PEER_OPS = {"ext": _peer_ext, "ext_tags": _peer_tags}
