"""Topology against a real etcd: Youzan's key layout, nodes on leases, topics created
once, partitions read at one revision, names checked before they become keys."""

import json

import pytest

from nsqshm.consistence.errors import InvalidName, TopicExists, TopicNotFound
from nsqshm.consistence.leadership import Leadership
from nsqshm.consistence.placement import spread
from nsqshm.consistence.topology import NodeInfo, TopicMeta, Topology


def test_nodes_register_on_their_lease_under_youzans_keys(sessions):
    a, b = sessions(), sessions()
    ta, tb = Topology(a, "c1"), Topology(b, "c1")
    ta.register_node(NodeInfo("n1", "10.0.0.1", tcp_port=4150, http_port=4151, rpc_port=4250))
    tb.register_node(NodeInfo("n2", "10.0.0.2", tcp_port=4150))
    assert [n.id for n in ta.nodes()] == ["n1", "n2"]
    kv = a.get("/NSQMetaData/c1/NsqdNodes/Node-n1")
    assert kv.lease == a.lease_id
    assert json.loads(kv.value) == {"ID": "n1", "NodeIP": "10.0.0.1", "TcpPort": "4150",
                                    "HttpPort": "4151", "RpcPort": "4250", "Version": ""}
    assert Topology(a, "other").nodes() == []  # clusters do not mix
    b.close(revoke=True)
    assert [n.id for n in ta.nodes()] == ["n1"]


def test_a_node_key_that_does_not_hold_a_node_is_left_out(sessions):
    """(Before, one bad value made every nodes() raise, and with it every peer check
    of every node's RPC port: replication stopped cluster-wide.)"""
    s = sessions()
    t = Topology(s, "c1")
    t.register_node(NodeInfo("n1", "10.0.0.1", rpc_port=4250))
    prefix = "/NSQMetaData/c1/NsqdNodes/Node-"
    for name, value in [("list", "[1, 2]"), ("noid", '{"NodeIP": "10.0.0.9"}'),
                        ("badid", '{"ID": "a/b"}'), ("port", '{"ID": "n9", "RpcPort": "70000"}'),
                        ("workers", '{"ID": "n9", "Workers": 0}'), ("text", "not json"),
                        ("ports", '{"ID": "n9", "RpcPort": "65535", "Workers": 2}')]:
        s.put(prefix + name, value)
    assert [n.id for n in t.nodes()] == ["n1"]


def test_create_topic_once_with_its_partitions(sessions):
    s = sessions()
    t = Topology(s, "c1")
    placement = spread(["n1", "n2", "n3"], 3, 2)
    assert placement == [["n1", "n2"], ["n3", "n1"], ["n2", "n3"]]
    t.create_topic("orders", TopicMeta(partition_num=3, replica=2, sync_every=1), placement)
    with pytest.raises(TopicExists):
        t.create_topic("orders", TopicMeta(1, 1), [["n1"]])
    assert t.topic_meta("orders") == TopicMeta(partition_num=3, replica=2, sync_every=1)
    assert json.loads(s.get("/NSQMetaData/c1/Topics/orders/TopicMeta").value)["PartitionNum"] == 3
    states = t.partitions("orders")
    assert [(st.replicas.leader, st.replicas.isr) for st in states] == [
        ("n1", ("n1", "n2")), ("n3", ("n3", "n1")), ("n2", ("n2", "n3"))]
    assert t.load() == {"n1": (1, 2), "n2": (1, 2), "n3": (1, 2)}
    assert all(st.leader_session is None and st.epoch > 0 for st in states)
    assert t.topics() == ["orders"]
    assert t.delete_topic("orders") == 4
    with pytest.raises(TopicNotFound):
        t.topic_meta("orders")
    with pytest.raises(TopicNotFound):
        t.partition("orders", 0)


