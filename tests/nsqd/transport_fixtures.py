"""Fixtures of the transport tests, loaded with
pytest_plugins = ["tests.nsqd.transport_fixtures"]."""

import pytest

from tests.nsqd.certs import make_certs
from tests.nsqd.transport import AuthServer


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """CA, server, client and stranger certificates (see certs.py)."""
    return make_certs(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture
def authd():
    """An auth server on 127.0.0.1 (transport.AuthServer)."""
    server = AuthServer()
    yield server
    server.close()
