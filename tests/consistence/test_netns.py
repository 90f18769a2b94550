"""The namespaces helper of the multi-host tests: hosts reach each other and the root
namespace over the bridge; a cut link stops traffic, a restored one carries it again;
nothing is left behind."""

import subprocess
import sys

import pytest

from tests.consistence.netns import IP, Hosts, available

pytestmark = pytest.mark.skipif(bool(available()), reason=available() or "available")

# a TCP echo server, and a client that prints what came back or the error's class
SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], 7000))
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(c.recv(100))
    c.close()
"""
CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], 7000), timeout=1.0) as c:
        c.sendall(b"ping")
        print(c.recv(100).decode())
except OSError as err:
    print(type(err).__name__)
"""


def talk(hosts, i, address):
    return hosts.check_output(i, [sys.executable, "-c", CLIENT, address]).strip()


@pytest.fixture
def hosts():
    with Hosts(3) as h:
        yield h


def test_hosts_reach_each_other_and_a_cut_link_stops_traffic(hosts):
    server = hosts.run(1, [sys.executable, "-c", SERVER, hosts.addresses[1]],
                       stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "listening"
    assert talk(hosts, 0, hosts.addresses[1]) == "ping"
    assert talk(hosts, 2, hosts.addresses[1]) == "ping"
    hosts.cut(1)
    assert talk(hosts, 0, hosts.addresses[1]) in ("TimeoutError", "OSError")
    assert server.poll() is None  # cut off, still running
    hosts.restore(1)
    assert talk(hosts, 0, hosts.addresses[1]) == "ping"


def test_hosts_reach_the_root_namespace_on_the_bridge(hosts):
    server = subprocess.Popen([sys.executable, "-c", SERVER, hosts.host_address],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        assert talk(hosts, 2, hosts.host_address) == "ping"
        hosts.cut(2)
        assert talk(hosts, 2, hosts.host_address) in ("TimeoutError", "OSError")
    finally:
        server.kill()
        server.wait()


def test_close_removes_everything_and_kills_what_runs_inside():
    h = Hosts(2).create()
    proc = h.run(0, ["sleep", "60"])
    h.close()
    assert proc.wait(5) == -9
    names = subprocess.run([IP, "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run([IP, "-o", "link"], capture_output=True, text=True).stdout
    assert h.token not in names and h.token not in links


def test_a_leader_cut_off_from_etcd_gives_up_before_a_follower_is_elected(hosts, tmp_path):
    """The leader runs in host 0, etcd and the follower in the root namespace; host 0's
    link goes down.  The leader must take its lease as lost (and so stop acknowledging)
    no later than the follower is elected in its place."""
    import json
    import os
    import time

    from nsqshm.consistence.etcd.session import EtcdSession
    from nsqshm.consistence.leadership import CANDIDATE, Leadership
    from nsqshm.consistence.topology import NodeInfo, TopicMeta, Topology
    from tests.consistence.conftest import TTL
    from tests.consistence.etcd_server import ETCD, EtcdServer
    from tests.consistence.wait import wait_for

    if ETCD is None:
        pytest.skip("etcd not installed (scripts/setup.sh installs Debian's etcd-server)")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    etcd = EtcdServer(tmp_path, host=hosts.host_address).start()
    session = EtcdSession(etcd.endpoint, ttl=TTL, timeout=1.0).start()
    leader = None
    try:
        topology = Topology(session, "c1")
        follower = Leadership(topology, NodeInfo("b", hosts.host_address))
        topology.create_topic("t", TopicMeta(1, 2), [["a", "b"]])
        leader = hosts.run(0, ["env", f"PYTHONPATH={root}", sys.executable, "-m",
                               "tests.consistence.leader_node", etcd.endpoint, "c1", "a", "t",
                               "0", str(TTL)], stdout=subprocess.PIPE, text=True, cwd=root)
        held = json.loads(leader.stdout.readline())
        assert held["leader"] == "a"
        elected = []

        def on_role(role, state):
            if role == CANDIDATE:
                elected.append((time.monotonic(), follower.elect("t", 0)))

        watch = follower.watch_role("t", 0, on_role)
        hosts.cut(0)
        cut_at = time.monotonic()
        assert wait_for(lambda: elected, TTL + 3)
        elected_at, state = elected[0]
        assert state.leader == "b" and state.epoch > held["epoch"]
        lost_at = json.loads(leader.stdout.readline())["lost_at"]  # printed by the cut leader
        assert cut_at < lost_at <= elected_at, (cut_at, lost_at, elected_at)
        assert leader.poll() is None  # still running, cut off
        watch.stop()
    finally:
        if leader is not None:
            leader.kill()
            leader.wait()
        session.close(revoke=False)
        etcd.stop()
