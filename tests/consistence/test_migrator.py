"""The master nsqlookupd's replacement of lost replicas (consistence/migrator.py):
the plan, table-driven on partition states as etcd holds them, then a real cluster
(three nsqd in network namespaces, a real etcd: cluster.py) where a follower's node
is gone and its replica moves to the spare node."""

import json

import pytest

from nsqshm.consistence.migrator import plan, rebalance, removal_states
from nsqshm.consistence.topology import (
    LeaderSession,
    MoveRequest,
    NodeInfo,
    PartitionState,
    ReplicaInfo,
)
from tests.consistence.cluster import Client, Cluster
from tests.consistence.etcd_server import ETCD
from tests.consistence.netns import available
from tests.consistence.test_replication import consume_all, isr, publish, wait_until
from tests.nsqadmin.conftest import Admin

A, B, C, D = "10.0.0.1:4250", "10.0.0.2:4250", "10.0.0.3:4250", "10.0.0.4:4250"
WAIT, URGENT = 600.0, 10.0


def on_a_cluster(timeout):
    """A test on a real cluster (cluster.py: network namespaces, a real etcd), on
    one and two workers a node."""
    marks = [pytest.mark.skipif(bool(available()), reason=available() or "available"),
             pytest.mark.skipif(ETCD is None, reason="etcd not installed (scripts/setup.sh)"),
             pytest.mark.timeout(timeout),
             pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])]

    def mark(test):
        for m in reversed(marks):
            test = m(test)
        return test
    return mark


def state(isr, catchup=(), partition=0, leader=True, move=None, designated=None,
          preferred=""):
    session = LeaderSession("t", partition, NodeInfo(id=isr[0], ip="10.0.0.1", tcp_port=1,
                                                     http_port=2), "1", 1) if leader else None
    return PartitionState("t", partition, ReplicaInfo(leader=designated or isr[0],
                                                      isr=tuple(isr), catchup=tuple(catchup),
                                                      preferred=preferred),
                          leader_session=session, move=move)


@pytest.mark.parametrize("partitions, live, lost_for, want", [
    # replicator 2, the follower's node gone: half the replicas left, urgent
    ([(state([A, B]), 2)], {A, C}, URGENT, [(0, B, C)]),
    ([(state([A, B]), 2)], {A, C}, URGENT - 1, []),
    # out of the ISR already (the leader moved it to the catch-up list): the same
    ([(state([A], [B]), 2)], {A, C}, URGENT, [(0, B, C)]),
    # replicator 3, one of three gone: not urgent, the long wait
    ([(state([A, B, C]), 3)], {A, B, D}, URGENT, []),
    ([(state([A, B, C]), 3)], {A, B, D}, WAIT, [(0, C, D)]),
    # every node holds a replica: nowhere to move it
    ([(state([A, B]), 2)], {A}, WAIT, []),
    # a move that gave up (timed out): its live catch-up member takes the lost one's
    # place, the copy going on, not another spare node
    ([(state([A], [B, C]), 2)], {A, C, D}, URGENT, [(0, B, C)]),
    # ... but a live catch-up member does not make up for the lost one when the
    # copies are short without it (replicator 3: A, C and a spare)
    ([(state([A], [B, C]), 3)], {A, C, D}, URGENT, [(0, B, D)]),
    # copies enough (a live ISR beside the lost one): after the long wait it leaves
    ([(state([A, C], [B]), 2)], {A, C, D}, URGENT, []),
    ([(state([A, C], [B]), 2)], {A, C, D}, WAIT, [(0, B, C)]),
    # no live leader (the election comes first), or a move under way: left alone
    ([(state([A, B], leader=False), 2)], {A, C}, WAIT, []),
    ([(state([A, B], move=MoveRequest(A, C, True)), 2)], {A, C}, WAIT, []),
    # the live leader's node is never lost (worker 0, which keeps the node's key,
    # may stall while the worker that leads lives)
    ([(state([A, B]), 2)], {B, C}, WAIT, []),
    # the spare node with the fewest replicas is taken, and counted for the next
    ([(state([A, B], partition=0), 2), (state([A, B], partition=1), 2),
      (state([C, A], partition=2), 2)], {A, C, D}, URGENT, [(0, B, D), (1, B, C)]),
])
def test_plan(partitions, live, lost_for, want):
    lost_since = {}
    assert plan(partitions, live, lost_since, 1000.0, WAIT, URGENT)[0] == []  # first seen
    got, _ = plan(partitions, live, lost_since, 1000.0 + lost_for, WAIT, URGENT)
    assert [(st.partition, m.from_, m.to) for st, m in got] == want
    assert all(not m.leader for _, m in got)


