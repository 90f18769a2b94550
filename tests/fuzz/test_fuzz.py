"""The fuzzer (tests/fuzz/runner.py) against real nsqd (--workers 2),
nsqlookupd and nsqadmin: a bounded run in the default suite, a million
inputs in the soak run; no finding allowed.  A failure lists every finding
of the run with its input (rerun one with `python -m tests.fuzz.runner
--seed S --only I`).  NSQSHM_FUZZ_SEED picks another seed."""

import os
import random

import pytest

from .runner import fuzz, report
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


def test_fuzz_bounded():
    summary, findings = fuzz(SEED, 60_000)
    assert not findings, report(summary, findings)
    assert summary["inputs"] >= 50_000 and not summary["stopped_early"], summary


@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
def test_fuzz_soak():
    summary, findings = fuzz(SEED, 1_000_000)
    assert not findings, report(summary, findings)
    assert summary["inputs"] >= 1_000_000, summary
