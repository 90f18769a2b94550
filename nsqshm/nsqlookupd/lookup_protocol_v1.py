"""nsqlookupd's TCP protocol (nsqlookupd/tcp.go, lookup_protocol_v1.go).

The client sends the 4-byte magic "  V1", then lines:

    PING\\n
    IDENTIFY\\n<int32 BE size><JSON: broadcast_address, tcp_port, http_port, version, hostname>
    REGISTER <topic> [<channel>]\\n
    UNREGISTER <topic> [<channel>]\\n

An nsqshm nsqd adds "topic_partitions": true to its IDENTIFY; this lookupd
then answers with "topic_partitions": true too, and that nsqd's REGISTER and
UNREGISTER name a partition as Youzan's nsqlookupd reads them:

    REGISTER <topic> <partition> [<channel>]\n
    UNREGISTER <topic> <partition> [<channel>]\n

with partition -11 (Youzan's OLD_VERSION_PID) for a classic topic, and for
a log topic's channels and for the whole topic when it goes.  A peer that
did not ask (any NSQ nsqd) keeps NSQ's form and NSQ's answers, byte for byte.
A Go nsqlookupd ignores the field, so an nsqshm nsqd speaks NSQ's form to it.

Every answer, error or not, is <int32 BE size><data> (protocol.SendResponse,
no frame type): "OK", the IDENTIFY JSON, or "E_CODE description".  Every
error is fatal: the connection is closed right after it.  A line is read up
to "\\n" (any length), Go-TrimSpace'd and split on single spaces.  When the
connection ends, the producer is removed from all its registrations.
"""

import json
import socket
import struct
import time

from nsqshm import NSQD_COMPAT_VERSION
from nsqshm.flags import format_address, format_duration
from nsqshm.nsqd.errors import ClientErr
from nsqshm.nsqd.monitoring.stats import go_json
from nsqshm.nsqd.names import is_valid_name
from nsqshm.nsqlookupd.registration_db import PeerInfo, Producer
from nsqshm.youzan.lookup import OLD_VERSION_PID as NO_PARTITION
from nsqshm.youzan.lookup import parse_registration

MAGIC_V1 = b"  V1"
OK = b"OK"
CLIENT_REG = ("client", "", "")
OLD_VERSION_PID = int(NO_PARTITION)  # Youzan's: a registration without a partition

