"""Notifications of admin actions (nsqadmin/notify.go, handleAdminActions):
with --notification-http-endpoint, every action taken through the API is
POSTed there as JSON, one request at a time, from a greenlet fed by a queue
so that the API never waits for the endpoint.

The payload is nsqadmin's AdminAction:

    {"action":"pause_channel","topic":"t","channel":"c","timestamp":1700000000,
     "user":"alice","remote_ip":"127.0.0.1:51234","user_agent":"curl/8",
     "url":"http://127.0.0.1:4171/api/topics/t/c","via":"host"}

``channel``, ``node`` and ``user`` are left out when empty (omitempty);
``user`` is the HTTP basic-auth user of the request.
"""

import base64
import binascii
import time

import gevent
import gevent.queue

from nsqshm.nsqadmin.client import ClientError
from nsqshm.nsqadmin.stats import local_hostname
from nsqshm.nsqd.http_api import _escaped_path, request_path
from nsqshm.nsqd.monitoring.stats import go_json


def basic_auth_user(req):
    """The user of an `Authorization: Basic ...` header, or ""."""
    scheme, _, encoded = req.headers.get("Authorization", "").partition(" ")
    if scheme != "Basic" or not encoded:
        return ""
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return ""
    user, colon, _ = decoded.partition(":")
    return user if colon else ""


def remote_addr(req):
    """Go's Request.RemoteAddr: host:port, IPv6 in brackets."""
    host = req.environ.get("REMOTE_ADDR", "")
    port = req.environ.get("REMOTE_PORT", "")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def admin_action(action, topic, channel, node, req):
    """The AdminAction document of an action taken by req."""
    scheme = "https" if req.headers.get("X-Scheme") == "https" else req.scheme
    url = f"{scheme}://{req.host}{_escaped_path(request_path(req))}"
    if req.query_string:
        url += "?" + req.query_string.decode("latin-1")
    doc = {"action": action, "topic": topic}
    if channel:
        doc["channel"] = channel
    if node:
        doc["node"] = node
    doc["timestamp"] = int(time.time())
    user = basic_auth_user(req)
    if user:
        doc["user"] = user
    doc.update({"remote_ip": remote_addr(req), "user_agent": req.headers.get("User-Agent", ""),
                "url": url, "via": local_hostname()})
    return doc


class Notifier:
    def __init__(self, admin):
        self.admin = admin
        self.queue = gevent.queue.Queue()
        self.sender = None

    def start(self):
        self.sender = gevent.spawn(self._send_loop)

    def stop(self, timeout=2.0):
        """Send what is queued (within timeout), then stop."""
        if self.sender is None:
            return
        self.queue.put(None)
        self.sender.join(timeout)
        self.sender.kill()

    def notify(self, action, topic, channel, node, req):
        """Queue an action (nothing without --notification-http-endpoint)."""
        if not self.admin.opts.notification_http_endpoint:
            return
        self.queue.put(admin_action(action, topic, channel, node, req))

    def _send_loop(self):
        log = self.admin.log
        for doc in self.queue:
            if doc is None:
                return
            endpoint = self.admin.opts.notification_http_endpoint
            log.info(f"POSTing notification to {endpoint}")
            try:
                self.admin.client.post_json(endpoint, go_json(doc))
            except ClientError as err:
                log.error(f"failed to POST notification - {err}")
