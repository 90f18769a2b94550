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


# `make test` runs the suite on two processes (pytest-xdist, --dist loadgroup); the tests of
# one group run in one of them, one after another: the multi-host tests (network namespaces,
# one etcd at a time, 2 s leases), the Spark tests (one JVM), the browser tests
XDIST_GROUPS = (("tests/consistence/", "cluster"), ("tests/servers/", "cluster"),
                ("tests/spark/", "spark"), ("tests/nsqadmin/", "browser"),
                ("tests/bench/", "bench"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        for prefix, group in XDIST_GROUPS:
            if path.startswith(prefix):
                item.add_marker(pytest.mark.xdist_group(group))
                break
