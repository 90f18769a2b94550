"""A node in its own process: registers, elects itself leader of a partition, prints
its state as one JSON line, then keeps its lease alive until killed.  If the lease is
lost (cut off from etcd past its deadline) it prints {"lost_at": <monotonic time>}:
from then on a leader must acknowledge nothing.

    python -m tests.consistence.leader_node ENDPOINT CLUSTER NODE_ID TOPIC PARTITION TTL
"""

import json
import sys
import time

import gevent

from nsqshm.consistence.etcd.session import EtcdSession
from nsqshm.consistence.leadership import Leadership
from nsqshm.consistence.topology import NodeInfo, Topology


def main(endpoint, cluster, node_id, topic, partition, ttl):
    session = EtcdSession(endpoint, ttl=int(ttl)).start()
    topology = Topology(session, cluster)
    node = NodeInfo(node_id, "127.0.0.1")
    topology.register_node(node)
    state = Leadership(topology, node).elect(topic, int(partition))
    session.on_lease_lost(
        lambda session: print(json.dumps({"lost_at": time.monotonic()}), flush=True))
    print(json.dumps({"epoch": state.epoch, "leader": state.leader,
                      "session_revision": state.leader_session.create_revision}), flush=True)
    while True:
        gevent.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:])
