"""The etcd session of one node: the facade every other module of consistence/ uses.

- KV: get, get_prefix, put, delete, delete_prefix, and transactions (txn, create, cas).
- One lease per session, kept alive by a greenlet (lease.py).  Keys given to `keep`
  are attached to it: they vanish when the node dies, and are put again under a new
  lease when the old one was lost (etcd down past the TTL, or revoked): that is the
  node re-registering.  `on_new_lease` callbacks run after that, so that leadership
  can re-acquire what it held.
- Watches (watch.py), each a greenlet calling back with batches of events.

Across an etcd restart nothing is needed from the caller: unary calls retry on a new
connection, watches resume from their next revision, the keep-alive goes on (etcd
keeps leases across a restart and extends them), or a new lease is granted and the
kept keys are put again.

Cooperative under gevent with or without monkey patching (gateway.py says why).
"""

import logging
import time

import gevent

from nsqshm.consistence.errors import CompareFailed, CoordinationError
from nsqshm.consistence.etcd.gateway import Gateway
from nsqshm.consistence.etcd.kv import KeyValue, b64, prefix_end
from nsqshm.consistence.etcd.lease import Lease
from nsqshm.consistence.etcd.txn import Compare, Op, TxnResult
from nsqshm.consistence.etcd.watch import Watch

log = logging.getLogger("nsqshm.consistence")

# seconds: a node is seen dead this long after its last keep-alive, which bounds the
# failover time; 6 leaves issue 17's 10 s target room for the new leader to resume writes
DEFAULT_TTL = 6


