"""Where a new topic's partitions go: each partition on `replica` distinct nodes,
counting what each node already leads and holds, so that the leaderships (where a
partition's writes go) and the copies spread evenly over the cluster as topics come.
Youzan's data_placement_mgr weighs nodes by load figures (data sizes and message
rates the nsqd nodes report); here a partition counts as one, whatever its traffic."""


def spread(node_ids, partition_num, replica, load=None):
    """-> placement: for each partition, its replicas' node IDs, the leader first.
    Each leader is the node that leads the fewest of this topic's partitions, then
    the fewest partitions of all, then holds the fewest copies; each other replica
    a node that holds the fewest copies of this topic, then of all; ties go
    round-robin (from the partition's turn, and after the leader): on a fresh
    cluster of 3 nodes, 3 partitions of 2 replicas are [[n1, n2], [n3, n1], [n2, n3]].
    (This topic first: a node that joins empty does not take all of a new topic's
    leaderships, its writes and its failovers.)
    load: {node ID: (partitions it leads, copies it holds)} of the topics there
    already (Topology.load); the partitions placed here count as they are placed."""
    nodes = sorted(node_ids)
    if replica < 1 or partition_num < 1:
        raise ValueError("partition_num and replica must be at least 1")
    if replica > len(nodes):
        raise ValueError(f"replicator {replica} needs {replica} nodes, {len(nodes)} alive")
    load = load or {}
    leads = {n: load.get(n, (0, 0))[0] for n in nodes}
    holds = {n: load.get(n, (0, 0))[1] for n in nodes}
    out = []
    size = len(nodes)
    own_leads = dict.fromkeys(nodes, 0)
    own_holds = dict.fromkeys(nodes, 0)
    for p in range(partition_num):
        leader = min(range(size), key=lambda i: (own_leads[nodes[i]], leads[nodes[i]],
                                                 holds[nodes[i]], (i - p) % size))
        # the others: fewest copies, ties to the nodes after the leader in turn
        others = sorted((i for i in range(size) if i != leader),
                        key=lambda i: (own_holds[nodes[i]], holds[nodes[i]], (i - leader) % size))
        replicas = [nodes[i] for i in [leader, *others[:replica - 1]]]
        for counts in (leads, own_leads):
            counts[replicas[0]] += 1
        for n in replicas:
            holds[n] += 1
            own_holds[n] += 1
        out.append(replicas)
    return out
