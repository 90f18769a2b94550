"""nsqadmin's view of the delivery policies of issue 18 (Go nsqadmin has
none): a channel's page of policies, dead letters and next messages, and the
JSON API behind it, each forwarded to every node that has the topic (as
nsqadmin's pause and empty are):

    GET  /policies/:t                    a topic's page (policy_topic.html): its policy,
                                         its channels', what it holds (peek)
    GET  /api/policies/:t                {"nodes": [{node, topic: {...}, channels: {c: {...}}}]}
    POST /api/policies/:t                {"ttl": "ms", "max_depth", "max_bytes", "overflow"}
                                         -> each node's /topic/policy
    GET  /topics/:t/:c/policy            a channel's page (policy.html)
    GET  /api/topics/:t/:c/policy        {"nodes": [{node, topic: {...}, channel: {...}}]}
    POST /api/topics/:t/:c/policy        {"of": "topic"|"channel", "ttl": "ms", ...}
                                         -> each node's /topic/policy or /channel/policy
    GET  /api/topics/:t/:c/peek?n=       each node's /channel/peek
    GET  /api/topics/:t/:c/dead_letters?n=   each node's /topic/peek of the
                                         channel's dead-letter topic
    POST /api/topics/:t/:c/redrive       {"n": "1"}, {"id": "<16 hex>"} or {} (all) -> each node's
                                         /channel/redrive; {"moved": total}

The values of a policy are passed through as the node's query parameters,
each checked here only for its characters (the node answers its own 400 for
a bad value, which becomes the page's error).  Message bodies are shown as
text (UTF-8, replaced where they are not), escaped by the templates.
"""

import base64
import json
import time
from urllib.parse import quote_plus

from nsqshm.nsqadmin.client import ClientError
from nsqshm.nsqadmin.cluster_view import maybe_warn
from nsqshm.nsqadmin.clusterinfo import UpstreamError
from nsqshm.nsqd.http_api import Err
from nsqshm.nsqd.names import is_valid_name
from nsqshm.nsqd.policies.policy import is_message_id

# body field -> the node's query parameter, per scope (policy_api's names)
TOPIC_FIELDS = ("ttl", "max_depth", "max_bytes", "overflow")
CHANNEL_FIELDS = ("ttl", "max_attempts", "dead_letter_topic", "dead_letter_expired",
                  "max_depth", "max_bytes", "overflow")
VALUE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._#-")
VALUE_MAX = 64
PEEK_N = 20       # messages per list on the page
PEEK_N_MAX = 1000  # nsqd's peek.PEEK_MAX
BODY_SHOWN = 200  # characters of a body on the page
# the policy keys of nsqd's /stats (policy.channel_stats / topic_stats)
STAT_KEYS = ("ttl_ms", "max_attempts", "dead_letter_topic", "dead_letter_expired",
             "max_depth", "max_bytes", "overflow", "expired_count", "dead_letter_count",
             "dead_letter_requeued_count", "dead_letter_timed_out_count",
             "dead_letter_expired_count", "rejected_count", "dropped_count")
STAT_DEFAULTS = {**dict.fromkeys(STAT_KEYS, 0), "dead_letter_topic": "",
                 "dead_letter_expired": False, "overflow": ""}


def default_dead_letter_topic(topic, channel):
    return f"{topic}.{channel}.dead"


def body_text(b64):
    """A peeked message's body (base64) as text for the page, cut short."""
    try:
        body = base64.b64decode(b64)
    except ValueError:
        return ""
    text = body.decode("utf-8", "replace")
    return text if len(text) <= BODY_SHOWN else text[:BODY_SHOWN] + "\u2026"


def ns_time(ns):
    """Nanoseconds since the epoch as UTC time of day with milliseconds."""
    if not isinstance(ns, int) or isinstance(ns, bool) or ns <= 0:
        return ""
    secs, rest = divmod(ns, 1_000_000_000)
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(secs))
    except (OverflowError, OSError, ValueError):
        return ""
    return f"{stamp}.{rest // 1_000_000:03d}"


