"""nsqlookupd's side of a leadership move (LookupdCoordinator.move_partition) against
a real etcd, with the partition's leader played step by step through the same
Leadership and Topology calls a replicator makes, so that each moment between its
writes can be looked at."""

import gevent
import pytest

from nsqshm.consistence.leadership import Leadership
from nsqshm.consistence.lookupd_coordinator import MOVE_POLL, LookupdCoordinator
from nsqshm.consistence.topology import NodeInfo, TopicMeta, Topology
from nsqshm.nsqlookupd.options import parse_args
from tests.consistence.wait import wait_for


def node(sessions, node_id):
    topology = Topology(sessions(), "c1")
    info = NodeInfo(node_id, "127.0.0.1")
    topology.register_node(info)
    return Leadership(topology, info)


@pytest.fixture
def lookupd(etcd):
    """The coordinator of an nsqlookupd on the test's etcd, its master campaign and
    migrator not started (nothing but the move under test writes)."""
    opts = parse_args(["--cluster-id=c1", f"--cluster-leadership-addresses={etcd.endpoint}",
                       "--broadcast-address=127.0.0.1"])
    made = LookupdCoordinator(opts, lambda level, line: None, 4160, 4161)
    made.session.start()
    yield made
    made.session.close()


@pytest.fixture
def moving(sessions, lookupd):
    """Topic t, one partition on a, b, c, led by a; a leadership move from a to b
    asked of the lookupd (a greenlet), its MoveRequest put.  -> (a, b, greenlet)."""
    a, b, c = (node(sessions, n) for n in ("a", "b", "c"))
    a.topology.create_topic("t", TopicMeta(1, 3), [["a", "b", "c"]])
    a.elect("t", 0)
    asked = gevent.spawn(lookupd.move_partition, "t", 0, True, "a", "b")
    assert wait_for(lambda: a.topology.partition("t", 0).move is not None, 5)
    yield a, b, asked
    asked.kill()


def test_a_move_waits_while_the_leader_that_ended_it_has_not_resigned_yet(moving):
    """The leader hands off in three writes (replicator.hand_off): the new leader
    designated, the move ended, then its own leadership resigned.  A lookupd that
    reads between the last two still waits (CI: it answered "the move was given up"
    to a move that went through), and answers once the new leader is elected."""
    a, b, asked = moving
    state = a.topology.partition("t", 0)
    state = a.update_replicas(state, state.replicas.isr, state.replicas.catchup,
                              designated="b", preferred="b")
    assert a.topology.end_move("t", 0, a.topology.partition("t", 0).move)
    gevent.sleep(MOVE_POLL * 5)  # several reads of the lookupd fall in the gap
    assert not asked.ready(), asked.exception
    a.resign(a.topology.partition("t", 0))
    b.elect("t", 0)
    after = asked.get(timeout=10)
    assert (after.leader, after.replicas.leader) == ("b", "b")


def test_a_move_the_leader_gave_up_is_answered_at_once(moving):
    """A leader that ends the move without designating anyone (it gave up: the
    destination fell out of the ISR, etcd refused) is not waited for."""
    a, _, asked = moving
    assert a.topology.end_move("t", 0, a.topology.partition("t", 0).move)
    with pytest.raises(ValueError, match="the move was given up by the partition's leader a"):
        asked.get(timeout=MOVE_POLL * 20)
