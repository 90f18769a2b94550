"""nsqd's HTTP API (nsqd/http.go, internal/http_api) on werkzeug and gevent.

werkzeug supplies the request and response objects (_App is the WSGI shell); routing is done here the
way nsqd's router (julienschmidt/httprouter) does it, since its behaviour is
part of the API:

- an exact (method, path) match runs the handler;
- otherwise, for a method that has routes, a path that matches with a
  trailing slash added or removed, or after cleaning (`//`, `.`, `..`) and
  case-folding, is redirected there: 301 for GET, 307 for other methods;
- OPTIONS on a known path answers 200 with `Allow`;
- a known path with another method is 405 {"message":"METHOD_NOT_ALLOWED"}
  with `Allow` (sorted, OPTIONS included); anything else is 404
  {"message":"NOT_FOUND"}; an exception is 500 {"message":"INTERNAL_ERROR"}.

Responses follow internal/http_api/api_response.go: V1 handlers answer 200
with a raw string body, an empty body, or JSON; errors are
{"message":"TEXT"} as JSON; every V1 response carries
`X-NSQ-Content-Type: nsq; version=1.0`.  /ping and /debug/* are plain text.

Parameters come from the query string only, parsed as Go's url.ParseQuery
(`;` separators and bad %-escapes are errors, answered 400 INVALID_REQUEST).
"""

import gc
import json
import os
import re
import socket
import time
import traceback
from urllib.parse import quote

from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Request, Response

from nsqshm._core import wire
from nsqshm._core.commitlog import LogError
from nsqshm._core.logcursor import ID_OFFSET_BITS
from nsqshm.httpserver import RAW_HEADERS, HTTPServer
from nsqshm.nsqd import ext
from nsqshm.nsqd.errors import E_SUB_ORDER_IS_MUST
from nsqshm.nsqd.logtopics.logtopic import (
    LogTopicError,
    NoSuchPartition,
    PartitionError,
    PartitionNeeded,
    partition_word,
)
from nsqshm.nsqd.logtopics.partition import MAX_SECONDS
from nsqshm.nsqd.logtopics.replica import NotLeader
from nsqshm.nsqd.monitoring import metrics
from nsqshm.nsqd.monitoring.stats import go_json, install_gc_hook, stats_json, stats_text
from nsqshm.nsqd.names import go_quote, is_valid_name
from nsqshm.nsqd.options import FLAGS, LOG_LEVELS, format_duration, listen_address_kind
from nsqshm.nsqd.policies import message_ttl
from nsqshm.nsqd.policies.policy_api import PolicyRoutes
from nsqshm.nsqd.tcp import fairshare
from nsqshm.nsqd.topic import TopicError, TopicFull
from nsqshm.nsqd.tracing import trace
from nsqshm.nsqd.workers.listeners import listen
from nsqshm.youzan import http as youzan_http
from nsqshm.youzan.commands import NO_PARTITION
from nsqshm.youzan.go_strconv import atoi
from nsqshm.youzan.offset import check_supported, count_of, offset_of_count


def put_error(err):
    """A failed publish: 503 EXITING while the broker stops, as nsqd; 500
    when the message could not be stored (a full or unwritable disk); 503
    QUEUE_FULL when a bounded queue refused it (bounds.py)."""
    if isinstance(err, TopicFull):
        return Err(503, "QUEUE_FULL")
    if isinstance(err, NotLeader):  # cluster mode (nsqd/logtopics/replica.py)
        return Err(400, "E_FAILED_ON_NOT_LEADER")
    return Err(503, "EXITING") if str(err) == "exiting" else Err(500, "INTERNAL_ERROR")

RECORD_OVERHEAD = 4 + 26  # packed record: native size + message header
EXT_PREFIX = "nsqshm.ext_prefix"  # a /pub_ext's ext part, for /pub's code (request environ)
EXT_DEADLINE = "nsqshm.ext_deadline"  # its ##ttl_ms header's deadline (message_ttl.py)
BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}
X_NSQ = ("X-Nsq-Content-Type", "nsq; version=1.0")
JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
STATUS_TEXT = {301: "Moved Permanently", 307: "Temporary Redirect"}
_INT = re.compile(r"[+-]?[0-9]+\Z")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
# /config/<opt> names: nsqd's cfg names; nsqshm's own flags are not exposed
CONFIG_NAMES = frozenset(f.cfg_name for f in FLAGS if f.cfg_name and not f.extension)
MPUB_BAD_BODY = (wire.MPUB_COUNT_UNREADABLE, wire.MPUB_BAD_COUNT)
MPUB_NEEDS_MORE = (wire.MPUB_SIZE_UNREADABLE, wire.MPUB_BODY_UNREADABLE)
# A chunked binary /mpub is read as nsqd's readMPUB reads the stream: as far
# as its messages go, past --max-body-size (nsqd has no bound there); nsqshm
# stops at this many times --max-body-size with 413 BODY_TOO_BIG
MPUB_CHUNKED_BOUND = 4
MPUB_FIRST_READ = 1 << 16
SETOFFSET_BODY_LIMIT = 256  # "<type>:<value>": a type name and an int64
MESSAGE_GET_SLACK = 64      # a record's size word and message header past --max-msg-size
ID_MASK = (1 << 64) - 1     # search_pos is an int64: a log ID is read as its 64 bits
PPROF_INDEX = ("/debug/pprof/: nsqshm is a Python process; Go runtime profiles "
               "(heap, goroutine, block, threadcreate, profile) are not available\n")


def _raw_headers(req):
    """The request's headers as sent: WSGI's environ drops names with "_",
    which Youzan's X-NSQEXT-<key> headers have (##client_dispatch_tag,
    ##ttl_ms); Go's net/http keeps them."""
    raw = req.environ.get(RAW_HEADERS)
    if raw is None:  # (another WSGI server)
        return list(req.headers.items())
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw]


class Err(Exception):
    """http_api.Err: a status code and the text of the response."""

    def __init__(self, code, text):
        super().__init__(text)
        self.code = code
        self.text = text


class Panic(Exception):
    """What nsqd answers through its router's panic handler (500 INTERNAL_ERROR)."""


class JSONBody(bytes):
    """An already encoded JSON 200 body."""


class _Response(Response):
    default_mimetype = None  # no Content-Type unless one is set


# ---------------------------------------------------------------------------
# Go helpers


class QueryError(ValueError):
    pass


