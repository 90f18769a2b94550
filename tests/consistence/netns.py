"""Hosts for the multi-host tests: network namespaces joined by veth pairs on a bridge
(iproute2; needs root).

    root namespace                     namespace <name>-<i>
    bridge br<tok>  10.A.B.254/24 ─┬── v<tok><i>h ══ veth ══ eth0  10.A.B.<i+1>/24
      (etcd and the test process   ├── ...                   (default route via .254)
       reach every host here)      └── ...

`cut(i)` takes host i's link down (host-side end of its veth): it no longer reaches the
other hosts nor the root namespace, while processes inside it go on running;
`restore(i)` brings it back.  `run(i, argv)` starts a process inside host i.
`close()` kills what still runs in the namespaces and deletes namespaces, veths and
bridge; a `with` block or the pytest fixture always calls it.  Names carry a random
token so parallel runs do not collide; interface names stay within Linux's 15 bytes.
"""

import ipaddress
import os
import secrets
import shutil
import signal
import subprocess

IP = shutil.which("ip")


def available():
    """Why namespaces cannot be made here, or "" if they can."""
    if IP is None:
        return "iproute2's ip is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return ""


def _ip(*args, check=True):
    return subprocess.run([IP, *args], check=check, capture_output=True, text=True, timeout=10)


def _free_subnet():
    """A 10.x.y.0/24 no interface of the root namespace is on."""
    used = _ip("-4", "-o", "addr", "show").stdout
    for _ in range(64):
        net = ipaddress.ip_network(f"10.{secrets.randbelow(150) + 100}."
                                   f"{secrets.randbelow(256)}.0/24")
        first_three = str(net.network_address).rsplit(".", 1)[0]
        if f"inet {first_three}." not in used:
            return net
    raise RuntimeError("no free 10.x.y.0/24 subnet")


class Hosts:
    def __init__(self, count):
        if not 1 <= count <= 200:
            raise ValueError("1 to 200 hosts")
        self.count = count
        self.token = secrets.token_hex(3)  # 6 hex digits
        self.subnet = _free_subnet()
        base = self.subnet.network_address
        self.bridge = f"br{self.token}"
        self.host_address = str(base + 254)  # the root namespace, on the bridge
        self.namespaces = [f"nsqshm-{self.token}-{i}" for i in range(count)]
        self.addresses = [str(base + i + 1) for i in range(count)]
        self._veths = [f"v{self.token}{i}h" for i in range(count)]
        self._created = False
        self._procs = []  # what run() started

    # -- life ------------------------------------------------------------------------

    def create(self):
        self._created = True
        try:
            prefix = self.subnet.prefixlen
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.host_address}/{prefix}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, ns in enumerate(self.namespaces):
                host_end, peer = self._veths[i], f"v{self.token}{i}n"
                _ip("netns", "add", ns)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", peer)
                _ip("link", "set", peer, "netns", ns)
                _ip("link", "set", host_end, "master", self.bridge)
                _ip("link", "set", host_end, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "link", "set", peer, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.addresses[i]}/{prefix}", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "route", "add", "default", "via", self.host_address)
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        """Kill what runs inside, delete everything made; never raises."""
        if not self._created:
            return
        self._created = False
        # what run() started (it may not have entered its namespace yet), then whatever
        # else runs inside one (started through command())
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        for ns in self.namespaces:
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", ns, check=False)  # its end of the veth goes with it
        for veth in self._veths:
            _ip("link", "del", veth, check=False)
        _ip("link", "del", self.bridge, check=False)

    def __enter__(self):
        return self.create()

    def __exit__(self, *exc):
        self.close()

    # -- use -------------------------------------------------------------------------

    def command(self, i, argv):
        """argv wrapped to run inside host i."""
        return [IP, "netns", "exec", self.namespaces[i], *argv]

    def run(self, i, argv, **popen):
        """Start argv inside host i -> Popen (close() kills it if still running)."""
        proc = subprocess.Popen(self.command(i, argv), **popen)
        self._procs.append(proc)
        return proc

    def check_output(self, i, argv, timeout=10):
        return subprocess.run(self.command(i, argv), check=True, capture_output=True,
                              text=True, timeout=timeout).stdout

    def cut(self, i):
        """Host i loses its link: nothing in or out, its processes keep running."""
        _ip("link", "set", self._veths[i], "down")

    def restore(self, i):
        _ip("link", "set", self._veths[i], "up")
