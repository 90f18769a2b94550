"""A watch: a greenlet that follows a key (or a prefix) and calls back with each batch
of changes, in revision order, resuming after any break.

The stream is the gateway's `watch` call: one JSON object a line,

    {"result": {"header": {"revision": R}, "created": true}}            the watch is set
    {"result": {"header": ..., "events": [{"type": "DELETE"?, "kv": {...}, "prev_kv": {...}}]}}
    {"result": {"compact_revision": C, "canceled": true}}              history before C is gone

A PUT event has no "type" (proto3 omits the zero value).  When the stream breaks
(etcd restarted, connection cut, `reset()`), the watch opens a new one from the
revision after the last it delivered, so no change is missed or repeated.  If that
revision was compacted meanwhile, the callback gets one COMPACTED event: the caller
must read the state again; the watch goes on from the compaction revision.
"""

import http.client
import json
import logging
from dataclasses import dataclass

import gevent
import gevent.event
import gevent.socket

from nsqshm.consistence.errors import CoordinationError
from nsqshm.consistence.etcd.kv import KeyValue, b64, prefix_end

log = logging.getLogger("nsqshm.consistence")

MAX_LINE = 64 << 20


@dataclass(frozen=True)
class WatchEvent:
    type: str  # "PUT", "DELETE", or "COMPACTED" (kv None: read the state again)
    kv: KeyValue | None
    prev: KeyValue | None  # the value before a PUT or DELETE, when etcd still had it


class Watch:
    def __init__(self, gateway, key, callback, prefix=False, start_revision=None,
                 retry_interval=0.2):
        self.gateway = gateway
        self.key = key
        self.prefix = prefix
        self.callback = callback
        self.retry_interval = retry_interval
        self.next_revision = start_revision  # None: from now on
        self.ready = gevent.event.Event()  # set once a stream is established
        self.restarts = 0  # streams opened after the first: how often it resumed
        self._conn = None
        self._sock = None
        self._stopped = False
        self._greenlet = gevent.spawn(self._run)

    def stop(self):
        self._stopped = True
        if self._greenlet is not gevent.getcurrent():
            self._greenlet.kill()  # its finally closes the stream

    def reset(self):
        """Drop the current stream (it may be hanging on a dead path); the watch
        resumes on a new one.  Only a shutdown here: the reading greenlet, woken by
        it, closes the connection (closing under its read is not allowed)."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(gevent.socket.SHUT_RDWR)
            except OSError:
                pass

    def _close(self):
        conn, self._conn, self._sock = self._conn, None, None
        if conn is not None:
            conn.close()

    def _request(self):
        create = {"key": b64(self.key), "prev_kv": True}
        if self.prefix:
            create["range_end"] = b64(prefix_end(self.key))
        if self.next_revision is not None:
            create["start_revision"] = str(self.next_revision)
        return {"create_request": create}

    def _run(self):
        opened = 0
        while not self._stopped:
            try:
                conn, resp = self.gateway.open_stream("watch", self._request())
                self._conn, self._sock = conn, conn.sock
                if opened:
                    self.restarts += 1
                opened += 1
                self._follow(resp)
            except (CoordinationError, OSError, ValueError, http.client.HTTPException) as err:
                # (a chunked stream cut mid-chunk is http.client's IncompleteRead)
                if not self._stopped:
                    log.debug("watch %s: stream broke (%s); resuming from %s",
                              self.key, err, self.next_revision)
            finally:
                self._close()
            if not self._stopped:
                gevent.sleep(self.retry_interval)

    def _follow(self, resp):
        while not self._stopped:
            line = resp.readline(MAX_LINE)
            if not line:
                raise OSError("watch stream ended")
            if not line.strip():
                continue
            message = json.loads(line)
            if "error" in message:
                raise CoordinationError(f"watch error: {message['error']}")
            result = message.get("result", {})
            compacted = int(result.get("compact_revision", 0))
            if compacted:
                self.next_revision = compacted
                self._deliver([WatchEvent("COMPACTED", None, None)])
                return  # canceled by etcd: open a new stream from there
            if result.get("created"):
                if self.next_revision is None:
                    self.next_revision = int(result["header"]["revision"]) + 1
                self.ready.set()
            events = result.get("events")
            if events:
                batch = [WatchEvent(e.get("type", "PUT"), KeyValue.from_json(e["kv"]),
                                    KeyValue.from_json(e["prev_kv"]) if "prev_kv" in e else None)
                         for e in events]
                self.next_revision = batch[-1].kv.mod_revision + 1
                self._deliver(batch)

    def _deliver(self, batch):
        try:
            self.callback(batch)
        except Exception:
            log.exception("watch %s: callback failed", self.key)
