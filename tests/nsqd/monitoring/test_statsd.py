"""nsqd's statsd pushes (nsqd 1.3's statsd.go): metric names and types,
counter deltas, the prefix, packet sizes, exclusions and spreading, received
by a UDP socket in the test."""

import socket
import threading
import time
from types import SimpleNamespace

import pytest

from nsqshm.nsqd.log import Logger
from nsqshm.nsqd.monitoring import statsd as sd
from tests.nsqd.conftest import wait_for
from tests.nsqd.test_http_api import TCP

MEM = ["mem.heap_objects", "mem.heap_idle_bytes", "mem.heap_in_use_bytes",
       "mem.heap_released_bytes", "mem.gc_pause_usec_100", "mem.gc_pause_usec_99",
       "mem.gc_pause_usec_95", "mem.next_gc_bytes", "mem.gc_runs"]


class Receiver:
    """A statsd daemon: keeps every datagram with its arrival time."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.datagrams = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            self.datagrams.append((time.monotonic(), data))

    def lines(self):
        return [line for _, d in list(self.datagrams) for line in d.decode().splitlines()]

    def pushes(self, last="gc_runs"):
        """The lines of each complete push (a push ends with `last`)."""
        out, current = [], []
        for line in self.lines():
            current.append(line)
            if line.split(":")[0].endswith(last):
                out.append(current)
                current = []
        return out

    def close(self):
        self.sock.close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def parse(line, prefix):
    assert line.startswith(prefix), line
    stat, _, rest = line[len(prefix):].partition(":")
    value, _, kind = rest.partition("|")
    return stat, int(value), kind


def test_names_types_values_and_deltas(nsqd_factory, receiver):
    node = nsqd_factory(f"--statsd-address={receiver.address}", "--statsd-interval=1s",
                        "--broadcast-address=127.0.0.1")
    prefix = f"nsq.127_0_0_1_{node.http_port}."
    node.post("/topic/create?topic=st")
    node.post("/channel/create?topic=st&channel=c")
    node.post("/mpub?topic=st", b"a0\na1\na2")
    assert wait_for(lambda: any("topic.st." in li for push in receiver.pushes() for li in push),
                    timeout=5)
    push = [p for p in receiver.pushes() if any("topic.st." in li for li in p)][0]
    parsed = [parse(li, prefix) for li in push]
    assert [(s, k) for s, _, k in parsed] == [
        ("topic.st.message_count", "c"), ("topic.st.message_bytes", "c"),
        ("topic.st.depth", "g"), ("topic.st.backend_depth", "g"),
        ("topic.st.channel.c.message_count", "c"), ("topic.st.channel.c.depth", "g"),
        ("topic.st.channel.c.backend_depth", "g"), ("topic.st.channel.c.in_flight_count", "g"),
        ("topic.st.channel.c.deferred_count", "g"), ("topic.st.channel.c.requeue_count", "c"),
        ("topic.st.channel.c.timeout_count", "c"), ("topic.st.channel.c.clients", "g"),
        *[(m, "c" if m == "mem.gc_runs" else "g") for m in MEM]]
    values = {s: v for s, v, _ in parsed}
    assert values["topic.st.message_count"] == 3
    assert values["topic.st.message_bytes"] == 6
    assert values["topic.st.channel.c.depth"] == 3
    assert values["mem.heap_objects"] > 0
    assert any(f"STATSD: pushing stats to {receiver.address}" in li for li in node.lines)

    # counters are deltas since the last push; gauges are current values
    consumer = TCP(node)
    consumer.sub("st", "c")
    node.post("/pub?topic=st", b"a3")
    count = len(receiver.pushes())
    assert wait_for(lambda: len(receiver.pushes()) >= count + 2, timeout=5)
    pushes = [[parse(li, prefix) for li in p] for p in receiver.pushes()]
    total = sum(v for p in pushes for s, v, _ in p if s == "topic.st.message_count")
    assert total == 4
    last = {s: v for s, v, _ in pushes[-1]}
    assert last["topic.st.message_count"] == 0
    assert last["topic.st.channel.c.clients"] == 1
    assert last["topic.st.channel.c.depth"] == 4
    consumer.close()


def test_exclusions_packet_size_and_prefix(nsqd_factory, receiver):
    node = nsqd_factory(f"--statsd-address={receiver.address}", "--statsd-interval=1s",
                        "--statsd-exclude-ephemeral", "--statsd-mem-stats=false",
                        "--statsd-udp-packet-size=120", "--statsd-prefix=app")
    a, b = TCP(node), TCP(node)
    a.sub("keep", "c")
    b.sub("keep", "x#ephemeral")
    c = TCP(node)
    c.sub("gone#ephemeral", "c")
    assert wait_for(lambda: receiver.pushes(last="clients"), timeout=5)
    time.sleep(0.2)
    lines = receiver.lines()
    assert lines and all(li.startswith("app.") for li in lines)
    assert not [li for li in lines if "#ephemeral" in li]
    assert not [li for li in lines if li.startswith("app.mem.")]
    assert "app.topic.keep.channel.c.clients:1|g" in lines
    for _, datagram in receiver.datagrams:
        assert len(datagram) <= 120 and datagram.endswith(b"\n")
    for conn in (a, b, c):
        conn.close()


def test_unusable_address_is_logged(nsqd_factory):
    node = nsqd_factory("--statsd-address=127.0.0.1:nope", "--statsd-interval=1s")
    assert wait_for(lambda: any("ERROR: failed to create UDP socket to statsd(127.0.0.1:nope)"
                                in li for li in node.lines), timeout=5)


# ---------------------------------------------------------------------------
# the parts, in process


def test_expand_prefix():
    assert sd.expand_prefix("nsq.%s", "10.0.0.1", 4151) == "nsq.10_0_0_1_4151."
    assert sd.expand_prefix("nsq.%s.x.", "h.example", 1) == "nsq.h_example_1.x."
    assert sd.expand_prefix("%s-%s", "::1", 2) == "[__1]_2-[__1]_2."
    assert sd.expand_prefix("", "h", 1) == ""


def test_packets_keep_lines_whole():
    lines = [b"a" * 10 + b"\n", b"b" * 20 + b"\n", b"c" * 50 + b"\n", b"d\n"]
    assert sd.packets(lines, 32) == [lines[0] + lines[1], lines[2], lines[3]]
    assert sd.packets(lines, 0) == [b"".join(lines)]  # bufio's default size
    assert sd.packets([], 508) == []


def test_push_spreads_datagrams_over_the_interval_minus_a_second(receiver):
    import gevent

    from nsqshm.nsqd import options

    opts = options.parse_args([f"--statsd-address={receiver.address}",
                               "--statsd-interval=1500ms", "--statsd-udp-packet-size=40"])
    opts.statsd_prefix = "p."
    nsqd = SimpleNamespace(opts=opts, topics={}, clients={}, log=Logger(level="error"))
    service = sd.Statsd(nsqd)
    started = time.monotonic()
    gevent.spawn(service.push).join()
    elapsed = time.monotonic() - started
    assert wait_for(lambda: len(receiver.pushes()) == 1)
    stamps = [t for t, _ in receiver.datagrams]
    assert len(stamps) >= 5  # nine mem lines in datagrams of at most 40 bytes
    assert 0.45 <= elapsed < 1.5  # spread over 1.5 s - 1 s
    assert stamps[-1] - stamps[0] >= 0.3


@pytest.mark.workers(2)
def test_worker_0_pushes_the_whole_brokers_numbers(nsqd_factory, receiver, tmp_path):
    """Consumers and publishes on both workers, and both workers' memory (an
    idle worker's heap is about half of the broker's), in worker 0's pushes."""
    import json

    from tests.nsqd.conftest import http_call, http_on_worker
    from tests.nsqd.workers.test_workers import client_on_worker

    node = nsqd_factory(f"--statsd-address={receiver.address}", "--statsd-interval=1s",
                        "--broadcast-address=127.0.0.1")
    prefix = f"nsq.127_0_0_1_{node.http_port}."
    consumers = [client_on_worker(node, i, "both", "c") for i in (0, 1)]
    for i in (0, 1):
        assert http_call(http_on_worker(node, i), "POST", "/mpub?topic=both",
                         b"x\n" * (i + 1))[0] == 200
    count = len(receiver.pushes())
    assert wait_for(lambda: len(receiver.pushes()) >= count + 2, timeout=5)
    last = dict((s, v) for s, v, _ in (parse(li, prefix) for li in receiver.pushes()[-1]))
    assert last["topic.both.channel.c.clients"] == 2
    total = sum(v for p in receiver.pushes() for s, v, _ in (parse(li, prefix) for li in p)
                if s == "topic.both.message_count")
    assert total == 3
    (tmp_path / "one").mkdir()
    one = nsqd_factory("--workers=1", data_path=tmp_path / "one")
    heap_one = json.loads(one.get("/stats?format=json")[1])["memory"]["heap_objects"]
    assert last["mem.heap_objects"] > 1.5 * heap_one
    for c in consumers:
        c.close()
