"""Youzan's HTTP surface as pure functions: query/body parsing with its answers, and its
JSON responses built from plain values (youzan/nsq nsqdserver/http.go,
nsqlookupd/http.go, internal/http_api/).

A query is a mapping of name to value (a list is read as Go's url.Values.Get: its
first value, "" when absent). Errors are HTTPError(status, text); the broker answers
them as it answers nsqd's ({"message":"<text>"} with X-NSQ-Content-Type). JSON is
Go's json.Marshal: struct fields in declaration order, map keys sorted.
"""

import codecs
import json
from typing import NamedTuple

from nsqshm.nsqd.errors import E_EXT_NOT_SUPPORT, E_INVALID_JSON_HEADER, INVALID_TRACE_ID
from nsqshm.nsqd.monitoring.stats import go_json
from nsqshm.nsqd.names import is_valid_name
from nsqshm.youzan.bodies import RESERVED_PREFIX, TRACE_ID_KEY
from nsqshm.youzan.frames import PARTITION_LIMIT, partition_of
from nsqshm.youzan.go_strconv import atoi, parse_int, parse_uint
from nsqshm.youzan.offset import parse_consume_offset

NO_PARTITION = -1
MAX_PARTITION_NUM = 255     # nsqlookupd/http.go
MAX_REPLICATOR = 5
MAX_LOAD_FACTOR = 10000
HTTP_EXT_HEADER_PREFIX = "x-nsqext-"   # "X-Nsqext-" canonical; compared lower-case here


class HTTPError(Exception):
    def __init__(self, status, text):
        super().__init__(f"{status} {text}")
        self.status = status
        self.text = text


def get(query, name):
    v = query.get(name, "")
    if isinstance(v, (list, tuple)):
        v = v[0] if v else ""
    return v


def ordered_multi(query):
    """/topic/create's orderedmulti=true (an ordered topic), as doCreateTopic reads it."""
    return get(query, "orderedmulti") == "true"


# --- nsqd: topic, partition and channel arguments (http_api/topic_channel_args.go) ---

def topic_partition_args(query):
    """GetTopicPartitionArgs: (topic, partition); a bad partition answers the strconv
    error text itself."""
    topic = get(query, "topic")
    if topic == "":
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    raw = get(query, "partition")
    if raw == "":
        return topic, NO_PARTITION
    try:
        return topic, atoi(raw)
    except ValueError as e:
        raise HTTPError(400, str(e)) from None


def topic_partition_channel_args(query):
    topic, partition = topic_partition_args(query)
    channel = get(query, "channel")
    if channel == "":
        raise HTTPError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, partition, channel


# The answers once the names are parsed: an unknown topic (or partition) is
# 404 E_TOPIC_NOT_EXIST, a partition asked for but not there 404 "Topic partition not
# exist", an unknown channel 404 CHANNEL_NOT_FOUND.
# (status, text): raise HTTPError(*TOPIC_NOT_FOUND)
TOPIC_NOT_FOUND = (404, "E_TOPIC_NOT_EXIST")
PARTITION_NOT_FOUND = (404, "Topic partition not exist")
CHANNEL_NOT_FOUND = (404, "CHANNEL_NOT_FOUND")


def setoffset_body(body):
    """POST /channel/setoffset's body ("<type>:<value>", no newline). Then Youzan sets
    it (500 with the error text if it cannot, e.g. "not supported offset type")."""
    if len(body) == 0:
        raise HTTPError(406, "MSG_EMPTY")
    try:
        return parse_consume_offset(body)
    except ValueError as e:
        raise HTTPError(400, str(e)) from None


# --- POST /topic/create (nsqlookupd's; nsqshm's nsqd takes the same) ---

class TopicCreate(NamedTuple):
    topic: str
    partition_num: int
    replicator: int
    suggest_load: int
    sync_disk: int          # 0: the broker's --sync-every
    retention_days: int     # 0: the broker's default
    retention_bytes: int    # nsqshm's; 0: no size limit
    ordered_multi: bool     # orderedmulti=true: several partitions of the topic per node
    ext: bool               # extend=true (Youzan) or ext=true (nsqshm)


