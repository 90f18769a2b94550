"""Placement of a new topic's partitions: distinct replicas, leaders spread."""

from collections import Counter

import pytest

from nsqshm.consistence.placement import spread


def test_replicas_are_distinct_and_leaders_spread():
    placement = spread(["n3", "n1", "n2"], 6, 3)
    assert all(len(set(p)) == 3 for p in placement)
    assert Counter(p[0] for p in placement) == {"n1": 2, "n2": 2, "n3": 2}


@pytest.mark.parametrize("nodes,partitions,replica", [(["n1"], 1, 2), (["n1"], 0, 1),
                                                      (["n1"], 1, 0)])
def test_impossible_placements_are_refused(nodes, partitions, replica):
    with pytest.raises(ValueError):
        spread(nodes, partitions, replica)
