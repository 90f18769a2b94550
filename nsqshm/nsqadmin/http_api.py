"""nsqadmin's HTTP API (nsqadmin/http.go) on werkzeug and gevent, mounted under
--base-path:

    GET    /ping                          "OK"
    GET    / /topics /topics/:t /topics/:t/:c /nodes /nodes/:n /counter /lookup
                                          the HTML pages (nsqshm.nsqadmin.pages)
    GET    /static/:asset /fonts/:asset   the pages' CSS and JavaScript
    GET    /render                        graphite, proxied (--proxy-graphite)
    GET    /api/topics[?inactive=true]    {"topics":[...],"message":""}
    GET    /api/topics/:t                 the topic's stats across nodes
    GET    /api/topics/:t/:c              the channel's stats across nodes
    GET    /api/nodes  /api/nodes/:n      producers; one node's stats
    GET    /api/counter                   message counts per topic:channel:node
    GET    /api/graphite?metric=rate&target=...
    POST   /api/topics                    {"topic":..,"channel":..} creates
    POST   /api/topics/:t[/:c]            {"action":"pause|unpause|empty"}
    POST   /api/topics/:t/:c              {"action":"setoffset","position":"earliest|latest|
                                           timestamp:<s>"} (a log topic's channel; nsqshm's)
    DELETE /api/topics/:t[/:c]            deletes
    DELETE /api/nodes/:n                  {"topic":..} tombstones the node for the topic
    POST   /api/cluster/nodes/:id         {"action":"remove|restore"} marks a cluster node
                                          for removal or calls it off (nsqshm's; cluster mode)
    POST   /api/cluster/topics/:t/:p      {"action":"move_leader|move_replica","from":..,
                                           "to":..} moves a partition's leadership or a
                                          replica (nsqshm's; a lookupd's /topic/partition/move)
    GET|PUT /config/:opt                  options (from --allow-config-from-cidr only)
    GET    /topics/:t/:c/policy, /api/topics/:t/:c/{policy,peek,dead_letters,redrive}
                                          delivery policies (nsqshm.nsqadmin.policies)

Answers are nsqadmin's: V1 JSON with Go's field order, a "message" that
carries "WARNING: ..." when some node failed, 502 "UPSTREAM_ERROR: ..." when
all did, 403 FORBIDDEN for actions by a user not in --admin-user (read from
the --acl-http-header header), 400 with the decoder's text for a bad body.
Beyond nsqadmin, topic and channel names in paths are validated (400
INVALID_TOPIC / INVALID_CHANNEL) and a node to tombstone must be host:port
(400 INVALID_NODE), since both end up in requests to the cluster.
"""

import ipaddress
import json
import mimetypes
import os
import re

from werkzeug.wrappers import Response

from nsqshm.consistence.topology import NODE_ID
from nsqshm.flags import LOG_LEVELS, split_host_port
from nsqshm.nsqadmin import graphite
from nsqshm.nsqadmin.cluster_view import ClusterView, maybe_warn
from nsqshm.nsqadmin.options import parse_cidr
from nsqshm.nsqadmin.pages import Pages
from nsqshm.nsqadmin.policies import PolicyRoutes
from nsqshm.nsqadmin.router import PatternRoute, check_channel, check_topic, join_base
from nsqshm.nsqd.http_api import (
    HTTPAPI,
    TEXT_TYPE,
    Err,
    JSONBody,
    Router,
    _App,
    _parse_string_list,
    _Response,
    parse_query,
)
from nsqshm.nsqd.log import LEVELS
from nsqshm.nsqd.monitoring.stats import go_json
from nsqshm.youzan.offset import SPECIAL, SPECIAL_EARLIEST, SPECIAL_END, TIMESTAMP, ConsumeOffset

STATIC_DIR = os.path.join(os.path.dirname(__file__), "static")
ASSET_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*\Z")
GO_MIME = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".map": "application/json", ".svg": "image/svg+xml", ".woff": "application/font-woff",
           ".ttf": "application/font-sfnt", ".eot": "application/vnd.ms-fontobject",
           ".woff2": "application/font-woff2"}
NODE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):[0-9]{1,5}\Z")
CONFIG_READ_MAX = 1024 * 1024 + 1