def test_placement_balances_what_the_nodes_already_lead_and_hold(sessions):
    """Topics of one partition each: their leaderships and copies go round the
    nodes (each placed on the layout etcd holds, Topology.load), where a
    placement blind to it put every leader on the first node."""
    nodes = {}
    for node_id in ("n1", "n2", "n3"):
        t = Topology(sessions(), "c1")
        t.register_node(NodeInfo(node_id, "127.0.0.1"))
        nodes[node_id] = t
    t = nodes["n1"]
    leaders = [t.create_topic_on_live_nodes(f"t{i}", TopicMeta(partition_num=1, replica=2))[0][0]
               for i in range(6)]
    assert sorted(leaders) == ["n1", "n1", "n2", "n2", "n3", "n3"], leaders
    assert t.load() == {"n1": (2, 4), "n2": (2, 4), "n3": (2, 4)}
    # a topic of 3 partitions on top: one more leadership and two more copies each
    placement = t.create_topic_on_live_nodes("wide", TopicMeta(partition_num=3, replica=2))
    assert sorted(p[0] for p in placement) == ["n1", "n2", "n3"]
    assert t.load() == {"n1": (3, 6), "n2": (3, 6), "n3": (3, 6)}
    # an uneven layout is evened out: the nodes leading least lead the next ones
    assert spread(["n1", "n2", "n3"], 2, 1, {"n1": (4, 4), "n2": (1, 1)}) == [["n3"], ["n2"]]
    # a topic's own partitions first: a node that joins empty takes its share of a new
    # topic's leaderships, not all of them
    placed = spread(["n1", "n2", "n3", "n4"], 8, 2, {n: (10, 20) for n in ("n1", "n2", "n3")})
    assert sorted(p[0] for p in placed) == ["n1", "n1", "n2", "n2", "n3", "n3", "n4", "n4"]


@pytest.mark.parametrize("topic", ["a/b", "../x", "", "t#ephemeral", "x" * 65, "a b"])
def test_bad_topic_names_never_become_keys(sessions, topic):
    t = Topology(sessions(), "c1")
    with pytest.raises(InvalidName):
        t.create_topic(topic, TopicMeta(1, 1), [["n1"]])


@pytest.mark.parametrize("node_id", ["a/b", "", "x" * 129, "n\n"])
def test_bad_node_ids_are_refused(sessions, node_id):
    t = Topology(sessions(), "c1")
    with pytest.raises(InvalidName):
        t.register_node(NodeInfo(node_id, "127.0.0.1"))
    with pytest.raises(InvalidName):
        t.create_topic("t", TopicMeta(1, 1), [[node_id]])


def test_bad_cluster_id_and_partition():
    with pytest.raises(InvalidName):
        Topology(None, "a/b")
    t = Topology(None, "c1")
    for partition in (-1, 1024, "0", True):
        with pytest.raises(InvalidName):
            t.keys.partition("t", partition)


def test_topic_on_live_nodes_and_its_leaders(sessions):
    from nsqshm.consistence.leadership import Leadership
    nodes = {}
    for node_id in ("n1", "n2", "n3"):
        t = Topology(sessions(), "c1")
        info = NodeInfo(node_id, "127.0.0.1", tcp_port=4150 + int(node_id[1]))
        t.register_node(info)
        nodes[node_id] = (t, info)
    t1 = nodes["n1"][0]
    placement = t1.create_topic_on_live_nodes("orders", TopicMeta(partition_num=3, replica=2))
    assert sorted(p[0] for p in placement) == ["n1", "n2", "n3"]
    assert t1.leaders("orders") == [None, None, None]  # nobody elected yet
    t, info = nodes[placement[1][0]]
    Leadership(t, info).elect("orders", 1)
    assert t1.leaders("orders") == [None, info, None]
    with pytest.raises(ValueError):  # replicator 4 needs 4 live nodes
        t1.create_topic_on_live_nodes("big", TopicMeta(partition_num=1, replica=4))


def test_only_the_live_leader_keeps_the_tombstones(sessions):
    """A partition's deleted channels are written by its leader while it holds its
    session: a deposed leader's, or one whose topic was deleted meanwhile, would
    leave them to a topic made again under the name."""
    s = sessions()
    t = Topology(s, "c1")
    node = NodeInfo("a", "10.0.0.1")
    t.register_node(node)
    t.create_topic("t", TopicMeta(1, 1), [["a"]])
    held = Leadership(t, node).elect("t", 0).leader_session.create_revision
    assert t.set_deleted_channels("t", 0, {"gone", "old"}, held)
    assert t.deleted_channels("t", 0) == {"gone", "old"}
    assert t.set_deleted_channels("t", 0, set(), held)  # none left: the key goes
    assert s.get(t.keys.deleted_channels("t", 0)) is None
    t.delete_topic("t")
    assert not t.set_deleted_channels("t", 0, {"gone"}, held)
    t.create_topic("t", TopicMeta(1, 1), [["a"]])
    assert t.deleted_channels("t", 0) == set()