def _bounded(raw, lo, hi, error):
    try:
        v = atoi(raw)
    except ValueError:
        raise HTTPError(400, error) from None
    if not lo <= v <= hi:
        raise HTTPError(400, error)
    return v


def topic_create(query, require_replicator=True):
    """doCreateTopic's checks, in its order. require_replicator: nsqlookupd's (True);
    nsqshm's standalone nsqd takes no replicas (False: default 1). nsqshm also reads
    retention_days (for Youzan's retention) and ext (for extend), and retention_bytes."""
    topic = get(query, "topic")
    if topic == "":
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    raw = get(query, "partition_num")
    if raw == "":
        raise HTTPError(400, "MISSING_ARG_TOPIC_PARTITION_NUM")
    pnum = _bounded(raw, 1, MAX_PARTITION_NUM, "INVALID_ARG_TOPIC_PARTITION_NUM")
    raw = get(query, "replicator")
    if raw == "" and require_replicator:
        raise HTTPError(400, "MISSING_ARG_TOPIC_REPLICATOR")
    replicator = _bounded(raw or "1", 1, MAX_REPLICATOR, "INVALID_ARG_TOPIC_REPLICATOR")
    load = _bounded(get(query, "suggestload") or "0", 0, MAX_LOAD_FACTOR,
                    "INVALID_ARG_TOPIC_LOAD_FACTOR")
    try:
        sync_disk = atoi(get(query, "syncdisk") or "0")
    except ValueError:
        raise HTTPError(400, "INVALID_ARG_TOPIC_SYNC_DISK") from None
    try:
        retention = atoi(get(query, "retention_days") or get(query, "retention") or "0")
    except ValueError as e:
        raise HTTPError(400, str(e)) from None
    try:
        retention_bytes = parse_int(get(query, "retention_bytes") or "0")
    except ValueError as e:
        raise HTTPError(400, str(e)) from None
    if retention < 0 or retention_bytes < 0:  # nsqshm's check; Youzan stores them as given
        raise HTTPError(400, "INVALID_ARG_TOPIC_RETENTION")
    ext = get(query, "extend") == "true" or get(query, "ext") == "true"
    return TopicCreate(topic, pnum, replicator, load, sync_disk, retention, retention_bytes,
                       ordered_multi(query), ext)


# --- GET /message/get ---

SEARCH_MODES = ("count", "id", "virtual_offset", "timestamp")  # timestamp: nsqshm's
BAD_SEARCH_MODE = (400, "search mode should be one of id/count/virtual_offset")


class MessageGet(NamedTuple):
    topic: str
    partition: int
    mode: str
    pos: int
    need_ext: bool
    delayed_queue: bool     # Youzan's delayed queue: nsqshm has none (404)
    channel: str


def message_get(query):
    """doMessageGet's parsing: search_pos first (ParseInt), then the partition (from the
    ID in id mode). Youzan checks the mode only after finding the topic; nsqshm checks
    it here, so a bad mode on an unknown topic answers the mode's error."""
    try:
        pos = parse_int(get(query, "search_pos"))
    except ValueError as e:
        raise HTTPError(400, str(e)) from None
    mode = get(query, "search_mode")
    if mode == "id":
        partition = partition_of(pos & 0xFFFFFFFFFFFFFFFF)
        if partition >= PARTITION_LIMIT:   # cannot happen (masked): Youzan's check kept
            raise HTTPError(400, "invalid message id")
    else:
        try:
            partition = atoi(get(query, "partition"))
        except ValueError as e:
            raise HTTPError(400, str(e)) from None
    if mode not in SEARCH_MODES:
        raise HTTPError(*BAD_SEARCH_MODE)
    return MessageGet(get(query, "topic"), partition, mode, pos,
                      get(query, "needext") == "true", get(query, "delayed_queue") == "true",
                      get(query, "channel"))


def _go_string(raw):
    """string(b) as Go's JSON writes it: each byte of an invalid UTF-8 sequence is one
    U+FFFD (Python's "replace" would make one of a whole truncated sequence)."""
    if isinstance(raw, str):
        return raw
    return bytes(raw).decode("utf-8", "gojson_replace")


def _each_byte_replaced(err):
    return "\ufffd" * (err.end - err.start), err.end


codecs.register_error("gojson_replace", _each_byte_replaced)


