"""A follower's checks of a leader's APPEND (NsqdCoordinator.on_append), driven
from inside the leader's network namespace as the leader's node (its ID, its
address, its write epoch): what a deposed leader's late frame or a stream from
another leader would look like to the follower.  Three nsqd in network
namespaces and a real etcd (cluster.py)."""

import json
import subprocess
import sys
import textwrap

import pytest

from nsqshm.consistence import rpc
from nsqshm.consistence.etcd.session import EtcdSession
from nsqshm.nsqd.logtopics.partition import partition_owner
from tests.consistence.cluster import RPC_PORT, Cluster
from tests.consistence.etcd_server import ETCD
from tests.consistence.netns import available
from tests.consistence.test_replication import isr, publish, wait_until

pytestmark = [
    pytest.mark.skipif(bool(available()), reason=available() or "available"),
    pytest.mark.skipif(ETCD is None, reason="etcd not installed (scripts/setup.sh)"),
    pytest.mark.timeout(120),
]

# run in the leader's namespace: probe the follower, then APPEND one record where its
# log ends, first with a previous-record crc that is not its own, then with its own
AS_THE_LEADER = textwrap.dedent("""
    import json, struct, sys, time
    from nsqshm.consistence import rpc
    ip, port, cluster, me, topic, epoch = sys.argv[1:7]
    port, epoch = int(port), int(epoch)
    record = struct.pack("=I", 26 + 4) + struct.pack(">qH", time.time_ns(), 0) \\
        + b"0" * 16 + b"fake"
    out = {}
    client = rpc.RPCClient(ip, port, cluster, me, 5, source=me.split(":")[0])
    status, end, crc = client.append(rpc.encode_append(topic, 0, epoch, rpc.PROBE), b"")
    out["probe"] = [status, end]
    status, after, _ = client.append(rpc.encode_append(topic, 0, epoch, end, len(record),
                                                       prev_crc=crc ^ 0xFFFFFFFF), record)
    out["wrong"] = [status, after]
    status, after, _ = client.append(rpc.encode_append(topic, 0, epoch, end, len(record),
                                                       prev_crc=crc), record)
    out["right"] = [status, after]
    client.close()
    print(json.dumps(out))
""")