def _json_kind(value):
    return {dict: "object", list: "array", str: "string", bool: "bool"}.get(
        type(value), "null" if value is None else "number")


def _is_utf8(value):
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # percent-escapes of bytes that are not UTF-8 (surrogates)
        return False
    return True


def decode_body(req, fields):
    """json.NewDecoder(req.Body).Decode(&struct{fields string}): {field: str}.
    Raises ValueError with the decoder's text ("EOF" for an empty body)."""
    try:
        raw = req.get_data(cache=True)
    except OSError as err:  # a body cut short: the decoder's read error ("unexpected EOF")
        raise ValueError(str(err)) from None
    text = raw.decode("utf-8", "replace").lstrip()
    if not text:
        raise ValueError("EOF")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text)  # the first value only, as Decode
    except ValueError:
        if text[0] in "{[\"-0123456789tfn":
            raise ValueError("unexpected EOF") from None
        raise ValueError(f"invalid character {text[0]!r} looking for beginning of value") from None
    if not isinstance(doc, dict):
        raise ValueError(f"json: cannot unmarshal {_json_kind(doc)} into Go value of type struct")
    out = {}
    for field in fields:
        key = field if field in doc else next((k for k in doc if k.lower() == field), None)
        value = doc.get(key) if key is not None else None
        if value is not None and not isinstance(value, str):
            raise ValueError(f"json: cannot unmarshal {_json_kind(value)} into Go struct field "
                             f".{field} of type string")
        out[field] = value or ""
    return out


