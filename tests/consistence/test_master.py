"""The nsqlookupd master against a real etcd: one master among campaigners, a standby
takes over when the master's lease runs out or it resigns."""

import time

from nsqshm.consistence.master import Master
from nsqshm.consistence.topology import NodeInfo, Topology
from tests.consistence.conftest import TTL
from tests.consistence.wait import wait_for


def lookupd(sessions, node_id, seen):
    node = NodeInfo(node_id, "127.0.0.1", tcp_port=4160, http_port=4161)
    return Master(Topology(sessions(), "c1"), node,
                  lambda master: seen.append(master.id if master else None)).start()


def test_one_master_and_a_standby_takes_over_when_it_dies(sessions):
    seen_a, seen_b, seen_c = [], [], []
    a = lookupd(sessions, "a", seen_a)
    b = lookupd(sessions, "b", seen_b)
    c = lookupd(sessions, "c", seen_c)
    assert a.is_master and not b.is_master and not c.is_master
    assert seen_a == seen_b == seen_c == ["a"]
    stored = b.session.get(b.key)
    assert stored.lease == a.session.lease_id
    a.session.close(revoke=False)  # dies: its lease runs out
    died = time.monotonic()
    assert wait_for(lambda: b.is_master or c.is_master, TTL + 3)
    assert time.monotonic() - died <= TTL + 1.5
    assert b.is_master != c.is_master  # exactly one
    winner = "b" if b.is_master else "c"
    assert wait_for(lambda: seen_b[-1] == seen_c[-1] == winner, 2), (seen_b, seen_c)


def test_resign_hands_over_at_once(sessions):
    seen_a, seen_b = [], []
    a = lookupd(sessions, "a", seen_a)
    b = lookupd(sessions, "b", seen_b)
    assert a.is_master
    a.stop(resign=True)
    assert wait_for(lambda: b.is_master, 2)  # well under the TTL
    assert seen_b == ["a", None, "b"]
    assert not a.resign()  # nothing held any more
