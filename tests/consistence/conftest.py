import pytest

from nsqshm.consistence.etcd.session import EtcdSession
from tests.consistence import cluster
from tests.consistence.etcd_server import ETCD, EtcdServer

# the tests' lease TTL: etcd's minimum with the server's short election timeout is
# about 1 s; 2 s leaves room for a loaded machine and keeps each expiry quick
TTL = 2


@pytest.fixture
def etcd(tmp_path):
    """A real etcd (scripts/setup.sh installs Debian's etcd-server), killed after."""
    if ETCD is None:
        pytest.skip("etcd not installed (scripts/setup.sh installs Debian's etcd-server)")
    server = EtcdServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def sessions(etcd):
    """Make sessions on the test's etcd; every one is closed after the test."""
    made = []

    def make(ttl=TTL, timeout=1.0, endpoints=None):
        s = EtcdSession(endpoints or etcd.endpoint, ttl=ttl, timeout=timeout).start()
        made.append(s)
        return s

    yield make
    for s in made:
        s.close(revoke=False)


def pytest_runtest_setup(item):
    cluster.MADE.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failure's report carries the logs of the clusters the test made (CI keeps
    nothing else of the servers)."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for n, made in enumerate(cluster.MADE):
            report.sections.append((f"cluster {n + 1} logs ({report.when})", made.logs()))