def _policy_of(doc):
    """A node's policy keys of a topic or channel; those it leaves out (no
    policy, or a Go nsqd) as unset."""
    return {k: doc.get(k, STAT_DEFAULTS[k]) for k in STAT_KEYS}


class PolicyView:
    """The cluster queries of the page and API (through nsqadmin's ClusterInfo)."""

    def __init__(self, view):
        self.view = view

    @property
    def ci(self):
        return self.view.ci

    def _producers(self, topic, messages):
        return self.view.gather("get topic producers", messages, self.ci.get_topic_producers,
                                topic, *self.view.lists())

    def _each(self, producers, path, method, what, messages):
        """path (with its query) on every producer: [(node, JSON answer)]."""
        def query(producer):
            endpoint = f"http://{producer.http_address()}{path}"
            self.ci._logf(f"CI: querying nsqd {endpoint}")
            status, _, body = self.ci.client.request(method, endpoint)
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
            if status != 200:
                text = doc.get("message") if isinstance(doc, dict) else body[:200]
                raise ClientError(f"{method} {endpoint}: {status} {text}")
            return doc

        try:
            results, errs = self.ci._each(producers, query, "nsqd")
        except UpstreamError as err:
            self.view.admin.log.error(f"failed to {what} - {err}")
            raise Err(502, f"UPSTREAM_ERROR: {err}") from None
        if errs:
            messages.append("\n".join(errs))
        return sorted(((p.http_address(), doc) for p, doc in results), key=lambda r: r[0])

    def policies(self, topic, channel, messages):
        """Per node: {"node", "topic": {...}, "channel": {...} or None}."""
        producers = self._producers(topic, messages)
        path = (f"/stats?format=json&include_clients=false&topic={quote_plus(topic)}"
                f"&channel={quote_plus(channel)}")
        out = []
        for node, doc in self._each(producers, path, "GET", "get policies", messages):
            entry = {"node": node, "topic": _policy_of({}), "channel": None}
            for t in (doc or {}).get("topics") or ():
                if t.get("topic_name") != topic:
                    continue
                entry["topic"] = _policy_of(t)
                for c in t.get("channels") or ():
                    if c.get("channel_name") == channel:
                        entry["channel"] = _policy_of(c)
            out.append(entry)
        return out

    def topic_policies(self, topic, messages):
        """Per node: {"node", "topic": {...}, "channels": {name: {...}}}."""
        producers = self._producers(topic, messages)
        path = f"/stats?format=json&include_clients=false&topic={quote_plus(topic)}"
        out = []
        for node, doc in self._each(producers, path, "GET", "get policies", messages):
            entry = {"node": node, "topic": _policy_of({}), "channels": {}}
            for t in (doc or {}).get("topics") or ():
                if t.get("topic_name") == topic:
                    entry["topic"] = _policy_of(t)
                    entry["channels"] = {str(c.get("channel_name")): _policy_of(c)
                                         for c in t.get("channels") or ()}
            out.append(entry)
        return out

    def topic_peek(self, topic, n, messages):
        producers = self._producers(topic, messages)
        path = f"/topic/peek?topic={quote_plus(topic)}&n={n}"
        return [{"node": node, **doc}
                for node, doc in self._each(producers, path, "GET", "peek", messages)]

    def dead_letter_topic(self, topic, channel, nodes):
        for entry in nodes:
            name = (entry["channel"] or {}).get("dead_letter_topic")
            if name:
                return name
        return default_dead_letter_topic(topic, channel)

    def peek(self, topic, channel, n, messages):
        producers = self._producers(topic, messages)
        path = f"/channel/peek?topic={quote_plus(topic)}&channel={quote_plus(channel)}&n={n}"
        return [{"node": node, **doc}
                for node, doc in self._each(producers, path, "GET", "peek", messages)]

    def dead_letters(self, topic, channel, n, messages):
        """(dead-letter topic, [{"node", "depth", "messages"}]) of the nodes
        that have that topic."""
        nodes = self.policies(topic, channel, messages)
        name = self.dead_letter_topic(topic, channel, nodes)
        producers = self._producers(topic, messages)
        out = []
        for producer in producers:
            path = f"/topic/peek?topic={quote_plus(name)}&n={n}"
            endpoint = f"http://{producer.http_address()}{path}"
            try:
                status, _, body = self.ci.client.request("GET", endpoint)
            except ClientError as err:
                messages.append(str(err))
                continue
            if status == 404:  # no dead letter yet: the topic is made on the first one
                continue
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
            if status != 200 or not isinstance(doc, dict):
                messages.append(f"GET {endpoint}: {status}")
                continue
            out.append({"node": producer.http_address(), "depth": doc.get("depth", 0),
                        "messages": doc.get("messages") or []})
        return name, out

    def set_policy(self, topic, channel, of, values, messages):
        """of: "topic" or "channel" (channel "" for a topic's)."""
        producers = self._producers(topic, messages)
        qs = f"topic={quote_plus(topic)}"
        if of == "channel":
            qs += f"&channel={quote_plus(channel)}"
        qs += "".join(f"&{k}={quote_plus(v)}" for k, v in values.items())
        return self._each(producers, f"/{of}/policy?{qs}", "POST", "set policy", messages)

    def redrive(self, topic, channel, n, messages, msg_id=""):
        producers = self._producers(topic, messages)
        path = f"/channel/redrive?topic={quote_plus(topic)}&channel={quote_plus(channel)}"
        if n:
            path += f"&n={n}"
        if msg_id:  # (only the node that holds it moves it)
            path += f"&id={msg_id}"
        answers = self._each(producers, path, "POST", "redrive", messages)
        return sum(int((doc or {}).get("moved") or 0) for _, doc in answers)


