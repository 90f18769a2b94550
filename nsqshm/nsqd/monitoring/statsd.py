"""nsqd's statsd pushes (nsqd/statsd.go, internal/statsd, internal/writers).

Every --statsd-interval a greenlet takes the /stats numbers (without
clients) and sends, over UDP to --statsd-address, lines
`<prefix><stat>:<value>|<type>`:

    topic.<t>.message_count  c   (increase since the last push)
    topic.<t>.message_bytes  c
    topic.<t>.depth, topic.<t>.backend_depth  g
    topic.<t>.e2e_processing_latency_<pct>  g   (per configured percentile)
    topic.<t>.channel.<c>.message_count  c
    topic.<t>.channel.<c>.depth, .backend_depth, .in_flight_count, .deferred_count  g
    topic.<t>.channel.<c>.requeue_count, .timeout_count  c
    topic.<t>.channel.<c>.clients  g
    topic.<t>.channel.<c>.e2e_processing_latency_<pct>  g
    mem.heap_objects, mem.heap_idle_bytes, mem.heap_in_use_bytes,
    mem.heap_released_bytes, mem.gc_pause_usec_100/_99/_95, mem.next_gc_bytes  g
    mem.gc_runs  c                                   (with --statsd-mem-stats)

The numbers are the whole broker's: every worker's part, merged as /stats
merges them (memory: stats.merge_memory).

Lines are packed whole into datagrams of at most --statsd-udp-packet-size
bytes (a longer line goes alone), and the datagrams are spread over the
interval minus one second, as nsqd's SpreadWriter does.  Topics and
channels ending in #ephemeral are skipped with --statsd-exclude-ephemeral.

The prefix ("nsq.%s" by default) has %s replaced by the broadcast address
and HTTP port with "." and ":" turned into "_", and always ends in ".";
nsqd rewrites its statsd_prefix option so, and so does start() here.
"""

import socket
import time

import gevent

from nsqshm.flags import split_host_port
from nsqshm.nsqd.monitoring.stats import broker_stats

DEFAULT_BUFFER = 4096  # bufio's size when asked for one <= 0

MEM_GAUGES = ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
              "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes")


def host_key(host_port):
    """internal/statsd HostKey."""
    return host_port.replace(".", "_").replace(":", "_")


def expand_prefix(prefix, broadcast_address, http_port):
    """nsqd.New's statsd prefix: %s -> host key of broadcast address:port,
    then a trailing "." (an empty prefix stays empty)."""
    if not prefix:
        return prefix
    host = f"[{broadcast_address}]" if ":" in broadcast_address else broadcast_address
    prefix = prefix.replace("%s", host_key(f"{host}:{http_port}"))
    return prefix if prefix.endswith(".") else prefix + "."


def packets(lines, size):
    """BoundaryBufferedWriter over bufio.Writer: whole lines per datagram."""
    size = size if size > 0 else DEFAULT_BUFFER
    out = []
    buf = bytearray()
    for line in lines:
        if len(line) > size - len(buf) and buf:
            out.append(bytes(buf))
            buf.clear()
        if len(line) > size:  # a large write with an empty buffer goes straight out
            out.append(line)
        else:
            buf += line
    if buf:
        out.append(bytes(buf))
    return out


def _e2e(stats):
    result = stats.get("e2e_processing_latency") or {}
    return result.get("percentiles") or ()


