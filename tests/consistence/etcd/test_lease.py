"""Leases against a real etcd: keys vanish after the TTL once keep-alives stop, at
once on revoke, and a node cut off from etcd takes its lease as lost by its own
deadline."""

import time

import gevent
import pytest

from nsqshm.consistence.errors import EtcdUnavailable
from tests.consistence.conftest import TTL
from tests.consistence.wait import wait_for


def test_lease_keys_vanish_after_ttl_when_keepalive_stops(sessions):
    s, observer = sessions(), sessions()
    s.keep("/nodes/a", b"alive")
    gevent.sleep(TTL + 0.5)  # longer than the TTL: the keep-alive holds it
    assert observer.get("/nodes/a").lease == s.lease_id
    s.close(revoke=False)  # as a death: no revoke, no more keep-alives
    started = time.monotonic()
    assert wait_for(lambda: observer.get("/nodes/a") is None, TTL + 3)
    gone_after = time.monotonic() - started
    assert gone_after <= TTL + 2, gone_after


def test_revoke_deletes_at_once(sessions):
    s, observer = sessions(), sessions()
    s.keep("/nodes/b", b"alive")
    s.close(revoke=True)
    assert observer.get("/nodes/b") is None


def test_a_session_cut_off_from_etcd_gives_its_lease_up_by_the_deadline(etcd, sessions):
    s = sessions(timeout=0.3)
    lease = s.lease
    etcd.freeze()  # sockets open, nothing answered: a cut path
    try:
        started = time.monotonic()
        assert wait_for(lambda: lease.lost, TTL + 2)
        assert time.monotonic() - started <= TTL + 0.5
        assert not lease.alive and time.monotonic() >= lease.deadline
        with pytest.raises(EtcdUnavailable):
            s.get("/x")
    finally:
        etcd.thaw()