@pytest.mark.parametrize("partitions, live, removing, want", [
    # the leader's node is removed: its leadership goes to the ISR member that stays
    ([(state([A, B]), 2)], {A, B, C}, {A}, [(0, A, B, True)]),
    # ... or, with no other ISR member (or only ones removed too), to the spare node,
    # which catches up before it takes the leadership
    ([(state([A]), 1)], {A, B}, {A}, [(0, A, B, True)]),
    ([(state([A, B]), 2)], {A, B, C}, {A, B}, [(0, A, C, True)]),
    # a follower's node is removed: a spare node takes its replica (copies short
    # without it) ...
    ([(state([A, B]), 2)], {A, B, C}, {B}, [(0, B, C, False)]),
    # ... or it only leaves (copies enough without it)
    ([(state([A, B, C]), 2)], {A, B, C}, {B}, [(0, B, C, False)]),
    # ... and waits for a node while there is no spare
    ([(state([A, B]), 2)], {A, B}, {B}, []),
    # a removed node that is gone too: at once, not after the wait
    ([(state([A, B]), 2)], {A, C}, {B}, [(0, B, C, False)]),
    # a node being removed is no spare for a lost replica
    ([(state([A, B]), 2)], {A, C, D}, {C}, []),
    # a hand-off that gave up left a catch-up member: it takes the leadership, its
    # copy going on, not another spare node each time
    ([(state([A], [C]), 1)], {A, B, C, D}, {A}, [(0, A, C, True)]),
    # a hand-off under way (the designated leader named, the old one not resigned
    # yet): not planned again
    ([(state([A, B], designated=B), 2)], {A, B, C}, {A}, []),
])
def test_plan_empties_a_node_being_removed(partitions, live, removing, want):
    got, again = plan(partitions, live, {}, 1000.0, WAIT, URGENT, frozenset(removing))
    assert [(st.partition, m.from_, m.to, m.leader) for st, m in got] == want
    if not want:
        assert again in (None, URGENT)


def test_plan_takes_a_lost_replica_to_a_node_not_being_removed():
    lost_since = {}
    partitions = [(state([A, B]), 2)]
    plan(partitions, {A, C, D}, lost_since, 0.0, WAIT, URGENT, frozenset({C}))
    got, _ = plan(partitions, {A, C, D}, lost_since, URGENT, WAIT, URGENT, frozenset({C}))
    assert [(m.from_, m.to) for _, m in got] == [(B, D)]


def test_plan_names_the_partitions_that_wait_for_their_keys():
    """Only these make a change under the topics' keys worth a look (Migrator's
    topics watch): a move planned, no live leader, a move under way."""
    partitions = [(state([A, B], partition=0), 2),  # B removed: a move planned
                  (state([A, C], partition=1, leader=False), 2),  # C removed, no leader
                  (state([A, D], partition=2, move=MoveRequest(D, B, False)), 2),
                  (state([A, B, C], partition=3), 3)]  # nowhere to go (no spare node)
    waiting = []
    moves, _ = plan(partitions, {A, B, C, D}, {}, 0.0, WAIT, URGENT,
                    frozenset({B, C, D}), waiting)
    assert [st.partition for st, _ in moves] == []  # (no spare: B, C, D all removed)
    assert [st.partition for st in waiting] == [1, 2]
    waiting = []
    moves, _ = plan(partitions[:1], {A, B, C}, {}, 0.0, WAIT, URGENT, frozenset({B}), waiting)
    assert [(m.from_, m.to) for _, m in moves] == [(B, C)]
    assert [st.partition for st in waiting] == [0]


def test_plan_times_nothing_when_lost_replicas_are_never_replaced():
    lost_since = {}
    assert plan([(state([A, B]), 2)], {A, C}, lost_since, 0.0, 0.0, 0.0) == ([], None)
    assert lost_since == {}


REBALANCE = 300.0


