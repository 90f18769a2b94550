"""The TCP protocol V2 (nsqd's protocol_v2.go): one greenlet per
connection reads commands; each wire verb is a method named as the command,
taking (client, params, reader) and returning a response payload or None,
or raising a ClientErr.  Error codes, texts and fatality follow nsqd 1.3.

Frames (server to client), big-endian:

    [ 4-byte size ][ 4-byte frame type ][ size - 4 bytes of data ]

A command is a line `VERB arg arg\\n`; IDENTIFY, AUTH, PUB, MPUB and DPUB
are followed by [ 4-byte size ][ body ].
"""

import json
import os
import socket
import time

import gevent

from nsqshm._core import wire
from nsqshm._core.codec import FRAME_TYPE_ERROR
from nsqshm._core.commands import NEED_MORE, CommandParser
from nsqshm.nsqd import ext
from nsqshm.nsqd.channel import ChannelError
from nsqshm.nsqd.errors import (
    BAD_PARTITION,
    E_CREATE_TOPIC_FAILED,
    E_FAILED_ON_NOT_LEADER,
    E_SUB_ORDER_IS_MUST,
    E_TOPIC_NOT_EXIST,
    SUB_ORDER_IS_MUST_TEXT,
    ClientErr,
    FatalClientErr,
)
from nsqshm.nsqd.logtopics.logtopic import PartitionError, partition_word
from nsqshm.nsqd.logtopics.replica import NotLeader
from nsqshm.nsqd.monitoring.stats import go_json
from nsqshm.nsqd.names import go_quote, is_valid_name
from nsqshm.nsqd.options import TLS_NOT_REQUIRED
from nsqshm.nsqd.tcp import fairshare
from nsqshm.nsqd.tcp.auth import AuthError
from nsqshm.nsqd.tcp.client_v2 import (
    STATE_CLOSING,
    STATE_INIT,
    STATE_SUBSCRIBED,
    ClientV2,
    frame,
)
from nsqshm.nsqd.tcp.compression import CorruptStream, DeflateCodec, SnappyCodec
from nsqshm.nsqd.tcp.reader import MAX_LINE, Disconnect, LineTooLong, Reader
from nsqshm.nsqd.topic import Topic, TopicError
from nsqshm.nsqd.tracing import trace
from nsqshm.youzan.commands import (
    NO_PARTITION,
    ORDERED_WITH_SAMPLE_RATE,
    parse_internal_create_topic,
    parse_sub,
)
from nsqshm.youzan.offset import NOT_SUPPORTED, check_supported

MAGIC_V2 = b"  V2"
# a topic or channel being deleted as a client asks for it: tries, and the wait between
RETRIES = 20
RETRY_DELAY = 0.05
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"
BAD_PROTOCOL_FRAME = frame(FRAME_TYPE_ERROR, b"E_BAD_PROTOCOL")

# IDENTIFY's JSON fields (nsqd's identifyDataV2) and the Python type Go's decoder
# accepts for each; an int field's range is that of its Go type (int64, or int32)
IDENTIFY_FIELDS = {
    "client_id": str, "hostname": str, "heartbeat_interval": int, "output_buffer_size": int,
    "output_buffer_timeout": int, "feature_negotiation": bool, "tls_v1": bool, "deflate": bool,
    "deflate_level": int, "snappy": bool, "sample_rate": int, "user_agent": str,
    "msg_timeout": int,
}
INT_BITS = {"sample_rate": 32}  # the others are Go ints: 64 bits
MESSAGE_ERRORS = {
    wire.MPUB_COUNT_UNREADABLE: ("E_BAD_BODY", "MPUB failed to read message count"),
    wire.MPUB_BAD_COUNT: ("E_BAD_BODY", "MPUB invalid message count {value}"),
    wire.MPUB_SIZE_UNREADABLE: ("E_BAD_MESSAGE", "MPUB failed to read message({index}) body size"),
    wire.MPUB_BAD_SIZE: ("E_BAD_MESSAGE", "MPUB invalid message({index}) body size {value}"),
    wire.MPUB_TOO_BIG: ("E_BAD_MESSAGE", "MPUB message too big {value} > {max}"),
    wire.MPUB_BODY_UNREADABLE: ("E_BAD_MESSAGE", "MPUB failed to read message body"),
}


def base10(value):
    """nsqd's ByteToBase10, a uint64: ASCII digits only (empty is 0),
    wrapping; None if not digits."""
    if value and not value.isdigit():
        return None
    n = 0
    for ch in value:
        n = (n * 10 + ch - 48) & 0xFFFFFFFFFFFFFFFF
    return n


def int64(n):
    """A uint64 as Go's int64(n)."""
    n &= 0xFFFFFFFFFFFFFFFF
    return n - (1 << 64) if n >= 1 << 63 else n


def duration_ms(ms):
    """Go's time.Duration(ms) * time.Millisecond in ns: int64, wrapping."""
    return int64(ms * 1_000_000)


class _Pairs(list):
    """A JSON object's members in order (json's object_pairs_hook)."""


