"""A TCP client's state (nsqd's clientV2): identity, negotiated settings,
RDY and in-flight accounting, and its output buffer.

Frames are appended to `out` by whoever produces them (the command loop,
the channel's dispatcher, the heartbeat) and a writer greenlet sends them,
so a slow client never holds up the dispatcher of its channel.
"""

import time

import gevent
import gevent.event
import gevent.lock

from nsqshm._core.codec import FRAME_TYPE_RESPONSE

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
        self.heartbeat_interval = opts.client_timeout / 2
        self.msg_timeout = opts.msg_timeout
        self.output_buffer_size = 16 * 1024
        self.output_buffer_timeout = opts.output_buffer_timeout
        self.sample_rate = 0
        self.tls = self.snappy = self.deflate = False
        self.deflate_level = 0
        self.auth_identity = ""
        self.ready_count = 0
        self.in_flight = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts = {}
        self.channel = None
        self.closed = False
        self.out = bytearray()
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
            self.kick()

    def send_response(self, data):
        self.out += frame(FRAME_TYPE_RESPONSE, data)
        self.kick()

    def kick(self):
        """Ask the writer to send what is buffered."""
        self._wake_writer.set()

    def _write_loop(self):
        sock = self.sock
        try:
            while True:
                self._wake_writer.wait()
                self._wake_writer.clear()
                while self.out:
                    data = bytes(self.out)
                    del self.out[:]
                    sock.sendall(data)
                if self.closed:
                    return
        except OSError:
            self.closed = True

    def flush_now(self):
        """Send what is buffered from the calling greenlet (before a close)."""
        if self.out:
            data = bytes(self.out)
            del self.out[:]
            try:
                self.sock.sendall(data)
            except OSError:
                pass

    def close(self):
        if self.closed:
            return
        self.closed = True
        if self._heartbeat is not None:
            self._heartbeat.kill(block=False)
        if self._writer is not None:
            self._writer.kill(block=False)
        try:
            self.sock.close()
        except OSError:
            pass
