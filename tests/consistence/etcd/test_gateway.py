"""The gateway transport: the API path chosen from etcd's version, endpoints,
etcd's gRPC errors as typed exceptions, and a server that does not answer."""

import time

import pytest

from nsqshm.consistence.errors import EtcdRequestError, EtcdUnavailable, LeaseNotFound
from nsqshm.consistence.etcd.gateway import Gateway, api_path_for, split_endpoint
from tests.consistence.etcd_server import free_ports


@pytest.mark.parametrize("version,path", [("3.4.23", "/v3/"), ("3.5.9", "/v3/"),
                                          ("3.3.25", "/v3beta/"), ("3.2.0", "/v3alpha/")])
def test_api_path_follows_the_server_version(version, path):
    assert api_path_for(version) == path


def test_endpoints():
    assert split_endpoint("http://127.0.0.1:2379") == ("127.0.0.1", 2379)
    assert split_endpoint("[::1]:2379") == ("::1", 2379)
    for bad in ("localhost", "host:port", ":2379"):
        with pytest.raises(ValueError):
            split_endpoint(bad)
    with pytest.raises(ValueError):
        Gateway("")


def test_the_real_server_gets_its_path(etcd):
    gw = Gateway(etcd.endpoint)
    assert gw.call("maintenance/status", {})["version"].startswith("3.4")
    assert gw._paths == {0: "/v3/"}
    gw.close()


def test_grpc_errors_are_typed(etcd):
    gw = Gateway(etcd.endpoint)
    with pytest.raises(LeaseNotFound):
        gw.call("lease/revoke", {"ID": "12345"})
    with pytest.raises(EtcdRequestError) as err:
        gw.call("kv/put", {"key": ""})  # etcd: key is not provided
    assert err.value.code == 3  # INVALID_ARGUMENT
    gw.close()


def test_no_endpoint_answering_is_unavailable():
    gw = Gateway([f"127.0.0.1:{port}" for port in free_ports(2)], timeout=0.5)
    with pytest.raises(EtcdUnavailable):
        gw.call("kv/range", {"key": "YQ=="})


def test_a_server_that_does_not_answer_is_given_up_after_one_timeout(etcd):
    """A request on an idle connection is sent again on a new one only when the
    server had closed it (etcd restarted), not when it timed out: that request
    reached a server that may have applied it, and the caller's wait doubled."""
    gw = Gateway(etcd.endpoint, timeout=1.0)
    gw.call("kv/range", {"key": "YQ=="})  # a connection left idle
    etcd.freeze()  # sockets open, nothing answered
    try:
        began = time.monotonic()
        with pytest.raises(EtcdUnavailable, match="timed out"):
            gw.call("kv/range", {"key": "YQ=="})
        assert time.monotonic() - began < 1.7
    finally:
        etcd.thaw()
    assert gw.call("kv/range", {"key": "YQ=="}) is not None  # and on, once it answers
    gw.close()