@pytest.mark.parametrize("partition, live, removing, want", [
    # led by B (a failover) while A, its preferred leader, is back in the ISR: back to A
    (state([B, A], preferred=A), {A, B}, (), (B, A)),
    # A still catching up, gone, or being removed; no preference (an older key); led by
    # its preferred leader already; no live leader; a move or a hand-off under way
    (state([B], [A], preferred=A), {A, B}, (), None),
    (state([B, A], preferred=A), {B}, (), None),
    (state([B, A], preferred=A), {A, B}, {A}, None),
    (state([B, A]), {A, B}, (), None),
    (state([A, B], preferred=A), {A, B}, (), None),
    (state([B, A], preferred=A, leader=False), {A, B}, (), None),
    (state([B, A], preferred=A, move=MoveRequest(B, C, False)), {A, B, C}, (), None),
    (state([B, A], preferred=A, designated=A), {A, B}, (), None),
])
def test_rebalance_hands_the_leadership_back_to_the_preferred_leader(partition, live,
                                                                     removing, want):
    since = {}
    got, again = rebalance([(partition, 2)], live, frozenset(removing), since, 0.0, REBALANCE)
    assert got == []  # not before the wait
    assert again == (REBALANCE if want else None)
    got, _ = rebalance([(partition, 2)], live, frozenset(removing), since, REBALANCE,
                       REBALANCE)
    assert [(m.from_, m.to, m.leader) for _, m in got] == ([(*want, True)] if want else [])


def test_rebalance_forgets_a_partition_led_by_its_preferred_leader_again_and_a_wait_of_0():
    since = {}
    imbalanced = [(state([B, A], preferred=A), 2)]
    rebalance(imbalanced, {A, B}, frozenset(), since, 0.0, REBALANCE)
    assert since == {("t", 0): 0.0}
    rebalance([(state([A, B], preferred=A), 2)], {A, B}, frozenset(), since, 1.0, REBALANCE)
    assert since == {}
    assert rebalance(imbalanced, {A, B}, frozenset(), since, 1e9, 0.0) == ([], None)
    waiting = []  # a preferred leader catching up: its joining the ISR is worth a look
    rebalance([(state([B], [A], preferred=A), 2)], {A, B}, frozenset(), since, 0.0,
              REBALANCE, waiting)
    assert len(waiting) == 1


def test_rebalance_tries_again_only_after_another_wait():
    """A hand-off that does not take (the preferred leader lost the election) is
    not tried at every check; one under way keeps its time and waits for its keys."""
    since = {}
    led_by_b = [(state([B, A], preferred=A), 2)]
    rebalance(led_by_b, {A, B}, frozenset(), since, 0.0, REBALANCE)
    assert len(rebalance(led_by_b, {A, B}, frozenset(), since, REBALANCE, REBALANCE)[0]) == 1
    assert rebalance(led_by_b, {A, B}, frozenset(), since, REBALANCE + 1, REBALANCE) == \
        ([], REBALANCE - 1)
    waiting = []
    handing = [(state([B, A], preferred=A, designated=A), 2)]
    assert rebalance(handing, {A, B}, frozenset(), since, REBALANCE + 2, REBALANCE,
                     waiting) == ([], None)
    assert len(waiting) == 1 and since == {("t", 0): REBALANCE}


def test_removal_states():
    partitions = [(state([A, B], [C]), 2)]
    assert removal_states(partitions, {A, C, D}) == {A: "pending", C: "pending",
                                                    D: "data_transferred"}
    # a move put before D was marked, read before its leader (or, in a failover, no
    # leader) added D to the catch-up list: D is about to hold a replica
    moving = [(state([A, B], move=MoveRequest(B, D, False)), 2)]
    assert removal_states(moving, {C, D}) == {C: "data_transferred", D: "pending"}


def test_plan_says_when_to_look_again():
    lost_since = {}
    assert plan([(state([A, B]), 2)], {A, B, C}, lost_since, 0.0, WAIT, URGENT) == ([], None)
    # lost: at its due time, not before
    assert plan([(state([A, B]), 2)], {A, C}, lost_since, 0.0, WAIT, URGENT) == ([], URGENT)
    assert plan([(state([A, B]), 2)], {A, C}, lost_since, 4.0, WAIT, URGENT) == \
        ([], URGENT - 4.0)
    # nothing can be done (no spare node): not before the nodes change
    assert plan([(state([A, B]), 2)], {A}, lost_since, 5.0, WAIT, URGENT) == ([], None)
    # an election or a move to wait for: its keys' change wakes the check, no timer
    assert plan([(state([A, B], leader=False), 2)], {A, C}, lost_since, 5.0, WAIT,
                URGENT) == ([], None)


