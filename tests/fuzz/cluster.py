"""The servers a fuzzing run talks to, and its witnesses: nsqlookupd, nsqd
--workers 2 registered to it and nsqadmin reading it, as real processes;
a witness subscribes to a topic of its own and publishes tagged bodies to it,
so that at the end every message published to it has come, and no other."""

import json
import os
import socket
import stat
import struct
import threading
import urllib.request

import psutil

from tests.nsqadmin.conftest import Admin
from tests.nsqd.conftest import Lookupd, Server

from .conversation import parse_frames
from .v2_inputs import tag, untag


class Cluster:
    """nsqlookupd, nsqd --workers 2 registered to it, nsqadmin reading it."""

    def __init__(self, data_path, limits, workers=2):
        self.lookupd = Lookupd()
        self.nsqd = Server([f"--workers={workers}", f"--max-msg-size={limits.msg}",
                            f"--max-body-size={limits.body}",
                            f"--lookupd-tcp-address={self.lookupd.tcp_address}",
                            "--broadcast-address=127.0.0.1"], data_path)
        self.admin = Admin([f"--lookupd-http-address={self.lookupd.http_address}"])
        self.node = f"127.0.0.1:{self.nsqd.http_port}"

    def processes(self):
        """Every server process: {pid: psutil.Process}."""
        procs = {}
        for top in (self.lookupd.proc, self.nsqd.proc, self.admin.proc):
            try:
                p = psutil.Process(top.pid)
                procs[p.pid] = p
                for child in p.children(recursive=True):
                    procs[child.pid] = child
            except psutil.NoSuchProcess:
                pass
        return procs

    def rss(self):
        total = 0
        for p in self.processes().values():
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def memory(self):
        """What the servers hold, in bytes: "heap", the anonymous resident
        pages of every process (what a leak grows); "rss", their RSS summed
        (shared pages counted in each process that touched them: a ring's
        pages in both workers); "shm", the blocks of the broker's segments in
        /dev/shm, each counted once (its rings grow with the topics and
        channels the inputs name, and with what is queued in them)."""
        heap = 0
        for p in self.processes().values():
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    heap += sum(int(line.split()[1]) * 1024 for line in f
                                if line.startswith("RssAnon:"))
            except FileNotFoundError:
                pass
        shm = 0
        for entry in os.listdir("/dev/shm"):
            if entry.startswith(self.nsqd.prefix + "."):
                try:
                    shm += os.stat(f"/dev/shm/{entry}").st_blocks * 512
                except FileNotFoundError:
                    pass
        return {"heap": heap, "rss": self.rss(), "shm": shm}

    def queues(self):
        """The broker's topics and channels: {(topic, channel or None)}."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.nsqd.http_port}/stats?"
                                    "format=json&include_clients=false", timeout=30) as resp:
            doc = json.loads(resp.read())
        out = set()
        for t in doc["topics"]:
            out.add((t["topic_name"], None))
            out.update((t["topic_name"], c["channel_name"]) for c in t["channels"])
        return out

    def rings(self):
        """The rings in /dev/shm: {(topic, channel or None)} from their names
        (<prefix>.t.<topic>, <prefix>.c.<topic>:<channel>)."""
        out = set()
        for entry in os.listdir("/dev/shm"):
            kind, _, name = entry[len(self.nsqd.prefix) + 1:].partition(".")
            if not entry.startswith(self.nsqd.prefix + ".") or kind not in ("t", "c"):
                continue
            try:
                if not stat.S_ISREG(os.lstat(f"/dev/shm/{entry}").st_mode):
                    continue  # a waiter's FIFO
            except FileNotFoundError:
                continue
            out.add((name, None) if kind == "t" else tuple(name.split(":", 1)))
        return out

    def stale_mappings(self):
        """Segments of the broker that a process maps although their name is
        gone, or names another segment by now: handles a delete left open,
        or a worker left on a ring the others no longer use."""
        return stale_mappings([p.pid for p in self.processes().values()], self.nsqd.prefix)

    def logs(self):
        return {"nsqd": self.nsqd.lines, "nsqlookupd": self.lookupd.lines, "nsqadmin": self.admin.lines}

    def close(self):
        self.admin.stop()
        self.nsqd.cleanup()
        self.lookupd.stop()


class Witness:
    """A subscriber to a topic of its own and a publisher of tagged bodies to
    it: at the end, every message published has come, and nothing else."""

    def __init__(self, address, topic):
        self.topic = topic
        self.published = 0
        self.failed = None
        self.received = []
        self.foreign = []
        self.sub = socket.create_connection(address, timeout=10)
        self.sub.sendall(b"  V2SUB " + topic + b" c\nRDY 100\n")
        self.pub = socket.create_connection(address, timeout=10)
        self.pub.sendall(b"  V2")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        buf = b""
        self.sub.settimeout(1.0)
        while not self.stop.is_set():
            try:
                data = self.sub.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            frames, buf = parse_frames(buf + data)
            fins = b""
            for ftype, body in frames:
                if ftype == 2:
                    msg = body[26:]
                    (self.received if untag(msg) == self.topic else self.foreign).append(msg)
                    fins += b"FIN " + body[10:26] + b"\n"
                elif ftype == 0 and body == b"_heartbeat_":
                    fins += b"NOP\n"
            if fins:
                self.sub.sendall(fins)

    def publish(self):
        """Publish one more (False once the connection has failed)."""
        if self.failed:
            return False
        body = tag(self.topic, self.published + 1)
        try:
            self.pub.sendall(b"PUB " + self.topic + b"\n" + len(body).to_bytes(4, "big") + body)
            while True:
                frame = self._read_frame(self.pub)
                if frame != (0, b"_heartbeat_"):
                    break
                self.pub.sendall(b"NOP\n")
            ok = frame == (0, b"OK")
        except OSError as err:
            self.failed = f"publishing failed: {err!r}"
            return False
        if not ok:
            self.failed = "a PUB was not answered OK"
            return False
        self.published += 1
        return True

    @staticmethod
    def _read_frame(sock):
        def exactly(n):
            data = b""
            while len(data) < n:
                part = sock.recv(n - len(data))
                if not part:
                    raise ConnectionError("closed")
                data += part
            return data
        size, ftype = struct.unpack(">ii", exactly(8))
        return ftype, exactly(size - 4)

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sub.close()
        self.pub.close()


def stale_mappings(pids, prefix):
    """What of /dev/shm/<prefix>.* the processes map though its name is gone
    or is another segment's by now, as "pid: path (inode i, now j)".  A
    segment made unnamed (O_TMPFILE, then linked) shows in the maps as
    /dev/shm/#<inode>: it is stale when no name of the broker's has that
    inode any more (a worker left on a ring the others made anew)."""
    named = set()
    for name in os.listdir("/dev/shm"):
        if name.startswith(f"{prefix}."):
            try:
                named.add(str(os.stat(f"/dev/shm/{name}").st_ino))
            except FileNotFoundError:
                pass
    stale = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = [line.rstrip("\n").split(None, 5) for line in f]
        except FileNotFoundError:
            continue
        for fields in lines:
            if len(fields) < 6:
                continue
            if fields[5].startswith("/dev/shm/#"):
                if fields[4] not in named:
                    stale.add(f"{pid}: unnamed {fields[5]} (inode {fields[4]}, no name has it)")
                continue
            if not fields[5].startswith(f"/dev/shm/{prefix}."):
                continue
            path = fields[5].removesuffix(" (deleted)")
            try:
                now = str(os.stat(path).st_ino)
            except FileNotFoundError:
                now = None
            if now != fields[4]:
                stale.add(f"{pid}: {path} (inode {fields[4]}, now {now})")
    return sorted(stale)
