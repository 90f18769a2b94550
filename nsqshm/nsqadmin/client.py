"""The HTTP client nsqadmin talks to nsqd and nsqlookupd with
(internal/http_api/api_request.go): GET/POST with
`Accept: application/vnd.nsq; version=1.0`, a connect timeout and an overall
request timeout, a 403 answered by a retry over HTTPS on the `https_port`
the body names, and errors worded as Go's http.Client words them, since
they end up in nsqadmin's UPSTREAM_ERROR messages.

Cooperative under gevent (the binary monkey-patches sockets), so the
cluster queries of one page run side by side.
"""

import http.client
import json
import socket
import ssl
from http import HTTPStatus
from urllib.parse import urlsplit, urlunsplit

import gevent

from nsqshm.flags import split_host_port
from nsqshm.nsqd.names import go_quote

ACCEPT_V1 = "application/vnd.nsq; version=1.0"


class ClientError(Exception):
    """A failed request; str() is Go's error text."""


class DialError(ClientError):
    """The connection could not be made: nothing of the request was sent."""


class _Deadline(Exception):
    pass


def _dial_error(addr, err):
    """net.Dial's error text for an OSError."""
    if isinstance(err, socket.gaierror):
        host = addr.rsplit(":", 1)[0].strip("[]")
        return f"dial tcp: lookup {host}: no such host"
    if isinstance(err, TimeoutError):
        return f"dial tcp {addr}: i/o timeout"
    reason = (err.strerror or str(err)).lower()
    return f"dial tcp {addr}: connect: {reason}"


def status_text(status, reason):
    """Go's Response.Status as a Go server writes it ("404 Not Found")."""
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} {reason}"


def json_error(body):
    """encoding/json's error for a body that does not decode."""
    text = body.decode("utf-8", "replace").lstrip()
    if not text:
        return "unexpected end of JSON input"
    return f"invalid character {text[0]!r} looking for beginning of value"


class V1Client:
    def __init__(self, connect_timeout, request_timeout, tls_context=None):
        self.connect_timeout = connect_timeout or None
        self.request_timeout = request_timeout or None  # Go: 0 means no limit
        self.tls_context = tls_context or ssl.create_default_context()

    # -- the V1 helpers -----------------------------------------------------------

    def get_v1(self, endpoint):
        """GETV1: the decoded JSON body of a 200, else ClientError."""
        status, _, body = self._v1("GET", endpoint)
        try:
            return json.loads(body)
        except ValueError:
            raise ClientError(json_error(body)) from None

    def post_v1(self, endpoint, body=b""):
        """POSTV1: None on a 200, else ClientError."""
        self._v1("POST", endpoint, body)

    def get_raw(self, endpoint, headers=None):
        """(status, content type, body) of a GET, whatever the status (the graphite proxy)."""
        return self.request("GET", endpoint, None, headers)

    def post_json(self, endpoint, body):
        """POST a JSON document (the notification webhook); the response is dropped."""
        self.request("POST", endpoint, body, {"Content-Type": "application/json"})

    # -- plumbing ---------------------------------------------------------------------

    def _v1(self, method, endpoint, data=b""):
        while True:
            status, ctype, body, reason = self._request(method, endpoint, data if method == "POST"
                                                        else None, {"Accept": ACCEPT_V1})
            if status == 200:
                return status, ctype, body
            if status == 403 and not endpoint.startswith("https"):
                endpoint = _https_endpoint(endpoint, body)
                continue
            raise ClientError(f"got response {status_text(status, reason)} {go_quote(body)}")

    def request(self, method, endpoint, body=None, headers=None, timeout=None):
        """timeout: at least this long for this request, whatever
        --http-client-request-timeout (a partition move, which nsqlookupd
        answers once it is done; 0 there still means no limit)."""
        status, ctype, data, _ = self._request(method, endpoint, body, headers or {}, timeout)
        return status, ctype, data

    def _request(self, method, endpoint, body, headers, timeout=None):
        verb = method.capitalize()
        parts = urlsplit(endpoint)
        addr = parts.netloc.rpartition("@")[2]
        if timeout is None or self.request_timeout is None:  # (None: no limit)
            timeout = self.request_timeout
        else:
            timeout = max(timeout, self.request_timeout)
        try:
            with gevent.Timeout(timeout, _Deadline):
                conn = self._connect(parts, addr, timeout)
                try:
                    target = parts.path or "/"
                    if parts.query:
                        target += "?" + parts.query
                    conn.request(method, target, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
        except _Deadline:
            raise ClientError(f'{verb} "{endpoint}": context deadline exceeded '
                              "(Client.Timeout exceeded while awaiting headers)") from None
        except ClientError as err:  # (a DialError stays one)
            raise type(err)(f'{verb} "{endpoint}": {err}') from None
        except (OSError, http.client.HTTPException) as err:
            text = str(err) or type(err).__name__
            if isinstance(err, ssl.SSLError):
                text = f"tls: {err.reason or err}"
            raise ClientError(f'{verb} "{endpoint}": {text}') from None
        return resp.status, resp.getheader("Content-Type", ""), data, resp.reason

    def _connect(self, parts, addr, timeout):
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            sock = socket.create_connection((host, port), timeout=self.connect_timeout)
        except OSError as err:
            raise DialError(_dial_error(addr, err)) from None
        sock.settimeout(timeout)
        if parts.scheme == "https":
            sock = self.tls_context.wrap_socket(sock, server_hostname=host)
            conn = http.client.HTTPSConnection(host, port, context=self.tls_context)
        else:
            conn = http.client.HTTPConnection(host, port)
        conn.sock = sock
        return conn


def _https_endpoint(endpoint, body):
    """httpsEndpoint: the same URL over https on the port a 403 body names."""
    try:
        port = int(json.loads(body).get("https_port", 0))
    except (ValueError, AttributeError, TypeError):
        raise ClientError(json_error(body)) from None
    parts = urlsplit(endpoint)
    host, _ = split_host_port(parts.netloc)
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return urlunsplit(("https", netloc, parts.path, parts.query, parts.fragment))
