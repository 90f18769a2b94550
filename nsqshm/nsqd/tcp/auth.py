"""nsqd's auth protocol (nsqd/client_v2.go QueryAuthd, internal/auth).

With --auth-http-address (repeatable), a TCP client must AUTH with a secret
before SUB, PUB, MPUB or DPUB.  nsqd asks an auth server, starting at a
random one of the addresses and trying the next on failure:

    GET  http://<addr>/auth?common_name=..&remote_ip=..&secret=..&tls=true|false
         (an address with "://" is used as the URL itself, the query appended)
    POST the same URL without the query, the values as a JSON body
         {"common_name":[".."],"remote_ip":[".."],"secret":[".."],"tls":[".."]}
         (--auth-http-request-method=post)

and expects 200 with

    {"ttl": 3600, "identity": "..", "identity_url": "..",
     "authorizations": [{"topic": "<regex>", "channels": ["<regex>", ..],
                         "permissions": ["subscribe", "publish"]}, ..]}

A 403 from a plain-HTTP server whose JSON names an "https_port" is retried
over HTTPS there.  The answer is kept for ttl seconds; a check after that
asks again.  A publish needs "publish" on a matching topic (the channel is
"", which every channel regex must then match); a SUB needs "subscribe" on
a matching topic and channel.  Regexes match anywhere, as Go's MatchString.
"""

import http.client
import json
import random
import re
import ssl
import time
from urllib.parse import urlencode, urlsplit

ACCEPT = "application/vnd.nsq; version=1.0"
PERMISSIONS = ("subscribe", "publish")


class AuthError(Exception):
    pass


class Authorization:
    __slots__ = ("topic", "channels", "permissions", "_topic_re", "_channel_res")

    def __init__(self, topic, channels, permissions):
        self.topic = topic
        self.channels = channels
        self.permissions = permissions
        self._topic_re = re.compile(topic)
        self._channel_res = [re.compile(c) for c in channels]

    def has_permission(self, permission):
        return permission in self.permissions

    def is_allowed(self, topic, channel):
        if not self.has_permission("subscribe" if channel else "publish"):
            return False
        if not self._topic_re.search(topic):
            return False
        return any(r.search(channel) for r in self._channel_res)


class State:
    """An auth server's answer: identity and authorizations until `expires`."""

    def __init__(self, ttl, authorizations, identity, identity_url):
        self.ttl = ttl
        self.authorizations = authorizations
        self.identity = identity
        self.identity_url = identity_url
        self.expires = time.monotonic() + ttl

    def is_allowed(self, topic, channel):
        return any(a.is_allowed(topic, channel) for a in self.authorizations)

    def is_expired(self):
        return self.expires < time.monotonic()


# -- the answer, decoded as Go's encoding/json into auth.State ------------------------


def _field(obj, name):
    """Go's case-insensitive field lookup (an exact match wins)."""
    if name in obj:
        return obj[name]
    for key, value in obj.items():
        if key.lower() == name:
            return value
    return None


def _typed(value, kind, what):
    if value is None:
        return kind()
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
            raise AuthError(f"json: cannot unmarshal {what} into Go value of type int")
        return int(value)
    if not isinstance(value, kind):
        raise AuthError(f"json: cannot unmarshal {what} into Go value of type "
                        f"{'string' if kind is str else kind.__name__}")
    return value


def _strings(value, what):
    items = _typed(value, list, what)
    return [_typed(v, str, what) for v in items]


