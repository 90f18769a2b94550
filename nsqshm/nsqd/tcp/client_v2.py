"""A TCP client's state (nsqd's clientV2): identity, negotiated settings,
RDY and in-flight accounting, its output buffer and its transport.

Frames are appended to `out` by whoever produces them (the command loop,
the channel's dispatcher, the heartbeat) and a writer greenlet sends them,
so a slow client never holds up the dispatcher of its channel.

Output buffering, as nsqd's messagePump and bufio.Writer: message frames
wait in `out` while the client can take more messages, until
output_buffer_size bytes are there or the next tick of its
output_buffer_timeout (a libev timer per client while frames wait, none
while idle); any other frame (a response, an error, a heartbeat) goes at
once and takes them along, as nsqd's Send flushes its writer for every
frame but a message.  A timeout of 0 (IDENTIFY's -1 for either field)
sends at once.

The transport starts as the plain socket; IDENTIFY may upgrade it, in
nsqd's order, to TLS (the socket is replaced by a TLS socket), then snappy
or deflate (a codec encodes each chunk the writer sends and decodes what
the reader receives).  The writer holds `_write_lock` while it sends, so an
upgrade can flush what precedes it through the old transport and switch.
"""

import socket
import time

import gevent
import gevent.event
import gevent.lock

from nsqshm._core.codec import FRAME_TYPE_RESPONSE
from nsqshm.nsqd.tcp import tls as tls_mod
from nsqshm.nsqd.tcp.auth import client_ssl_context, query_any_authd

STATE_INIT = 0
STATE_DISCONNECTED = 1
STATE_CONNECTED = 2
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

HEARTBEAT = b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"


def frame(frame_type, data):
    n = len(data) + 4
    return n.to_bytes(4, "big") + frame_type.to_bytes(4, "big") + data


