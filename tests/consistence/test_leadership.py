"""Leadership against a real etcd: elections among the ISR, exactly one winner, a
follower taking over when the leader's process is killed, epochs that fence a
deposed leader, and role watches."""

import json
import os
import subprocess
import sys
import time

import gevent
import pytest

from nsqshm.consistence.errors import CompareFailed, Fenced, LeaderAlive, NotInISR
from nsqshm.consistence.leadership import CANDIDATE, CATCHUP, FOLLOWER, LEADER, NONE, Leadership
from nsqshm.consistence.topology import NodeInfo, TopicMeta, Topology
from tests.consistence.conftest import TTL
from tests.consistence.wait import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def node(sessions, node_id):
    topology = Topology(sessions(), "c1")
    info = NodeInfo(node_id, "127.0.0.1")
    topology.register_node(info)
    return Leadership(topology, info)


def make_topic(leadership, replicas=("a", "b", "c"), topic="t"):
    leadership.topology.create_topic(topic, TopicMeta(1, len(replicas)), [list(replicas)])


def test_election_bumps_the_epoch_and_refuses_while_the_leader_lives(sessions):
    a, b = node(sessions, "a"), node(sessions, "b")
    make_topic(a)
    before = a.topology.partition("t", 0)
    state = a.elect("t", 0)
    assert state.leader == "a" and state.epoch > before.epoch
    assert state.replicas.epoch_for_write == before.replicas.epoch_for_write + 1
    assert state.leader_session.session == f"{a.session.lease_id:x}"
    assert a.session.get(a.keys.leader_session("t", 0)).lease == a.session.lease_id
    with pytest.raises(LeaderAlive):
        b.elect("t", 0)
    assert a.elect("t", 0) == a.topology.partition("t", 0)  # already ours: no change


def test_only_an_isr_member_can_be_elected(sessions):
    a, d = node(sessions, "a"), node(sessions, "d")
    make_topic(a, ("a", "b"))
    with pytest.raises(NotInISR):
        d.elect("t", 0)


def test_concurrent_candidates_exactly_one_wins(sessions):
    cands = [node(sessions, n) for n in ("a", "b", "c")]
    make_topic(cands[0])
    for round_ in range(5):
        topic = f"t{round_}"
        make_topic(cands[0], topic=topic)
        results = {}

        def run(c, topic=topic, results=results):
            try:
                results[c.node.id] = c.elect(topic, 0).epoch
            except (CompareFailed, LeaderAlive):
                results[c.node.id] = None

        gevent.joinall([gevent.spawn(run, c) for c in cands])
        winners = [n for n, epoch in results.items() if epoch is not None]
        assert len(winners) == 1, results
        assert cands[0].topology.partition(topic, 0).leader == winners[0]


def test_isr_shrink_and_expand_with_compare_and_set_on_the_epoch(sessions):
    a = node(sessions, "a")
    make_topic(a)
    s1 = a.elect("t", 0)
    s2 = a.shrink_isr(s1, "c")
    assert s2.replicas.isr == ("a", "b") and s2.replicas.catchup == ("c",)
    assert s2.epoch > s1.epoch
    with pytest.raises(Fenced):
        a.expand_isr(s1, "c")  # an old epoch: refused
    s3 = a.expand_isr(s2, "c")
    assert s3.replicas.isr == ("a", "b", "c") and s3.replicas.catchup == ()
    assert a.topology.partition("t", 0).epoch == s3.epoch


def test_a_follower_cannot_change_the_isr(sessions):
    a, b = node(sessions, "a"), node(sessions, "b")
    make_topic(a)
    a.elect("t", 0)
    with pytest.raises(Fenced):
        b.shrink_isr(b.topology.partition("t", 0), "a")


def test_a_follower_takes_over_when_the_leader_process_is_killed(etcd, sessions):
    b = node(sessions, "b")
    make_topic(b, ("a", "b"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.consistence.leader_node", etcd.endpoint, "c1", "a", "t",
         "0", str(TTL)], stdout=subprocess.PIPE, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT})
    try:
        old = json.loads(proc.stdout.readline())
        assert old["leader"] == "a"
        roles = []
        elected = []

        def on_role(role, state):
            roles.append(role)
            if role == CANDIDATE:
                elected.append(b.elect("t", 0))

        watch = b.watch_role("t", 0, on_role)
        assert roles == [FOLLOWER]
        proc.kill()  # SIGKILL: no revoke, the lease runs out
        killed = time.monotonic()
        assert wait_for(lambda: elected, TTL + 3), roles
        took = time.monotonic() - killed
        assert took <= TTL + 1.5, took  # within the lease TTL (plus etcd's expiry tick)
        new = elected[0]
        assert new.leader == "b" and new.epoch > old["epoch"]
        assert wait_for(lambda: roles[-1] == LEADER, 2), roles
        assert roles == [FOLLOWER, CANDIDATE, LEADER]
        assert [n.id for n in b.topology.nodes()] == ["b"]  # a's registration went too
        watch.stop()
    finally:
        proc.kill()
        proc.wait()


