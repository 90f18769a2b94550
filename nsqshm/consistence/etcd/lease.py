"""A lease: etcd deletes every key attached to it TTL seconds after its last
keep-alive.  It is how a node's liveness is seen by the others (its registration
and its leader sessions vanish with it) and how a node knows it may have been
given up.

The keep-alive greenlet refreshes every TTL/3.  `deadline` is the monotonic time
until which the lease is surely alive: the send time of the last refresh etcd
answered, plus the TTL it granted.  Past it, this node must act as if its keys were
gone (a leader stops acknowledging) even while etcd is unreachable, because etcd
may have expired the lease meanwhile.  When etcd says the lease is gone, or the
deadline passes, `on_lost(lease)` is called once and the greenlet ends.
"""

import logging
import time

import gevent

from nsqshm.consistence.errors import CoordinationError, LeaseNotFound

log = logging.getLogger("nsqshm.consistence")


class Lease:
    def __init__(self, gateway, lease_id, ttl, granted_at, on_lost=None):
        self.gateway = gateway
        self.id = lease_id
        self.ttl = ttl  # what etcd granted (it raises a TTL below its minimum)
        self.deadline = granted_at + ttl
        self.lost = False
        self._on_lost = on_lost
        self._keeper = None

    @classmethod
    def grant(cls, gateway, ttl, on_lost=None):
        sent = time.monotonic()
        answer = gateway.call("lease/grant", {"TTL": str(int(ttl))})
        return cls(gateway, int(answer["ID"]), int(answer["TTL"]), sent, on_lost)

    @property
    def alive(self):
        return not self.lost and time.monotonic() < self.deadline

    def start_keepalive(self):
        if self._keeper is None:
            self._keeper = gevent.spawn(self._keepalive_loop)

    def stop_keepalive(self):
        """Stop refreshing without revoking: the lease runs out after its TTL, as
        when the node dies."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None and keeper is not gevent.getcurrent():
            keeper.kill()

    def refresh(self):
        """One keep-alive; returns the TTL etcd renewed, 0 if the lease is gone."""
        sent = time.monotonic()
        answer = self.gateway.call("lease/keepalive", {"ID": str(self.id)})
        ttl = int(answer.get("result", {}).get("TTL", 0))  # absent: expired
        if ttl > 0:
            self.deadline = sent + ttl
        return ttl

    def revoke(self):
        """Give the lease up now: its keys are deleted at once."""
        self.stop_keepalive()
        self.lost = True
        try:
            self.gateway.call("lease/revoke", {"ID": str(self.id)})
        except LeaseNotFound:
            pass

    def _keepalive_loop(self):
        interval = max(self.ttl / 3.0, 0.1)
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                log.warning("lease %x: no keep-alive answered before its deadline", self.id)
                break
            try:
                # a refresh hanging on a cut path must not carry the node past its
                # deadline still believing it holds the lease
                with gevent.Timeout(remaining, _DeadlinePassed):
                    renewed = self.refresh()
                if renewed <= 0:
                    break
                gevent.sleep(interval)
            except LeaseNotFound:
                break
            except _DeadlinePassed:
                log.warning("lease %x: keep-alive unanswered at its deadline", self.id)
                break
            except CoordinationError as err:
                # etcd unreachable: retry often until the deadline
                log.debug("lease %x: keep-alive failed (%s)", self.id, err)
                gevent.sleep(min(interval, 0.25, max(self.deadline - time.monotonic(), 0)))
        self.lost = True
        self._keeper = None
        log.info("lease %x lost", self.id)
        if self._on_lost is not None:
            self._on_lost(self)


class _DeadlinePassed(Exception):
    pass