def _query_unescape(raw):
    """url.QueryUnescape of bytes: '+' is a space, '%' needs two hex digits."""
    if b"%" not in raw:
        return raw.replace(b"+", b" ")
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == 0x25:  # %
            h = raw[i + 1:i + 3]
            if len(h) < 2 or not all(x in b"0123456789abcdefABCDEF" for x in h):
                raise QueryError(f"invalid URL escape {go_quote(raw[i:i + 3])}")
            out.append(int(h, 16))
            i += 3
            continue
        out.append(0x20 if c == 0x2B else c)
        i += 1
    return bytes(out)


def parse_query(raw):
    """Go's url.ParseQuery: ({key: [values]}, first error or None)."""
    values = {}
    err = None
    for part in raw.split(b"&"):
        if b";" in part:
            err = err or QueryError("invalid semicolon separator in query")
            continue
        if not part:
            continue
        key, _, value = part.partition(b"=")
        try:
            key = _query_unescape(key)
            value = _query_unescape(value)
        except QueryError as e:
            err = err or e
            continue
        values.setdefault(key.decode("utf-8", "surrogateescape"), []).append(
            value.decode("utf-8", "surrogateescape"))
    return values, err


def parse_int64(text):
    """strconv.ParseInt(s, 10, 64); None on error."""
    if not _INT.match(text):
        return None
    v = int(text)
    return v if _INT64_MIN <= v <= _INT64_MAX else None


def wrap_int64(v):
    v &= (1 << 64) - 1
    return v - (1 << 64) if v > _INT64_MAX else v


def clean_path(p):
    """httprouter's CleanPath (path.Clean keeping a trailing slash)."""
    if not p:
        return "/"
    if p[0] != "/":
        p = "/" + p
    trailing = len(p) > 1 and p.endswith("/")
    parts = []
    for seg in p.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts:
                parts.pop()
            continue
        parts.append(seg)
    out = "/" + "/".join(parts)
    if trailing and out != "/":
        out += "/"
    return out


def _escaped_path(path):
    """url.URL.EscapedPath for a path Go would re-encode."""
    return quote(path.encode("utf-8", "surrogateescape"), safe="/$&+,:;=@")


def request_path(req):
    """The decoded path as sent (Go's URL.Path); werkzeug's req.path folds leading slashes."""
    raw = req.environ.get("PATH_INFO", "")
    return raw.encode("latin-1", "replace").decode("utf-8", "surrogateescape") or "/"


def _html_escape(s):
    return (s.replace("&", "&amp;").replace("'", "&#39;").replace("<", "&lt;")
            .replace(">", "&gt;").replace('"', "&#34;"))


# ---------------------------------------------------------------------------
# routing


class Route:
    __slots__ = ("method", "path", "prefix", "param", "handler", "plain", "log")

    def __init__(self, method, path, handler, plain=False, log=True):
        self.method = method
        self.path = path
        self.prefix, sep, param = path.partition(":")
        self.param = param if sep else None
        self.handler = handler
        self.plain = plain
        self.log = log

    def match(self, path):
        """Path parameters on a match, else None."""
        if self.param is None:
            return {} if path == self.path else None
        if not path.startswith(self.prefix):
            return None
        value = path[len(self.prefix):]
        if not value or "/" in value:
            return None
        return {self.param: value}

    def match_fold(self, path):
        """The route's spelling of path when they match ignoring case, else None."""
        if self.param is None:
            return self.path if path.lower() == self.path.lower() else None
        head = path[:len(self.prefix)]
        value = path[len(self.prefix):]
        if head.lower() != self.prefix.lower() or not value or "/" in value:
            return None
        return self.prefix + value


class Router:
    def __init__(self):
        self.routes = {}  # method -> [Route]

    def add(self, route):
        self.routes.setdefault(route.method, []).append(route)

    def add_route(self, method, path, handler, **options):
        """add(Route(...)): for a module that adds a route and is imported here."""
        self.add(Route(method, path, handler, **options))

    def find(self, method, path):
        for route in self.routes.get(method, ()):
            params = route.match(path)
            if params is not None:
                return route, params
        return None, None

    def redirect_target(self, method, path):
        """Where httprouter redirects a path that missed in method's tree, or None."""
        if method not in self.routes or method == "CONNECT" or path == "/":
            return None
        alt = path[:-1] if len(path) > 1 and path.endswith("/") else path + "/"
        if self.find(method, alt)[0] is not None:
            return alt
        cleaned = clean_path(path)
        candidates = [cleaned]
        if len(cleaned) > 1 and cleaned.endswith("/"):
            candidates.append(cleaned[:-1])
        else:
            candidates.append(cleaned + "/")
        for candidate in candidates:
            for route in self.routes[method]:
                fixed = route.match_fold(candidate)
                if fixed is not None:
                    return fixed
        return None

    def allowed(self, path, method):
        allow = [m for m, routes in self.routes.items()
                 if m not in (method, "OPTIONS") and any(r.match(path) is not None for r in routes)]
        if not allow:
            return ""
        return ", ".join(sorted(allow + ["OPTIONS"]))


# ---------------------------------------------------------------------------
# the API


def partition_error(err):
    """A log topic's `partition` refused, as Youzan's nsqd: one the topic has not is
    404 E_TOPIC_NOT_EXIST, one strconv.Atoi does not take 400 with Atoi's error; a
    publish without one to an ordered topic 400 INVALID_PARTITION (nsqshm's)."""
    if isinstance(err, NoSuchPartition):
        return Err(404, "E_TOPIC_NOT_EXIST")
    if isinstance(err, PartitionNeeded):
        return Err(400, "INVALID_PARTITION")
    return Err(400, str(err))


