"""A real etcd for the tests: Debian's etcd-server binary on ephemeral ports with a temp
data dir, started, killed, frozen (SIGSTOP: a cut-off etcd) and restarted on the same
ports and data."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

ETCD = shutil.which("etcd")


def free_port():
    return free_ports(1)[0]


def free_ports(n):
    """n distinct free ports (bound at once: two binds in turn may get one port twice,
    and etcd then fails with "address already in use")."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class EtcdServer:
    def __init__(self, data_dir, host="127.0.0.1"):
        self.data_dir = str(data_dir)
        self.host = host
        self.client_port, self.peer_port = free_ports(2)
        self.proc = None
        self.log_path = os.path.join(self.data_dir, "etcd.log")

    @property
    def endpoint(self):
        return f"{self.host}:{self.client_port}"

    def start(self, timeout=15.0):
        client = f"http://{self.host}:{self.client_port}"
        peer = f"http://{self.host}:{self.peer_port}"
        args = [ETCD, "--name", "test", "--data-dir", os.path.join(self.data_dir, "member"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"test={peer}", "--initial-cluster-state", "new",
                # a one-member cluster elects itself at once; short ticks keep the
                # minimum lease TTL (1.5 election timeouts) low for quick tests
                "--heartbeat-interval", "50", "--election-timeout", "500",
                "--logger", "zap", "--log-outputs", self.log_path]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited {self.proc.returncode}: {self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.05)
        raise RuntimeError(f"etcd not healthy in {timeout}s: {self.log_tail()}")

    def healthy(self):
        try:
            url = f"http://{self.endpoint}/health"
            with urllib.request.urlopen(url, timeout=0.5) as resp:
                return json.loads(resp.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def kill(self):
        """SIGKILL, as a crash: what it fsynced survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, down_for=0.0):
        self.kill()
        time.sleep(down_for)
        return self.start()

    def freeze(self):
        """SIGSTOP: etcd keeps its sockets but answers nothing (a cut path)."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self):
        self.proc.send_signal(signal.SIGCONT)

    def stop(self):
        self.kill()

    def log_tail(self, n=2000):
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""
