import os
import uuid

import pytest

from nsqshm.ring import Ring
from tests.nsqd.conftest import Spares


@pytest.fixture
def ring_name():
    """A unique segment name, unlinked after the test."""
    name = f"nsqshm-test-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    yield name
    Ring.unlink_segment(name)


@pytest.fixture
def ring(ring_name):
    r = Ring.create(ring_name, capacity=1 << 16)
    yield r
    r.close()


@pytest.fixture(scope="session")
def nsqd_spares(tmp_path_factory):
    """One pool of spare servers for the whole run (tests/nsqd/conftest.py's
    nsqd_factory takes from it, in every directory that uses that factory)."""
    spares = Spares(tmp_path_factory)
    spares.DEPTH = int(os.environ.get("NSQSHM_TEST_SPARES", Spares.DEPTH))  # 0: none
    yield spares
    spares.close()
