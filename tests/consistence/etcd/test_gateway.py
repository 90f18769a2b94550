"""The gateway transport: the API path chosen from etcd's version, endpoints, and
etcd's gRPC errors as typed exceptions."""

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
