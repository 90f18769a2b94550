"""nsqd's registration with nsqlookupd (nsqd/lookup.go, nsqd/lookup_peer.go).

One LookupPeer per --lookupd-tcp-address speaks nsqlookupd's TCP protocol
("  V1", then IDENTIFY / REGISTER / UNREGISTER / PING, each answered by
<int32 BE size><data>).  A peer connects lazily: any command on a closed
peer first dials (1 s timeout), sends the magic and runs the connect
callback, which IDENTIFYs (broadcast address and ports, hostname, version)
and REGISTERs every topic and channel this nsqd has.  Reads and writes have
1 s deadlines; any failure closes the connection, and the next command
(at the latest the next PING) reconnects and re-registers everything.

nsqshm's nsqd adds "topic_partitions": true to its IDENTIFY.  An nsqshm
nsqlookupd answers with the same field, and to it REGISTER and UNREGISTER
name a partition, as Youzan's nsqd registers: `REGISTER <topic> <n>` for
each partition of a log topic, partition -11 (Youzan's OLD_VERSION_PID) for
a classic topic, for channels, and for a topic that goes.  Its /lookup can
then tell Youzan's clients which partitions there are (`partitions`).  Any
other nsqlookupd (Go's ignores the field) gets NSQ's lines, as nsqd sends.

One greenlet (nsqd's lookupLoop) owns the peers and handles, in order:
topic/channel changes from NSQD.notify_change (REGISTER when created,
UNREGISTER when deleted; ephemeral ones too, as nsqd), a PING to every peer
each --lookupd-ping-interval (15 s in nsqd), and run-time changes of the
address list (PUT /config/nsqlookupd_tcp_addresses), which add and drop peers.

When a topic is created while peers are known, nsqd asks every lookupd
(HTTP /channels?topic=) for the channels others registered and creates
them at once (not ephemeral ones), so no channel misses a message; that
happens in the creating greenlet, before its first publish, as in nsqd.
"""

import http.client
import json
import socket
import struct
import time

import gevent
import gevent.queue
from gevent import socket as gsocket

from nsqshm import NSQD_COMPAT_VERSION
from nsqshm.flags import split_host_port
from nsqshm.nsqd.monitoring.stats import go_json
from nsqshm.nsqd.names import is_ephemeral
from nsqshm.youzan.lookup import OLD_VERSION_PID  # a registration without a partition

MAGIC_V1 = b"  V1"
STATE_DISCONNECTED = 1
STATE_CONNECTED = 2
PEER_TIMEOUT = 1.0  # nsqd: dial timeout and per read/write deadline


class Command:
    """A go-nsq Command: `NAME p1 p2\\n` and, for IDENTIFY, a sized body."""

    __slots__ = ("name", "params", "body")

    def __init__(self, name, params=(), body=None):
        self.name = name
        self.params = list(params)
        self.body = body

    def __bytes__(self):
        line = b" ".join([self.name.encode(), *(p.encode() for p in self.params)]) + b"\n"
        if self.body is not None:
            line += struct.pack(">I", len(self.body)) + self.body
        return line

    def __str__(self):
        return " ".join([self.name, *self.params])


def identify(data):
    return Command("IDENTIFY", body=go_json(data))


def register(topic, channel="", partition=None):
    return _registration("REGISTER", topic, channel, partition)


def unregister(topic, channel="", partition=None):
    return _registration("UNREGISTER", topic, channel, partition)


def _registration(verb, topic, channel, partition):
    """NSQ's `VERB <topic> [<channel>]`, or with a partition (a peer that
    reads them) Youzan's `VERB <topic> <partition> [<channel>]`."""
    params = [topic] if partition is None else [topic, partition]
    return Command(verb, params + [channel] if channel else params)


def ping():
    return Command("PING")


class LookupdError(Exception):
    pass