class AdminHTTPAPI(HTTPAPI):
    def __init__(self, admin):
        self.nsqd = admin  # HTTPAPI logs through .nsqd.log
        self.admin = admin
        self.view = ClusterView(admin)
        self.pages = Pages(self)
        self.router = Router()
        base = admin.opts.base_path

        def add(method, path, handler, **kw):
            self.router.add(PatternRoute(method, join_base(base, path), handler, **kw))

        add("GET", "/", self.pages.topics, raw=True)
        add("GET", "/ping", self.ping, plain=True)
        add("GET", "/topics", self.pages.topics, raw=True)
        add("GET", "/topics/:topic", self.pages.topic, raw=True)
        add("GET", "/topics/:topic/:channel", self.pages.channel, raw=True)
        add("GET", "/nodes", self.pages.nodes, raw=True)
        add("GET", "/nodes/:node", self.pages.node, raw=True)
        add("GET", "/counter", self.pages.counter, raw=True)
        add("GET", "/lookup", self.pages.lookup, raw=True)
        add("GET", "/trace", self.pages.trace, raw=True)
        add("GET", "/static/:asset", self.static_asset, raw=True)
        add("GET", "/fonts/:asset", self.static_asset, raw=True)
        if admin.opts.proxy_graphite:
            add("GET", "/render", lambda req: graphite.proxy(admin, req), raw=True)
        add("GET", "/api/topics", self.api_topics)
        add("GET", "/api/topics/:topic", self.api_topic)
        add("GET", "/api/topics/:topic/:channel", self.api_channel)
        add("GET", "/api/nodes", self.api_nodes)
        add("GET", "/api/nodes/:node", self.api_node)
        add("POST", "/api/topics", self.create_topic_channel)
        add("POST", "/api/topics/:topic", self.topic_action)
        add("POST", "/api/topics/:topic/:channel", self.channel_action)
        add("DELETE", "/api/nodes/:node", self.tombstone_node_for_topic)
        add("POST", "/api/cluster/nodes/:node", self.cluster_node_action)
        add("POST", "/api/cluster/topics/:topic/:partition", self.cluster_partition_action)
        add("DELETE", "/api/topics/:topic", self.delete_topic)
        add("DELETE", "/api/topics/:topic/:channel", self.delete_channel)
        add("GET", "/api/counter", self.api_counter)
        add("GET", "/api/graphite", lambda req: self._json(graphite.rate(admin, req)))
        add("GET", "/config/:opt", self.config)
        add("PUT", "/config/:opt", self.config)
        for method, path, handler, raw in PolicyRoutes(self).routes():  # issue 18
            add(method, path, handler, raw=raw)

    @property
    def opts(self):
        return self.admin.opts

    # -- dispatch -------------------------------------------------------------------

    def _run(self, route, req, params, started):
        if not all(_is_utf8(v) for v in params.values()):
            # no topic, channel or node is named so (nsqd's names are ASCII): a page
            # or answer for it would have to print bytes that are not text
            resp = self._v1_error(404, "NOT_FOUND")
            self._access_log(req, 404, started)
            return resp
        if not getattr(route, "raw", False):
            return super()._run(route, req, params, started)
        try:
            resp = route.handler(req, **params)
        except Err as err:
            resp = _Response(err.text, err.code, content_type=TEXT_TYPE)
        except Exception as exc:  # the router's PanicHandler
            self._log("error", f"panic in HTTP handler - {exc}")
            resp = self._v1_error(500, "INTERNAL_ERROR")
        self._access_log(req, resp.status_code, started)
        return resp

    # -- helpers ----------------------------------------------------------------------

    def is_admin(self, req):
        """isAuthorizedAdminRequest: everyone without --admin-user, else the listed users."""
        users = self.opts.admin_user
        return not users or req.headers.get(self.opts.acl_http_header, "") in users

    def _require_admin(self, req):
        if not self.is_admin(req):
            raise Err(403, "FORBIDDEN")

    @staticmethod
    def _json(doc):
        return JSONBody(go_json(doc))

    # -- GET endpoints --------------------------------------------------------------------

    def ping(self, req):
        return "OK"

    def api_topics(self, req):
        values, err = parse_query(req.query_string)
        if err is not None:
            raise Err(400, str(err))
        messages = []
        topics = self.view.topic_names(messages)
        if values.get("inactive", [""])[0] == "true":
            return self._json({"topics": dict(sorted(self.view.inactive_topics(topics).items())),
                               "message": maybe_warn(messages)})
        return self._json({"topics": topics, "message": maybe_warn(messages)})

    def api_topic(self, req, topic):
        check_topic(topic)
        messages = []
        total = self.view.topic_stats(topic, messages)
        return self._json({**total.to_json(), "message": maybe_warn(messages)})

    def api_channel(self, req, topic, channel):
        check_topic(topic)
        check_channel(channel)
        messages = []
        stats = self.view.channel_stats(topic, channel, messages)
        doc = stats.to_json() if stats is not None else {}  # a nil embedded struct adds nothing
        return self._json({**doc, "message": maybe_warn(messages)})

    def api_nodes(self, req):
        messages = []
        producers = self.view.producers("get nodes", messages)
        return self._json({"nodes": [p.to_json() for p in producers] if producers else None,
                           "message": maybe_warn(messages)})

    def api_node(self, req, node):
        messages = []
        topics, total_messages, total_clients = self.view.node_stats(node, messages)
        return self._json({"node": node,
                           "topics": [t.to_json() for t in topics] if topics else None,
                           "total_messages": total_messages, "total_clients": total_clients,
                           "message": maybe_warn(messages)})

    def api_counter(self, req):
        messages = []
        stats = self.view.counter_stats(messages)
        return self._json({"stats": stats, "message": maybe_warn(messages)})

    # -- actions ----------------------------------------------------------------------------

    def _decode(self, req, fields, error=None):
        try:
            return decode_body(req, fields)
        except ValueError as err:
            raise Err(400, error or str(err)) from None

    def _notify(self, action, topic, channel, node, req):
        self.admin.notifier.notify(action, topic, channel, node, req)

    def tombstone_node_for_topic(self, req, node):
        self._require_admin(req)
        topic = self._decode(req, ("topic",), "INVALID_BODY")["topic"]
        check_topic(topic)
        if not NODE.match(node):
            raise Err(400, "INVALID_NODE")
        messages = []
        self.view.act("tombstone node for topic", messages, self.view.ci.tombstone_node_for_topic,
                  topic, node, self.opts.lookupd_http_address)
        self._notify("tombstone_topic_producer", topic, "", node, req)
        return self._json({"message": maybe_warn(messages)})

    def cluster_node_action(self, req, node):
        """Remove an nsqd node from the cluster (its leaderships and replicas are moved
        off it) or call the removal off: a lookupd's POST /cluster/node/remove."""
        self._require_admin(req)
        if not NODE_ID.match(node):  # (it goes into a request to the lookupd)
            raise Err(400, "INVALID_NODE_ID: a cluster node ID is <address>:<rpc port>, "
                           "up to 128 of A-Z a-z 0-9 . _ : -")
        action = self._decode(req, ("action",))["action"]
        if action not in ("remove", "restore"):
            raise Err(400, 'INVALID_ACTION: a cluster node\'s action is "remove" or "restore"')
        if not self.opts.lookupd_http_address:
            raise Err(400, "MISSING_LOOKUPD: nodes are removed from a cluster through "
                           "nsqlookupd (--lookupd-http-address)")
        messages = []
        answer = self.view.remove_node(node, action == "restore", messages)
        self._notify(f"{action}_cluster_node", "", "", node, req)
        return self._json({"node": node, "state": answer.get("state") or "",
                           "message": maybe_warn(messages)})

    def cluster_partition_action(self, req, topic, partition):
        """Move a replicated topic's partition: its leadership to another ISR
        member, or a replica from one node to another (a lookupd's POST
        /topic/partition/move, answered once the move is done)."""
        self._require_admin(req)
        check_topic(topic)
        if not (partition.isascii() and partition.isdigit()) or len(partition) > 4:
            raise Err(400, "INVALID_PARTITION")
        body = self._decode(req, ("action", "from", "to"))
        if body["action"] not in ("move_leader", "move_replica"):
            raise Err(400, 'INVALID_ACTION: a partition\'s action is "move_leader" or '
                           '"move_replica"')
        for end in (body["from"], body["to"]):
            if not NODE_ID.match(end):  # (they go into a request to the lookupd)
                raise Err(400, "INVALID_NODE_ID: a cluster node ID is <address>:<rpc port>, "
                               "up to 128 of A-Z a-z 0-9 . _ : -")
        if not self.opts.lookupd_http_address:
            raise Err(400, "MISSING_LOOKUPD: partitions are moved through nsqlookupd "
                           "(--lookupd-http-address)")
        messages = []
        self.view.move_partition(topic, int(partition), body["action"] == "move_leader",
                                 body["from"], body["to"], messages)
        self._notify(body["action"], topic, "", body["to"], req)
        return self._json({"message": maybe_warn(messages)})

    def create_topic_channel(self, req):
        self._require_admin(req)
        body = self._decode(req, ("topic", "channel"))
        topic, channel = body["topic"], body["channel"]
        check_topic(topic)
        if channel:
            check_channel(channel)
        messages = []
        self.view.act("create topic/channel", messages, self.view.ci.create_topic_channel, topic, channel,
                  self.opts.lookupd_http_address)
        self._notify("create_topic", topic, "", "", req)
        if channel:
            self._notify("create_channel", topic, channel, "", req)
        return self._json({"message": maybe_warn(messages)})

    def delete_topic(self, req, topic):
        self._require_admin(req)
        check_topic(topic)
        messages = []
        self.view.act("delete topic", messages, self.view.ci.delete_topic, topic, *self.view.lists())
        self._notify("delete_topic", topic, "", "", req)
        return self._json({"message": maybe_warn(messages)})

    def delete_channel(self, req, topic, channel):
        self._require_admin(req)
        check_topic(topic)
        check_channel(channel)
        messages = []
        self.view.act("delete channel", messages, self.view.ci.delete_channel, topic, channel,
                  *self.view.lists())
        self._notify("delete_channel", topic, channel, "", req)
        return self._json({"message": maybe_warn(messages)})

    def topic_action(self, req, topic):
        return self._topic_channel_action(req, topic, "")

    def channel_action(self, req, topic, channel):
        return self._topic_channel_action(req, topic, channel)

    def _topic_channel_action(self, req, topic, channel):
        self._require_admin(req)
        check_topic(topic)
        if channel:
            check_channel(channel)
        action = self._decode(req, ("action",))["action"]
        if action not in ("pause", "unpause", "empty") and not (action == "setoffset" and channel):
            raise Err(400, "INVALID_ACTION")
        if action == "setoffset":  # a log topic's channel (nsqshm's): its cursors move
            position = offset_position(self._decode(req, ("position",))["position"])
            fn, args, kind = (self.view.ci.channel_setoffset, (position, topic, channel),
                              "channel")
        elif channel:
            fn, args, kind = self.view.ci.channel_action, (action, topic, channel), "channel"
        else:
            fn, args, kind = self.view.ci.topic_action, (action, topic), "topic"
        messages = []
        try:
            self.view.act(f"{action} topic/channel", messages, fn, *args, *self.view.lists())
        finally:  # nsqadmin notifies before it looks at the outcome
            self._notify(f"{action}_{kind}", topic, channel, "", req)
        return self._json({"message": maybe_warn(messages)})

    # -- static assets ----------------------------------------------------------------------

    def static_asset(self, req, asset):
        directory = self.opts.dev_static_dir or STATIC_DIR
        if not ASSET_NAME.match(asset):
            raise Err(404, "NOT_FOUND")
        try:
            with open(os.path.join(directory, asset), "rb") as fh:
                body = fh.read()
        except OSError:
            raise Err(404, "NOT_FOUND") from None
        ext = os.path.splitext(asset)[1]
        ctype = GO_MIME.get(ext) or mimetypes.types_map.get(ext)
        if ctype and ctype.startswith("text/"):
            ctype += "; charset=utf-8"
        return Response(body, 200, content_type=ctype)

    # -- /config ----------------------------------------------------------------------------

    def _check_config_client(self, req):
        cidr = self.opts.allow_config_from_cidr
        if not cidr:
            return
        try:
            ip = ipaddress.ip_address(req.environ.get("REMOTE_ADDR", ""))
        except ValueError:
            self._log("error", f"failed to parse RemoteAddr {req.environ.get('REMOTE_ADDR')}")
            raise Err(400, "INVALID_REMOTE_ADDR") from None
        if getattr(ip, "ipv4_mapped", None) is not None:
            ip = ip.ipv4_mapped
        if ip not in parse_cidr(cidr):
            raise Err(403, "FORBIDDEN")

    def _set_lookupd_addresses(self, body):
        self.opts.lookupd_http_address = _parse_addresses(body)

    def _set_log_level(self, body):
        level = body.decode("utf-8", "replace").lower()
        if level not in LOG_LEVELS:
            raise Err(400, "INVALID_VALUE")
        self.opts.log_level = level
        self.admin.log.level = LEVELS[level]

    def config(self, req, opt):
        self._check_config_client(req)
        opts = self.opts
        if req.method == "PUT":  # only these two can change while nsqadmin runs
            body = self._read_body(req, CONFIG_READ_MAX)
            if len(body) == CONFIG_READ_MAX or not body:
                raise Err(413, "INVALID_VALUE")
            setter = {"nsqlookupd_http_addresses": self._set_lookupd_addresses,
                      "log_level": self._set_log_level}.get(opt)
            if setter is None:
                raise Err(400, "INVALID_OPTION")
            setter(body)
        values = opts.to_config_dict(go_types=True)
        if opt not in values:
            raise Err(400, "INVALID_OPTION")
        value = values[opt]
        if isinstance(value, str):
            return value  # RespondV1 writes a Go string as is
        return self._json(value)


def _parse_addresses(body):
    """json.Unmarshal into a []string, as nsqd's /config; each must be host:port,
    since nsqadmin will send requests there."""
    addresses = _parse_string_list(body)
    for address in addresses:
        try:
            split_host_port(address)
        except ValueError:
            raise Err(400, "INVALID_VALUE") from None
    return addresses


# the channel page's resets: where a log topic's channel goes (Youzan's setoffset body)
POSITIONS = {"earliest": str(ConsumeOffset(SPECIAL, SPECIAL_EARLIEST)),
             "latest": str(ConsumeOffset(SPECIAL, SPECIAL_END))}


def offset_position(text):
    """"earliest", "latest" or "timestamp:<seconds>": the setoffset body;
    400 INVALID_POSITION otherwise."""
    if text in POSITIONS:
        return POSITIONS[text]
    kind, _, value = text.partition(":")
    if kind == TIMESTAMP and value.isascii() and value.isdigit() and len(value) <= 12:
        return str(ConsumeOffset(TIMESTAMP, int(value)))
    raise Err(400, "INVALID_POSITION")


def create_app(admin):
    app = _App("nsqshm.nsqadmin")
    app.nsq_api = AdminHTTPAPI(admin)
    return app
