"""nsqlookupd in cluster mode (Youzan's NsqLookupCoordinator, nsqlookup_coordinator.go):
its registration in etcd, the master campaign (master.py), topic creation with the
partitions placed on the live nsqd nodes (placement.py), and the partition leaders
for `/lookup?access=w`.

Any nsqlookupd can create a topic: the creation is one etcd transaction that fails
when the topic exists, so two concurrent creations cannot both succeed.  Elections
are run by the ISR members themselves (nsqd_coordinator.py) as etcd transactions;
the master stands ready for the moves and balancing that are not built yet.
"""

import gevent

from nsqshm.consistence.errors import CoordinationError
from nsqshm.consistence.master import Master
from nsqshm.consistence.options import endpoints
from nsqshm.consistence.session import EtcdSession
from nsqshm.consistence.topology import NodeInfo, TopicMeta, Topology

RETRY = 0.5
MAX_REPLICATOR = 8


class LookupdCoordinator:
    def __init__(self, opts, logf, tcp_port, http_port, version=""):
        self.opts = opts
        self.logf = logf
        ip = opts.broadcast_address
        self.node = NodeInfo(id=f"{ip}:{http_port}", ip=ip, tcp_port=tcp_port,
                             http_port=http_port, version=version)
        self.session = EtcdSession(endpoints(opts), ttl=max(2, round(opts.cluster_lease_ttl)))
        self.topology = Topology(self.session, opts.cluster_id)
        self.master = Master(self.topology, self.node, self._master_changed)
        self._loop = None

    def start(self):
        self._loop = gevent.spawn(self._run)
        return self

    def _run(self):
        while True:
            try:
                self.session.start()
                self.topology.register_lookupd(self.node)
                self.master.start()
                return
            except CoordinationError as err:
                self.logf("warn", f"cluster: etcd not reachable yet ({err}); retrying")
                gevent.sleep(RETRY)

    def close(self):
        if self._loop is not None:
            self._loop.kill(block=False)
        try:
            self.master.stop()
        except CoordinationError:
            pass
        self.session.close()

    def _master_changed(self, master):
        self.logf("info", f"cluster: master nsqlookupd is {master.id if master else 'nobody'}")

    # -- topics -----------------------------------------------------------------------

    def create_topic(self, topic, partition_num, replicator, sync_every=0):
        """The topic's meta and partitions in etcd, placed on the live nodes.  ValueError
        (not enough nodes, bad counts), TopicExists, CoordinationError.  -> placement."""
        meta = TopicMeta(partition_num=partition_num, replica=replicator, sync_every=sync_every)
        placement = self.topology.create_topic_on_live_nodes(topic, meta)
        self.logf("info", f"cluster: topic {topic} created: {partition_num} partitions x "
                          f"{replicator} replicas on {placement}")
        return placement

    def topic_layout(self, topic):
        """(TopicMeta, [PartitionState]) -- TopicNotFound when it is not in etcd."""
        return self.topology.topic_meta(topic), self.topology.partitions(topic)