# unicode.IsSpace beyond ASCII (what strings.TrimSpace trims)
_UNICODE_SPACES = frozenset("\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
                            "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_ASCII_SPACES = b" \t\n\v\f\r"


class FatalClientErr(Exception):
    """protocol.FatalClientErr: the text is Code + " " + Desc (bytes)."""

    def __init__(self, code, desc, parent=None):
        if isinstance(desc, str):
            desc = desc.encode("utf-8", "surrogateescape")
        self.text = code.encode() + b" " + desc
        self.parent = parent
        super().__init__(self.text.decode("utf-8", "replace"))


def go_trim_space(line):
    """strings.TrimSpace on bytes: ASCII and Unicode white space at both ends."""
    line = line.strip(_ASCII_SPACES)
    if not line or (line[0] < 0x80 and line[-1] < 0x80):
        return line
    text = line.decode("utf-8", "surrogateescape")
    start, end = 0, len(text)
    while start < end and (text[start] in _UNICODE_SPACES
                           or text[start] in " \t\n\v\f\r"):
        start += 1
    while end > start and (text[end - 1] in _UNICODE_SPACES
                           or text[end - 1] in " \t\n\v\f\r"):
        end -= 1
    return text[start:end].encode("utf-8", "surrogateescape")


def send_response(sock, data):
    sock.sendall(struct.pack(">i", len(data)) + data)


# ---------------------------------------------------------------------------
# IDENTIFY's JSON body, decoded as Go's json.Unmarshal into a PeerInfo

_STRING_FIELDS = ("remote_address", "hostname", "broadcast_address", "version")
_INT_FIELDS = ("tcp_port", "http_port")
_BOOL_FIELDS = ("topic_partitions",)  # nsqshm's (the module docstring)
_FIELDS = _STRING_FIELDS + _INT_FIELDS + _BOOL_FIELDS


class _Float(str):
    """A JSON number with a fraction or exponent (not an int for Go)."""


class _Object(list):
    """A JSON object, as its (key, value) pairs in document order."""


def _fold(name):
    """encoding/json's case-insensitive key match, for ASCII field names."""
    return name.replace("\u212a", "k").replace("\u017f", "s").lower()


_FOLDED = {_fold(f): f for f in _FIELDS}


def decode_identify(body):
    """{field: value} for the PeerInfo fields set by the body, or ValueError
    where json.Unmarshal would fail (syntax, or a value of the wrong type)."""

    def bad_constant(text):
        raise ValueError(f"invalid character {text[:1]!r} looking for beginning of value")

    doc = json.loads(body.decode("utf-8", "replace"), object_pairs_hook=_Object,
                     parse_float=_Float, parse_constant=bad_constant)
    if doc is None:
        return {}
    if not isinstance(doc, _Object):
        raise ValueError("json: cannot unmarshal into Go value of type nsqlookupd.PeerInfo")
    out = {}
    error = None
    for key, value in doc:
        field = key if key in _FIELDS else _FOLDED.get(_fold(key))
        if field is None or value is None:
            continue
        if field in _STRING_FIELDS:
            if isinstance(value, str) and not isinstance(value, _Float):
                out[field] = value
                continue
        elif field in _BOOL_FIELDS:  # nsqshm's: nsqlookupd would not know it, so no error
            if isinstance(value, bool):
                out[field] = value
            continue
        elif (isinstance(value, int) and not isinstance(value, bool)
              and -(1 << 63) <= value < (1 << 63)):
            out[field] = value
            continue
        error = error or ValueError(f"json: cannot unmarshal into Go struct field "
                                    f"PeerInfo.{field}")
    if error is not None:
        raise error
    return out


# ---------------------------------------------------------------------------
# a connection


class ClientV1:
    def __init__(self, sock, address):
        self.sock = sock
        self.remote = format_address(address)
        self.peer_info = None
        self._buf = bytearray()

    def __str__(self):
        return self.remote

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            return False
        self._buf += data
        return True

    def read_line(self):
        """Up to and including "\\n"; None at EOF (a partial line is dropped, as Go)."""
        start = 0
        while True:
            i = self._buf.find(b"\n", start)
            if i >= 0:
                line = bytes(self._buf[:i + 1])
                del self._buf[:i + 1]
                return line
            start = len(self._buf)
            if not self._fill():
                return None

    def read_exact(self, n):
        """n bytes, or None when the connection ends first."""
        while len(self._buf) < n:
            if not self._fill():
                return None
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def read_body(self, n):
        """Like read_exact, without buffering a huge announced size up front."""
        if n <= len(self._buf):
            return self.read_exact(n)
        chunks = [bytes(self._buf)]
        got = len(self._buf)
        self._buf.clear()
        while got < n:
            data = self.sock.recv(min(n - got, 1 << 20))
            if not data:
                return None
            chunks.append(data)
            got += len(data)
        return b"".join(chunks)


class LookupProtocolV1:
    def __init__(self, lookupd):
        self.lookupd = lookupd
        self.db = lookupd.db

    def _log(self, level, msg):
        getattr(self.lookupd.log, level)(msg)

    # -- tcp.go Handle ------------------------------------------------------------

    def handle(self, sock, address):
        remote = format_address(address)
        self._log("info", f"TCP: new client({remote})")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = ClientV1(sock, address)
        try:
            try:
                magic = client.read_exact(4)
            except OSError as err:
                magic, reason = None, str(err)
            else:
                reason = "EOF" if not client._buf else "unexpected EOF"
            if magic is None:
                self._log("error", f"failed to read protocol version - {reason}")
                return
            shown = magic.decode("utf-8", "replace")
            self._log("info", f"CLIENT({remote}): desired protocol magic '{shown}'")
            if magic != MAGIC_V1:
                try:
                    send_response(sock, b"E_BAD_PROTOCOL")
                except OSError:
                    pass
                self._log("error", f"client({remote}) bad protocol magic '{shown}'")
                return
            self.lookupd.clients[remote] = client
            try:
                err = self.io_loop(client)
            finally:
                self.lookupd.clients.pop(remote, None)
            if err:
                self._log("error", f"client({remote}) - {err}")
        finally:
            try:
                sock.close()
            except OSError:
                pass

    # -- the loop ----------------------------------------------------------------------

    def io_loop(self, client):
        err = None
        while True:
            try:
                line = client.read_line()
            except OSError as e:
                err = e
                break
            if line is None:
                err = "EOF"
                break
            params = go_trim_space(line).split(b" ")
            try:
                response = self.exec(client, params)
            except FatalClientErr as e:
                ctx = f" - {e.parent}" if e.parent else ""
                self._log("error", f"[{client}] - {e}{ctx}")
                err = e
                try:
                    send_response(client.sock, e.text)
                except OSError as send_err:
                    self._log("error", f"[{client}] - {send_err}{ctx}")
                break  # every nsqlookupd error is fatal
            if response is not None:
                try:
                    send_response(client.sock, response)
                except OSError as e:
                    err = e
                    break
        self._log("info", f"PROTOCOL(V1): [{client}] exiting ioloop")
        if client.peer_info is not None:
            peer_id = client.peer_info.id
            for reg in self.db.lookup_registrations(peer_id):
                removed, _ = self.db.remove_producer(reg, peer_id)
                if removed:
                    self._log("info", f"DB: client({client}) UNREGISTER category:{reg[0]} "
                                      f"key:{reg[1]} subkey:{reg[2]}")
        return err

    def exec(self, client, params):
        cmd = params[0]
        if cmd == b"PING":
            return self.ping(client, params)
        if cmd == b"IDENTIFY":
            return self.identify(client, params[1:])
        if cmd == b"REGISTER":
            return self.register(client, params[1:])
        if cmd == b"UNREGISTER":
            return self.unregister(client, params[1:])
        raise FatalClientErr("E_INVALID", b"invalid command " + cmd)

    # -- commands ------------------------------------------------------------------------

    @staticmethod
    def _topic_channel(command, params):
        """getTopicChan: (topic, channel) with channel "" when absent."""
        if not params:
            raise FatalClientErr("E_INVALID", f"{command} insufficient number of params")
        topic = params[0]
        channel = params[1] if len(params) >= 2 else b""
        if not is_valid_name(topic):
            raise FatalClientErr("E_BAD_TOPIC", command.encode() + b" topic name '" + topic
                                 + b"' is not valid")
        if channel and not is_valid_name(channel):
            raise FatalClientErr("E_BAD_CHANNEL", command.encode() + b" channel name '"
                                 + channel + b"' is not valid")
        return topic.decode("ascii"), channel.decode("ascii")

    @staticmethod
    def _partition(command, params):
        """Youzan's getTopicChan for a partitioned peer (youzan.lookup's
        codec): (topic, channel, partition) from <topic> <partition> [<channel>]."""
        words = [w.decode("utf-8", "surrogateescape") for w in params]
        try:
            reg = parse_registration(command, words, old_peer=False)
        except ClientErr as err:
            raise FatalClientErr(err.code, err.desc) from None
        return reg.topic, reg.channel, int(reg.partition)

    def register(self, client, params):
        if client.peer_info is None:
            raise FatalClientErr("E_INVALID", "client must IDENTIFY")
        if client.peer_info.topic_partitions:
            return self._register_partition(client, params)
        topic, channel = self._topic_channel("REGISTER", params)
        return self._register(client, topic, channel)

    def _register(self, client, topic, channel):
        producer = Producer(client.peer_info)
        if channel:
            if self.db.add_producer(("channel", topic, channel), producer):
                self._log("info", f"DB: client({client}) REGISTER category:channel "
                                  f"key:{topic} subkey:{channel}")
        if self.db.add_producer(("topic", topic, ""), Producer(client.peer_info)):
            self._log("info", f"DB: client({client}) REGISTER category:topic key:{topic} subkey:")
        return OK

    def _register_partition(self, client, params):
        topic, channel, pid = self._partition("REGISTER", params)
        if pid != OLD_VERSION_PID:
            if self.db.add_producer(("partition", topic, str(pid)), Producer(client.peer_info)):
                self._log("info", f"DB: client({client}) REGISTER category:partition "
                                  f"key:{topic} subkey:{pid}")
        return self._register(client, topic, channel)

    def unregister(self, client, params):
        if client.peer_info is None:
            raise FatalClientErr("E_INVALID", "client must IDENTIFY")
        if client.peer_info.topic_partitions:
            topic, channel, pid = self._partition("UNREGISTER", params)
            if pid != OLD_VERSION_PID and not channel:
                # one partition of a log topic: the topic stays registered
                removed, _ = self.db.remove_producer(("partition", topic, str(pid)),
                                                     client.peer_info.id)
                if removed:
                    self._log("info", f"DB: client({client}) UNREGISTER category:partition "
                                      f"key:{topic} subkey:{pid}")
                return OK
            if not channel:  # the whole topic: its partitions too
                for reg in self.db.find_registrations("partition", topic, "*"):
                    self.db.remove_producer(reg, client.peer_info.id)
            return self._unregister(client, topic, channel)
        topic, channel = self._topic_channel("UNREGISTER", params)
        return self._unregister(client, topic, channel)

    def _unregister(self, client, topic, channel):
        peer_id = client.peer_info.id
        if channel:
            reg = ("channel", topic, channel)
            removed, left = self.db.remove_producer(reg, peer_id)
            if removed:
                self._log("info", f"DB: client({client}) UNREGISTER category:channel "
                                  f"key:{topic} subkey:{channel}")
            # an ephemeral channel goes away with its last producer
            if left == 0 and channel.endswith("#ephemeral"):
                self.db.remove_registration(reg)
        else:
            # a topic unregistration: its channels too (nsqd sends those first,
            # so anything removed here is unexpected)
            for reg in self.db.find_registrations("channel", topic, "*"):
                removed, _ = self.db.remove_producer(reg, peer_id)
                if removed:
                    self._log("warn", f"client({client}) unexpected UNREGISTER "
                                      f"category:channel key:{topic} subkey:{reg[2]}")
            reg = ("topic", topic, "")
            removed, left = self.db.remove_producer(reg, peer_id)
            if removed:
                self._log("info", f"DB: client({client}) UNREGISTER category:topic "
                                  f"key:{topic} subkey:")
            if left == 0 and topic.endswith("#ephemeral"):
                self.db.remove_registration(reg)
        return OK

    def identify(self, client, params):
        if client.peer_info is not None:
            raise FatalClientErr("E_INVALID", "cannot IDENTIFY again")
        head = client.read_exact(4)
        if head is None:
            raise FatalClientErr("E_BAD_BODY", "IDENTIFY failed to read body size",
                                 "unexpected EOF" if client._buf else "EOF")
        (size,) = struct.unpack(">i", head)
        # nsqlookupd panics on a negative size (make([]byte, n)); here it is
        # a body that cannot be read
        body = client.read_body(size) if size >= 0 else None
        if body is None:
            raise FatalClientErr("E_BAD_BODY", "IDENTIFY failed to read body",
                                 "unexpected EOF" if size > 0 else "negative size")
        peer = PeerInfo(client.remote)
        try:
            fields = decode_identify(body)
        except ValueError as err:
            raise FatalClientErr("E_BAD_BODY", "IDENTIFY failed to decode JSON body",
                                 err) from None
        for name, value in fields.items():
            setattr(peer, name, value)
        peer.remote_address = client.remote
        if (peer.broadcast_address == "" or peer.tcp_port == 0 or peer.http_port == 0
                or peer.version == ""):
            raise FatalClientErr("E_BAD_BODY", "IDENTIFY missing fields")
        peer.last_update = time.time_ns()
        self._log("info", f"CLIENT({client}): IDENTIFY Address:{peer.broadcast_address} "
                          f"TCP:{peer.tcp_port} HTTP:{peer.http_port} Version:{peer.version}")
        client.peer_info = peer
        if self.db.add_producer(CLIENT_REG, Producer(peer)):
            self._log("info", f"DB: client({client}) REGISTER category:client key: subkey:")
        lookupd = self.lookupd
        answer = {  # a Go map: keys sorted
            "broadcast_address": lookupd.opts.broadcast_address,
            "hostname": lookupd.hostname,
            "http_port": lookupd.http_port,
            "tcp_port": lookupd.tcp_port,
        }
        if peer.topic_partitions:  # (only to a peer that asked: NSQ's answer otherwise)
            answer["topic_partitions"] = True
        answer["version"] = NSQD_COMPAT_VERSION
        return go_json(answer)

    def ping(self, client, params):
        peer = client.peer_info
        if peer is not None:
            now = time.time_ns()
            since = format_duration((now - peer.last_update) / 1e9)
            self._log("info", f"CLIENT({peer.id}): pinged (last ping {since})")
            peer.last_update = now
        return OK