class LookupPeer:
    """One nsqlookupd (lookupPeer): a lazily (re)connected socket and the
    peer info its IDENTIFY answer gave (kept across reconnects)."""

    def __init__(self, addr, max_body_size, log, connect_callback):
        self.addr = addr
        self.max_body_size = max_body_size
        self.log = log
        self.connect_callback = connect_callback
        self.state = STATE_DISCONNECTED
        self.sock = None
        self.info = {"tcp_port": 0, "http_port": 0, "version": "", "broadcast_address": ""}
        self.partitioned = False  # its IDENTIFY answer had "topic_partitions": true

    def __str__(self):
        return self.addr

    def connect(self):
        self.log.info(f"LOOKUP connecting to {self.addr}")
        try:
            host, port = split_host_port(self.addr)
            port = int(port)
        except ValueError as err:
            raise LookupdError(f"dial tcp: address {self.addr}: {err}") from None
        self.sock = gsocket.create_connection((host, port), timeout=PEER_TIMEOUT)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def close(self):
        self.state = STATE_DISCONNECTED
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def command(self, cmd):
        """One round trip: the response bytes (None for cmd None, which only
        connects).  Raises OSError/LookupdError after closing the connection."""
        initial = self.state
        if self.state != STATE_CONNECTED:
            self.connect()
            self.state = STATE_CONNECTED
            try:
                self.sock.sendall(MAGIC_V1)
            except OSError:
                pass  # nsqd ignores it: the command below fails instead
            if initial == STATE_DISCONNECTED:
                self.connect_callback(self)
        if cmd is None:
            return None
        if self.sock is None:  # the callback closed it
            raise LookupdError("use of closed network connection")
        try:
            self.sock.sendall(bytes(cmd))
            return self._read_response()
        except (OSError, LookupdError):
            self.close()
            raise

    def _read_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            data = self.sock.recv(n - len(buf))
            if not data:
                raise LookupdError("EOF" if not buf else "unexpected EOF")
            buf += data
        return bytes(buf)

    def _read_response(self):
        """readResponseBounded."""
        (size,) = struct.unpack(">i", self._read_exact(4))
        if size > self.max_body_size:
            raise LookupdError(f"response body size ({size}) is greater than limit "
                              f"({self.max_body_size})")
        if size < 0:
            raise LookupdError(f"invalid response size ({size})")
        return self._read_exact(size)


def _go_struct_v(info):
    """%+v of nsqd's peerInfo struct."""
    return (f"{{TCPPort:{info['tcp_port']} HTTPPort:{info['http_port']} "
            f"Version:{info['version']} BroadcastAddress:{info['broadcast_address']}}}")


