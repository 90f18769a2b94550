"""The replication suite's arithmetic and report (nsqshm/bench/replication.py),
without a cluster: a round per load combined, the tables and target rows per
load, a result recorded before the loads, and bad --connections."""

import argparse

import pytest

from nsqshm.bench import replication

CASES = ("standalone", "replicator 1", "replicator 2", "replicator 3")


def _round(rates, isr=(1, 1, 2, 3)):
    """measure()'s rows for one load from msg/s per case (latencies 1 ms..)."""
    lat = [i / 1000 for i in range(1, 101)]
    return replication._rows({name: (rate, lat) for name, rate in zip(CASES, rates, strict=True)},
                             {name: size for name, size in zip(CASES, isr, strict=True)})


def test_rounds_combine_per_load_and_render_a_table_each():
    rounds = [{"4": _round((100, 100, 50, 40)), "16": _round((200, 200, 150, 100))},
              {"4": _round((120, 100, 60, 40)), "16": _round((200, 200, 170, 120), (1, 1, 1, 3))}]
    loads = replication.combine(rounds)
    assert list(loads) == ["4", "16"]
    assert loads["4"]["replicator 2"]["msgs_per_s"] == 55  # (the median of two)
    assert loads["16"]["replicator 2"]["ratio_to_replicator_1"] == 0.8
    assert loads["16"]["replicator 2"]["isr_at_end"] == 1  # (the smallest seen)
    params = {"batch": 20, "size": 200, "connections": [4, 16], "seconds": 3, "workers": 1,
              "rounds": 2}
    res = {"params": params, "loads": loads}
    text = "\n".join(replication.render(res))
    assert text.count("| replicator 3 |") == 2 and "4 connections:" in text
    assert "16 connections:" in text
    assert "a follower left it in replicator 2" in text
    rows = replication.targets(res)
    assert [r[1] for r in rows] == [
        f"publish msg/s, replicator {r} / replicator 1, {c} connections (p99 batch)"
        for c in ("4", "16") for r in (2, 3)]
    assert rows[0][3] == "0.55 (100.00 ms)"
    assert len(replication.lines(res)) == 1 + 2 * 5


def test_a_result_recorded_before_the_loads_reads_as_one_load():
    old = {"params": {"batch": 20, "size": 200, "connections": 4, "seconds": 3,
                      "workers": 1, "rounds": 1},
           "cases": replication.combine([{"4": _round((100, 90, 45, 30))}])["4"]}
    assert "4 connections:" in "\n".join(replication.render(old))
    assert [r[3] for r in replication.targets(old)] == ["0.50 (100.00 ms)", "0.33 (100.00 ms)"]


@pytest.mark.parametrize("text, why", [("4,x", "not a list"), ("0", "a connection or more"),
                                       ("", "not a list")])
def test_connections_must_be_a_list_of_positive_numbers(text, why):
    ap = argparse.ArgumentParser()
    replication.add_arguments(ap)
    assert ap.parse_args(["--connections", "2,8"]).connections == [2, 8]
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        replication._loads(text)