class ClientV2:
    def __init__(self, nsqd, sock, address, client_id):
        opts = nsqd.opts
        self.nsqd = nsqd
        self.sock = sock
        self.id = client_id
        self.remote_address = f"{address[0]}:{address[1]}"
        self.state = STATE_INIT
        self.client_id = address[0]
        self.hostname = address[0]
        self.user_agent = ""
        self.connect_time = time.time()
        self.ticks_from = time.monotonic()  # the phase of nsqd's outputBufferTicker (IDENTIFY resets it)
        self.heartbeat_interval = opts.client_timeout / 2
        self.msg_timeout = opts.msg_timeout
        self.output_buffer_size = 16 * 1024
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.sample_rate = 0
        # SUB_ADVANCED / SUB_ORDERED (Youzan's EnableTrace): frames carry the queue offset
        # and raw size (InFlight.deliver's detail: the record overhead; -1: none)
        self.detail = -1
        self.detail_log = False
        self.tls = self.snappy = self.deflate = False
        self.deflate_level = 0
        self.tls_cipher_suite = self.tls_version = self.tls_negotiated_protocol = ""
        self.tls_negotiated_protocol_is_mutual = False
        self.tls_sock = None
        self.codec = None          # snappy or deflate: encodes each chunk sent
        self.auth_secret = ""
        self.auth_state = None
        self.ready_count = 0
        self.in_flight = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts = {}
        self.channel = None
        # Youzan's IDENTIFY fields and the ExtView of an ext topic (nsqd/ext.py)
        self.extend_support = False
        self.desired_tag = ""
        self.ext_filter = None
        self.ext_view = None
        self.partition = None      # a log topic's partition the client SUBscribed to (None: all)
        self.closed = False
        self.unwritable = False  # a failed TLS handshake: the socket takes no more writes
        self.out = bytearray()
        self._spare = bytearray()  # the other output buffer, while one is being sent
        self._urgent = False      # out holds a frame that must go now (not a held message)
        self._flush_timer = None  # the output buffer's timer, while messages are held
        self._write_lock = gevent.lock.Semaphore()
        self._wake_writer = gevent.event.Event()
        self._writer = None
        self._heartbeat = None

    def __repr__(self):
        return f"{self.remote_address}"

    # -- flow control ---------------------------------------------------------------

    def is_ready(self):
        return (self.state == STATE_SUBSCRIBED and self.ready_count > self.in_flight
                and not self.closed)

    @property
    def msg_timeout_ns(self):
        return int(self.msg_timeout * 1e9)

    # -- output ---------------------------------------------------------------------

    def start(self):
        self._writer = gevent.spawn(self._write_loop)
        self.reset_heartbeat()

    def reset_heartbeat(self):
        if self._heartbeat is not None:
            self._heartbeat.kill(block=False)
            self._heartbeat = None
        if self.heartbeat_interval > 0:
            self._heartbeat = gevent.spawn(self._heartbeat_loop, self.heartbeat_interval)

    def _heartbeat_loop(self, interval):
        while not self.closed:
            gevent.sleep(interval)
            self.out += HEARTBEAT
            self.flush()

    def flush(self):
        """Ask the writer to send everything buffered now."""
        self._urgent = True
        self._wake_writer.set()

    def kick(self):
        """Message frames were appended to `out` (the channel's dispatcher,
        after counting them in flight), or RDY changed: send now, or hold
        them in the output buffer as nsqd's messagePump does while the client
        is ready for more, until the buffer is full or the timeout fires."""
        if not self.out:
            return
        timeout = self.output_buffer_timeout
        if (timeout <= 0 or self._urgent or len(self.out) >= self.output_buffer_size
                or self.in_flight >= self.ready_count):
            self._wake_writer.set()
            return
        if self._flush_timer is None:
            # at the next tick of nsqd's outputBufferTicker (every timeout since the
            # connection began, or IDENTIFY): a held message waits at most the timeout,
            # and batches go a timeout apart.  A new libev timer per held batch: a fired one,
            # restarted, would fire at once.
            delay = timeout - (time.monotonic() - self.ticks_from) % timeout
            self._flush_timer = gevent.get_hub().loop.timer(delay)
            self._flush_timer.start(self._wake_writer.set)

    def _stop_flush_timer(self):
        timer = self._flush_timer
        if timer is not None:
            self._flush_timer = None
            timer.close()

    def queue_frame(self, frame_type, data):
        """A response or error to the client's own command: sent by its
        reader before it next waits for input (flush_pending), as nsqd's
        IOLoop sends responses itself; waking the writer greenlet for each
        would cost a switch per PUB at low rates."""
        self.out += frame(frame_type, data)
        self._urgent = True

    def queue_response(self, data):
        self.queue_frame(FRAME_TYPE_RESPONSE, data)

    def send_now(self):
        """Send what is buffered from the calling greenlet, the client's own
        reader (an ordered channel's next message, which its FIN let go:
        LogChannel._deliver_ordered), without waking the writer, unless the
        writer is sending (then it sends this too)."""
        self._urgent = True
        self.flush_pending()

    def send_or_hold(self):
        """From the client's own reader, after it took messages there
        (Channel.refill_finisher): sent now if they fill it to its RDY (as
        kick() would have the writer send them), else held as kick() holds
        them."""
        if self.in_flight >= self.ready_count:
            self.send_now()
        else:
            self.kick()

    def flush_pending(self):
        """Send what is buffered from the reader if a response or error is
        among it (held messages wait for their timer), unless the writer is
        busy sending (then it sends this too)."""
        if not self._urgent or self.closed:
            return
        if self._write_lock.locked():
            self._wake_writer.set()
            return
        try:
            with self._write_lock:
                self._send_buffered()
        except OSError:
            self.closed = True

    def _write_loop(self):
        lock = self._write_lock
        try:
            while True:
                self._wake_writer.wait()
                self._wake_writer.clear()
                with lock:
                    self._send_buffered()
                if self.closed:
                    return
        except OSError:
            self.closed = True

    def _send_buffered(self):
        """Send `out` through the current transport (the write lock held)."""
        if self.unwritable:
            del self.out[:]
            return
        send = self.sock.send  # not sendall: gevent's asks for SO_SNDBUF every call
        while self.out:
            # the buffer itself is sent, and a spare takes its place for the frames
            # appended meanwhile (a send may wait): no copy of the whole output
            spare, self._spare = self._spare, None  # (a send that fails leaves none)
            data, self.out = self.out, spare if spare is not None else bytearray()
            self._urgent = False
            if self._flush_timer is not None:
                self._stop_flush_timer()
            codec = self.codec
            if codec is not None:
                encoded = codec.encode(data)
                del data[:]
                self._spare, data = data, encoded
            with memoryview(data) as whole:
                view = whole
                while view:
                    view = view[send(view):]
                view.release()
            if codec is None:
                del data[:]
                self._spare = data

    def _send_what_fits(self):
        """Before a close from elsewhere (its channel deleted): the answers
        queued for the client's commands go if the socket takes them now,
        as nsqd had sent them already; never waits."""
        try:
            with self._write_lock:
                self.sock.settimeout(0.0)
                self._send_buffered()
        except (OSError, ValueError):
            pass

    # -- transport upgrades (IDENTIFY) ------------------------------------------------

    def upgrade(self, response, reader, tls_context=None, codec=None):
        """nsqd's feature-negotiation sequence: the IDENTIFY response through
        the current transport, then for TLS the handshake and an OK frame over
        it, then for a codec the switch and an OK frame through it.  Raises
        OSError (or ValueError) when an upgrade fails."""
        ok = frame(FRAME_TYPE_RESPONSE, b"OK")
        with self._write_lock:
            self.out += frame(FRAME_TYPE_RESPONSE, response)
            self._send_buffered()
            if tls_context is not None:
                if reader.pending():
                    raise ValueError("tls: unexpected data before the handshake")
                self._upgrade_tls(tls_context, reader)
                self.out += ok
                self._send_buffered()
            if codec is not None:
                reader.set_codec(codec)
                self.codec = codec
                setattr(self, codec.name, True)
                if codec.name == "deflate":
                    self.deflate_level = codec.level
                self.out += ok
                self._send_buffered()

    def _upgrade_tls(self, ctx, reader):
        tls_sock = ctx.wrap_socket(self.sock, server_side=True, do_handshake_on_connect=False)
        self.sock = reader.sock = tls_sock
        tls_sock.settimeout(tls_mod.HANDSHAKE_TIMEOUT)
        try:
            tls_sock.do_handshake()
        except BaseException:
            # nothing more can be written: a write would retry the handshake
            # and wait out its timeout before the connection is closed
            self.unwritable = True
            raise
        tls_sock.settimeout(None)
        reader.recv = tls_sock.recv
        self.tls_sock = tls_sock
        self.tls = True
        self.tls_cipher_suite, self.tls_version = tls_mod.connection_state(tls_sock)
        self.tls_negotiated_protocol = tls_sock.selected_alpn_protocol() or ""
        self.tls_negotiated_protocol_is_mutual = True  # Go: deprecated, always true

    # -- AUTH -------------------------------------------------------------------------

    @property
    def auth_identity(self):
        return self.auth_state.identity if self.auth_state is not None else ""

    @property
    def auth_identity_url(self):
        return self.auth_state.identity_url if self.auth_state is not None else ""

    def has_authorizations(self):
        return self.auth_state is not None and len(self.auth_state.authorizations) != 0

    def auth(self, secret):
        self.auth_secret = secret
        self.query_authd()

    def query_authd(self):
        """Ask the auth servers about this client's secret (AuthError on failure)."""
        opts = self.nsqd.opts
        remote_ip = self.remote_address.rpartition(":")[0].strip("[]")
        common_name = tls_mod.peer_common_name(self.tls_sock) if self.tls else ""
        ctx = getattr(self.nsqd, "auth_ssl_context", None)
        if ctx is None and any(a.startswith("https") for a in opts.auth_http_address):
            ctx = self.nsqd.auth_ssl_context = client_ssl_context(opts)
        self.auth_state = query_any_authd(
            opts.auth_http_address, remote_ip, self.tls, common_name, self.auth_secret,
            method=getattr(opts, "auth_http_request_method", "get"),
            connect_timeout=opts.http_client_connect_timeout,
            request_timeout=opts.http_client_request_timeout, ssl_context=ctx)

    def is_authorized(self, topic, channel):
        """Whether the (unexpired, else refreshed) authorizations allow it;
        AuthError when a refresh fails."""
        state = self.auth_state
        if state is None:
            return False
        if state.is_expired():
            self.query_authd()
            state = self.auth_state
        return state.is_allowed(topic, channel)

    def close(self):
        if self.closed:
            return
        if self._urgent and not self._write_lock.locked():
            self._send_what_fits()
        self.closed = True
        if self._heartbeat is not None:
            self._heartbeat.kill(block=False)
        if self._writer is not None:
            self._writer.kill(block=False)
        self._stop_flush_timer()
        try:
            # shutdown first: the peer sees the end now, even when gevent defers
            # the close of a socket another greenlet was waiting on
            self.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass
        try:
            self.sock.close()
        except OSError:
            pass
