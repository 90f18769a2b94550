"""A cluster for the replication tests: a real etcd on the bridge of three network
namespaces (netns.py), an `nsqshm lookupd` in the root namespace, and an `nsqshm
start` in each namespace, all in cluster mode with a short lease TTL."""

import json
import os
import signal
import socket
import struct
import time
import urllib.error
import urllib.parse
import urllib.request

from nsqshm import protocol as p
from nsqshm.consistence.etcd.session import EtcdSession
from nsqshm.consistence.topology import Topology
from tests.consistence.etcd_server import EtcdServer
from tests.consistence.netns import Hosts
from tests.nsqd.conftest import Lookupd, Server

RPC_PORT = 4250
TTL = "2s"
CLUSTER_ID = "nsq-test-cluster"  # --cluster-id's default: the cluster's nodes use it
LOG_TAIL = 400  # lines of each process's log a failure report shows

# the clusters made in the running test: conftest.py adds their processes' logs to the
# report of a failure (a cluster made inside the test is closed before the report)
MADE = []


class Node:
    """One nsqd in namespace i."""

    def __init__(self, cluster, i):
        self.cluster = cluster
        self.i = i
        self.address = cluster.hosts.addresses[i]
        self.id = f"{self.address}:{RPC_PORT}"
        self.data_path = os.path.join(cluster.tmp, f"node{i}")
        os.makedirs(self.data_path, exist_ok=True)
        self.server = None
        self.servers = []  # each start's, for the logs of a failure

    def start(self):
        hosts, a = self.cluster.hosts, self.address
        args = [f"--tcp-address={a}:0", f"--http-address={a}:0", f"--broadcast-address={a}",
                f"--cluster-leadership-addresses={self.cluster.etcd.endpoint}",
                f"--rpc-port={RPC_PORT}", f"--cluster-lease-ttl={self.cluster.ttl}",
                "--log-level=info", *self.cluster.args]
        # a restart takes the same shared memory back, as a restarted host's nsqd does
        self.server = Server(args, self.data_path, workers=self.cluster.workers,
                             wrap=hosts.command(self.i, []),
                             prefix=self.server.prefix if self.server else None)
        self.servers.append(self.server)
        self.tcp = (a, self.server.tcp_port)
        self.http = f"http://{a}:{self.server.http_port}"
        self.server.http = self.http  # (its get/post: the node's address, not 127.0.0.1)
        return self

    def kill(self):
        """SIGKILL the supervisor: its workers die with it (PR_SET_PDEATHSIG)."""
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait(10)

    def stop(self):
        if self.server is not None:
            self.server.cleanup()

    def processes(self):
        """The supervisor's PID and its descendants' (the workers)."""
        children = {}
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
        found, todo = [], [self.server.proc.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(children.get(pid, ()))
        return found

    def freeze(self):
        """SIGSTOP every process of the node: alive to etcd until its lease runs
        out, answering nothing (a host stalled by load)."""
        self._signal_all(signal.SIGSTOP)

    def thaw(self):
        self._signal_all(signal.SIGCONT)

    def _signal_all(self, sig):
        for pid in self.processes():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:  # (gone since the listing)
                pass

    def get_json(self, path):
        with urllib.request.urlopen(self.http + path, timeout=5) as resp:
            return json.loads(resp.read())

    def log_topic_specs(self):
        """{name: spec} of the node's nsqshm.logtopics.json."""
        try:
            with open(os.path.join(self.data_path, "nsqshm.logtopics.json")) as f:
                return {t["name"]: t for t in json.load(f)["topics"]}
        except (FileNotFoundError, ValueError):
            return {}

    def partition_stats(self, topic, partition=0):
        """The partition's entry in /stats (start_offset, end_offset, ...), or None."""
        doc = self.get_json(f"/stats?format=json&topic={topic}")
        for t in doc["topics"] or ():
            if t["topic_name"] == topic:
                return t["partitions"][partition]
        return None

    def end_offset(self, topic, partition=0):
        stats = self.partition_stats(topic, partition)
        return None if stats is None else stats["end_offset"]


class Cluster:
    def __init__(self, tmp, workers=1, count=3, ttl=TTL, args=(), lookupd_args=()):
        self.tmp = str(tmp)
        self.workers = workers
        self.ttl = ttl
        self.args = tuple(args)  # more flags for every nsqd
        self.hosts = Hosts(count).create()
        self.etcd = None
        self.lookupd = None
        self.nodes = []
        MADE.append(self)
        try:
            etcd_dir = os.path.join(self.tmp, "etcd")
            os.makedirs(etcd_dir)
            self.etcd = EtcdServer(etcd_dir, host=self.hosts.host_address).start()
            self.lookupd = Lookupd([f"--cluster-leadership-addresses={self.etcd.endpoint}",
                                    f"--cluster-lease-ttl={ttl}", *lookupd_args])
            self.nodes = [Node(self, i) for i in range(count)]
            for node in self.nodes:
                node.start()
        except BaseException:
            self.close()
            raise

    def close(self):
        for node in self.nodes:
            node.stop()
        if self.lookupd is not None:
            self.lookupd.stop()
        if self.etcd is not None:
            self.etcd.stop()
        self.hosts.close()

    def node(self, node_id):
        return next(n for n in self.nodes if n.id == node_id)

    def logs(self):
        """The last LOG_TAIL lines of each process's stderr (every start of a node)."""
        parts = []
        if self.lookupd is not None:
            parts.append(("lookupd", self.lookupd.lines))
        for node in self.nodes:
            for n, server in enumerate(node.servers):
                parts.append((f"node {node.id} (start {n + 1})", server.lines))
        return "\n".join(f"----- {name}\n" + "".join(lines[-LOG_TAIL:])
                         for name, lines in parts)

    def create_topic(self, topic, partitions, replicator, timeout=15, extra=""):
        """POST /topic/create on the lookupd, once every node is registered (the
        placement spreads over the nodes registered at that moment)."""
        end = time.monotonic() + timeout
        session = EtcdSession(self.etcd.endpoint, ttl=5).start()
        try:
            topology = Topology(session, CLUSTER_ID)
            while len(topology.nodes()) < len(self.nodes) and time.monotonic() < end:
                time.sleep(0.1)
        finally:
            session.close()
        while True:
            status, body = self.lookupd.post(f"/topic/create?topic={topic}&partition_num="
                                             f"{partitions}&replicator={replicator}{extra}")
            if status == 200 or time.monotonic() > end:
                return status, body
            time.sleep(0.1)

    def lookup(self, topic):
        return self.lookupd.get_json(f"/lookup?topic={urllib.parse.quote(topic)}&access=w")

    def leader(self, topic, partition=0, timeout=15, not_in=()):
        """The node the lookupd names leader of the partition (waiting for one)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                entry = self.lookup(topic)["partitions"].get(str(partition))
            except (urllib.error.URLError, KeyError, OSError):
                entry = None
            if entry is not None:
                node_id = f"{entry['broadcast_address']}:{RPC_PORT}"
                if node_id not in not_in:
                    return self.node(node_id)
            time.sleep(0.05)
        raise AssertionError(f"no leader for {topic}-{partition} in {timeout}s")


class Client:
    """A plain NSQ TCP client (the V2 protocol) to one node."""

    def __init__(self, node, timeout=10):
        self.sock = socket.create_connection(node.tcp, timeout=timeout)
        self.sock.sendall(p.MAGIC_V2)
        self.dec = p.FrameDecoder()
        self.pending = []

    def send(self, data):
        self.sock.sendall(data)

    def frame(self):
        while not self.pending:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed")
            self.dec.feed(data)
            self.pending.extend(self.dec.frames())
        return self.pending.pop(0)

    def response(self):
        while True:
            kind, data = self.frame()
            if kind == p.FRAME_TYPE_RESPONSE and data == p.HEARTBEAT:
                self.send(p.nop())
                continue
            if kind != p.FRAME_TYPE_MESSAGE:
                return kind, data

    def pub(self, topic, body, partition=0):
        self.send(b"PUB %s %d\n" % (topic.encode(), partition) + struct.pack(">I", len(body)) + body)
        return self.response()

    def message_frame(self):
        """The next message frame's data, undecoded (heartbeats answered)."""
        while True:
            kind, data = self.frame()
            if kind == p.FRAME_TYPE_MESSAGE:
                return data
            if data == p.HEARTBEAT:
                self.send(p.nop())

    def message(self):
        return p.decode_message(self.message_frame())

    def consume(self, topic, channel, count, partition=None):
        """SUB (to one partition if given), then `count` messages (each FINished): their
        bodies."""
        self.send(p.sub(topic, channel) if partition is None else
                  b"SUB %s %s %d\n" % (topic.encode(), channel.encode(), partition))
        assert self.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        self.send(p.rdy(1000))
        bodies = []
        for _ in range(count):
            m = self.message()
            bodies.append(m.body)
            self.send(p.fin(m.id))
        return bodies

    def close(self):
        self.sock.close()
