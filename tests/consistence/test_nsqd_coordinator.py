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


@pytest.mark.parametrize("workers", [1, 2], ids=["w1", "w2"])
def test_an_append_whose_previous_record_is_not_the_followers_is_refused(tmp_path, workers):
    """Raft's previous-entry check: the records are taken only where the follower's
    record before them is the leader's (its crc32), so that two logs that match at
    an offset match below it (what the leader's search for where a diverged log
    parts assumes)."""
    cluster = Cluster(tmp_path, workers=workers, ttl="10s")
    try:
        assert cluster.create_topic("checked", 1, 3)[0] == 200
        leader = cluster.leader("checked")
        wait_until(lambda: len(isr(cluster, "checked")) == 3, 15, "a full ISR")
        publish(leader, "checked", [b"m%02d" % i for i in range(10)])
        follower = next(n for n in cluster.nodes if n is not leader)
        wait_until(lambda: follower.end_offset("checked") == 10, 10, "the follower has all")
        layout = cluster.lookupd.get_json("/cluster/topic?topic=checked")["partitions"][0]
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