def message_get_json(msg_id, trace_id, body, timestamp, attempts, offset, queue_cnt_index,
                     ext=b""):
    """doMessageGet's answer (V1: the bare object). ext is sent only with needext=true
    (else ""). Fields in Youzan's order."""
    return go_json({
        "id": msg_id, "trace_id": trace_id, "body": _go_string(body),
        "timestamp": timestamp, "attempts": attempts, "offset": offset,
        "queue_cnt_index": queue_cnt_index, "ext": _go_string(ext)})


# --- POST /pub_ext, /pubtrace ---

def _go_map(value):
    """A JSON value as Go's json.Unmarshal into interface{} then Marshal leaves it:
    map keys sorted, numbers float64."""
    if isinstance(value, dict):
        return {k: _go_map(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_go_map(v) for v in value]
    return value


def _reject_constant(name):
    raise ValueError(name)


class HTTPExt(NamedTuple):
    headers: bytes | None    # None: published without ext
    trace_id: int
    traced: bool


_HEX = frozenset(b"0123456789abcdefABCDEF")


def query_unescape(value):
    """Go's url.QueryUnescape: "+" is a space, "%XX" a byte; a bad escape is an error."""
    raw = value.encode("utf-8", "surrogateescape")
    out = bytearray()
    i = 0
    while i < len(raw):
        c = raw[i]
        if c == 0x25:  # %
            pair = raw[i + 1:i + 3]
            if len(pair) < 2 or not _HEX.issuperset(pair):
                raise ValueError("invalid URL escape")
            out.append(int(pair, 16))
            i += 3
            continue
        out.append(0x20 if c == 0x2B else c)
        i += 1
    return out.decode("utf-8", "surrogateescape")


def http_ext(ext_param, header_items, topic_ext, allow_ext_compatible=False):
    """/pub_ext's headers: the ext query value (as the query parser gave it: Youzan
    unescapes it once more) with each "X-Nsqext-<k>" HTTP header as key <k>
    lower-cased, re-marshalled by Go (keys sorted, numbers float64)."""
    try:
        ext_param = query_unescape(ext_param)
    except ValueError:
        raise HTTPError(400, E_INVALID_JSON_HEADER) from None
    if ext_param == "":
        raise HTTPError(400, E_INVALID_JSON_HEADER)
    try:
        headers = json.loads(ext_param, parse_int=float, parse_constant=_reject_constant)
    except ValueError:
        raise HTTPError(400, E_INVALID_JSON_HEADER) from None
    if not isinstance(headers, dict):
        raise HTTPError(400, E_INVALID_JSON_HEADER)
    seen = set()
    for key, value in header_items:  # Header.Get: the first value of a header
        low = key.lower()
        if low.startswith(HTTP_EXT_HEADER_PREFIX) and low not in seen:
            seen.add(low)
            headers[low[len(HTTP_EXT_HEADER_PREFIX):]] = value
    trace_id, traced = 0, False
    if TRACE_ID_KEY in headers:
        value = headers[TRACE_ID_KEY]
        if not isinstance(value, str):
            raise HTTPError(400, INVALID_TRACE_ID)
        try:
            trace_id = parse_uint(value)
        except ValueError:
            raise HTTPError(400, INVALID_TRACE_ID) from None
        traced = True
    raw = go_json(_go_map(headers))
    if not topic_ext:
        if allow_ext_compatible and all(k.startswith(RESERVED_PREFIX) for k in headers):
            return HTTPExt(None, trace_id, traced)
        raise HTTPError(400, E_EXT_NOT_SUPPORT)
    return HTTPExt(raw, trace_id, traced)


def pubtrace_trace_id(query):
    """/pubtrace's trace_id parameter (ParseUint)."""
    try:
        return parse_uint(get(query, "trace_id"))
    except ValueError:
        raise HTTPError(400, INVALID_TRACE_ID) from None


def traced_pub_json(msg_id, trace_id_text, queue_offset, raw_size):
    """The answer of a traced HTTP publish; trace_id is the text the client sent."""
    return go_json({"status": "OK", "id": msg_id, "trace_id": trace_id_text,
                    "queue_offset": queue_offset, "rawsize": raw_size})