def _check_names(topic, channel):
    if not is_valid_name(topic):
        raise Err(400, "INVALID_TOPIC")
    if not is_valid_name(channel):
        raise Err(400, "INVALID_CHANNEL")


def _n(req, default):
    raw = req.args.get("n", "")
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 6 or not 1 <= int(raw) <= PEEK_N_MAX:
        raise Err(400, "INVALID_N")
    return int(raw)


class PolicyRoutes:
    """The page and JSON API above, for AdminHTTPAPI (which passes itself in)."""

    def __init__(self, api):
        self.api = api
        self.pv = PolicyView(api.view)

    def routes(self):
        """(method, path, handler, raw) for AdminHTTPAPI's router."""
        return [("GET", "/policies/:topic", self.topic_page, True),
                ("GET", "/api/policies/:topic", self.api_topic_policy, False),
                ("POST", "/api/policies/:topic", self.api_set_topic_policy, False),
                ("GET", "/topics/:topic/:channel/policy", self.page, True),
                ("GET", "/api/topics/:topic/:channel/policy", self.api_policy, False),
                ("POST", "/api/topics/:topic/:channel/policy", self.api_set_policy, False),
                ("GET", "/api/topics/:topic/:channel/peek", self.api_peek, False),
                ("GET", "/api/topics/:topic/:channel/dead_letters", self.api_dead_letters,
                 False),
                ("POST", "/api/topics/:topic/:channel/redrive", self.api_redrive, False)]

    # -- the page ---------------------------------------------------------------------

    def page(self, req, topic, channel):
        pages = self.api.pages

        def build(messages):
            _check_names(topic, channel)
            nodes = self.pv.policies(topic, channel, messages)
            dead_topic, dead = self.pv.dead_letters(topic, channel, PEEK_N, messages)
            return {"nodes": nodes, "dead_topic": dead_topic, "dead": dead,
                    "peeked": self.pv.peek(topic, channel, PEEK_N, messages)}

        return pages._page(req, "policy.html", build, topic=topic, channel=channel, nodes=[],
                           dead_topic=default_dead_letter_topic(topic, channel), dead=[],
                           peeked=[], section="topics", peek_n=PEEK_N,
                           empty_policy=_policy_of({}),
                           channel_url=pages.url("topics", topic, channel))

    def topic_page(self, req, topic):
        pages = self.api.pages

        def build(messages):
            if not is_valid_name(topic):
                raise Err(400, "INVALID_TOPIC")
            return {"nodes": self.pv.topic_policies(topic, messages),
                    "peeked": self.pv.topic_peek(topic, PEEK_N, messages)}

        return pages._page(req, "policy_topic.html", build, topic=topic, nodes=[], peeked=[],
                           section="topics", peek_n=PEEK_N)

    # -- the JSON API -----------------------------------------------------------------

    def api_topic_policy(self, req, topic):
        if not is_valid_name(topic):
            raise Err(400, "INVALID_TOPIC")
        messages = []
        return self._answer({"nodes": self.pv.topic_policies(topic, messages)}, messages)

    def api_set_topic_policy(self, req, topic):
        self.api._require_admin(req)
        if not is_valid_name(topic):
            raise Err(400, "INVALID_TOPIC")
        values = self._values(self.api._decode(req, TOPIC_FIELDS), TOPIC_FIELDS)
        messages = []
        answers = self.pv.set_policy(topic, "", "topic", values, messages)
        self.api._notify("policy_topic", topic, "", "", req)
        return self._answer({"nodes": [{"node": n, "policy": d} for n, d in answers]}, messages)

    @staticmethod
    def _values(body, fields):
        """The non-empty fields of a decoded body, each checked for its characters."""
        values = {}
        for key, value in body.items():
            if not value:
                continue  # a field left empty does not change
            if key not in fields:
                raise Err(400, f"INVALID_ARG_{key.upper()}")
            if len(value) > VALUE_MAX or not set(value) <= VALUE_CHARS:
                raise Err(400, f"INVALID_{key.upper()}")
            values[key] = value
        return values

    def _answer(self, doc, messages):
        return self.api._json({**doc, "message": maybe_warn(messages)})

    def api_policy(self, req, topic, channel):
        _check_names(topic, channel)
        messages = []
        return self._answer({"nodes": self.pv.policies(topic, channel, messages)}, messages)

    def api_set_policy(self, req, topic, channel):
        self.api._require_admin(req)
        _check_names(topic, channel)
        body = self.api._decode(req, ("of", *CHANNEL_FIELDS))
        of = body.pop("of") or "channel"
        if of not in ("topic", "channel"):
            raise Err(400, "INVALID_ARG_OF")
        values = self._values(body, TOPIC_FIELDS if of == "topic" else CHANNEL_FIELDS)
        messages = []
        answers = self.pv.set_policy(topic, channel, of, values, messages)
        self.api._notify(f"policy_{of}", topic, channel if of == "channel" else "", "", req)
        return self._answer({"nodes": [{"node": n, "policy": d} for n, d in answers]}, messages)

    def api_peek(self, req, topic, channel):
        _check_names(topic, channel)
        messages = []
        return self._answer({"nodes": self.pv.peek(topic, channel, _n(req, PEEK_N), messages)},
                            messages)

    def api_dead_letters(self, req, topic, channel):
        _check_names(topic, channel)
        messages = []
        name, nodes = self.pv.dead_letters(topic, channel, _n(req, PEEK_N), messages)
        return self._answer({"dead_letter_topic": name, "nodes": nodes}, messages)

    def api_redrive(self, req, topic, channel):
        self.api._require_admin(req)
        _check_names(topic, channel)
        doc = self.api._decode(req, ("n", "id"))
        raw, msg_id = doc["n"], doc["id"]
        if raw and not (raw.isascii() and raw.isdigit() and len(raw) <= 12 and int(raw) >= 1):
            raise Err(400, "INVALID_N")
        if msg_id and not is_message_id(msg_id):
            raise Err(400, "INVALID_MESSAGE_ID")
        if raw and msg_id:
            raise Err(400, "N_AND_ID_EXCLUSIVE")
        messages = []
        moved = self.pv.redrive(topic, channel, int(raw) if raw else None, messages, msg_id)
        self.api._notify("redrive_channel", topic, channel, "", req)
        return self._answer({"moved": moved}, messages)

