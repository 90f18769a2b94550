"""Where a new topic's partitions go: each partition on `replica` distinct nodes, the
leaders spread round-robin so that no node leads more than its share (Youzan's
data_placement_mgr does this with load figures; here the nodes count equally)."""


def spread(node_ids, partition_num, replica):
    """-> placement: for each partition, its replicas' node IDs, the leader first."""
    nodes = sorted(node_ids)
    if replica < 1 or partition_num < 1:
        raise ValueError("partition_num and replica must be at least 1")
    if replica > len(nodes):
        raise ValueError(f"replicator {replica} needs {replica} nodes, {len(nodes)} alive")
    return [[nodes[(p + r) % len(nodes)] for r in range(replica)] for p in range(partition_num)]
