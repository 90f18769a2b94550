"""EtcdSession against a real etcd: KV, compare-and-set races, a lost lease replaced
with the kept keys put again, an etcd restarted under a session or down past the TTL,
endpoints, and a monkey-patched process (leases alone: test_lease.py; watches:
test_watch.py)."""

import gevent
import pytest

from nsqshm.consistence.errors import CompareFailed
from nsqshm.consistence.etcd.txn import Compare, Op
from tests.consistence.conftest import TTL
from tests.consistence.etcd_server import free_port
from tests.consistence.wait import wait_for


def test_kv_get_put_delete_with_prefix(sessions):
    s = sessions()
    rev = s.put("/t/a", b"1")
    s.put("/t/b", "2")
    s.put("/t0", b"outside the prefix")
    kv = s.get("/t/a")
    assert (kv.value, kv.mod_revision, kv.create_revision, kv.version) == (b"1", rev, rev, 1)
    assert s.get("/t/none") is None
    assert [(kv.key, kv.value) for kv in s.get_prefix("/t/")] == [("/t/a", b"1"), ("/t/b", b"2")]
    assert s.delete("/t/a") == 1 and s.delete("/t/a") == 0
    assert s.delete_prefix("/t/") == 1
    assert s.get("/t0").value == b"outside the prefix"


def test_binary_keys_and_values_round_trip(sessions):
    s = sessions()
    value = bytes(range(256))
    s.put("/bin/\u00e9t\u00e9", value)
    assert s.get("/bin/\u00e9t\u00e9").value == value


def test_create_and_cas(sessions):
    s = sessions()
    rev = s.create("/k", b"first")
    with pytest.raises(CompareFailed):
        s.create("/k", b"second")
    rev2 = s.cas("/k", b"third", rev)
    assert rev2 > rev
    with pytest.raises(CompareFailed):
        s.cas("/k", b"stale", rev)  # a writer holding the old revision loses
    assert s.get("/k").value == b"third"
    result = s.txn([Compare.value("/k", "=", b"third")], [Op.get("/k")], [Op.delete("/k")])
    assert result.succeeded and result.ranges[0][0].value == b"third"


def test_cas_race_between_two_sessions_exactly_one_wins(sessions):
    a, b = sessions(), sessions()
    a.put("/race", b"0")
    for round_ in range(20):
        seen = a.get("/race").mod_revision
        outcomes = {}

        def attempt(name, session, seen=seen, round_=round_, outcomes=outcomes):
            try:
                session.cas("/race", f"{name}{round_}".encode(), seen)
                outcomes[name] = "won"
            except CompareFailed:
                outcomes[name] = "lost"

        gevent.joinall([gevent.spawn(attempt, "a", a), gevent.spawn(attempt, "b", b)])
        assert sorted(outcomes.values()) == ["lost", "won"], outcomes
        winner = next(n for n, o in outcomes.items() if o == "won")
        assert a.get("/race").value == f"{winner}{round_}".encode()


def test_lost_lease_is_replaced_and_kept_keys_put_again(sessions):
    s, other = sessions(), sessions()
    s.keep("/nodes/c", b"c")
    renewed = []
    s.on_new_lease(renewed.append)
    old = s.lease_id
    other.gateway.call("lease/revoke", {"ID": str(old)})  # etcd drops the lease
    assert other.get("/nodes/c") is None
    assert wait_for(lambda: renewed, TTL + 2)
    assert s.lease_id != old and s.leases_granted == 2
    assert other.get("/nodes/c").lease == s.lease_id


def test_etcd_restarted_under_a_session_it_reconnects(etcd, sessions):
    s = sessions()
    s.keep("/nodes/r", b"r")
    events = []
    w = s.watch("/after/", events.extend, prefix=True)
    assert w.ready.wait(5)
    lease = s.lease_id
    etcd.restart()  # down well under the TTL: the same lease goes on
    s.put("/after/1", b"x")  # the call itself reconnects
    assert wait_for(lambda: len(events) == 1, 5), "the watch did not resume"
    assert w.restarts >= 1
    gevent.sleep(TTL + 0.5)
    assert s.lease_id == lease and s.get("/nodes/r").lease == lease


def test_etcd_down_longer_than_the_ttl_the_session_re_registers(etcd, sessions):
    s = sessions()
    s.keep("/nodes/d", b"d")
    events = []
    w = s.watch("/after/", events.extend, prefix=True)
    assert w.ready.wait(5)
    old = s.lease_id
    etcd.kill()
    # the lease's deadline passes while etcd is away: the node must take its keys as gone
    assert wait_for(lambda: not s.lease.alive, TTL + 2)
    etcd.start()
    assert s.wait_lease(10), "no new lease after etcd came back"
    assert s.leases_granted == 2 and s.lease_id != old
    kv = s.get("/nodes/d")
    assert kv is not None and kv.lease == s.lease_id  # re-registered on the new lease
    s.put("/after/2", b"y")
    assert wait_for(lambda: len(events) == 1, 5)
    # the old lease (restored by etcd at its start) expires without taking the key along
    gevent.sleep(TTL + 1.5)
    assert s.get("/nodes/d").lease == s.lease_id


def test_unreachable_endpoint_is_skipped(etcd, sessions):
    dead = f"127.0.0.1:{free_port()}"
    s = sessions(endpoints=f"{dead},{etcd.endpoint}")
    s.put("/ep", b"ok")
    assert s.get("/ep").value == b"ok"


MONKEY_PATCHED = """
from gevent import monkey; monkey.patch_all()
import sys, gevent
from nsqshm.consistence.etcd.session import EtcdSession
s = EtcdSession(sys.argv[1], ttl=2).start()
events = []
w = s.watch("/mp/", events.extend, prefix=True)
assert w.ready.wait(5)
s.keep("/mp/k", b"v")
gevent.sleep(2.5)  # past the TTL: the keep-alive greenlet ran
while not events:
    gevent.sleep(0.05)
assert s.get("/mp/k").lease == s.lease_id and events[0].kv.value == b"v"
s.close()
print("ok")
"""


def test_works_in_a_monkey_patched_process_as_the_daemons_are(etcd):
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", MONKEY_PATCHED, etcd.endpoint], cwd=root,
                         env={**os.environ, "PYTHONPATH": root}, capture_output=True,
                         text=True, timeout=30)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]