def test_a_deposed_leaders_isr_write_is_refused(sessions):
    a, b = node(sessions, "a"), node(sessions, "b")
    make_topic(a, ("a", "b"))
    held = a.elect("t", 0)
    a.session.close(revoke=False)  # a stops its keep-alive (hung, or cut off from etcd)
    assert wait_for(lambda: b.topology.partition("t", 0).leader_session is None, TTL + 3)
    new = b.elect("t", 0)
    assert new.epoch > held.epoch
    with pytest.raises(Fenced):
        a.shrink_isr(held, "b")  # the old leader tries to drop the new one: fenced
    assert b.topology.partition("t", 0).replicas.isr == ("a", "b")


def test_a_leader_whose_session_expired_is_fenced_before_any_election(sessions):
    a, b = node(sessions, "a"), node(sessions, "b")
    make_topic(a, ("a", "b"))
    held = a.elect("t", 0)
    b.session.gateway.call("lease/revoke", {"ID": str(a.session.lease_id)})
    with pytest.raises(Fenced):  # same epoch, but its leader session is gone
        a.shrink_isr(held, "b")


def test_graceful_resign_lets_a_follower_in_at_once(sessions):
    a, b = node(sessions, "a"), node(sessions, "b")
    make_topic(a, ("a", "b"))
    held = a.elect("t", 0)
    assert a.resign(held)
    assert b.elect("t", 0).leader == "b"
    assert not a.resign(held)  # no longer ours


def test_role_watch_reports_each_change(sessions):
    a, b = node(sessions, "a"), node(sessions, "b")
    make_topic(a, ("a", "b"))
    roles = []
    w = b.watch_role("t", 0, lambda role, state: roles.append(role))
    assert roles == [CANDIDATE]  # b in the ISR, nobody leads

    def step(expected):
        assert wait_for(lambda: roles[-1] == expected, 5), roles

    held = a.elect("t", 0)
    step(FOLLOWER)
    s2 = a.shrink_isr(held, "b")
    step(CATCHUP)
    s3 = a.expand_isr(s2, "b")
    step(FOLLOWER)
    a.update_replicas(s3, ["a"], [])
    step(NONE)
    assert roles == [CANDIDATE, FOLLOWER, CATCHUP, FOLLOWER, NONE]
    a.topology.delete_topic("t")
    gevent.sleep(0.3)
    assert roles[-1] == NONE and w.state is None
    w.stop()


def test_a_leaders_role_watch_reports_an_isr_change_it_did_not_hear_of(sessions):
    """An ISR change the leader made whose answer from etcd was lost is in etcd
    all the same: the leader's role watch reports it (role LEADER, the new
    replicas), so its commits count the member it added."""
    a = node(sessions, "a")
    make_topic(a, ("a", "b"))
    held = a.elect("t", 0)
    shrunk = a.shrink_isr(held, "b")
    seen = []
    w = a.watch_role("t", 0, lambda role, state: seen.append((role, state.replicas.isr)))
    assert seen == [(LEADER, ("a",))]
    a.expand_isr(shrunk, "b")  # its answer, as if lost: only the watch tells
    assert wait_for(lambda: seen[-1] == (LEADER, ("a", "b")), 5), seen
    w.stop()


def test_a_topic_made_again_starts_above_every_write_epoch_of_the_old_one(sessions):
    """Write epochs start at the store's revision when a topic is made, so a
    topic deleted and made again under the same name refuses a late frame of
    the old topic's leader as stale (epochs from 0 again took it as newer)."""
    a, b = node(sessions, "a"), node(sessions, "b")
    make_topic(a, ("a", "b"))
    held = a.elect("t", 0)
    for _ in range(3):  # leader changes, each a write epoch more
        leader, other = (a, b) if held.replicas.leader == "a" else (b, a)
        assert leader.resign(held)
        held = other.elect("t", 0)
    old_epoch = held.replicas.epoch_for_write
    a.topology.delete_topic("t")
    make_topic(a, ("a", "b"))
    again = a.topology.partition("t", 0)
    assert again.replicas.epoch_for_write > old_epoch


def test_leadership_survives_an_etcd_restart(etcd, sessions):
    a, b = node(sessions, "a"), node(sessions, "b")
    make_topic(a, ("a", "b"))
    held = a.elect("t", 0)
    roles = []
    watch = b.watch_role("t", 0, lambda role, state: roles.append(role))
    etcd.restart()  # shorter than the TTL: no failover
    state = a.shrink_isr(held, "b")  # the leader's session and epoch still hold
    assert state.leader == "a" and state.leader_session.create_revision == \
        held.leader_session.create_revision
    assert wait_for(lambda: roles[-1] == CATCHUP, 5), roles
    gevent.sleep(TTL + 0.5)
    assert b.topology.partition("t", 0).leader == "a"
    assert roles == [FOLLOWER, CATCHUP]
    watch.stop()