def parse_state(body):
    """An auth server's 200 body as a State; AuthError as QueryAuthd's errors."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise AuthError(f"invalid character in JSON ({err})") from None
    if not isinstance(data, dict):
        raise AuthError("json: cannot unmarshal into Go value of type auth.State")
    ttl = _typed(_field(data, "ttl"), int, "ttl")
    identity = _typed(_field(data, "identity"), str, "identity")
    identity_url = _typed(_field(data, "identity_url"), str, "identity_url")
    authorizations = []
    for item in _typed(_field(data, "authorizations"), list, "authorizations"):
        if item is None:
            item = {}
        if not isinstance(item, dict):
            raise AuthError("json: cannot unmarshal into Go value of type auth.Authorization")
        topic = _typed(_field(item, "topic"), str, "topic")
        channels = _strings(_field(item, "channels"), "channels")
        permissions = _strings(_field(item, "permissions"), "permissions")
        for p in permissions:
            if p not in PERMISSIONS:
                raise AuthError(f"unknown permission {p}")
        try:
            re.compile(topic)
        except re.error as err:
            raise AuthError(f"unable to compile topic {json.dumps(topic)} {err}") from None
        for c in channels:
            try:
                re.compile(c)
            except re.error as err:
                raise AuthError(f"unable to compile channel {json.dumps(c)} {err}") from None
        authorizations.append(Authorization(topic, channels, permissions))
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    return State(ttl, authorizations, identity, identity_url)


# -- asking --------------------------------------------------------------------------


def _values(remote_ip, tls, common_name, secret):
    return {"common_name": common_name, "remote_ip": remote_ip, "secret": secret,
            "tls": "true" if tls else "false"}


def _request(url, method, body, connect_timeout, request_timeout, ssl_context):
    """(status, reason, body) of one HTTP request."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(host, parts.port or 443, timeout=connect_timeout,
                                           context=ssl_context)
    else:
        conn = http.client.HTTPConnection(host, parts.port or 80, timeout=connect_timeout)
    try:
        conn.connect()
        conn.sock.settimeout(request_timeout)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        headers = {"Accept": ACCEPT}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.reason, resp.read()
    finally:
        conn.close()


def _https_endpoint(url, body):
    try:
        port = json.loads(body)["https_port"]
    except (ValueError, KeyError, TypeError):
        raise AuthError(f"got response 403 Forbidden {body!r}") from None
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return parts._replace(scheme="https", netloc=f"{host}:{port}").geturl()


def query_authd(address, remote_ip, tls, common_name, secret, method="get",
                connect_timeout=2.0, request_timeout=5.0, ssl_context=None):
    """Ask one auth server (nsqd's auth.QueryAuthd); a State or AuthError."""
    values = _values(remote_ip, tls, common_name, secret)
    endpoint = address if "://" in address else f"http://{address}/auth"
    if method == "post":
        url = endpoint
        body = json.dumps({k: [v] for k, v in values.items()}, separators=(",", ":")).encode()
        verb = "POST"
    else:
        raw = {k: v.encode("utf-8", "surrogateescape") for k, v in values.items()}
        url = f"{endpoint}?{urlencode(raw)}"  # the secret's bytes as sent
        body = None
        verb = "GET"
    for _ in range(2):
        try:
            status, reason, data = _request(url, verb, body, connect_timeout, request_timeout,
                                            ssl_context)
        except (OSError, http.client.HTTPException) as err:
            raise AuthError(str(err) or type(err).__name__) from None
        if status == 200:
            return parse_state(data)
        if status == 403 and not url.startswith("https"):
            url = _https_endpoint(url, data)
            continue
        raise AuthError(f"got response {status} {reason} {data!r}")
    raise AuthError(f"got response {status} {reason} {data!r}")


def query_any_authd(addresses, remote_ip, tls, common_name, secret, **kw):
    """Try each auth server from a random one on; the first answer, or
    AuthError naming every failure (nsqd's auth.QueryAnyAuthd)."""
    errors = []
    n = len(addresses)
    start = random.randrange(n)
    for i in range(n):
        address = addresses[(start + i) % n]
        try:
            return query_authd(address, remote_ip, tls, common_name, secret, **kw)
        except AuthError as err:
            errors.append(f"failed to auth against {address} - {err}")
    raise AuthError("; ".join(errors))


def client_ssl_context(opts):
    """For https auth servers: --tls-root-ca-file as the roots when given
    (nsqd 1.3 #1473), else the system's."""
    ctx = ssl.create_default_context()
    if opts.tls_root_ca_file:
        ctx.load_verify_locations(cafile=opts.tls_root_ca_file)
    return ctx