def test_plan_forgets_a_node_back_and_the_waits_of_zero():
    lost_since = {}
    partitions = [(state([A, B]), 2)]
    plan(partitions, {A, C}, lost_since, 0.0, WAIT, URGENT)
    assert lost_since == {("t", 0, B): 0.0}
    assert plan(partitions, {A, B, C}, lost_since, 5.0, WAIT, URGENT)[0] == []  # B is back
    assert lost_since == {}
    assert plan(partitions, {A, C}, lost_since, 6.0, WAIT, URGENT)[0] == []  # lost: anew
    assert plan(partitions, {A, C}, lost_since, 6.0 + URGENT - 1, WAIT, URGENT)[0] == []
    # urgent wait 0: the long wait; both 0: never
    assert plan(partitions, {A, C}, lost_since, 6.0 + URGENT, WAIT, 0.0)[0] == []
    assert len(plan(partitions, {A, C}, lost_since, 6.0 + WAIT, WAIT, 0.0)[0]) == 1
    assert plan(partitions, {A, C}, lost_since, 1e9, 0.0, 0.0) == ([], None)


@on_a_cluster(timeout=120)
def test_a_replica_whose_node_is_gone_moves_to_the_spare_node(tmp_path, workers):
    cluster = Cluster(tmp_path, workers=workers,
                      lookupd_args=["--lost-replica-urgent-wait=1s"])
    try:
        assert cluster.create_topic("kept", 1, 2)[0] == 200
        leader = cluster.leader("kept")
        wait_until(lambda: len(isr(cluster, "kept")) == 2, 15, "both replicas in the ISR")
        follower = cluster.node(next(n for n in isr(cluster, "kept") if n != leader.id))
        spare = next(n for n in cluster.nodes if n not in (leader, follower))
        publish(leader, "kept", [b"a%03d" % i for i in range(50)])

        follower.kill()  # for good: its registration goes with its lease (2 s)
        publish(leader, "kept", [b"b%03d" % i for i in range(50)])
        def replicas():
            layout = cluster.lookupd.get_json("/cluster/topic?topic=kept")["partitions"][0]
            return set(layout["isr"]), set(layout["catchup"])

        wait_until(lambda: replicas() == ({leader.id, spare.id}, set()), 30,
                   "the spare node takes the lost replica's place: in the ISR, and the "
                   "lost one no longer a replica")
        assert spare.end_offset("kept") == 100

        # the new replica holds every acknowledged message: elected, it delivers them
        leader.kill()
        assert cluster.leader("kept", not_in=(leader.id,), timeout=20) is spare
        got = consume_all(spare, "kept", 100)
        assert got == [b"%s%03d" % (k, i) for k in (b"a", b"b") for i in range(50)]
    finally:
        cluster.close()


def consume_partition(node, topic, partition, count):
    client = Client(node)
    try:
        return client.consume(topic, "audit", count, partition)
    finally:
        client.close()


