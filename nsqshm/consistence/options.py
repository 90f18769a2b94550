"""The cluster-mode flags of nsqd (`nsqshm start`) and nsqlookupd (`nsqshm lookupd`),
declared once here and appended to each daemon's flag table.  Youzan's names
(apps/nsqd and apps/nsqlookupd of youzan/nsq) where Youzan has the flag.

Without --cluster-leadership-addresses a daemon runs standalone, as before: the
other cluster flags are then refused when set to anything but their defaults (they
would do nothing).

This module declares and checks values only; it opens no connection, so a daemon
imports it whether or not it runs in cluster mode.
"""

from __future__ import annotations

import re

from nsqshm.flags import DURATION, STRING, Flag, OptionsError

CLUSTER_ID = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")  # becomes part of etcd keys (topology.py)
MIN_LEASE_TTL = 1.5  # etcd refuses a TTL under 1.5 election timeouts (1.5 s by default)
MAX_WORKERS = 1024  # a node's "Workers" in etcd (its RPC ports: RpcPort .. + Workers - 1)
_EXT = "[nsqshm extension] "

# the flags both daemons take
COMMON: tuple[Flag, ...] = (
    Flag("cluster-id", STRING, "nsq-test-cluster",
         "the cluster id used for separating different nsq cluster."),
    Flag("cluster-leadership-addresses", STRING, "",
         "the cluster leadership server list: etcd endpoints host:port, comma separated "
         "(empty: standalone, no cluster)"),
    Flag("cluster-lease-ttl", DURATION, "6s",
         _EXT + "etcd lease TTL: a dead or cut-off node loses its leaderships this long "
         "after its last refresh (lower: faster failover, more false ones)", extension=True),
)

NSQD: tuple[Flag, ...] = COMMON + (
    Flag("rpc-port", STRING, "",
         "<port> to listen on for replication from the other nsqd of the cluster "
         "(cluster mode; worker k of nsqshm listens on port + k)"),
)

# the nsqlookupd's own (the master's replacement of lost replicas and leadership
# rebalance: migrator.py)
LOOKUPD_ONLY: tuple[Flag, ...] = (
    Flag("lost-replica-wait", DURATION, "10m",
         _EXT + "how long a replica's nsqd may be gone from the cluster before the master "
         "nsqlookupd moves the replica to another node (Youzan's waitMigrateInterval; "
         "0: never)", extension=True),
    Flag("lost-replica-urgent-wait", DURATION, "10s",
         _EXT + "the same when no more than half of a partition's replicas are live ISR "
         "members (Youzan's waitEmergencyMigrateInterval; 0: --lost-replica-wait)",
         extension=True),
    Flag("leader-rebalance-wait", DURATION, "5m",
         _EXT + "how long a partition may be led by another node than its preferred leader "
         "(the one its placement chose) while that one is a live ISR member, before the "
         "master nsqlookupd hands the leadership back to it (Kafka's "
         "auto.leader.rebalance with leader.imbalance.check.interval.seconds; 0: never)",
         extension=True),
)

LOOKUPD: tuple[Flag, ...] = COMMON + LOOKUPD_ONLY


def cluster_mode(opts) -> bool:
    return bool(opts.cluster_leadership_addresses)


def endpoints(opts) -> list[str]:
    """The etcd endpoints of --cluster-leadership-addresses."""
    return [e.strip() for e in opts.cluster_leadership_addresses.split(",") if e.strip()]


def _check_endpoint(endpoint: str) -> None:
    rest = endpoint.split("://", 1)
    if len(rest) == 2 and rest[0] not in ("http", "https"):
        raise OptionsError(f"--cluster-leadership-addresses {endpoint!r}: scheme must be http")
    host, sep, port = rest[-1].rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise OptionsError(f"--cluster-leadership-addresses {endpoint!r}: want host:port")


def validate(opts, workers: int = 1) -> None:
    """One-line OptionsError for a bad cluster flag.  workers: how many RPC ports
    the daemon takes (nsqd: one per worker; 0 for nsqlookupd, which has none)."""
    if not cluster_mode(opts):
        # (a config file listing every option at its default sets them: not an error)
        given = [f.name for f in (*NSQD, *LOOKUPD_ONLY) if getattr(opts, f.attr, None) not in
                 (None, f.default_value())]
        if given:
            raise OptionsError(f"--{given[0]} needs --cluster-leadership-addresses "
                               "(cluster mode)")
        return
    if not CLUSTER_ID.match(opts.cluster_id):
        raise OptionsError(f"--cluster-id {opts.cluster_id!r}: want 1-64 of A-Z a-z 0-9 . _ -")
    addresses = endpoints(opts)
    if not addresses:
        raise OptionsError("--cluster-leadership-addresses: no endpoint")
    for endpoint in addresses:
        _check_endpoint(endpoint)
    if opts.cluster_lease_ttl < MIN_LEASE_TTL:
        raise OptionsError(f"--cluster-lease-ttl must be >= {MIN_LEASE_TTL}s")
    for flag in LOOKUPD_ONLY:
        if getattr(opts, flag.attr, 0) < 0:
            raise OptionsError(f"--{flag.name} must be >= 0")
    wait, urgent = getattr(opts, "lost_replica_wait", 0), getattr(opts, "lost_replica_urgent_wait", 0)
    if wait and urgent > wait:
        raise OptionsError("--lost-replica-urgent-wait must be <= --lost-replica-wait")
    if workers > MAX_WORKERS:  # (what a node's registration may say: topology.NodeInfo)
        raise OptionsError(f"--workers {workers}: at most {MAX_WORKERS} in cluster mode")
    if workers:
        port = opts.rpc_port
        if not port:
            raise OptionsError("--rpc-port is required in cluster mode")
        if not port.isdigit() or not 0 < int(port) <= 65535 - max(0, workers - 1):
            raise OptionsError(f"--rpc-port {port!r}: want a port 1-{65535 - max(0, workers - 1)}")
