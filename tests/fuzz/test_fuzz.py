"""The fuzzer (tests/fuzz/runner.py) against real nsqd (--workers 2),
nsqlookupd and nsqadmin: a bounded run in the default suite, a million
inputs in the soak run; no finding allowed.  A failure lists every finding
of the run with its input (rerun one with `python -m tests.fuzz.runner
--seed S --only I`).  NSQSHM_FUZZ_SEED picks another seed."""

import os
import random

import pytest

from .runner import HEAP_SLACK, PER_QUEUE, Run, fuzz, report, traceback_end
from .v2_inputs import Generator, Limits, mutate, tag, untag

SEED = int(os.environ.get("NSQSHM_FUZZ_SEED", "1"))


def test_inputs_are_reproducible_from_seed_and_index():
    limits = Limits(4096, 16384)

    def build(i):
        rng = random.Random(f"{SEED}:{i}")
        stream = Generator(limits).generate(rng)
        return mutate(rng, stream.data, limits)

    assert [build(i) for i in range(50)] == [build(i) for i in range(50)]


def test_tags_name_their_topic_and_damaged_ones_do_not_check():
    body = tag(b"x#ephemeral", 7)
    assert untag(body) == b"x#ephemeral"
    assert untag(body[:-1] + b"0") is None
    assert untag(body.replace(b"x#", b"y#")) is None


def test_a_traceback_is_read_whole_through_another_workers_log_lines():
    lines = ["[nsqd] 2026/11/23 15:27:10.86 INFO: 200 POST /x\n",
             "Traceback (most recent call last):\n",
             "[nsqd] 2026/11/23 15:27:10.86 INFO: 500 PUT /config/x (127.0.0.1:1) 57us\n",
             '  File "a.py", line 1, in f\n',
             "KeyError: 'x'\n",
             "[nsqd] 2026/11/23 15:27:11.00 INFO: next\n"]
    assert traceback_end(lines, 1) == 5


class Figures:
    """What the memory oracle reads from a cluster (Cluster.queues, rings,
    stale_mappings, memory), given."""

    def __init__(self, heap, queues, rings=None, stale=()):
        self.heap, self._queues = heap, queues
        self._rings = queues if rings is None else rings
        self.stale = list(stale)

    def queues(self):
        return set(self._queues)

    def rings(self):
        return set(self._rings)

    def stale_mappings(self):
        return self.stale

    def memory(self):
        return {"heap": self.heap, "rss": 2 * self.heap, "shm": 0}


def oracle(cluster, warm_heap, warm_queues):
    run = Run(cluster, SEED, Limits(4096, 16384))
    mem = {"warm": {"heap": warm_heap, "rss": 0, "shm": 0, "queues": warm_queues},
           "max": {"heap": 0, "rss": 0, "shm": 0}}
    final = run.check_memory(mem, settle=0)
    return sorted(f.kind for f in run.findings), final


def test_the_memory_oracle_allows_the_heap_of_new_topics_and_channels_only():
    queues = {(f"t{i}", None) for i in range(300)}
    warm = 100 << 20
    budget = warm * HEAP_SLACK[0] + HEAP_SLACK[1]
    assert oracle(Figures(int(budget), queues), warm, 300) == ([], {
        "heap": int(budget), "rss": 2 * int(budget), "shm": 0, "queues": 300})
    assert oracle(Figures(int(budget) + 1, queues), warm, 300)[0] == ["memory"]
    # 100 topics more than at the warm-up: 100 x PER_QUEUE more allowed
    grown = int(budget) + 100 * PER_QUEUE
    assert oracle(Figures(grown, queues), warm, 200)[0] == []
    assert oracle(Figures(grown + 1, queues), warm, 200)[0] == ["memory"]


def test_the_memory_oracle_finds_rings_left_behind_missing_or_mapped_stale():
    queues = {("a", None), ("a", "c")}
    assert oracle(Figures(0, queues, queues | {("gone", None)}), 1 << 20, 2)[0] == ["shm-leak"]
    assert oracle(Figures(0, queues, {("a", None)}), 1 << 20, 2)[0] == ["ring-missing"]
    stale = ["123: /dev/shm/p.t.a (inode 5, now 6)"]
    assert oracle(Figures(0, queues, stale=stale), 1 << 20, 2)[0] == ["shm-stale"]


def test_fuzz_bounded():
    # (15,000 inputs, about a quarter of a minute: the default run's share, which is
    # near its 20 minutes; make soak runs a million.  The 10,000-input prefix of this
    # seed ends on a topic delete racing a SUB on the other worker, which once left a
    # channel without its ring: fixed, and tests/nsqd/workers/test_segment_race.py races it on
    # purpose)
    summary, findings = fuzz(SEED, 15_000)
    assert not findings, report(summary, findings)
    assert summary["inputs"] >= 12_000 and not summary["stopped_early"], summary


@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
def test_fuzz_soak():
    summary, findings = fuzz(SEED, 1_000_000)
    assert not findings, report(summary, findings)
    assert summary["inputs"] >= 1_000_000, summary
