"""The HTML pages at nsqadmin's URLs (/, /topics, /topics/:t, /topics/:t/:c,
/nodes, /nodes/:n, /counter, /lookup), rendered on the server from the same
numbers the JSON API gives (nsqadmin ships a JavaScript app instead; the URLs
and what they show are the same).

Every page works without JavaScript.  With it (static/nsqadmin.js) a page
refreshes its numbers in place: it fetches itself with ``?partial=1``, which
renders only the ``live`` block, and feeds its rate chart from the JSON API
(``chart_api``).  ``?refresh=N`` sets the interval in seconds (default 2).

Templates are Jinja with autoescaping on: names and addresses from the
cluster are never written unescaped.  URLs are built with ``url(...)``,
which quotes each segment and prefixes --base-path.
"""

import os
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from werkzeug.wrappers import Response

from nsqshm.flags import format_duration
from nsqshm.nsqadmin.cluster_view import maybe_warn
from nsqshm.nsqadmin.options import VERSION_STRING
from nsqshm.nsqadmin.policies import body_text, ns_time
from nsqshm.nsqadmin.router import check_channel, check_topic
from nsqshm.nsqadmin.stats import TopicStats
from nsqshm.nsqd.http_api import Err
from nsqshm.nsqd.monitoring.stats import nanoseconds_to_human

TEMPLATES = os.path.join(os.path.dirname(__file__), "templates")
DEFAULT_REFRESH_S = 2
HTML_TYPE = "text/html; charset=utf-8"


def commafy(n):
    return f"{n:,}" if isinstance(n, int) else n


def percent(quantile):
    """0.99 -> "99", 0.999 -> "99.9"."""
    return f"{quantile * 100:g}"


