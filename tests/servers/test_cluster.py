"""servers/cluster: the local cluster (2 nsqlookupd, 3 nsqd, 1 nsqadmin)
started by its one supervisord command, a message published on one nsqd,
found through a lookupd and consumed by a client of the lookupds, then the
whole cluster stopped by its one command: every process gone, every exit
status 0.

It runs a copy of servers/cluster in a temp directory with its ports moved
to free ones, so it clashes with nothing else."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from nsqshm.nsqd.local import instance

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(ROOT, "servers", "cluster")
READER = os.path.join(ROOT, "tests", "nsqd", "clients", "lookupd_client.py")
BIN = os.path.dirname(sys.executable)  # the virtualenv's: supervisord and nsqshm
PROGRAMS = ["etcd", "nsqlookupd1", "nsqlookupd2", "nsqd1", "nsqd2", "nsqd3", "nsqadmin"]
PORT = re.compile(r"127\.0\.0\.1:(\d+)")


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    return predicate()


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        body = resp.read()
    return json.loads(body) if body[:1] == b"{" else body


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def cluster(tmp_path):
    """A copy of servers/cluster with free ports: (its directory, old port -> new port)."""
    here = tmp_path / "cluster"
    here.mkdir()
    # what a fresh clone has: the config and the empty data and log directories
    for sub in ("data/nsqd1", "data/nsqd2", "data/nsqd3", "data/etcd", "logs"):
        assert os.path.exists(os.path.join(CLUSTER, sub, ".gitignore")), sub
        (here / sub).mkdir(parents=True)
    text = open(os.path.join(CLUSTER, "supervisord.conf")).read()
    config = [line for line in text.splitlines() if not line.startswith(";")]
    ports = sorted({int(p) for p in PORT.findall("\n".join(config))})
    assert len(ports) == 13  # 2 lookupds x 2, 3 nsqd x 2, 1 nsqadmin, etcd x 2
    moved = dict(zip(ports, free_ports(len(ports)), strict=True))
    text = PORT.sub(lambda m: f"127.0.0.1:{moved[int(m.group(1))]}", text)
    (here / "supervisord.conf").write_text(text)
    yield str(here), moved
    # whatever the test did: nothing left running, no segment left in /dev/shm
    pidfile = here / "supervisord.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text())
        if alive(pid):
            for child in psutil.Process(pid).children(recursive=True):
                child.kill()
            os.kill(pid, signal.SIGKILL)
    for n in (1, 2, 3):
        prefix = instance.prefix_for(str(here / "data" / f"nsqd{n}"))
        for entry in os.listdir("/dev/shm"):
            if entry.startswith(prefix):
                os.unlink(os.path.join("/dev/shm", entry))


def test_cluster_starts_serves_through_lookupd_and_stops_cleanly(cluster):
    here, moved = cluster
    conf = os.path.join(here, "supervisord.conf")
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    ctl = [os.path.join(BIN, "supervisorctl"), "-c", conf]
    lookupd_http = [moved[4261], moved[4263]]
    nsqd_http = [moved[4251], moved[4253], moved[4255]]
    nsqd_tcp = [moved[4250], moved[4252], moved[4254]]

    # the one command up (supervisord daemonizes: its first process exits 0 at once)
    up = subprocess.run([os.path.join(BIN, "supervisord"), "-c", conf], env=env,
                        capture_output=True, text=True, timeout=30)
    assert up.returncode == 0, up.stderr
    for port in [*lookupd_http, *nsqd_http, moved[4271]]:
        assert wait_for(lambda port=port: get(port, "/ping") == b"OK"), port

    def running():  # (supervisord says RUNNING once a program has lived startsecs, 1 s)
        status = subprocess.run([*ctl, "status"], capture_output=True, text=True, timeout=30)
        return sorted(line.split()[0] for line in status.stdout.splitlines()
                      if " RUNNING " in line), status.stdout

    assert wait_for(lambda: running()[0] == sorted(PROGRAMS)), running()[1]
    for port in lookupd_http:  # every nsqd registered with every lookupd
        assert wait_for(lambda port=port: len(get(port, "/nodes")["producers"]) == 3)

    # a message on nsqd2, found through either lookupd, consumed by a lookupd client
    req = urllib.request.Request(f"http://127.0.0.1:{nsqd_http[1]}/pub?topic=cluster_t",
                                 data=b"across the cluster", method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.read() == b"OK"
    for port in lookupd_http:
        assert wait_for(lambda port=port: [p["tcp_port"] for p in
                                           get(port, "/lookup?topic=cluster_t")["producers"]]
                        == [nsqd_tcp[1]])
    out = subprocess.run([sys.executable, READER, "gnsq",
                          ",".join(f"127.0.0.1:{p}" for p in lookupd_http), "cluster_t", "c", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"received": ["across the cluster"], "nsqd": [f"127.0.0.1:{nsqd_tcp[1]}"]}

    # cluster mode: a replicated log topic made through a lookupd, written to its
    # leader, in every node's log once acknowledged
    def create():
        req = urllib.request.Request(f"http://127.0.0.1:{lookupd_http[0]}/topic/create?"
                                     "topic=cluster_r&partition_num=1&replicator=3",
                                     data=b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=5):
                return True
        except urllib.error.HTTPError:  # the nodes not all in etcd yet
            return False

    assert wait_for(create)

    def leader():
        doc = get(lookupd_http[1], "/lookup?topic=cluster_r&access=w")
        return doc.get("partitions", {}).get("0")

    assert wait_for(lambda: leader() is not None)

    def publish():
        req = urllib.request.Request(f"http://127.0.0.1:{leader()['http_port']}/pub?"
                                     "topic=cluster_r&partition=0", data=b"replicated",
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.read() == b"OK"
        except urllib.error.HTTPError:  # E_FAILED_ON_NOT_LEADER until it knows its role
            return False

    assert wait_for(publish)

    def end_offsets():
        out = []
        for port in nsqd_http:
            topics = get(port, "/stats?format=json&topic=cluster_r")["topics"]
            out += [t["partitions"][0]["end_offset"] for t in topics]
        return out

    assert end_offsets() == [1, 1, 1]

    # every process of the cluster, then the one command down
    pid = int(open(os.path.join(here, "supervisord.pid")).read())
    pids = [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]
    assert len(pids) >= 1 + 7 + 3 * 2  # supervisord, its programs, two workers per nsqd
    down = subprocess.run([*ctl, "shutdown"], capture_output=True, text=True, timeout=30)
    assert down.returncode == 0, down.stdout + down.stderr
    assert wait_for(lambda: not any(alive(p) for p in pids), timeout=60), \
        [p for p in pids if alive(p)]
    log = open(os.path.join(here, "logs", "supervisord.log")).read()
    for name in PROGRAMS:
        # etcd ends by re-raising the signal it handled (after its clean shutdown)
        end = "terminated by SIGTERM" if name == "etcd" else "exit status 0"
        assert f"stopped: {name} ({end})" in log, log[-3000:]
    assert "not expected" not in log and "FATAL" not in log, log[-3000:]  # no crash, no restart
    # each nsqd said goodbye as nsqd does
    for n in (1, 2, 3):
        assert "NSQ: bye" in open(os.path.join(here, "logs", f"nsqd{n}.log")).read()
