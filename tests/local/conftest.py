"""Real brokers (tests/nsqd/conftest.py's nsqd_factory) for the local clients."""

import os

import pytest

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


def shm_entries(prefix):
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
