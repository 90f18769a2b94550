"""Real brokers (tests/nsqd/conftest.py's nsqd_factory) for the local clients."""

import os
import uuid

import pytest

from nsqshm._core.arena import Arena
from tests.nsqd.conftest import (  # noqa: F401
    nsqd_factory,
    nsqd_workers,
    pytest_generate_tests,
    wait_for,
)


def started(server):
    """The broker once its instance file (how local clients find it) is written."""
    path = f"/dev/shm/{server.prefix}.instance"
    assert wait_for(lambda: os.path.exists(path), timeout=10), "".join(server.lines)
    return server


@pytest.fixture
def broker(nsqd_factory):  # noqa: F811
    return started(nsqd_factory("--mem-queue-size=200000", "--msg-timeout=60s"))


@pytest.fixture
def arena():
    """A fresh arena of 4 MiB, 4 queues."""
    name = f"nsqshm-test-arena-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    a = Arena.create(name, size=1 << 22, max_queues=4, label="test")
    yield a
    a.close()
    Arena.unlink_segment(name)


def shm_entries(prefix):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