def _no_constant(name):
    raise ValueError(f"invalid JSON constant {name}")


def go_json_object(body):
    """Decode IDENTIFY's body as Go's json.Unmarshal into a struct would:
    UTF-8 only (no BOM, no UTF-16; invalid bytes in strings become U+FFFD),
    no NaN/Infinity, `null` is an empty object; the members in order.
    ValueError if Go's decoder would fail."""
    value = json.loads(body.decode("utf-8", "replace"), object_pairs_hook=_Pairs,
                       parse_constant=_no_constant)
    if value is None:
        return []
    if not isinstance(value, _Pairs):
        raise ValueError("not an object")
    return value


def text(value):
    """Wire bytes as text for an error, byte for byte."""
    return value.decode("utf-8", "surrogateescape")


def require_state(client, verb, *states):
    if client.state not in states:
        raise FatalClientErr("E_INVALID", f"cannot {verb} in current state")


def partition_param(params):
    """`PUB <topic> <partition>` (Youzan's preparePub: read from a line of exactly
    three words, by Go's strconv.Atoi): the partition as an int, None for none
    (or -1, Youzan's "any"), the text when Atoi does not take it (a log topic then
    answers E_BAD_PARTITION with Atoi's error).  A classic topic ignores it, as
    nsqd ignores a PUB's extra parameters."""
    return partition_word(text(params[2])) if len(params) == 3 else None


def message_id(params, verb):
    if len(params) < 2:
        raise FatalClientErr("E_INVALID", f"{verb} insufficient number of params")
    if len(params[1]) != 16:
        raise FatalClientErr("E_INVALID", "invalid message ID")
    return params[1]


# --consumer-read-delay applies while a consumer holds this many messages in flight: it has
# work for longer than the delay at any rate a client that FINs one send at a time reaches
READ_DELAY_IN_FLIGHT = 256