@on_a_cluster(timeout=150)
def test_a_node_removed_by_the_operator_hands_off_and_empties(tmp_path, workers):
    """`/cluster/node/remove`: the node's leadership goes to a replica that stays, its
    replicas to the spare node; no message acknowledged is lost, no new topic is
    placed on it, and its mark goes once it is stopped."""
    cluster = Cluster(tmp_path, workers=workers)
    try:
        lookupd = cluster.lookupd
        assert cluster.create_topic("rm", 2, 2)[0] == 200
        for part in range(2):
            wait_until(lambda part=part: len(isr(cluster, "rm", part)) == 2, 15, "both in ISR")
            publish(cluster.leader("rm", part), "rm", [b"%d-a%03d" % (part, i)
                                                       for i in range(50)], partition=part)
        gone = cluster.leader("rm", 1)
        assert gone.id in isr(cluster, "rm", 0) | isr(cluster, "rm", 1)

        assert lookupd.post("/cluster/node/remove") == (400, b'{"message":"MISSING_ARG_NODE"}')
        assert lookupd.post("/cluster/node/remove?remove_node=a/b") == \
            (400, b'{"message":"INVALID_ARG_NODE"}')
        assert lookupd.post("/cluster/node/remove?remove_node=10.9.9.9:1")[0] == 404
        status, body = lookupd.post(f"/cluster/node/remove?remove_node={gone.id}")
        assert status == 200 and json.loads(body)["node"] == gone.id, body

        def node_entry(node_id):
            nodes = lookupd.get_json("/cluster/nodes")["nodes"]
            return next((n for n in nodes if n["id"] == node_id), None)

        wait_until(lambda: node_entry(gone.id)["removing"] == "data_transferred", 60,
                   "the removed node's leadership and replicas moved off it")
        assert node_entry(gone.id)["leaders"] == node_entry(gone.id)["replicas"] == 0
        for part in range(2):
            assert len(isr(cluster, "rm", part)) == 2 and gone.id not in isr(cluster, "rm", part)
            leader = cluster.leader("rm", part)
            assert leader is not gone
            publish(leader, "rm", [b"%d-b%03d" % (part, i) for i in range(50)], partition=part)
            assert consume_partition(leader, "rm", part, 100) == \
                [b"%d-%s%03d" % (part, k, i) for k in (b"a", b"b") for i in range(50)]

        # no new topic is placed on it; marking it again says where it stands
        assert cluster.create_topic("rm2", 3, 2)[0] == 200
        layout = lookupd.get_json("/cluster/topic?topic=rm2")["partitions"]
        assert all(gone.id not in entry["isr"] for entry in layout)
        status, body = lookupd.post(f"/cluster/node/remove?remove_node={gone.id}")
        assert (status, json.loads(body)["state"]) == (200, "data_transferred")

        gone.stop()  # its mark goes with its registration
        wait_until(lambda: node_entry(gone.id) is None, 20, "the removed node's mark deleted")
        assert lookupd.post(f"/cluster/node/remove?remove_node={gone.id}&restore=true")[0] \
            == 404
    finally:
        cluster.close()


@on_a_cluster(timeout=120)
def test_the_leadership_goes_back_to_the_preferred_leader_once_it_is_in_sync(tmp_path,
                                                                            workers):
    """After a failover the old leader, back and in the ISR, leads again once
    --leader-rebalance-wait has passed (Kafka's preferred replica election): its
    placement chose it, and leaderships do not pile up on the nodes that survived."""
    cluster = Cluster(tmp_path, workers=workers, lookupd_args=["--leader-rebalance-wait=1s"])
    try:
        assert cluster.create_topic("back", 1, 3)[0] == 200
        first = cluster.leader("back")
        layout = cluster.lookupd.get_json("/cluster/topic?topic=back")["partitions"][0]
        assert layout["preferred_leader"] == first.id
        wait_until(lambda: len(isr(cluster, "back")) == 3, 15, "a full ISR")
        publish(first, "back", [b"a%03d" % i for i in range(50)])
        first.kill()
        second = cluster.leader("back", not_in=(first.id,), timeout=20)
        publish(second, "back", [b"b%03d" % i for i in range(50)])
        # nsqadmin's replication table names the preferred leader beside the one leading
        admin = Admin([f"--lookupd-http-address={cluster.lookupd.http_address}"])
        try:
            status, _, page = admin.get("/topics/back")
            assert status == 200
            assert f'<td class="leader">{second.id} <span class="muted preferred"' in \
                page.decode() and f"(preferred: {first.id})" in page.decode()
        finally:
            admin.stop()
        first.start()
        wait_until(lambda: cluster.leader("back") is first, 40,
                   "the preferred leader leads again, once back in the ISR")
        publish(first, "back", [b"c%03d" % i for i in range(10)])
        assert consume_all(first, "back", 110) == \
            [b"%s%03d" % (k, i) for k in (b"a", b"b") for i in range(50)] + \
            [b"c%03d" % i for i in range(10)]
        layout = cluster.lookupd.get_json("/cluster/topic?topic=back")["partitions"][0]
        assert (layout["leader"], layout["preferred_leader"]) == (first.id, first.id)
    finally:
        cluster.close()