class StatsdClient:
    """internal/statsd Client: formats lines; `lines` collects them."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.lines = []

    def incr(self, stat, count):
        self.lines.append(f"{self.prefix}{stat}:{int(count)}|c\n".encode())

    def gauge(self, stat, value):
        self.lines.append(f"{self.prefix}{stat}:{int(value)}|g\n".encode())


class Statsd:
    """nsqd's statsdLoop."""

    def __init__(self, nsqd):
        self.nsqd = nsqd
        self.log = nsqd.log
        self.last_topics = {}  # topic name -> (topic stats, {channel name: channel stats})
        self.last_gc_runs = 0
        self._greenlet = None
        self.exiting = False

    def start(self):
        self._greenlet = gevent.spawn(self._loop)

    def stop(self):
        self.exiting = True
        if self._greenlet is not None:
            self._greenlet.kill(block=True, timeout=2)

    def _loop(self):
        interval = self.nsqd.opts.statsd_interval
        next_at = time.monotonic() + interval
        try:
            while not self.exiting:
                gevent.sleep(max(0.0, next_at - time.monotonic()))
                next_at += interval
                if next_at <= time.monotonic():  # a ticker drops missed ticks
                    next_at = time.monotonic() + interval
                self.push()
        finally:
            self.log.info("STATSD: closing")

    def lines(self):
        """This push's lines (and remember the counts for the next one)."""
        opts = self.nsqd.opts
        exclude = opts.statsd_exclude_ephemeral
        client = StatsdClient(opts.statsd_prefix)
        # the whole broker's, whichever worker pushes (worker 0 does)
        part = broker_stats(self.nsqd, "", "", False, include_mem=opts.statsd_mem_stats)
        topics = part["topics"]
        for topic in topics or ():
            name = topic["topic_name"]
            if exclude and name.endswith("#ephemeral"):
                continue
            last_topic, last_channels = self.last_topics.get(name, ({}, {}))
            client.incr(f"topic.{name}.message_count",
                        topic["message_count"] - last_topic.get("message_count", 0))
            client.incr(f"topic.{name}.message_bytes",
                        topic["message_bytes"] - last_topic.get("message_bytes", 0))
            client.gauge(f"topic.{name}.depth", topic["depth"])
            client.gauge(f"topic.{name}.backend_depth", topic["backend_depth"])
            for item in _e2e(topic):
                client.gauge(f"topic.{name}.e2e_processing_latency_{item['quantile'] * 100:.0f}",
                             item["value"])
            for channel in topic["channels"]:
                cname = channel["channel_name"]
                if exclude and cname.endswith("#ephemeral"):
                    continue
                last = last_channels.get(cname, {})
                stat = f"topic.{name}.channel.{cname}"
                client.incr(f"{stat}.message_count",
                            channel["message_count"] - last.get("message_count", 0))
                client.gauge(f"{stat}.depth", channel["depth"])
                client.gauge(f"{stat}.backend_depth", channel["backend_depth"])
                client.gauge(f"{stat}.in_flight_count", channel["in_flight_count"])
                client.gauge(f"{stat}.deferred_count", channel["deferred_count"])
                client.incr(f"{stat}.requeue_count",
                            channel["requeue_count"] - last.get("requeue_count", 0))
                client.incr(f"{stat}.timeout_count",
                            channel["timeout_count"] - last.get("timeout_count", 0))
                client.gauge(f"{stat}.clients", channel["client_count"])
                for item in _e2e(channel):
                    client.gauge(f"{stat}.e2e_processing_latency_{item['quantile'] * 100:.0f}",
                                 item["value"])
        # nsqd compares with the last push's stats, excluded topics included
        self.last_topics = {t["topic_name"]: (t, {c["channel_name"]: c for c in t["channels"]})
                            for t in topics or ()}
        if opts.statsd_mem_stats:
            ms = part["memory"]  # every worker's (stats.merge_memory)
            for key in MEM_GAUGES:
                client.gauge(f"mem.{key}", ms[key])
            client.incr("mem.gc_runs", ms["gc_total_runs"] - self.last_gc_runs)
            self.last_gc_runs = ms["gc_total_runs"]
        return client.lines

    def push(self):
        opts = self.nsqd.opts
        addr = opts.statsd_address
        try:
            host, port = split_host_port(addr)
            family, kind, proto, _, address = socket.getaddrinfo(
                host or None, int(port), type=socket.SOCK_DGRAM)[0]
            sock = socket.socket(family, kind, proto)
            try:
                sock.connect(address)
            except OSError:
                sock.close()
                raise
        except (OSError, ValueError):
            self.log.error(f"failed to create UDP socket to statsd({addr})")
            return
        try:
            self.log.info(f"STATSD: pushing stats to {addr}")
            datagrams = packets(self.lines(), opts.statsd_udp_packet_size)
            spread = opts.statsd_interval - 1.0  # nsqd's SpreadWriter window
            gap = spread / len(datagrams) if datagrams and spread > 0 else 0.0
            for datagram in datagrams:
                try:
                    sock.send(datagram)
                except OSError:
                    pass  # UDP: nsqd ignores write errors too
                if gap and not self.exiting:
                    gevent.sleep(gap)
        finally:
            sock.close()


def start(nsqd):
    """The running Statsd with --statsd-address, else None (nsqd.Main)."""
    if not nsqd.opts.statsd_address:
        return None
    service = Statsd(nsqd)
    service.start()
    return service