def connected(ns):
    return format_duration(max(0, ns // 1_000_000_000))


def percentiles(e2e):
    return list(e2e.percentiles or ()) if e2e is not None else []


class Pages:
    def __init__(self, api):
        self.api = api
        self.view = api.view
        env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True,
                          undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        env.filters.update(body_text=body_text, nstime=ns_time, commafy=commafy, nanotohuman=nanoseconds_to_human,
                           percent=percent, connected=connected)
        env.globals.update(percentiles=percentiles)
        self.env = env

    # -- rendering --------------------------------------------------------------------

    def url(self, *segments):
        base = self.api.opts.base_path.rstrip("/")
        return base + "/" + "/".join(quote(str(s), safe=":") for s in segments)

    def _refresh_ms(self, req):
        raw = req.args.get("refresh", "")
        if raw.isdigit() and 1 <= int(raw) <= 3600:
            return int(raw) * 1000
        return DEFAULT_REFRESH_S * 1000

    def _render(self, req, template, status=200, **ctx):
        opts = self.api.opts
        ctx.setdefault("chart_api", "")
        ctx.setdefault("chart_kind", "")
        ctx.setdefault("warning", "")
        ctx.setdefault("error", "")
        ctx.update(url=self.url, base=opts.base_path, version=VERSION_STRING,
                   is_admin=self.api.is_admin(req), lookupd=opts.lookupd_http_address or [],
                   nsqd=opts.nsqd_http_address or [], refresh_ms=self._refresh_ms(req))
        ctx["partial"] = req.args.get("partial") == "1"
        html = self.env.get_template(template).render(ctx)
        return Response(html, status, content_type=HTML_TYPE)

    def _page(self, req, template, build, **ctx):
        """Render template with what build(messages) returns; an error becomes
        the page's alert, with its status."""
        messages = []
        try:
            ctx.update(build(messages))
        except Err as err:
            return self._render(req, template, status=err.code, error=err.text,
                                failed=True, **ctx)
        return self._render(req, template, warning=maybe_warn(messages), failed=False, **ctx)

    # -- pages --------------------------------------------------------------------------

    def topics(self, req):
        def build(messages):
            names = self.view.topic_names(messages) or []
            totals = {}
            for t in self.view.all_topic_stats(messages) if names else ():
                totals.setdefault(t.topic_name, TopicStats(topic_name=t.topic_name)).add(t)
            rows = [(name, totals.get(name)) for name in sorted(set(names) | set(totals))]
            return {"rows": rows}

        return self._page(req, "topics.html", build, rows=[], section="topics",
                          chart_api="/api/counter", chart_kind="counter")

    def topic(self, req, topic):
        def build(messages):
            check_topic(topic)
            total = self.view.topic_stats(topic, messages)
            replication = self.view.replication(topic, total, messages)
            # (the nodes a replica can move to: for an admin, on a replicated topic)
            movable = replication and self.api.is_admin(req)
            return {"total": total, "replication": replication,
                    "cluster_nodes": self.view.cluster_nodes() if movable else None}

        return self._page(req, "topic.html", build, topic=topic, total=None, replication=None,
                          cluster_nodes=None,
                          section="topics",
                          chart_api=f"/api/topics/{quote(topic, safe='')}",
                          chart_kind="message_count")

    def channel(self, req, topic, channel):
        def build(messages):
            check_topic(topic)
            check_channel(channel)
            return {"stats": self.view.channel_stats(topic, channel, messages)}

        api = f"/api/topics/{quote(topic, safe='')}/{quote(channel, safe='')}"
        return self._page(req, "channel.html", build, topic=topic, channel=channel, stats=None,
                          section="topics", chart_api=api, chart_kind="message_count")

    def nodes(self, req):
        def build(messages):
            producers = self.view.producers("get nodes", messages) or []
            # a cluster node links to its page only if the lookupd lists it as a
            # producer: a node with no topic yet has none
            return {"producers": producers, "cluster_nodes": self.view.cluster_nodes(),
                    "listed": {p.http_address() for p in producers}}

        return self._page(req, "nodes.html", build, producers=[], cluster_nodes=None,
                          listed=set(), section="nodes",
                          chart_api="/api/counter", chart_kind="counter")

    def node(self, req, node):
        def build(messages):
            topics, total_messages, total_clients = self.view.node_stats(node, messages)
            return {"topics": topics or [], "total_messages": total_messages,
                    "total_clients": total_clients}

        return self._page(req, "node.html", build, node=node, topics=[], total_messages=0,
                          total_clients=0, section="nodes",
                          chart_api=f"/api/nodes/{quote(node, safe=':')}",
                          chart_kind="total_messages")

    def counter(self, req):
        def build(messages):
            stats = self.view.counter_stats(messages)
            per_channel = {}
            for entry in stats.values():
                key = (entry["topic_name"], entry["channel_name"])
                per_channel[key] = per_channel.get(key, 0) + entry["message_count"]
            return {"total": sum(per_channel.values()), "per_channel": sorted(per_channel.items())}

        return self._page(req, "counter.html", build, total=0, per_channel=[], section="counter",
                          chart_api="/api/counter", chart_kind="counter")

    def trace(self, req):
        """A message's history (nsqd's /message/trace): search by topic and
        message ID or trace ID; the timeline from every node of the topic."""
        args = {k: req.args.get(k, "").strip() for k in ("topic", "id", "trace_id")}

        def build(messages):
            if not args["topic"]:
                return {"events": None}
            check_topic(args["topic"])
            if not (args["id"] or args["trace_id"]):
                raise Err(400, "a message ID or a trace ID is needed")
            producers = self.view.gather("get topic producers", messages,
                                         self.view.ci.get_topic_producers, args["topic"],
                                         *self.view.lists())
            events = self.view.gather("get the message trace", messages,
                                      self.view.ci.get_message_trace, producers,
                                      args["topic"], args["id"], args["trace_id"])
            start = events[0]["ts"] if events else 0
            for e in events:
                e["after_ms"] = (e["ts"] - start) / 1e6
            return {"events": events}

        return self._page(req, "trace.html", build, events=None, section="trace", **args)

    def lookup(self, req):
        def build(messages):
            if not self.api.opts.lookupd_http_address:
                return {}
            topics = self.view.topic_names(messages) or []
            return {"topics": topics, "inactive": self.view.inactive_topics(topics)}

        return self._page(req, "lookup.html", build, topics=[], inactive={}, section="lookup")
