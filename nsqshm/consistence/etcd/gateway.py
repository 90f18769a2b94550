"""The transport to etcd: its v3 JSON gateway (grpc-gateway) over HTTP/1.1.

Why the gateway and our own ~150 lines rather than a client package:
- python-etcd3 speaks gRPC, and grpc's C core runs its own threads and polling, which
  gevent cannot make cooperative without grpc's experimental gevent mode; its last
  release is from 2020.
- etcd3gw (the maintained gateway client) sends through requests and watches in a
  futurist thread pool: cooperative only in a monkey-patched process (the pytest
  process is not, the daemons are), and a watch stream that breaks ends silently in
  that pool, so a session could not resume it from the next revision.
- Here every socket is a gevent socket, so the calls cooperate whether or not the
  process is monkey-patched, and a broken watch stream is an exception the watch
  greenlet sees.  http.client does the HTTP/1.1 framing (Content-Length, chunked,
  trailers); no new dependency.

The API path: etcd 3.4 serves `/v3/` (and still `/v3beta/`), 3.3 only `/v3beta/`, 3.5
only `/v3/`.  `/version` says which server this is; the path is chosen from it once
per endpoint.

Wire: POST <path><service>/<method> with a JSON body; keys and values are base64;
int64 fields come back as JSON strings.  A gRPC error is a non-200 answer with
`{"error", "message", "code"}` (the gRPC status code).
"""

import http.client
import json

import gevent.socket

from nsqshm.consistence.errors import EtcdRequestError, EtcdUnavailable, LeaseNotFound

GRPC_NOT_FOUND = 5  # "etcdserver: requested lease not found" and the like
MAX_BODY = 64 << 20  # an answer larger than this is not etcd's


class _Connection(http.client.HTTPConnection):
    """http.client over a gevent socket: cooperative without monkey patching."""

    def connect(self):
        self.sock = gevent.socket.create_connection((self.host, self.port), self.timeout)
        self.sock.setsockopt(gevent.socket.IPPROTO_TCP, gevent.socket.TCP_NODELAY, 1)


def split_endpoint(endpoint):
    """'http://host:port' or 'host:port' -> (host, port)."""
    rest = endpoint.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"bad etcd endpoint {endpoint!r} (want host:port)")
    return host.strip("[]"), int(port)


def api_path_for(version):
    """The gateway path prefix for an etcd server version string ("3.4.23")."""
    major_minor = tuple(int(p) for p in version.split(".")[:2])
    if major_minor >= (3, 4):
        return "/v3/"
    if major_minor >= (3, 3):
        return "/v3beta/"
    return "/v3alpha/"


class Gateway:
    """Calls to etcd's gateway, trying each endpoint in turn.

    Unary calls reuse idle keep-alive connections (one per concurrent caller); a
    stream (watch) has a connection of its own, closed when the stream ends."""

    def __init__(self, endpoints, timeout=2.0):
        if isinstance(endpoints, str):
            endpoints = endpoints.split(",")
        self.endpoints = [split_endpoint(e.strip()) for e in endpoints if e.strip()]
        if not self.endpoints:
            raise ValueError("no etcd endpoint")
        self.timeout = timeout
        self._preferred = 0  # the endpoint that answered last
        self._idle = []  # (endpoint index, _Connection)
        self._paths = {}  # endpoint index -> "/v3/" ...

    def close(self):
        idle, self._idle = self._idle, []
        for _, conn in idle:
            conn.close()

    def call(self, method, body):
        """One unary call ("kv/range", {...}) -> the decoded JSON answer."""
        last = None
        for index in self._order():
            conn, reused = self._take(index)
            try:
                status, data = self._exchange(conn, index, method, body)
            except (OSError, http.client.HTTPException, ValueError) as err:
                conn.close()
                last = err
                if not reused or isinstance(err, TimeoutError):
                    continue  # (timed out: it reached a server that did not answer, which
                    # may have applied it and will not answer sooner on a new connection)
                # an idle connection the server closed meanwhile (etcd restarted): the
                # request never reached it; once more on a new connection
                conn, _ = self._new(index)
                try:
                    status, data = self._exchange(conn, index, method, body)
                except (OSError, http.client.HTTPException, ValueError) as err2:
                    conn.close()
                    last = err2
                    continue
                except BaseException:
                    conn.close()  # a gevent.Timeout or kill mid-exchange: unusable
                    raise
            except BaseException:
                conn.close()
                raise
            self._idle.append((index, conn))
            self._preferred = index
            return _decode(status, data)
        raise EtcdUnavailable(f"no etcd endpoint answered {method}: {last}")

    def open_stream(self, method, body, timeout=None):
        """Start a streaming call (watch): (connection, response) to read lines from.
        The caller closes the connection."""
        last = None
        for index in self._order():
            host, port = self.endpoints[index]
            conn = _Connection(host, port, timeout=self.timeout)
            try:
                path = self._path(conn, index)
                conn.request("POST", path + method, json.dumps(body),
                              {"Content-Type": "application/json"})
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException, ValueError) as err:
                conn.close()
                last = err
                continue
            if resp.status != 200:
                data = resp.read(MAX_BODY)
                conn.close()
                _decode(resp.status, data)  # raises the typed error
            conn.sock.settimeout(timeout)  # a stream is quiet while nothing changes
            self._preferred = index
            return conn, resp
        raise EtcdUnavailable(f"no etcd endpoint answered {method}: {last}")

    # -- internals -------------------------------------------------------------------

    def _order(self):
        n = len(self.endpoints)
        return [(self._preferred + i) % n for i in range(n)]

    def _take(self, index):
        """(connection, reused): an idle one to this endpoint, else a new one."""
        for i, (idx, conn) in enumerate(self._idle):
            if idx == index:
                del self._idle[i]
                return conn, True
        return self._new(index)

    def _new(self, index):
        host, port = self.endpoints[index]
        return _Connection(host, port, timeout=self.timeout), False

    def _path(self, conn, index):
        path = self._paths.get(index)
        if path is None:
            conn.request("GET", "/version")
            resp = conn.getresponse()
            version = json.loads(resp.read(MAX_BODY))["etcdserver"]
            path = self._paths[index] = api_path_for(version)
        return path

    def _exchange(self, conn, index, method, body):
        path = self._path(conn, index)
        conn.request("POST", path + method, json.dumps(body),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read(MAX_BODY)


def _decode(status, data):
    try:
        answer = json.loads(data) if data else {}
    except ValueError:
        raise EtcdRequestError(-1, f"not JSON: {data[:200]!r}", status) from None
    if status == 200:
        return answer
    code = answer.get("code", -1)
    message = answer.get("message") or answer.get("error") or ""
    if code == GRPC_NOT_FOUND and "lease not found" in message:
        raise LeaseNotFound(code, message, status)
    if code == 14:  # UNAVAILABLE: no leader (etcd restarting, quorum lost)
        raise EtcdUnavailable(f"etcd unavailable: {message}")
    raise EtcdRequestError(code, message, status)