class EtcdSession:
    def __init__(self, endpoints, ttl=DEFAULT_TTL, timeout=2.0):
        self.gateway = Gateway(endpoints, timeout=timeout)
        self.ttl = ttl
        self.lease = None
        self.leases_granted = 0  # 1 after start; more each time a lost lease was replaced
        self._kept = {}  # key -> value, attached to the lease
        self._watches = set()
        self._new_lease_callbacks = []
        self._lease_lost_callbacks = []
        self._renewer = None
        self._closed = False

    # -- life ------------------------------------------------------------------------

    def start(self):
        """Grant the lease and start its keep-alive."""
        if self.lease is None:
            self._grant()
        return self

    def close(self, revoke=True):
        """Stop everything.  revoke=True gives the lease up (the node's keys vanish at
        once); revoke=False lets it run out after the TTL, as a dead node's does."""
        self._closed = True
        for watch in list(self._watches):
            watch.stop()
        self._watches.clear()
        if self._renewer is not None:
            self._renewer.kill()
        if self.lease is not None:
            if revoke:
                try:
                    self.lease.revoke()
                except CoordinationError as err:
                    log.warning("lease revoke failed: %s", err)
            else:
                self.lease.stop_keepalive()
        self.gateway.close()

    @property
    def lease_id(self):
        return self.lease.id if self.lease is not None else 0

    def on_lease_lost(self, callback):
        """callback(session) as soon as the lease is taken as lost (etcd said so, or its
        deadline passed unanswered): whatever was held on it (a leadership) is gone."""
        self._lease_lost_callbacks.append(callback)

    def on_new_lease(self, callback):
        """callback(session) after a lost lease was replaced and the kept keys put again."""
        self._new_lease_callbacks.append(callback)

    # -- KV --------------------------------------------------------------------------

    def get(self, key):
        """The KeyValue at key, or None."""
        answer = self.gateway.call("kv/range", {"key": b64(key)})
        kvs = answer.get("kvs")
        return KeyValue.from_json(kvs[0]) if kvs else None

    def get_prefix(self, prefix):
        """Every KeyValue whose key starts with prefix, in key order."""
        answer = self.gateway.call("kv/range", {"key": b64(prefix),
                                                "range_end": b64(prefix_end(prefix))})
        return [KeyValue.from_json(kv) for kv in answer.get("kvs", ())]

    def revision(self):
        """The store's current revision."""
        answer = self.gateway.call("kv/range", {"key": b64("\0"), "count_only": True})
        return int(answer["header"]["revision"])

    def put(self, key, value, leased=False):
        """Put; leased=True attaches the key to the session's lease.  -> revision."""
        body = {"key": b64(key), "value": b64(value)}
        if leased:
            body["lease"] = str(self.ensure_lease())
        return int(self.gateway.call("kv/put", body)["header"]["revision"])

    def delete(self, key):
        """-> how many keys were deleted (0 or 1)."""
        return int(self.gateway.call("kv/deleterange", {"key": b64(key)}).get("deleted", 0))

    def delete_prefix(self, prefix):
        body = {"key": b64(prefix), "range_end": b64(prefix_end(prefix))}
        return int(self.gateway.call("kv/deleterange", body).get("deleted", 0))

    def txn(self, compares, success, failure=()):
        """If every compare holds, apply success, else failure, atomically."""
        body = {"compare": list(compares), "success": list(success), "failure": list(failure)}
        return TxnResult.from_json(self.gateway.call("kv/txn", body))

    def create(self, key, value, leased=False):
        """Put only if key does not exist, else CompareFailed.  -> revision."""
        lease = self.ensure_lease() if leased else 0
        result = self.txn([Compare.absent(key)], [Op.put(key, value, lease)])
        if not result.succeeded:
            raise CompareFailed(f"{key} exists")
        return result.revision

    def cas(self, key, value, mod_revision, leased=False):
        """Put only if key was last changed at mod_revision (0: absent), else
        CompareFailed.  -> the new mod_revision."""
        lease = self.ensure_lease() if leased else 0
        result = self.txn([Compare.mod_revision(key, "=", mod_revision)],
                          [Op.put(key, value, lease)])
        if not result.succeeded:
            raise CompareFailed(f"{key} changed since revision {mod_revision}")
        return result.revision

    # -- keys kept with the lease -----------------------------------------------------

    def keep(self, key, value):
        """Put key under the lease, and again under each new lease: a registration
        that lives as long as this node does.  -> revision."""
        self._kept[key] = value
        return self.put(key, value, leased=True)

    def forget(self, key):
        """Stop keeping key and delete it."""
        self._kept.pop(key, None)
        return self.delete(key)

    # -- watches ---------------------------------------------------------------------

    def watch(self, key, callback, prefix=False, start_revision=None):
        """callback(list of WatchEvent) for each change of key (or of every key under
        it with prefix=True), from start_revision or from now.  -> Watch (stop())."""
        watch = Watch(self.gateway, key, callback, prefix=prefix, start_revision=start_revision)
        self._watches.add(watch)
        return watch

    def unwatch(self, watch):
        self._watches.discard(watch)
        watch.stop()

    # -- the lease -------------------------------------------------------------------

    def ensure_lease(self):
        """The session's lease ID, granting it first if needed."""
        if self.lease is None:
            self.start()
        return self.lease.id

    def _grant(self):
        """A new lease with the kept keys put on it, then its keep-alive; the session
        takes it only once all that succeeded."""
        lease = Lease.grant(self.gateway, self.ttl, on_lost=self._lease_lost)
        try:
            for key, value in list(self._kept.items()):
                self.gateway.call("kv/put", {"key": b64(key), "value": b64(value),
                                             "lease": str(lease.id)})
        except BaseException:
            try:
                lease.revoke()
            except CoordinationError:
                pass  # it expires by itself
            raise
        self.lease = lease
        self.leases_granted += 1
        lease.start_keepalive()

    def _lease_lost(self, lease):
        if self._closed or lease is not self.lease:
            return
        for callback in list(self._lease_lost_callbacks):
            try:
                callback(self)
            except Exception:
                log.exception("on_lease_lost callback failed")
        # the watches may hang on the path that failed: have them reconnect too
        for watch in list(self._watches):
            watch.reset()
        if self._renewer is None:
            self._renewer = gevent.spawn(self._renew)

    def _renew(self):
        """A new lease, the kept keys put again, then the callbacks; retried until
        etcd answers."""
        delay = 0.1
        try:
            while not self._closed:
                try:
                    self._grant()
                    break
                except CoordinationError as err:
                    log.info("etcd session: new lease not granted yet (%s)", err)
                    gevent.sleep(delay)
                    delay = min(delay * 2, 1.0)
            log.info("etcd session: lease %x granted, %d keys put again",
                     self.lease.id, len(self._kept))
        finally:
            self._renewer = None
        for callback in list(self._new_lease_callbacks):
            try:
                callback(self)
            except Exception:
                log.exception("on_new_lease callback failed")

    def wait_lease(self, timeout):
        """Block (cooperatively) until the session holds a live lease; -> bool."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.lease is not None and self.lease.alive and self._renewer is None:
                return True
            gevent.sleep(0.05)
        return False