class HTTPAPI:
    def __init__(self, nsqd):
        self.nsqd = nsqd
        self.router = Router()
        add = self.router.add
        add(Route("GET", "/ping", self.ping, plain=True))
        add(Route("GET", "/info", self.info))
        add(Route("POST", "/pub", self.pub, log=False))
        add(Route("POST", "/mpub", self.mpub, log=False))
        add(Route("POST", "/pub_ext", self.pub_ext, log=False))
        add(Route("POST", "/mpub_ext", self.mpub_ext, log=False))
        add(Route("POST", "/pubtrace", self.pubtrace, log=False))
        add(Route("POST", "/message/trace/enable", self.trace_enable))
        add(Route("POST", "/message/trace/disable", self.trace_disable))
        add(Route("GET", "/message/trace", self.message_trace))
        add(Route("GET", "/stats", self.stats))
        for action in ("create", "delete", "empty", "pause", "unpause"):
            add(Route("POST", f"/topic/{action}", getattr(self, f"topic_{action}")))
            add(Route("POST", f"/channel/{action}", getattr(self, f"channel_{action}")))
        add(Route("POST", "/channel/setoffset", self.channel_setoffset))
        add(Route("POST", "/channel/lane", self.channel_lane))
        add(Route("GET", "/message/get", self.message_get))
        for method, path, handler in PolicyRoutes(self, Err).routes():  # peek, policies
            add(Route(method, path, handler))
        add(Route("GET", "/config/:opt", self.config))
        add(Route("PUT", "/config/:opt", self.config))
        add(Route("PUT", "/debug/setblockrate", self.set_block_rate, plain=True))
        add(Route("POST", "/debug/freememory", self.free_memory, plain=True))
        add(Route("GET", "/debug/nsqshm/worker", self.worker))
        # nsqd serves net/http/pprof here; the route also makes GET /debug/pprof
        # redirect to it (301) as httprouter does
        add(Route("GET", "/debug/pprof/", self.pprof_index, plain=True))

    # -- logging ------------------------------------------------------------------------

    def _log(self, level, msg):
        log = getattr(self.nsqd, "log", None)
        if log is not None:
            getattr(log, level)(msg)

    def _access_log(self, req, status, started):
        elapsed = format_duration(time.perf_counter() - started)
        uri = _escaped_path(request_path(req))
        if req.query_string:
            uri += "?" + req.query_string.decode("latin-1")
        remote = f"{req.remote_addr}:{req.environ.get('REMOTE_PORT', '')}"
        self._log("info", f"{status} {req.method} {uri} ({remote}) {elapsed}")

    # -- dispatch -----------------------------------------------------------------------

    def __call__(self, req):
        method, path = req.method, request_path(req)
        started = time.perf_counter()
        route, params = self.router.find(method, path)
        if route is not None:
            return self._run(route, req, params, started)
        target = self.router.redirect_target(method, path)
        if target is not None:
            return self._redirect(req, target)
        if method == "OPTIONS":
            allow = self.router.allowed(path, "OPTIONS")
            if allow:
                return _Response(b"", 200, headers=[("Allow", allow)])
        else:
            allow = self.router.allowed(path, method)
            if allow:
                resp = self._v1_error(405, "METHOD_NOT_ALLOWED")
                resp.headers["Allow"] = allow
                self._access_log(req, 405, started)
                return resp
        self._access_log(req, 404, started)
        return self._v1_error(404, "NOT_FOUND")

    def _run(self, route, req, params, started):
        try:
            try:
                data = route.handler(req, **params)
                status = 200
            except Err as err:
                data, status = err, err.code
            if route.log:
                self._access_log(req, status, started)
            if route.plain:
                if isinstance(data, Err):
                    data = data.text
                if data is None:
                    raise Panic("unknown response type <nil>")
                return _Response(data, status, content_type=TEXT_TYPE if data else None)
            if isinstance(data, Err):
                return self._v1_error(data.code, data.text)
            return self._v1(data)
        except Exception as exc:  # nsqd's router PanicHandler
            self._log("error", f"panic in HTTP handler - {exc}")
            # and where it came from (nsqd logs the panic only: a Go panic is rare)
            self._log("error", traceback.format_exc().rstrip())
            self._access_log(req, 500, started)
            return self._v1_error(500, "INTERNAL_ERROR")

    @staticmethod
    def _v1(data):
        if data is None:
            return _Response(b"", 200, headers=[X_NSQ])
        if isinstance(data, JSONBody):
            return _Response(bytes(data), 200, headers=[X_NSQ], content_type=JSON_TYPE)
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        if isinstance(data, (bytes, bytearray)):
            return _Response(bytes(data), 200, headers=[X_NSQ],
                             content_type=TEXT_TYPE if data else None)
        return _Response(go_json(data), 200, headers=[X_NSQ], content_type=JSON_TYPE)

    @staticmethod
    def _v1_error(code, text):
        body = go_json({"message": text})
        return _Response(body, code, headers=[X_NSQ], content_type=JSON_TYPE)

    @staticmethod
    def _redirect(req, target):
        code = 301 if req.method == "GET" else 307
        url = _escaped_path(target)
        if req.query_string:
            url += "?" + req.query_string.decode("latin-1")
        headers = [("Location", url)]
        body = b""
        content_type = None
        if req.method in ("GET", "HEAD"):
            content_type = "text/html; charset=utf-8"
        if req.method == "GET":
            body = f'<a href="{_html_escape(url)}">{STATUS_TEXT[code]}</a>.\n\n'.encode()
        return _Response(body, code, headers=headers, content_type=content_type)

    # -- request helpers ----------------------------------------------------------------

    @staticmethod
    def _read_body(req, limit, chunks=None):
        """Up to limit bytes of the body (Go's io.ReadAll(io.LimitReader(...)));
        a body that cannot be read is 500 INTERNAL_ERROR, or with chunks (a
        list) what was read before the error, the rest being left in chunks."""
        stream = req.stream
        keep = chunks
        chunks = [] if keep is None else keep
        got = 0
        try:
            while got < limit:
                data = stream.read(min(limit - got, 1 << 20))
                if not data:
                    break
                chunks.append(data)
                got += len(data)
        except Exception:
            if keep is None:
                raise Err(500, "INTERNAL_ERROR") from None
        return b"".join(chunks)

    @staticmethod
    def _params(req):
        """http_api.NewReqParams: the query, then the whole body read (and
        dropped: no handler uses it); either failing is 400 INVALID_REQUEST."""
        values, err = parse_query(req.query_string)
        if err is not None:
            raise Err(400, "INVALID_REQUEST")
        stream = req.stream
        try:
            while stream.read(1 << 20):
                pass
        except Exception:
            raise Err(400, "INVALID_REQUEST") from None
        return values

    def _topic_from_query(self, req):
        """getTopicFromQuery: validates the name and creates the topic."""
        values, err = parse_query(req.query_string)
        if err is not None:
            self._log("error", f"failed to parse request params - {err}")
            raise Err(400, "INVALID_REQUEST")
        names = values.get("topic")
        if names is None:
            raise Err(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(names[0]):
            raise Err(400, "INVALID_TOPIC")
        return values, self.nsqd.get_topic(names[0])

    def _existing_topic_from_query(self, req):
        """getExistingTopicFromQuery with GetTopicChannelArgs."""
        values = self._params(req)
        topic_name = values.get("topic", [None])[0]
        if topic_name is None:
            raise Err(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(topic_name):
            raise Err(400, "INVALID_ARG_TOPIC")
        channel_name = values.get("channel", [None])[0]
        if channel_name is None:
            raise Err(400, "MISSING_ARG_CHANNEL")
        if not is_valid_name(channel_name):
            raise Err(400, "INVALID_ARG_CHANNEL")
        topic = self.nsqd.get_existing_topic(topic_name)
        if topic is None:
            raise Err(404, "TOPIC_NOT_FOUND")
        return topic, channel_name

    def _existing_channel(self, req):
        topic, channel_name = self._existing_topic_from_query(req)
        channel = topic.get_existing_channel(channel_name)
        if channel is None:
            raise Err(404, "CHANNEL_NOT_FOUND")
        return channel

    def _persist_metadata(self):
        persist = getattr(self.nsqd, "persist_metadata", None)
        (persist if callable(persist) else self.nsqd.notify_change)()

    # -- endpoints ----------------------------------------------------------------------

    def ping(self, req):
        health = self.nsqd.health
        if health != "OK":
            raise Err(500, health)
        return health

    def worker(self, req):
        """nsqshm: which worker answered, and the topics it owns (tests, operators)."""
        nsqd = self.nsqd
        return {"index": nsqd.index, "workers": nsqd.nworkers, "pid": os.getpid(),
                "owned_topics": sorted(t.name for t in nsqd.topics.values() if t.owned),
                "arena": nsqd.arena.name if nsqd.arena is not None else None}

    def info(self, req):
        nsqd = self.nsqd
        opts = nsqd.opts

        def port(server):
            address = getattr(server, "address", None)
            return address[1] if isinstance(address, tuple) else -1

        return {
            "version": nsqd.version,
            "broadcast_address": opts.broadcast_address,
            "hostname": nsqd.hostname,
            "http_port": port(nsqd.http_server),
            "tcp_port": port(nsqd.tcp_server),
            "start_time": int(nsqd.start_time),
            "max_heartbeat_interval": round(opts.max_heartbeat_interval * 1e9),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": round(opts.max_output_buffer_timeout * 1e9),
            "max_deflate_level": opts.max_deflate_level,
        }

    def pub(self, req):
        # the fair share (fairshare.py) before the topic is looked up: a yield between
        # the two could find it deleted meanwhile
        fairshare.pace(self.nsqd)
        opts = self.nsqd.opts
        if (req.content_length or 0) > opts.max_msg_size:
            raise Err(413, "MSG_TOO_BIG")
        read_max = opts.max_msg_size + 1
        body = self._read_body(req, read_max)
        if len(body) == read_max:
            raise Err(413, "MSG_TOO_BIG")
        if not body:
            raise Err(400, "MSG_EMPTY")
        values, topic = self._topic_from_query(req)
        expires_at = self._message_ttl(req, values, topic)  # issue 18
        if len(body) > message_ttl.max_body(opts.max_msg_size, expires_at):
            raise Err(413, "MSG_TOO_BIG")
        deferred_ns = 0
        if "defer" in values:
            ms = parse_int64(values["defer"][0])
            if ms is None:
                raise Err(400, "INVALID_DEFER")
            deferred_ns = wrap_int64(ms * 1_000_000)  # time.Duration(ms) * time.Millisecond
            if deferred_ns < 0 or deferred_ns > round(opts.max_req_timeout * 1e9):
                raise Err(400, "INVALID_DEFER")
        try:
            if deferred_ns:  # (an ext topic's deferred message: an empty ext part)
                topic.put_deferred(body, deferred_ns / 1e9, expires_at)
            elif req.environ.get(EXT_PREFIX) is not None:  # /pub_ext
                out = bytearray()
                wire.pack_message(body, self.nsqd.ids, time.time_ns(), out)
                if expires_at:  # the deadline after the body, the ext part before it
                    out = message_ttl.add(out, expires_at)
                out = self._ext(req, topic, out, 1)
                topic.put_packed(out, 1, len(body), self._partition(values, topic))
                # for a traced answer: the ID as stored (a log partition's owner stamps
                # the log's) and the raw size in the queue
                req.environ[EXT_PREFIX] = (bytes(memoryview(out)[14:30]),
                                           topic.raw_size(len(out) - 4))
            else:
                topic.put_message(body, self._partition(values, topic), expires_at)
        except PartitionError as err:
            raise partition_error(err) from None
        except TopicError as err:
            raise put_error(err) from None
        return "OK"

    @staticmethod
    def _message_ttl(req, values, topic):
        """The deadline of a ttl= (message_ttl.py), else of /pub_ext's
        ##ttl_ms header, 0 without either."""
        if message_ttl.PARAM not in values:
            return req.environ.get(EXT_DEADLINE, 0)
        try:
            return message_ttl.from_query(values, topic.is_log)
        except message_ttl.MessageTTLError as err:
            raise Err(400, str(err)) from None

    @staticmethod
    def _partition(values, topic):
        """Youzan's `partition` query parameter of /pub and /mpub: a log
        topic's partition (a classic topic ignores it, as nsqd ignores any
        parameter it does not know)."""
        value = values.get("partition", [None])[0]
        if value is None or value == "" or not topic.is_log:
            return None
        return partition_word(value)  # (Youzan's GetTopicPartitionArgs: strconv.Atoi)

    def mpub(self, req):
        fairshare.pace(self.nsqd)  # (before the topic is looked up, as pub)
        nsqd = self.nsqd
        opts = nsqd.opts
        if (req.content_length or 0) > opts.max_body_size:
            raise Err(413, "BODY_TOO_BIG")
        values, topic = self._topic_from_query(req)
        expires_at = self._message_ttl(req, values, topic)  # issue 18
        max_msg_size = message_ttl.max_body(opts.max_msg_size, expires_at)
        binary = False
        if "binary" in values:
            value = values["binary"][0]
            binary = BOOL_PARAMS.get(value)
            if binary is None:
                binary = True
                self._log("warn", f"deprecated value '{value}' used for /mpub binary param")
        read_max = opts.max_body_size + 1
        out = bytearray()
        if binary:
            count = self._binary_mpub(req, out, max_msg_size)
        else:
            body = self._read_body(req, read_max)
            if len(body) == read_max:
                # nsqd reads line by line: a too long line before the line that
                # reaches the limit is reported first
                cut = body.rfind(b"\n", 0, read_max - 1)
                if cut >= 0 and max(map(len, body[:cut].split(b"\n"))) > max_msg_size:
                    raise Err(413, "MSG_TOO_BIG")
                raise Err(413, "BODY_TOO_BIG")
            count, too_big = wire.pack_lines(body, nsqd.ids, time.time_ns(),
                                             max_msg_size, out)
            if too_big >= 0:
                raise Err(413, "MSG_TOO_BIG")
        try:
            if count:
                body_bytes = len(out) - count * RECORD_OVERHEAD
                if expires_at:
                    out = message_ttl.add(out, expires_at)
                topic.put_packed(self._ext(req, topic, out, count), count, body_bytes,
                                 self._partition(values, topic))
            elif topic.exiting:
                raise TopicError("exiting")
        except PartitionError as err:
            raise partition_error(err) from None
        except TopicError as err:
            raise put_error(err) from None
        return "OK"

    def pub_ext(self, req):
        """Youzan's /pub_ext (nsqd/ext.py): /pub with the `ext` JSON and
        X-NSQEXT-* headers; the topic must exist."""
        return self._ext_publish(req, self.pub)

    def mpub_ext(self, req):
        """/mpub with the same headers on every message (nsqshm's)."""
        return self._ext_publish(req, self.mpub)

    def _ext_publish(self, req, publish):
        values, err = parse_query(req.query_string)
        if err is not None:
            raise Err(400, "INVALID_REQUEST")
        name = values.get("topic", [""])[0]
        if not name:
            raise Err(400, "MISSING_ARG_TOPIC")
        topic = self.nsqd.get_existing_topic(name) if is_valid_name(name) else None
        if topic is None:
            raise Err(*youzan_http.TOPIC_NOT_FOUND)
        try:
            info, prefix = ext.http_prefix(self.nsqd, topic, values, _raw_headers(req))
        except ext.ExtError as e:
            raise Err(e.status, e.text) from None
        try:
            req.environ[EXT_DEADLINE] = message_ttl.from_headers(info.headers, topic.is_log)
        except message_ttl.MessageTTLError as err:
            raise Err(400, str(err)) from None
        req.environ[EXT_PREFIX] = prefix
        trace.publisher.client = req.remote_addr
        trace.publisher.trace_ids = [info.trace_id] if info.traced else None
        trace.publisher.queue_offset = 0
        try:
            answer = publish(req)
            queue_offset = trace.queue_offset()
        finally:
            trace.publisher.client = trace.publisher.trace_ids = None
            trace.publisher.queue_offset = 0
        stored = req.environ[EXT_PREFIX]
        if info.traced and isinstance(stored, tuple):  # /pub_ext's ID and stored size
            msg_id, size = stored
            return JSONBody(youzan_http.traced_pub_json(int(msg_id, 16), str(info.trace_id),
                                                        queue_offset, size))
        return answer

    def pubtrace(self, req):
        """Youzan's /pubtrace?topic=&trace_id=: the message recorded in the trace
        log with its trace ID; the traced JSON answer (its queue offset: a log
        partition's virtual offset where this worker appended it, else 0)."""
        values, err = parse_query(req.query_string)
        if err is not None:
            raise Err(400, "INVALID_REQUEST")
        try:
            trace_id = youzan_http.pubtrace_trace_id(values)
        except youzan_http.HTTPError as e:
            raise Err(e.status, e.text) from None
        name = values.get("topic", [""])[0]
        topic = self.nsqd.get_existing_topic(name) if is_valid_name(name) else None
        if topic is None:
            raise Err(*youzan_http.TOPIC_NOT_FOUND)
        body = self._read_body(req, self.nsqd.opts.max_msg_size + 1)
        if len(body) > self.nsqd.opts.max_msg_size:
            raise Err(413, "MSG_TOO_BIG")
        if not body:
            raise Err(400, "MSG_EMPTY")
        out = bytearray()
        msg_id = wire.pack_message(body, self.nsqd.ids, time.time_ns(), out)
        trace.publisher.client = req.remote_addr
        trace.publisher.trace_ids = [trace_id]
        trace.publisher.queue_offset = 0
        try:
            out = topic.ext_records(out, 1)  # (an ext topic's: the object put_packed stores)
            topic.put_packed(out, 1, len(body), self._partition(values, topic))
            queue_offset = trace.queue_offset()
            msg_id = bytes(out[14:30])  # a log partition's owner stamped the log's ID
        except PartitionError as err:
            raise partition_error(err) from None
        except TopicError as err:
            raise put_error(err) from None
        finally:
            trace.publisher.client = trace.publisher.trace_ids = None
            trace.publisher.queue_offset = 0
        return JSONBody(youzan_http.traced_pub_json(int(msg_id, 16), values["trace_id"][0],
                                                    queue_offset, topic.raw_size(len(out) - 4)))

    def _trace_switch(self, req, enable):
        values = self._params(req)
        name = values.get("topic", [""])[0]
        if not name:
            raise Err(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(name) or self.nsqd.get_existing_topic(name) is None:
            raise Err(404, "TOPIC_NOT_FOUND")
        channel = values.get("channel", [""])[0]
        if channel and not is_valid_name(channel):
            raise Err(400, "INVALID_ARG_CHANNEL")
        try:
            trace.set_traced(self.nsqd, name, channel, enable)
        except OSError as err:
            raise Err(500, f"INTERNAL_ERROR {err}") from None

    def trace_enable(self, req):
        """Youzan's POST /message/trace/enable?topic=T[&channel=C]."""
        self._trace_switch(req, True)

    def trace_disable(self, req):
        self._trace_switch(req, False)

    def message_trace(self, req):
        """GET /message/trace?topic=T&id=<16 hex>|trace_id=<n>: the events."""
        values = self._params(req)
        name = values.get("topic", [""])[0]
        if not name:
            raise Err(400, "MISSING_ARG_TOPIC")
        msg_id, trace_id = values.get("id", [None])[0], values.get("trace_id", [None])[0]
        if trace_id is not None:
            try:
                trace_id = youzan_http.pubtrace_trace_id(values)
            except youzan_http.HTTPError as e:
                raise Err(e.status, e.text) from None
        elif msg_id is None or len(msg_id) != 16:
            raise Err(400, "INVALID_MESSAGE_ID")
        events = trace.search(self.nsqd, name, msg_id, trace_id)
        return {"topic": name, "id": msg_id, "trace_id": trace_id, "events": events}

    def _ext(self, req, topic, packed, count):
        """/pub and /mpub records, with the ext part /pub_ext or /mpub_ext gave."""
        prefix = req.environ.get(EXT_PREFIX)
        if prefix is None or not topic.ext:
            return packed
        try:
            return ext.http_records(self.nsqd, topic, packed, count, prefix)
        except ext.ExtError as e:
            raise Err(e.status, e.text) from None

    def _binary_mpub(self, req, out, max_msg_size):
        """nsqd's readMPUB on the body stream: the count, then each size and
        message, and no further.  A body cut short (or chunked wrongly) ends
        the stream where it breaks: BAD_BODY if the count was not there,
        BAD_MESSAGE after it, OK if every message arrived.  The body is read
        in growing steps, so that a bad count or size stops the reading early
        as it stops nsqd's (the server then closes rather than read the rest).
        Returns the number of messages packed into out."""
        opts = self.nsqd.opts
        stream = req.stream
        bound = MPUB_CHUNKED_BOUND * opts.max_body_size
        limit = min(MPUB_FIRST_READ, bound)
        chunks, got, ended = [], 0, False
        while True:
            try:
                while got < limit:
                    data = stream.read(min(limit - got, 1 << 20))
                    if not data:
                        ended = True
                        break
                    chunks.append(data)
                    got += len(data)
            except Exception:  # the stream ends here for readMPUB
                ended = True
            body = b"".join(chunks)
            status, _index, count = wire.pack_mpub(body, self.nsqd.ids, time.time_ns(),
                                                   max_msg_size, opts.max_body_size, out)
            if status == wire.MPUB_OK:
                return count
            if status not in MPUB_NEEDS_MORE or ended:
                raise Err(413, "BAD_BODY" if status in MPUB_BAD_BODY else "BAD_MESSAGE")
            if limit >= bound:  # only a chunked body gets here
                raise Err(413, "BODY_TOO_BIG")
            limit = min(limit * 2, bound)
            chunks = [body]

    def stats(self, req):
        values = self._params(req)

        def get(key):
            return values.get(key, [""])[0]

        include_clients = BOOL_PARAMS.get(get("include_clients"), True)
        include_mem = BOOL_PARAMS.get(get("include_mem"), True)
        args = (self.nsqd, get("topic"), get("channel"), include_clients, include_mem)
        if get("format") == "json":
            return JSONBody(stats_json(*args))
        return stats_text(*args)

    # topics

    def _topic_name(self, req):
        values = self._params(req)
        names = values.get("topic")
        if names is None:
            raise Err(400, "MISSING_ARG_TOPIC")
        return names[0]

    def topic_create(self, req):
        """nsqd's, and with `partition_num` (Youzan's) a log topic
        (logtopic.py): `retention_days` (or Youzan's `retention`, 0 there: none),
        `retention_bytes` (-1: none), `syncdisk` (an fsync every that many
        messages; 0: --sync-every), `orderedmulti=true` (an ordered topic:
        SUB_ORDERED only, PUB by partition), `replicator` 1 if given (one copy:
        replicated topics are made through nsqlookupd).  Numbers are read as Go's
        strconv.Atoi reads them."""
        values, err = parse_query(req.query_string)
        want_ext = err is None and ext.wants_ext(values)
        if want_ext:  # Youzan's ext=true / extend=true: a new topic, or one already ext
            name = values.get("topic", [""])[0]
            try:
                ext.check_new(self.nsqd.get_existing_topic(name) if is_valid_name(name) else None)
            except ext.ExtError as e:
                raise Err(e.status, e.text) from None
        if err is None and "partition_num" in values:
            self._log_topic_create(values)
        else:
            self._topic_from_query(req)
        if want_ext:
            ext.make_ext(self.nsqd, self.nsqd.get_existing_topic(values["topic"][0]))
        return None

    def _log_topic_create(self, values):
        names = values.get("topic")
        if names is None:
            raise Err(400, "MISSING_ARG_TOPIC")

        def get(key):
            return values.get(key, ["-1"])[0] or "-1"

        replicator = values.get("replicator", [""])[0]
        if replicator:  # one copy here: replicated topics are made through nsqlookupd
            try:
                if atoi(replicator) != 1:
                    raise ValueError(replicator)
            except ValueError:
                raise Err(400, "INVALID_ARG_TOPIC_REPLICATOR") from None
        days = get("retention_days")
        if days == "-1" and values.get("retention", [""])[0]:  # Youzan's name (0: none)
            days = values["retention"][0] if values["retention"][0] != "0" else "-1"
        try:
            self.nsqd.create_log_topic(names[0], values["partition_num"][0],
                                       days, get("retention_bytes"),
                                       values.get("syncdisk", ["0"])[0] or "0",
                                       youzan_http.ordered_multi(values))
        except LogTopicError as err:
            raise Err(err.status, err.code) from None
        return None

    def topic_delete(self, req):
        name = self._topic_name(req)
        if name in self.nsqd.replicated_topics:
            # deleted here alone, it would come back from the other replicas' logs
            raise Err(400, "TOPIC_IS_REPLICATED: delete it through nsqlookupd, "
                           "with partition=**")
        try:
            self.nsqd.delete_topic(name)
        except KeyError:
            raise Err(404, "TOPIC_NOT_FOUND") from None

    def topic_empty(self, req):
        name = self._topic_name(req)
        if not is_valid_name(name):
            raise Err(400, "INVALID_TOPIC")
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise Err(404, "TOPIC_NOT_FOUND")
        try:
            topic.empty()
        except Exception as err:
            if topic.exiting:  # deleted meanwhile (by another request or worker)
                raise Err(404, "TOPIC_NOT_FOUND") from None
            self._log("error", f"failure in {request_path(req)} - {err}")
            raise Err(500, "INTERNAL_ERROR") from None

    def _topic_pause(self, req, pause):
        topic = self.nsqd.get_existing_topic(self._topic_name(req))
        if topic is None:
            raise Err(404, "TOPIC_NOT_FOUND")
        try:
            topic.pause() if pause else topic.unpause()
        except Exception as err:
            if topic.exiting:  # deleted meanwhile (by another request or worker)
                raise Err(404, "TOPIC_NOT_FOUND") from None
            self._log("error", f"failure in {request_path(req)} - {err}")
            raise Err(500, "INTERNAL_ERROR") from None
        self._persist_metadata()

    def topic_pause(self, req):
        self._topic_pause(req, True)

    def topic_unpause(self, req):
        self._topic_pause(req, False)

    # channels

    def channel_create(self, req):
        topic, channel_name = self._existing_topic_from_query(req)
        topic.get_channel(channel_name)

    def channel_delete(self, req):
        topic, channel_name = self._existing_topic_from_query(req)
        if topic.get_existing_channel(channel_name) is None:
            raise Err(404, "CHANNEL_NOT_FOUND")
        try:
            topic.delete_channel(channel_name)
        except TopicError:
            raise Err(404, "CHANNEL_NOT_FOUND") from None

    def channel_empty(self, req):
        channel = self._existing_channel(req)
        try:
            channel.empty()
        except Exception as err:
            if channel.exiting:  # deleted meanwhile (by another request or worker)
                raise Err(404, "CHANNEL_NOT_FOUND") from None
            self._log("error", f"failure in {request_path(req)} - {err}")
            raise Err(500, "INTERNAL_ERROR") from None

    def channel_setoffset(self, req):
        """Youzan's POST /channel/setoffset?topic=&partition=&channel= with a
        body "<type>:<value>" (youzan.http.setoffset_body): the channel's
        cursor in that partition (every partition when none is named) moves
        there (LogChannel.seek), whichever worker answers."""
        values, err = parse_query(req.query_string)
        if err is not None:
            raise Err(400, "INVALID_REQUEST")
        try:
            topic_name, partition, channel_name = youzan_http.topic_partition_channel_args(values)
            where = youzan_http.setoffset_body(self._read_body(req, SETOFFSET_BODY_LIMIT))
        except youzan_http.HTTPError as e:
            raise Err(e.status, e.text) from None
        topic = self.nsqd.get_existing_topic(topic_name)
        if topic is None or not topic.is_log:
            raise Err(*youzan_http.TOPIC_NOT_FOUND)
        if partition == NO_PARTITION:
            parts = topic.partitions
        elif 0 <= partition < len(topic.partitions):
            parts = [topic.partitions[partition]]
        else:
            raise Err(*youzan_http.PARTITION_NOT_FOUND)
        channel = topic.get_existing_channel(channel_name)
        if channel is None:
            raise Err(*youzan_http.CHANNEL_NOT_FOUND)
        try:
            check_supported(where)
            offsets = [(p, p.position(where)) for p in parts]
        except ValueError as e:
            raise Err(500, str(e)) from None
        channel.seek(offsets)
        return None

    def channel_lane(self, req):
        """nsqshm's POST /channel/lane?topic=&channel=[&partition=][&ordered=true]:
        what a `SUB T C p` (ordered=true: `SUB_ORDERED T C [p]`) does to a
        log topic's channel, for a consumer that does not come by TCP
        (nsqshm.local's Consumer(partition=, ordered=)): the partition, or
        with ordered=true and none named every partition, is delivered
        through its own lane (LogChannel.use_lanes), whichever worker
        answers.  A plain lane on an ordered-only topic is refused as nsqd
        refuses its plain SUB."""
        values, err = parse_query(req.query_string)
        if err is not None:
            raise Err(400, "INVALID_REQUEST")
        try:
            topic_name, partition, channel_name = youzan_http.topic_partition_channel_args(values)
        except youzan_http.HTTPError as e:
            raise Err(e.status, e.text) from None
        ordered = youzan_http.get(values, "ordered")
        if ordered not in ("", "true", "false"):
            raise Err(400, "INVALID_ARG_ORDERED")
        ordered = ordered == "true"
        if partition == NO_PARTITION and not ordered:
            raise Err(400, "MISSING_ARG_PARTITION")
        topic = self.nsqd.get_existing_topic(topic_name)
        if topic is None or not topic.is_log:
            raise Err(*youzan_http.TOPIC_NOT_FOUND)
        if partition != NO_PARTITION and not 0 <= partition < len(topic.partitions):
            raise Err(*youzan_http.PARTITION_NOT_FOUND)
        if topic.ordered and not ordered:
            raise Err(400, E_SUB_ORDER_IS_MUST)
        channel = topic.get_existing_channel(channel_name)
        if channel is None:
            raise Err(*youzan_http.CHANNEL_NOT_FOUND)
        indices = range(len(topic.partitions)) if partition == NO_PARTITION else [partition]
        channel.use_lanes(list(indices), ordered)
        return None

    def message_get(self, req):
        """Youzan's GET /message/get?topic=&partition=&search_mode=&search_pos=:
        one message read from the log (LogReader, any worker), no channel
        touched.  search_pos: count = the n-th message since the
        partition's first, counted from 1 as Youzan's queue_cnt_index (msg
        offset n - 1), virtual_offset = the first message at or after that
        byte (both the log start below it, as Youzan's searches),
        timestamp = seconds (nsqshm's mode: the first message at or after),
        id = nsqshm's ID as a number ((partition << 48) | offset: the
        partition comes from the ID, not from Youzan's bits 50..59)."""
        values, err = parse_query(req.query_string)
        if err is not None:
            raise Err(400, "INVALID_REQUEST")
        try:
            q = youzan_http.message_get(values)
        except youzan_http.HTTPError as e:
            raise Err(e.status, e.text) from None
        partition = q.partition
        if q.mode == "id":
            partition = (q.pos & ID_MASK) >> ID_OFFSET_BITS
        if q.delayed_queue:
            raise Err(404, "no delayed queue on the topic")
        topic = self.nsqd.get_existing_topic(q.topic) if is_valid_name(q.topic) else None
        if topic is None or not topic.is_log:
            raise Err(*youzan_http.TOPIC_NOT_FOUND)
        if not 0 <= partition < len(topic.partitions):
            raise Err(*youzan_http.PARTITION_NOT_FOUND)
        try:
            reader = topic.partitions[partition].reader
            offset = self._search(reader, q.mode, q.pos)
            buf = bytearray(self.nsqd.opts.max_msg_size + MESSAGE_GET_SLACK)
            n, nbytes, _ = reader.read_into(offset, buf, max_records=1)
            if not n:
                raise LogError(f"no message at offset {offset}")
            virtual = reader.virtual_offset_of(offset)
        except (LogError, OverflowError) as e:
            raise Err(404, str(e)) from None
        except OSError as e:  # the partition's owner has not made the log yet
            raise Err(404, str(e.strerror or e)) from None
        msg = memoryview(buf)[4:nbytes]
        msg_id = bytes(msg[10:26])
        if q.mode == "id" and int(msg_id, 16) != q.pos:
            raise Err(404, f"message {q.pos} not found")
        body, headers = bytes(msg[26:]), b""
        if topic.ext:  # the ext part apart; its JSON in "ext" when asked (needext=true)
            headers, body = ext.split_headers(body)
        trace_id = trace.trace_id_of(self.nsqd, topic.name, msg_id)
        return JSONBody(youzan_http.message_get_json(
            int(msg_id, 16), trace_id, body, int.from_bytes(msg[0:8], "big"),
            int.from_bytes(msg[8:10], "big"), virtual, count_of(offset),
            ext=headers if q.need_ext else b""))

    @staticmethod
    def _search(reader, mode, pos):
        """The msg offset /message/get's search names (LogError if none):
        count and virtual_offset as Youzan's SearchLogByMsgCnt and
        SearchLogByMsgOffset, from the log start for a position before it
        (past the end there is no message: 404)."""
        if mode == "count":
            return max(offset_of_count(pos), reader.start_offset)
        if mode == "virtual_offset":
            return reader.find_by_virtual_offset(max(pos, 0), next_record=True)
        if pos < 0:
            raise LogError(f"search position {pos} out of range")
        if mode == "timestamp":
            offset = reader.find_offset_by_time(min(pos, MAX_SECONDS) * 1_000_000_000)
            return max(offset, reader.start_offset)
        return pos & ((1 << ID_OFFSET_BITS) - 1)  # id

    def _channel_pause(self, req, pause):
        channel = self._existing_channel(req)
        try:
            channel.pause() if pause else channel.unpause()
        except Exception as err:
            if channel.exiting:  # deleted meanwhile (by another request or worker)
                raise Err(404, "CHANNEL_NOT_FOUND") from None
            self._log("error", f"failure in {request_path(req)} - {err}")
            raise Err(500, "INTERNAL_ERROR") from None
        self._persist_metadata()

    def channel_pause(self, req):
        self._channel_pause(req, True)

    def channel_unpause(self, req):
        self._channel_pause(req, False)

    # config

    def config(self, req, opt):
        opts = self.nsqd.opts
        if req.method == "PUT":
            read_max = opts.max_msg_size + 1
            body = self._read_body(req, read_max)
            if len(body) == read_max or not body:
                raise Err(413, "INVALID_VALUE")
            if opt == "nsqlookupd_tcp_addresses":
                values = {"lookupd_tcp_address": _parse_string_list(body)}
            elif opt == "log_level":
                level = body.decode("utf-8", "surrogateescape").lower()
                if level not in LOG_LEVELS:
                    raise Err(400, "INVALID_VALUE")
                values = {"log_level": level}
            else:
                raise Err(400, "INVALID_OPTION")
            # every worker applies it before the answer: one broker
            self.nsqd.set_options(values)
        if opt not in CONFIG_NAMES:
            raise Err(400, "INVALID_OPTION")
        value = opts.to_config_dict(go_types=True)[opt]
        if isinstance(value, str):
            return value  # RespondV1 writes a Go string as is, not as JSON
        return JSONBody(go_json(value))

    # debug

    def set_block_rate(self, req):
        rate = req.form.get("rate") if req.form else None
        if rate is None:
            values, _ = parse_query(req.query_string)
            rate = values.get("rate", [""])[0]
        if not _INT.match(rate):
            raise Err(400, f"invalid block rate : strconv.Atoi: parsing {go_quote(rate)}: "
                           "invalid syntax")
        if not _INT64_MIN <= int(rate) <= _INT64_MAX:
            raise Err(400, f"invalid block rate : strconv.Atoi: parsing {go_quote(rate)}: "
                           "value out of range")
        return None  # nsqd's PlainText panics on a nil body: 500 INTERNAL_ERROR

    def pprof_index(self, req):
        return PPROF_INDEX

    def free_memory(self, req):
        gc.collect()
        try:
            import ctypes

            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):
            pass
        return None  # as set_block_rate: nsqd answers 500 INTERNAL_ERROR


def _parse_string_list(body):
    """json.Unmarshal into a []string: null clears it, a null element is ""."""
    try:
        value = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        raise Err(400, "INVALID_VALUE") from None
    if value is None:
        return []
    if not isinstance(value, list) or not all(v is None or isinstance(v, str) for v in value):
        raise Err(400, "INVALID_VALUE")
    return ["" if v is None else v for v in value]


class _App:
    """The WSGI application of an HTTP API: werkzeug's Request in, the API's
    Response out (nsq_api routes: nsqd's router rules), then the after-request
    hooks.  (It was Flask, of which nothing but this was used: without it a
    worker starts ~0.1 s sooner, a respawned one too.)  An exception past the
    API's own handlers reaches the server: Go's handler panic (httpserver.py)."""

    nsq_api = None

    def __init__(self, name):
        self.name = name
        self._after = []

    def after_request(self, hook):
        """hook(req, response) -> response, for every answer."""
        self._after.append(hook)
        return hook

    def __call__(self, environ, start_response):
        req = Request(environ)
        try:
            response = self.nsq_api(req)
        except HTTPException as exc:  # werkzeug's, reading a form past its limits
            response = exc.get_response(environ)
        for hook in self._after:
            response = hook(req, response)
        return response(environ, start_response)


def create_app(nsqd):
    app = _App("nsqshm.nsqd")
    app.nsq_api = HTTPAPI(nsqd)
    install_gc_hook()
    metrics.register(app)  # GET /metrics (Prometheus)
    return app


def make_http_server(nsqd):
    """The HTTP listener, bound but not started: --http-address is host:port,
    or a unix socket path as in nsqd 1.3 (then /info reports http_port -1)."""
    address = nsqd.opts.http_address
    if listen_address_kind(address) == "unix":
        if getattr(nsqd, "index", 0) != 0:  # a path has one listener: worker 0's
            return None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(address)
            listener.listen(1024)
        except OSError:
            listener.close()
            raise
    else:
        listener = listen(nsqd.listen_address("http_address"))
    server = HTTPServer(listener, create_app(nsqd), log_error=server_log(nsqd))
    server.init_socket()
    return server


def server_log(nsqd):
    """Where nsqd's http.Server writes its ErrorLog: warnings of the nsqd log."""
    log = getattr(nsqd, "log", None)
    return log.warn if log is not None else None
