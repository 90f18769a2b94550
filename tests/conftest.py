import os
import uuid

import pytest

from nsqshm.ring import Ring


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