def _join_host_port(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def get_json_v1(host, port, path, connect_timeout, request_timeout):
    """http_api Client.GETV1: the decoded JSON of a 200 answer, else an error."""
    with gevent.Timeout(request_timeout, LookupdError(f"GET {path}: request timed out")):
        conn = http.client.HTTPConnection(host, port, timeout=connect_timeout)
        try:
            conn.request("GET", path, headers={"Accept": "application/vnd.nsq; version=1.0"})
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
    if resp.status != 200:
        raise LookupdError(f"got response {resp.status} {resp.reason} {body!r}")
    return json.loads(body)


def lookupd_topic_channels(topic, http_addrs, connect_timeout, request_timeout, log=None):
    """clusterinfo.GetLookupdTopicChannels: (sorted union of the channels every
    lookupd knows for topic, error text or None)."""
    from urllib.parse import quote_plus

    channels = set()
    errors = []

    def query(host, port):
        path = f"/channels?topic={quote_plus(topic)}"
        if log is not None:
            log.info(f"CI: querying nsqlookupd http://{_join_host_port(host, port)}{path}")
        try:
            doc = get_json_v1(host, port, path, connect_timeout, request_timeout)
            channels.update(c for c in doc.get("channels") or () if isinstance(c, str))
        except (OSError, LookupdError, ValueError, AttributeError, http.client.HTTPException) as err:
            errors.append(str(err) or type(err).__name__)

    gevent.joinall([gevent.spawn(query, host, port) for host, port in http_addrs])
    if errors and len(errors) == len(http_addrs):
        return [], "Failed to query any nsqlookupd: " + "\n".join(errors)
    return sorted(channels), ("\n".join(errors) if errors else None)


class Lookup:
    """nsqd's lookupLoop and its peers."""

    def __init__(self, nsqd):
        self.nsqd = nsqd
        self.log = nsqd.log
        self.peers = []
        self.events = gevent.queue.Queue()
        self.hostname = socket.gethostname()
        self.started = False
        self._greenlet = None

    # -- called by NSQD ------------------------------------------------------------------

    def start(self):
        self.started = True
        self._greenlet = gevent.spawn(self._loop)

    def stop(self):
        self.started = False
        if self._greenlet is not None:
            self._greenlet.kill(block=True, timeout=2)
        for lp in self.peers:
            lp.close()

    def notify(self, topic=None, channel=None, deleted=False, channels=()):
        """A topic or channel was created or deleted (channels: those a
        deleted topic had, unregistered before it)."""
        if topic is None or not self.started:
            return
        if channel is not None:
            self.events.put(("channel", topic, channel, deleted))
            return
        for name in channels:
            self.events.put(("channel", topic, name, True))
        self.events.put(("topic", topic, "", deleted))
        if not deleted and not getattr(self.nsqd, "loading", False):
            self._precreate_channels(topic)

    def options_changed(self):
        self.events.put(("opts",))

    def http_addresses(self):
        """lookupdHTTPAddrs: (broadcast address, http port) of every peer
        that told its broadcast address."""
        return [(lp.info["broadcast_address"], lp.info["http_port"]) for lp in self.peers
                if lp.info["broadcast_address"]]

    # -- topic creation -------------------------------------------------------------------

    def _precreate_channels(self, topic_name):
        opts = self.nsqd.opts
        addrs = self.http_addresses()
        if not addrs:
            if opts.lookupd_tcp_address:
                self.log.error("no available nsqlookupd to query for channels to pre-create "
                               f"for topic {topic_name}")
            return
        names, err = lookupd_topic_channels(topic_name, addrs, opts.http_client_connect_timeout,
                                            opts.http_client_request_timeout, self.log)
        if err:
            self.log.warn(f"failed to query nsqlookupd for channels to pre-create for topic "
                          f"{topic_name} - {err}")
        topic = self.nsqd.topics.get(topic_name)
        if topic is None:
            return
        # this worker's own changes even while it applies a peer's topic_create:
        # every worker has the channels before the publish that made the topic
        with self.nsqd.own_changes():
            for name in names:
                if not is_ephemeral(name):  # no ephemeral channel without a consumer
                    topic.get_channel(name)

    # -- the loop ------------------------------------------------------------------------

    def _connect_callback(self, lp):
        """connectCallback: IDENTIFY, then REGISTER every topic and channel."""
        opts = self.nsqd.opts
        cmd = identify({
            "broadcast_address": opts.broadcast_address,
            "hostname": self.hostname,
            "http_port": opts.broadcast_http_port,
            "tcp_port": opts.broadcast_tcp_port,
            "topic_partitions": True,  # (nsqshm's: see the module docstring)
            "version": NSQD_COMPAT_VERSION,
        })
        try:
            resp = lp.command(cmd)
        except (OSError, LookupdError) as err:
            self.log.error(f"LOOKUPD({lp}): {cmd} - {err}")
            return
        if resp == b"E_INVALID":
            self.log.info(f"LOOKUPD({lp}): lookupd returned {resp.decode('utf-8', 'replace')}")
            lp.close()
            return
        try:
            info = json.loads(resp)
            if not isinstance(info, dict):
                raise ValueError("not an object")
            for key, kind in (("tcp_port", int), ("http_port", int), ("version", str),
                              ("broadcast_address", str)):
                if key in info and info[key] is not None:
                    if not isinstance(info[key], kind) or isinstance(info[key], bool):
                        raise ValueError(key)
                    lp.info[key] = info[key]
            lp.partitioned = info.get("topic_partitions") is True
        except ValueError:
            self.log.error(f"LOOKUPD({lp}): parsing response - "
                           f"{resp.decode('utf-8', 'replace')}")
            lp.close()
            return
        self.log.info(f"LOOKUPD({lp}): peer info {_go_struct_v(lp.info)}")
        if not lp.info["broadcast_address"]:
            self.log.error(f"LOOKUPD({lp}): no broadcast address")
        commands = []
        for topic in list(self.nsqd.topics.values()):
            if not topic.channels or (lp.partitioned and topic.is_log):
                commands += self._changes(lp, topic.name, "", False)
            for channel in list(topic.channels):
                commands += self._changes(lp, topic.name, channel, False)
        for cmd in commands:
            self.log.info(f"LOOKUPD({lp}): {cmd}")
            try:
                lp.command(cmd)
            except (OSError, LookupdError) as err:
                self.log.error(f"LOOKUPD({lp}): {cmd} - {err}")
                return

    def _add_peers(self):
        opts = self.nsqd.opts
        for host in opts.lookupd_tcp_address:
            if any(lp.addr == host for lp in self.peers):
                continue
            self.log.info(f"LOOKUP({host}): adding peer")
            lp = LookupPeer(host, opts.max_body_size, self.log, self._connect_callback)
            try:
                lp.command(None)
            except (OSError, LookupdError):
                pass  # retried by the next command
            self.peers.append(lp)

    def _changes(self, lp, topic_name, channel, deleted):
        """The lines that tell lp a topic or channel came or went: NSQ's one,
        or for a peer that reads partitions, a log topic's partitions when
        it comes (partition -11 for everything else)."""
        if not lp.partitioned:
            return [(unregister if deleted else register)(topic_name, channel)]
        if not channel and not deleted:
            topic = self.nsqd.topics.get(topic_name)
            if topic is not None and topic.is_log:
                return [register(topic_name, partition=str(p.index)) for p in topic.partitions]
        return [(unregister if deleted else register)(topic_name, channel, OLD_VERSION_PID)]

    def _send(self, cmd):
        """A PING to every peer."""
        self._send_each(lambda lp: [cmd],
                        lambda lp, cmd: self.log.debug(f"LOOKUPD({lp}): sending heartbeat"))

    def _send_change(self, branch, topic, channel, deleted):
        self._send_each(lambda lp: self._changes(lp, topic, channel, deleted),
                        lambda lp, cmd: self.log.info(f"LOOKUPD({lp}): {branch} {cmd}"))

    def _send_each(self, commands_for, say):
        """Each peer's commands in turn; a failure ends that peer's (its next
        connection registers everything again)."""
        for lp in list(self.peers):
            for cmd in commands_for(lp):
                say(lp, cmd)
                try:
                    lp.command(cmd)
                except (OSError, LookupdError) as err:
                    self.log.error(f"LOOKUPD({lp}): {cmd} - {err}")
                    break

    def _loop(self):
        opts = self.nsqd.opts
        connect = True
        next_ping = time.monotonic() + opts.lookupd_ping_interval
        try:
            while True:
                if connect:
                    self._add_peers()
                    connect = False
                try:
                    event = self.events.get(timeout=max(0.0, next_ping - time.monotonic()))
                except gevent.queue.Empty:
                    event = None
                if event is None:
                    next_ping += opts.lookupd_ping_interval
                    if next_ping <= time.monotonic():  # a ticker drops missed ticks
                        next_ping = time.monotonic() + opts.lookupd_ping_interval
                    self._send(ping())
                elif event[0] == "opts":
                    keep = []
                    for lp in self.peers:
                        if lp.addr in opts.lookupd_tcp_address:
                            keep.append(lp)
                        else:
                            self.log.info(f"LOOKUP({lp}): removing peer")
                            lp.close()
                    self.peers = keep
                    connect = True
                else:
                    self._send_change(*event)
        finally:
            self.log.info("LOOKUP: closing")


def resolve_broadcast_ports(nsqd):
    """nsqd.New: a --broadcast-tcp-port / --broadcast-http-port of 0 becomes
    the port actually listened on (TCP/IP listeners only), and the statsd
    prefix is expanded with them; /config shows the results, as nsqd's."""
    from nsqshm.nsqd.monitoring.statsd import expand_prefix

    opts = nsqd.opts
    for attr, server in (("broadcast_http_port", nsqd.http_server),
                         ("broadcast_tcp_port", nsqd.tcp_server)):
        address = getattr(server, "address", None)
        if getattr(opts, attr) == 0 and isinstance(address, tuple):
            setattr(opts, attr, address[1])
    opts.statsd_prefix = expand_prefix(opts.statsd_prefix, opts.broadcast_address,
                                       opts.broadcast_http_port)