def ten_messages_on_three_replicas(cluster, topic):
    """A topic of one partition on the three nodes, ten messages acknowledged by all:
    -> (its leader, a follower that has the ten, the other follower, its layout)."""
    assert cluster.create_topic(topic, 1, 3)[0] == 200
    leader = cluster.leader(topic)
    wait_until(lambda: len(isr(cluster, topic)) == 3, 15, "a full ISR")
    publish(leader, topic, [b"m%02d" % i for i in range(10)])
    follower, other = [n for n in cluster.nodes if n is not leader]
    wait_until(lambda: follower.end_offset(topic) == 10, 10, "the follower has all")
    return leader, follower, other, cluster.lookupd.get_json(
        f"/cluster/topic?topic={topic}")["partitions"][0]


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_an_append_whose_previous_record_is_not_the_followers_is_refused(tmp_path, workers):
    """Raft's previous-entry check: the records are taken only where the follower's
    record before them is the leader's (its crc32), so that two logs that match at
    an offset match below it (what the leader's search for where a diverged log
    parts assumes)."""
    cluster = Cluster(tmp_path, workers=workers, ttl="10s")
    try:
        leader, follower, _, layout = ten_messages_on_three_replicas(cluster, "checked")
        port = RPC_PORT + partition_owner("checked", 0, workers)
        out = subprocess.run(
            cluster.hosts.command(leader.i, [
                sys.executable, "-c", AS_THE_LEADER, follower.address, str(port),
                "nsq-test-cluster", leader.id, "checked", str(layout["leader_epoch"])]),
            capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        assert got["probe"] == [rpc.MISMATCH, 10]
        assert got["wrong"] == [rpc.MISMATCH, 10]  # nothing taken
        assert got["right"] == [rpc.OK, 11]  # the same frame with the follower's own crc
    finally:
        cluster.close()


# run in a follower's namespace as that follower (a registered node, at its own
# address): frames at a write epoch newer than the partition's, to the leader and to
# the other follower, as a node whose clock of epochs ran ahead (or a process on that
# host) would send them
AS_A_FOLLOWER_AHEAD = textwrap.dedent("""
    import json, struct, sys, time
    from nsqshm.consistence import rpc
    cluster, me, topic, epoch, leader_ip, other_ip, port = sys.argv[1:8]
    epoch, port = int(epoch), int(port)
    record = struct.pack("=I", 26 + 4) + struct.pack(">qH", time.time_ns(), 0) \\
        + b"0" * 16 + b"fake"
    out = {}
    for name, ip in (("leader", leader_ip), ("other", other_ip)):
        client = rpc.RPCClient(ip, port, cluster, me, 5, source=me.split(":")[0])
        status, end, crc = client.append(rpc.encode_append(topic, 0, epoch, rpc.PROBE), b"")
        out[name] = [status]
        if status != rpc.FENCED:
            status, after, _ = client.append(rpc.encode_append(topic, 0, epoch, end,
                                                               len(record), prev_crc=crc),
                                             record)
            out[name].append(status)
        client.close()
    print(json.dumps(out))
""")


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_a_newer_write_epoch_that_etcd_does_not_name_deposes_nobody(tmp_path, workers):
    """A frame whose write epoch is past the one a node knows deposes the node's own
    leadership and reaches its log only once etcd names the sender leading at that
    epoch (a new leader the node's watch has not heard of yet); any other registered
    node claiming a higher number is refused, and the leader leads on."""
    cluster = Cluster(tmp_path, workers=workers, ttl="10s")
    try:
        leader, other, ahead, layout = ten_messages_on_three_replicas(cluster, "guarded")
        out = subprocess.run(
            cluster.hosts.command(ahead.i, [
                sys.executable, "-c", AS_A_FOLLOWER_AHEAD, "nsq-test-cluster", ahead.id,
                "guarded", str(layout["leader_epoch"] + 1), leader.address, other.address,
                str(RPC_PORT + partition_owner("guarded", 0, workers))]),
            capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"leader": [rpc.FENCED], "other": [rpc.FENCED]}
        # the leader was not deposed: it takes writes at once, and every replica's log
        # holds what it acknowledged, nothing else
        publish(leader, "guarded", [b"after"], settle=0)
        wait_until(lambda: [n.end_offset("guarded") for n in cluster.nodes] == [11] * 3, 10,
                   "every replica has the 11 acknowledged messages")
        assert cluster.lookupd.get_json("/cluster/topic?topic=guarded")["partitions"][0][
            "leader"] == leader.id
    finally:
        cluster.close()


def test_a_topic_key_that_does_not_parse_holds_up_no_other_topic(tmp_path):
    """A key under the cluster's topics that is not one of ours (a name with "/", a
    value of another shape) is said once and left out; the topics after it are made
    and led (before, the sync loop retried it for ever and made none of them)."""
    cluster = Cluster(tmp_path, workers=1, ttl="10s")
    try:
        session = EtcdSession(cluster.etcd.endpoint, ttl=5).start()
        try:
            topics = "/NSQMetaData/nsq-test-cluster/Topics/"
            session.put(topics + "a/b/TopicMeta", '{"PartitionNum": 1}')
            session.put(topics + "b/TopicMeta", "[1]")
            session.put(topics + "b/0/ReplicaInfo", '{"ISR": 5}')
        finally:
            session.close()
        assert cluster.create_topic("zeta", 1, 2)[0] == 200
        publish(cluster.leader("zeta"), "zeta", [b"after the bad keys"], settle=10)
        said = [line for node in cluster.nodes for line in node.server.lines
                if "in etcd is not readable" in line]
        assert any("topic 'a/b'" in line for line in said), said
        assert len(said) == len(cluster.nodes) * 2  # once each, not at every pass
        # nor does it stop the lookupd master's check of lost replicas
        assert not [line for line in cluster.lookupd.lines if "lost-replica check failed" in line]
    finally:
        cluster.close()
