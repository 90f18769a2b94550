"""A node in its own process: registers, elects itself leader of a partition, prints
its state as one JSON line, then keeps its lease alive until killed.

    python -m tests.consistence.leader_node ENDPOINT CLUSTER NODE_ID TOPIC PARTITION TTL
"""

import json
import sys

import gevent

from nsqshm.consistence.leadership import Leadership
from nsqshm.consistence.session import EtcdSession
from nsqshm.consistence.topology import NodeInfo, Topology


def main(endpoint, cluster, node_id, topic, partition, ttl):
    session = EtcdSession(endpoint, ttl=int(ttl)).start()
    topology = Topology(session, cluster)
    node = NodeInfo(node_id, "127.0.0.1")
    topology.register_node(node)
    state = Leadership(topology, node).elect(topic, int(partition))
    print(json.dumps({"epoch": state.epoch, "leader": state.leader,
                      "session_revision": state.leader_session.create_revision}), flush=True)
    while True:
        gevent.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:])
