"""The cluster-mode flags (consistence/options.py) on nsqd and nsqlookupd: standalone
without them, one-line errors for bad values."""

import pytest

from nsqshm.nsqd import options as nsqd_options
from nsqshm.nsqlookupd import options as lookupd_options

ETCD = "--cluster-leadership-addresses=127.0.0.1:2379,http://10.0.0.1:2379"


def test_standalone_by_default():
    for mod in (nsqd_options, lookupd_options):
        opts = mod.parse_args([])
        assert opts.cluster_leadership_addresses == ""
        assert opts.cluster_id == "nsq-test-cluster"
        assert opts.cluster_lease_ttl == 6.0
    assert nsqd_options.parse_args([]).rpc_port == ""


def test_cluster_mode_values():
    opts = nsqd_options.parse_args([ETCD, "--rpc-port=4250", "--cluster-id=prod-1",
                                    "--cluster-lease-ttl=2s", "--workers=2"])
    assert (opts.rpc_port, opts.cluster_id, opts.cluster_lease_ttl) == ("4250", "prod-1", 2.0)
    assert lookupd_options.parse_args([ETCD]).cluster_leadership_addresses.count(",") == 1
    opts = lookupd_options.parse_args([ETCD])
    assert (opts.lost_replica_wait, opts.lost_replica_urgent_wait) == (600.0, 10.0)
    opts = lookupd_options.parse_args([ETCD, "--lost-replica-wait=0",
                                       "--lost-replica-urgent-wait=1.5s"])
    assert (opts.lost_replica_wait, opts.lost_replica_urgent_wait) == (0.0, 1.5)


@pytest.mark.parametrize("argv, text", [
    (["--rpc-port=4250"], "--rpc-port needs --cluster-leadership-addresses"),
    (["--cluster-id=x"], "--cluster-id needs --cluster-leadership-addresses"),
    ([ETCD], "--rpc-port is required in cluster mode"),
    ([ETCD, "--rpc-port=0"], "--rpc-port '0': want a port"),
    ([ETCD, "--rpc-port=65535", "--workers=2"], "--rpc-port '65535': want a port 1-65534"),
    ([ETCD, "--rpc-port=x1"], "--rpc-port 'x1'"),
    (["--cluster-leadership-addresses=etcd", "--rpc-port=1"], "'etcd': want host:port"),
    (["--cluster-leadership-addresses=ftp://a:1", "--rpc-port=1"], "scheme must be http"),
    ([ETCD, "--rpc-port=1", "--cluster-id=a/b"], "--cluster-id 'a/b'"),
    ([ETCD, "--rpc-port=1", "--cluster-lease-ttl=1s"], "--cluster-lease-ttl must be >= 1.5s"),
    ([ETCD, "--rpc-port=1", "--workers=1025"], "--workers 1025: at most 1024 in cluster mode"),
])
def test_bad_values_one_line(argv, text):
    with pytest.raises(nsqd_options.OptionsError) as err:
        nsqd_options.parse_args(argv)
    assert text in str(err.value) and "\n" not in str(err.value)


def test_lookupd_bad_values():
    with pytest.raises(lookupd_options.OptionsError, match="needs --cluster-leadership"):
        lookupd_options.parse_args(["--cluster-lease-ttl=3s"])
    with pytest.raises(lookupd_options.OptionsError, match="want host:port"):
        lookupd_options.parse_args(["--cluster-leadership-addresses=a:b"])
    with pytest.raises(lookupd_options.OptionsError,
                       match="--lost-replica-wait needs --cluster-leadership"):
        lookupd_options.parse_args(["--lost-replica-wait=1m"])
    with pytest.raises(lookupd_options.OptionsError, match="--lost-replica-urgent-wait must be"):
        lookupd_options.parse_args([ETCD, "--lost-replica-urgent-wait=-1s"])
    with pytest.raises(lookupd_options.OptionsError,
                       match="--lost-replica-urgent-wait must be <= --lost-replica-wait"):
        lookupd_options.parse_args([ETCD, "--lost-replica-wait=5s",
                                    "--lost-replica-urgent-wait=6s"])