class ProtocolV2:
    def __init__(self, nsqd):
        self.nsqd = nsqd
        self.opts = nsqd.opts
        # NSQSHM_PYTHON_COMMANDS=1: every command through the Python path, the
        # reference the C parser is compared with (tests/nsqd/tcp/test_command_parser.py)
        self.c_commands = os.environ.get("NSQSHM_PYTHON_COMMANDS") != "1"
        self.commands = {
            b"IDENTIFY": self.IDENTIFY, b"AUTH": self.AUTH, b"SUB": self.SUB, b"RDY": self.RDY,
            b"FIN": self.FIN, b"REQ": self.REQ, b"TOUCH": self.TOUCH, b"CLS": self.CLS,
            b"NOP": self.NOP, b"PUB": self.PUB, b"MPUB": self.MPUB, b"DPUB": self.DPUB,
            b"SUB_ADVANCED": self.SUB_ADVANCED, b"SUB_ORDERED": self.SUB_ORDERED,
            b"PUB_EXT": self.PUB_EXT, b"MPUB_EXT": self.MPUB_EXT,
            b"PUB_TRACE": self.PUB_TRACE, b"MPUB_TRACE": self.MPUB_TRACE,
            b"INTERNAL_CREATE_TOPIC": self.INTERNAL_CREATE_TOPIC,
        }

    # -- the connection loop ------------------------------------------------------------

    def handle(self, sock, address):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = Reader(sock)
        try:
            magic = reader.read(4)
        except (Disconnect, OSError):
            sock.close()
            return
        if magic != MAGIC_V2:
            try:
                sock.sendall(BAD_PROTOCOL_FRAME)
            except OSError:
                pass
            sock.close()
            return
        nsqd = self.nsqd
        client = ClientV2(nsqd, sock, address, nsqd.next_client_id())
        nsqd.clients[client.id] = client
        reader.before_wait = client.flush_pending
        client.start()
        try:
            self.io_loop(client, reader)
        finally:
            self.exit(client)

    def io_loop(self, client, reader):
        commands = self.commands
        sock_timeout = None
        tls_required = self.opts.tls_required != TLS_NOT_REQUIRED
        parser = None
        parser_traced = False
        read_delay = self.opts.consumer_read_delay
        while not client.closed:
            hb = client.heartbeat_interval
            timeout = (client.sock, hb * 2 if hb > 0 else None)
            if timeout != sock_timeout:  # settimeout costs system calls: only on a change
                client.sock.settimeout(timeout[1])
                sock_timeout = timeout
            channel = client.channel
            if channel is not None and self.c_commands:
                # a consumer's FIN, REQ, TOUCH and NOP, from the first unread byte, in C
                # (_core/commands.pyx); it stops at a line for the path below
                if parser is None:
                    parser = self.command_parser(client, channel)
                traced = channel.traced
                if traced != parser_traced:  # a traced channel's commands are events too
                    if traced:
                        parser.trace_to(*trace.parser_tracing(channel, client))
                    else:
                        parser.trace_to(None)
                    parser_traced = traced
                status = parser.parse(reader.buf, reader.pos, channel.requeues_in_c())
                reader.pos = parser.pos
                if parser.finished or parser.requeued or parser.touched:
                    channel.commands_applied(client, parser)
                if status == NEED_MORE and reader.pending() < MAX_LINE:
                    # a consumer that FINs one send at a time (go-nsq, pynsq, gnsq) and still
                    # holds plenty to work on: its FINs wait in the socket until a batch is
                    # there or --consumer-read-delay passed, rather than a wake-up, a recv
                    # and a delivery round for every few (issue 20; bench/RESULTS.md)
                    # (at once while the worker publishes: the fair share, fairshare.py)
                    reader.batch_reads(read_delay if client.in_flight >= READ_DELAY_IN_FLIGHT
                                       and not fairshare.publishing(self.nsqd) else 0)
                    try:
                        reader.fill()
                    except (Disconnect, OSError):
                        return
                    continue
            try:
                line = reader.readline()
            except LineTooLong:
                self.close_after_flush(client)
                return
            except (Disconnect, OSError):
                return
            if line.endswith(b"\r"):
                line = line[:-1]
            params = line.split(b" ")
            try:
                if tls_required and not client.tls and params[0] != b"IDENTIFY":
                    raise FatalClientErr("E_INVALID", f"cannot {text(params[0])} in current "
                                                      "state (TLS required)")
                handler = commands.get(params[0])
                if handler is None:
                    raise FatalClientErr("E_INVALID", f"invalid command {text(params[0])}")
                response = handler(client, params, reader)
            except ClientErr as err:
                client.queue_frame(FRAME_TYPE_ERROR, err.wire)
                if err.fatal:
                    self.close_after_flush(client)
                    return
                continue
            except (Disconnect, OSError):
                return
            if response is not None:
                client.queue_response(response)  # sent before the reader next waits

    def command_parser(self, client, channel):
        opts = self.opts
        return CommandParser(channel.inflight, channel.deferred, channel.cursors, client.id,
                             client.msg_timeout_ns, int(opts.max_msg_timeout * 1e9),
                             int(opts.max_req_timeout * 1e9))

    def close_after_flush(self, client):
        client.flush()
        deadline = time.monotonic() + 1.0
        while client.out and not client.closed and time.monotonic() < deadline:
            gevent.sleep(0.001)
        gevent.sleep(0)

    def exit(self, client):
        client.close()
        self.nsqd.clients.pop(client.id, None)
        if client.channel is not None:
            client.channel.remove_client(client)
            ext.left(self.nsqd, client, client.channel)

    # -- commands -----------------------------------------------------------------------

    def IDENTIFY(self, client, params, reader):
        require_state(client, "IDENTIFY", STATE_INIT)
        body = self._read_body(reader, "IDENTIFY", "E_BAD_BODY", self.opts.max_body_size,
                               body_too_big="IDENTIFY body too big {n} > {max}",
                               bad_size="IDENTIFY invalid body size {n}")
        try:
            data = {}
            pairs = go_json_object(body)
            for key, value in pairs:
                field = key.casefold()  # Go matches a struct field's name case-insensitively
                kind = IDENTIFY_FIELDS.get(field)
                if kind is None or value is None:
                    continue
                if kind is int:
                    bits = INT_BITS.get(field, 64)
                    if (isinstance(value, bool) or not isinstance(value, int)
                            or not -(1 << (bits - 1)) <= value < 1 << (bits - 1)):
                        raise ValueError
                if not isinstance(value, kind):
                    raise ValueError
                data[field] = value
        except ValueError:
            raise FatalClientErr("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        client.client_id = data.get("client_id", "")
        client.hostname = data.get("hostname", "")
        client.user_agent = data.get("user_agent", "")
        error = self._apply_identify(client, data)
        if error:
            raise FatalClientErr("E_BAD_BODY", "IDENTIFY " + error)
        extra = ext.identify_client(self.nsqd, client, pairs)  # Youzan's fields (ext.py)
        client.reset_heartbeat()
        client.ticks_from = time.monotonic()  # nsqd's messagePump starts a new ticker
        if not data.get("feature_negotiation"):
            return OK
        opts = self.opts
        tls_context = self.nsqd.tls_context
        tls_v1 = tls_context is not None and bool(data.get("tls_v1"))
        deflate = bool(opts.deflate and data.get("deflate"))
        deflate_level = 6
        if deflate and data.get("deflate_level", 0) > 0:
            deflate_level = data["deflate_level"]
        deflate_level = min(deflate_level, opts.max_deflate_level)
        snappy = bool(opts.snappy and data.get("snappy"))
        if deflate and snappy:
            raise FatalClientErr("E_IDENTIFY_FAILED",
                                 "cannot enable both deflate and snappy compression")
        response = json.dumps({
            "max_rdy_count": opts.max_rdy_count,
            "version": self.nsqd.version,
            "max_msg_timeout": int(opts.max_msg_timeout * 1000),
            "msg_timeout": int(client.msg_timeout * 1000),
            "tls_v1": tls_v1,
            "deflate": deflate,
            "deflate_level": deflate_level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy,
            "sample_rate": client.sample_rate,
            "auth_required": bool(opts.auth_http_address),
            "output_buffer_size": client.output_buffer_size,
            "output_buffer_timeout": int(client.output_buffer_timeout * 1000),
            **extra,
        }, separators=(",", ":")).encode()
        if not (tls_v1 or snappy or deflate):
            return response
        # nsqd: the response, then TLS (handshake, OK), snappy (OK), deflate (OK)
        codec = SnappyCodec() if snappy else DeflateCodec(deflate_level) if deflate else None
        if tls_v1:
            self._log("info", f"PROTOCOL(V2): [{client}] upgrading connection to TLS")
        if snappy:
            self._log("info", f"PROTOCOL(V2): [{client}] upgrading connection to snappy")
        if deflate:
            self._log("info", f"PROTOCOL(V2): [{client}] upgrading connection to deflate "
                              f"(level {deflate_level})")
        try:
            client.upgrade(response, reader, tls_context if tls_v1 else None, codec)
        except (OSError, ValueError, CorruptStream) as err:
            raise FatalClientErr("E_IDENTIFY_FAILED", f"IDENTIFY failed {err}") from None
        return None

    def _apply_identify(self, client, data):
        """nsqd's clientV2.Identify checks, in its order; an error text or None."""
        opts = self.opts
        hb = data.get("heartbeat_interval", 0)
        if hb == -1:
            client.heartbeat_interval = 0
        elif hb == 0:
            pass
        elif 1000 <= hb <= int(opts.max_heartbeat_interval * 1000):
            client.heartbeat_interval = hb / 1000
        else:
            return f"heartbeat interval ({hb}) is invalid"
        timeout = data.get("output_buffer_timeout", 0)
        size = data.get("output_buffer_size", 0)
        if timeout == -1:
            client.output_buffer_timeout = 0
        elif timeout == 0:
            pass
        elif (int(opts.min_output_buffer_timeout * 1000) <= timeout
              <= int(opts.max_output_buffer_timeout * 1000)):
            client.output_buffer_timeout = timeout / 1000
        else:
            return f"output buffer timeout ({timeout}) is invalid"
        if size == -1:
            client.output_buffer_size = 1
            client.output_buffer_timeout = 0
        elif size == 0:
            pass
        elif 64 <= size <= opts.max_output_buffer_size:
            client.output_buffer_size = size
        else:
            return f"output buffer size ({size}) is invalid"
        rate = data.get("sample_rate", 0)
        if not 0 <= rate <= 99:
            return f"sample rate ({rate}) is invalid"
        client.sample_rate = rate
        msg_timeout = data.get("msg_timeout", 0)
        if msg_timeout == 0:
            pass
        elif 1000 <= msg_timeout <= int(opts.max_msg_timeout * 1000):
            client.msg_timeout = msg_timeout / 1000
        else:
            return f"msg timeout ({msg_timeout}) is invalid"
        return None

    def AUTH(self, client, params, reader):
        require_state(client, "AUTH", STATE_INIT)
        if len(params) != 1:
            raise FatalClientErr("E_INVALID", "AUTH invalid number of parameters")
        body = self._read_body(reader, "AUTH", "E_BAD_BODY", self.opts.max_body_size,
                               body_too_big="AUTH body too big {n} > {max}",
                               bad_size="AUTH invalid body size {n}")
        if client.has_authorizations():
            raise FatalClientErr("E_INVALID", "AUTH already set")
        if not self.opts.auth_http_address:
            raise FatalClientErr("E_AUTH_DISABLED", "AUTH disabled")
        try:
            client.auth(body.decode("utf-8", "surrogateescape"))
        except AuthError as err:
            # nsqd keeps the auth server's errors from untrusted clients
            self._log("warn", f"PROTOCOL(V2): [{client}] AUTH failed {err}")
            raise FatalClientErr("E_AUTH_FAILED", "AUTH failed") from None
        if not client.has_authorizations():
            raise FatalClientErr("E_UNAUTHORIZED", "AUTH no authorizations found")
        state = client.auth_state
        return go_json({"identity": state.identity, "identity_url": state.identity_url,
                        "permission_count": len(state.authorizations)})

    def check_auth(self, client, verb, topic_name, channel_name):
        """nsqd's CheckAuth: with auth enabled, a client must have
        authorizations, refreshed when expired, that allow this."""
        if not self.opts.auth_http_address:
            return
        if not client.has_authorizations():
            raise FatalClientErr("E_AUTH_FIRST", f"AUTH required before {verb}")
        try:
            allowed = client.is_authorized(topic_name, channel_name)
        except AuthError as err:
            self._log("warn", f"PROTOCOL(V2): [{client}] AUTH failed {err}")
            raise FatalClientErr("E_AUTH_FAILED", "AUTH failed") from None
        if not allowed:
            raise FatalClientErr("E_UNAUTHORIZED", f"AUTH failed for {verb} on "
                                                   f"{go_quote(topic_name.encode())} "
                                                   f"{go_quote(channel_name.encode())}")

    def _log(self, level, msg):
        log = getattr(self.nsqd, "log", None)
        if log is not None:
            getattr(log, level)(msg)

    def SUB(self, client, params, reader):
        require_state(client, "SUB", STATE_INIT)
        if client.heartbeat_interval <= 0:
            raise FatalClientErr("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise FatalClientErr("E_INVALID", "SUB insufficient number of parameters")
        topic_name, channel_name = params[1], params[2]
        if not is_valid_name(topic_name):
            raise FatalClientErr("E_BAD_TOPIC", f"SUB topic name {go_quote(topic_name)} is not valid")
        if not is_valid_name(channel_name):
            raise FatalClientErr("E_BAD_CHANNEL",
                                 f"SUB channel name {go_quote(channel_name)} is not valid")
        self.check_auth(client, "SUB", topic_name.decode(), channel_name.decode())
        partition = NO_PARTITION
        if len(params) >= 4:  # Youzan's SUB <topic> <channel> <partition>
            topic = self.nsqd.topics.get(topic_name.decode())
            if topic is not None and topic.is_log:
                partition = parse_sub(params[:4], True, True).partition
            elif params[3].isdigit():  # (other words: ignored, as nsqd ignores extra params)
                partition = int(params[3])  # a classic topic is partition 0 alone (_sub)
        return self._sub(client, topic_name.decode(), channel_name.decode(), partition, None)

    def SUB_ADVANCED(self, client, params, reader):
        """Youzan's SUB_ADVANCED <topic> <channel> [<partition> [<type>:<value>]]:
        a log topic's channel, its cursor moved to the position first (by
        the channel's first client only, as Youzan's)."""
        sub = parse_sub(params, client.state == STATE_INIT, client.heartbeat_interval > 0)
        self.check_auth(client, "SUB", sub.topic, sub.channel)
        return self._sub(client, sub.topic, sub.channel, sub.partition, sub.start, detail=True)

    def SUB_ORDERED(self, client, params, reader):
        """Youzan's SUB_ORDERED <topic> <channel> [<partition>]: a log topic's
        channel, one message of each partition in flight at a time (its
        lanes are ordered: logchannel.py), in log order."""
        sub = parse_sub(params, client.state == STATE_INIT, client.heartbeat_interval > 0)
        self.check_auth(client, "SUB", sub.topic, sub.channel)
        topic = self.nsqd.topics.get(sub.topic)
        if topic is None or not topic.is_log:  # (nsqshm: a classic topic has no order to keep)
            raise FatalClientErr(E_TOPIC_NOT_EXIST, "")
        return self._sub(client, sub.topic, sub.channel, sub.partition, None, ordered=True,
                         detail=True)

    def _sub(self, client, topic_name, channel_name, partition, start, ordered=False,
             detail=False):
        topic = self.nsqd.topics.get(topic_name)
        is_log = topic is not None and topic.is_log
        if not is_log and partition not in (NO_PARTITION, 0):
            # Youzan: no such topic partition here (a topic not partitioned is
            # partition 0 alone); go-nsq drops the connection on it
            raise FatalClientErr(E_TOPIC_NOT_EXIST, "")
        if is_log and partition != NO_PARTITION:
            try:
                topic.partition(partition)
            except PartitionError:  # Youzan: no such topic partition here
                raise FatalClientErr(E_TOPIC_NOT_EXIST, "") from None
        if is_log and topic.ordered and not ordered:
            raise FatalClientErr(E_SUB_ORDER_IS_MUST, SUB_ORDER_IS_MUST_TEXT)
        # (Youzan's order: the client is checked against the topic before its channel is
        # looked at, so a SUB refused here leaves the channel as it was)
        ext.check_sub(client, topic)
        if ordered and client.sample_rate:
            raise FatalClientErr("E_INVALID", ORDERED_WITH_SAMPLE_RATE)
        seek = None
        if start is not None:
            if not is_log:
                raise FatalClientErr("E_INVALID", NOT_SUPPORTED)
            seek = self._positions(topic, channel_name, partition, start)
        if is_log and (partition != NO_PARTITION or ordered):
            self._use_lanes(topic, channel_name, partition, ordered)
        if seek is not None:
            self._seek(topic, channel_name, partition, *seek)
        client.partition = partition if is_log and partition != NO_PARTITION else None
        if detail:  # the raw size: a log record's, or a disk queue's [4 size][message]
            client.detail = (topic if topic is not None else Topic).stored_overhead
            client.detail_log = is_log
        channel = self._subscribe(client, topic_name, channel_name)
        if client.detail_log:
            channel.open_detail_readers()
        client.state = STATE_SUBSCRIBED
        client.channel = channel
        ext.subscribed(self.nsqd, client, channel)
        return OK

    def _subscribers(self, topic, channel, partition=NO_PARTITION):
        """The channel's clients on every worker (the op "clients" of the others)
        that take `partition` (NO_PARTITION: any partition)."""
        count = channel.clients_taking(partition)
        cluster = self.nsqd.cluster
        if cluster is not None and not count:
            replies = cluster.gather({"op": "clients", "topic": topic.name,
                                      "channel": channel.name, "partition": partition},
                                     timeout=2)
            count = sum((r or {}).get("count", 0) for r in replies)
        return count

    def _use_lanes(self, topic, channel_name, partition, ordered):
        """A SUB naming a partition, or SUB_ORDERED: the partition (all, for
        SUB_ORDERED without one) is delivered through its own lane."""
        try:
            channel = topic.get_channel(channel_name)
        except (ChannelError, TopicError) as err:
            raise FatalClientErr("E_SUB_FAILED", f"SUB failed {err}") from None
        indices = [partition] if partition != NO_PARTITION else range(len(topic.partitions))
        channel.use_lanes(list(indices), ordered)

    def _positions(self, topic, channel_name, partition, start):
        """SUB_ADVANCED's position: (the channel if it exists, [(partition, msg
        offset)]) for every partition when none is named; None when it is not
        this client's to set.  Only a first client moves them: Youzan's nsqd
        has a channel per topic partition and sets the position when the
        client is its channel's only one (internalSUB), so a client of
        partition 0 leaves partition 1 to its own first client (go-nsq
        connects once per partition), and a later client's position is not
        looked up at all (no E_INVALID for one refused, timestamp:-1 say).  Looked up
        before the channel is touched: a position refused leaves no channel
        made, or moved to a lane, by a client that never subscribes (Youzan's
        fatal error removes its client, and an ephemeral channel with it)."""
        existing = topic.channels.get(channel_name)
        if existing is not None and self._subscribers(topic, existing, partition):
            return None
        try:
            check_supported(start)
            parts = topic.partitions if partition == NO_PARTITION else [topic.partition(partition)]
            return existing, [(p, p.position(start)) for p in parts]
        except ValueError as err:
            raise FatalClientErr("E_INVALID", str(err)) from None

    def _seek(self, topic, channel_name, partition, existing, offsets):
        try:
            channel = topic.get_channel(channel_name)
        except (ChannelError, TopicError) as err:
            raise FatalClientErr("E_SUB_FAILED", f"SUB failed {err}") from None
        if channel is not existing and self._subscribers(topic, channel, partition):
            return  # (made meanwhile, on another worker, and subscribed to)
        channel.seek(offsets)

    def RDY(self, client, params, reader):
        if client.state == STATE_CLOSING:
            return None
        require_state(client, "RDY", STATE_SUBSCRIBED)
        count = 1
        if len(params) > 1:
            count = base10(params[1])
            if count is None:
                raise FatalClientErr("E_INVALID", f"RDY could not parse count {text(params[1])}")
            count = int64(count)
        if not 0 <= count <= self.opts.max_rdy_count:
            raise FatalClientErr("E_INVALID",
                                 f"RDY count {count} out of range 0-{self.opts.max_rdy_count}")
        client.ready_count = count
        client.kick()  # held messages go when the client is no longer ready for more (nsqd)
        client.channel.wake()
        return None

    def FIN(self, client, params, reader):
        require_state(client, "FIN", STATE_SUBSCRIBED, STATE_CLOSING)
        msg_id = message_id(params, "FIN")
        try:
            client.channel.finish(client, msg_id)
        except ChannelError as err:
            raise ClientErr("E_FIN_FAILED", f"FIN {text(msg_id)} failed {err}") from None
        return None

    def REQ(self, client, params, reader):
        require_state(client, "REQ", STATE_SUBSCRIBED, STATE_CLOSING)
        if len(params) < 3:
            raise FatalClientErr("E_INVALID", "REQ insufficient number of params")
        msg_id = message_id(params, "REQ")
        timeout_ms = base10(params[2])
        if timeout_ms is None:
            raise FatalClientErr("E_INVALID", f"REQ could not parse timeout {text(params[2])}")
        max_ns = int(self.opts.max_req_timeout * 1e9)
        timeout_ns = min(max(duration_ms(timeout_ms), 0), max_ns)  # clamped, as nsqd >= 1.1
        try:
            client.channel.requeue(client, msg_id, timeout_ns / 1e9)
        except ChannelError as err:
            raise ClientErr("E_REQ_FAILED", f"REQ {text(msg_id)} failed {err}") from None
        return None

    def TOUCH(self, client, params, reader):
        require_state(client, "TOUCH", STATE_SUBSCRIBED, STATE_CLOSING)
        msg_id = message_id(params, "TOUCH")
        try:
            client.channel.touch(client, msg_id)
        except ChannelError as err:
            raise ClientErr("E_TOUCH_FAILED", f"TOUCH {text(msg_id)} failed {err}") from None
        return None

    def CLS(self, client, params, reader):
        if client.state != STATE_SUBSCRIBED:
            raise FatalClientErr("E_INVALID", "cannot CLS in current state")
        client.ready_count = 0
        client.state = STATE_CLOSING
        return CLOSE_WAIT

    def NOP(self, client, params, reader):
        return None

    def PUB(self, client, params, reader):
        if len(params) < 2:
            raise FatalClientErr("E_INVALID", "PUB insufficient number of parameters")
        topic_name = params[1]
        if not is_valid_name(topic_name):
            raise FatalClientErr("E_BAD_TOPIC", f"PUB topic name {go_quote(topic_name)} is not valid")
        partition = partition_param(params)
        body = self._read_message(reader, "PUB")
        try:  # the body is a view of the read buffer: packed into the ring, never kept
            self.check_auth(client, "PUB", topic_name.decode(), "")
            self._publish(topic_name.decode(), lambda topic: topic.put_message(body, partition),
                          client)
        except PartitionError as err:
            raise FatalClientErr(*BAD_PARTITION(err)) from None
        except NotLeader as err:  # cluster mode (nsqd/logtopics/replica.py): Youzan's, not fatal
            raise ClientErr(E_FAILED_ON_NOT_LEADER, str(err)) from None
        except TopicError as err:
            raise FatalClientErr("E_PUB_FAILED", f"PUB failed {err}") from None
        finally:
            body.release()
        self._count_pub(client, topic_name.decode(), 1)
        return OK

    def MPUB(self, client, params, reader):
        if len(params) < 2:
            raise FatalClientErr("E_INVALID", "MPUB insufficient number of parameters")
        topic_name = params[1]
        if not is_valid_name(topic_name):
            raise FatalClientErr("E_BAD_TOPIC",
                                 f"E_BAD_TOPIC MPUB topic name {go_quote(topic_name)} is not valid")
        partition = partition_param(params)
        self.check_auth(client, "MPUB", topic_name.decode(), "")
        topic = self.nsqd.get_topic(topic_name.decode())
        opts = self.opts
        try:
            size = reader.read_len()
        except Disconnect:
            raise FatalClientErr("E_BAD_BODY", "MPUB failed to read body size") from None
        if size <= 0:
            raise FatalClientErr("E_BAD_BODY", f"MPUB invalid body size {size}")
        if size > opts.max_body_size:
            raise FatalClientErr("E_BAD_BODY", f"MPUB body too big {size} > {opts.max_body_size}")
        # the size is checked, not used: the messages are read from the stream (readMPUB)
        status, index, value, body = reader.read_mpub(opts.max_msg_size, opts.max_body_size)
        packed = bytearray()
        if status == wire.MPUB_OK:
            with body:  # a view of the read buffer: its one copy is into `packed`
                status, index, value = wire.pack_mpub(body, self.nsqd.ids, time.time_ns(),
                                                      opts.max_msg_size, opts.max_body_size,
                                                      packed)
        if status != wire.MPUB_OK:
            code, template = MESSAGE_ERRORS[status]
            raise FatalClientErr(code, template.format(index=index, value=value,
                                                       max=opts.max_msg_size))
        try:
            self._publish(topic.name, lambda t: t.put_packed(packed, value,
                                                             len(packed) - value * 30, partition),
                          client)
        except PartitionError as err:
            raise FatalClientErr(*BAD_PARTITION(err)) from None
        except NotLeader as err:
            raise ClientErr(E_FAILED_ON_NOT_LEADER, str(err)) from None
        except TopicError as err:
            raise FatalClientErr("E_MPUB_FAILED", f"MPUB failed {err}") from None
        self._count_pub(client, topic.name, value)
        return OK

    def DPUB(self, client, params, reader):
        if len(params) < 3:
            raise FatalClientErr("E_INVALID", "DPUB insufficient number of parameters")
        topic_name = params[1]
        if not is_valid_name(topic_name):
            raise FatalClientErr("E_BAD_TOPIC", f"DPUB topic name {go_quote(topic_name)} is not valid")
        timeout_ms = base10(params[2])
        if timeout_ms is None:
            raise FatalClientErr("E_INVALID", f"DPUB could not parse timeout {text(params[2])}")
        max_ms = int(self.opts.max_req_timeout * 1000)
        timeout_ns = duration_ms(timeout_ms)  # Go's Duration: 2^63 ms wraps to 0, a valid delay
        if not 0 <= timeout_ns <= max_ms * 1_000_000:
            raise FatalClientErr("E_INVALID", f"DPUB timeout {timeout_ms} out of range 0-{max_ms}")
        body = self._read_message(reader, "DPUB")
        def put(topic):
            if timeout_ns:
                topic.put_deferred(body, timeout_ns / 1e9)
            else:
                topic.put_message(body)

        try:  # the body is a view of the read buffer: packed, never kept
            self.check_auth(client, "DPUB", topic_name.decode(), "")
            self._publish(topic_name.decode(), put)
        except TopicError as err:
            raise FatalClientErr("E_DPUB_FAILED", f"DPUB failed {err}") from None
        finally:
            body.release()
        self._count_pub(client, topic_name.decode(), 1)
        return OK

    # Youzan's publishes take the fair share (fairshare.py) before ext looks
    # the topic up and holds it: a yield between the lookup and the put could
    # find the topic deleted meanwhile
    def PUB_EXT(self, client, params, reader):
        fairshare.pace(self.nsqd)
        return ext.pub_ext(self, client, params, reader)

    def MPUB_EXT(self, client, params, reader):
        fairshare.pace(self.nsqd)
        return ext.mpub_ext(self, client, params, reader)

    def PUB_TRACE(self, client, params, reader):
        fairshare.pace(self.nsqd)
        return ext.pub_trace(self, client, params, reader)

    def MPUB_TRACE(self, client, params, reader):
        fairshare.pace(self.nsqd)
        return ext.mpub_trace(self, client, params, reader)

    def INTERNAL_CREATE_TOPIC(self, client, params, reader):
        """Youzan's INTERNAL_CREATE_TOPIC <topic> <partition> [<ext>]
        (internalCreateTopic), refused in cluster mode as Youzan's.  Partition
        0 of a name that is not a log topic is the classic topic, made ext
        when asked (a topic that exists is left as it is, as Youzan's
        getTopic does); a log topic answers OK for a partition it has.  A
        partition above 0 of anything else: E_CREATE_TOPIC_FAILED (a log
        topic is made with its partition count: /topic/create)."""
        req = parse_internal_create_topic(params)
        self.check_auth(client, "CREATE_TOPIC", req.topic, "")
        if getattr(self.nsqd, "replica_gate", None) is not None:
            raise ClientErr(E_CREATE_TOPIC_FAILED,
                            "CREATE_TOPIC is not allowed here while cluster feature enabled.")
        topic = self.nsqd.get_existing_topic(req.topic)
        if topic is not None and topic.is_log:
            made = req.partition < len(topic.partitions)
        elif req.partition == 0:
            made = True
            if topic is None:
                topic = self.nsqd.get_topic(req.topic)
                if req.ext:
                    ext.make_ext(self.nsqd, topic)
        else:
            made = False
        if not made:
            raise ClientErr(E_CREATE_TOPIC_FAILED, f"CREATE_TOPIC {req.topic} failed")
        return OK

    # -- helpers ------------------------------------------------------------------------

    def _publish(self, topic_name, put, client=None):
        """put(topic), with the topic got afresh when the one in hand was being
        deleted meanwhile (an ephemeral topic whose last channel just went, a
        delete from another worker): nsqd's GetTopic then makes a new one.
        Only a broker that stops answers "exiting".  While anything is traced,
        client is named as the publisher (trace.py)."""
        if client is not None:
            fairshare.pace(self.nsqd)
        if client is not None and self.nsqd.trace_switches:
            trace.publisher.client = client.remote_address
            try:
                return self._put_retrying(topic_name, put)
            finally:
                trace.publisher.client = None
        return self._put_retrying(topic_name, put)

    def _put_retrying(self, topic_name, put):
        for _ in range(RETRIES):
            topic = self.nsqd.get_topic(topic_name)
            try:
                return put(topic)
            except TopicError as err:
                if str(err) != "exiting" or self.nsqd.exiting or not topic.exiting:
                    raise
            gevent.sleep(RETRY_DELAY)
        raise TopicError("exiting")

    def _subscribe(self, client, topic_name, channel_name):
        """nsqd's SUB retry loop: the last client of an ephemeral channel (on
        any worker) can leave, and the channel or topic start exiting, between
        getting the channel and adding the client; then get them afresh."""
        for _ in range(RETRIES):
            topic = self.nsqd.get_topic(topic_name)
            channel = topic.get_channel(channel_name)
            try:
                channel.add_client(client)
            except ChannelError as err:
                if str(err) != "exiting" or self.nsqd.exiting:
                    raise FatalClientErr("E_SUB_FAILED", f"SUB failed {err}") from None
            else:
                if not topic.exiting and not channel.exiting:
                    return channel
                channel.remove_client(client)
            gevent.sleep(RETRY_DELAY)
        raise FatalClientErr("E_SUB_FAILED", "SUB failed to deleted topic/channel")

    def _read_message(self, reader, verb):
        max_size = self.opts.max_msg_size
        try:
            size = reader.read_len()
        except Disconnect:
            raise FatalClientErr("E_BAD_MESSAGE", f"{verb} failed to read message body size") from None
        if size <= 0:
            raise FatalClientErr("E_BAD_MESSAGE", f"{verb} invalid message body size {size}")
        if size > max_size:
            raise FatalClientErr("E_BAD_MESSAGE", f"{verb} message too big {size} > {max_size}")
        try:
            return reader.read_view(size)  # released by the caller
        except Disconnect:
            raise FatalClientErr("E_BAD_MESSAGE", f"{verb} failed to read message body") from None

    def _read_body(self, reader, verb, code, max_size, body_too_big, bad_size):
        try:
            size = reader.read_len()
        except Disconnect:
            raise FatalClientErr(code, f"{verb} failed to read body size") from None
        if size > max_size:
            raise FatalClientErr(code, body_too_big.format(n=size, max=max_size))
        if size <= 0:
            raise FatalClientErr(code, bad_size.format(n=size))
        try:
            return reader.read(size)
        except Disconnect:
            raise FatalClientErr(code, f"{verb} failed to read body") from None

    @staticmethod
    def _count_pub(client, topic_name, n):
        client.pub_counts[topic_name] = client.pub_counts.get(topic_name, 0) + n
