"""A log range over TCP (broker on another host): a SUB_ADVANCED on an
ephemeral channel of the task's own,

    SUB_ADVANCED <topic> spark-<random>#ephemeral <partition> msgcount:<start + 1>

(Youzan's msgcount counts messages from 1: msg offset n is the n+1-th.)

Before it, the channel is made and every cursor moved to the log end over
HTTP (/channel/setoffset special:-1): a topic's first channel would start
at the log start in every partition, and the task wants one.  Whatever
still arrives from other partitions is dropped by the reader (logrange),
and FINed like the rest.  The channel goes with the connection."""

import time
import uuid
from urllib.parse import quote

from nsqshm.spark.connect import http_post
from nsqshm.spark.tcp import Connection, Subscription
from nsqshm.youzan.offset import count_of

IDLE_LIMIT = 30.0   # s without a message before the range is declared missing
POLL = 0.2


class RangeSubscription(Subscription):
    def __init__(self, log_topic, partition, start, columns=None):
        """columns: an ext topic's Columns(ext=True, ...): the connection asks
        for extend_support, so frames carry the headers (else nsqd strips them)."""
        self.channel = f"spark-{uuid.uuid4().hex[:12]}#ephemeral"
        topic = quote(log_topic.name, safe="")
        channel = quote(self.channel, safe="")
        if log_topic.http_address:
            try:
                http_post(log_topic.http_address, f"/channel/create?topic={topic}&channel={channel}")
                http_post(log_topic.http_address,
                          f"/channel/setoffset?topic={topic}&channel={channel}",
                          body=b"special:-1")
            except OSError:
                pass  # only saves work: the reader drops other partitions' messages
        self.conn = Connection(log_topic.tcp_address, extend_support=columns is not None)
        self.conn.sock.sendall(f"SUB_ADVANCED {log_topic.name} {self.channel} {partition} "
                               f"msgcount:{count_of(start)}\n".encode())
        self.conn.response()
        from nsqshm._core.localbatch import Columns

        self.columns = columns if columns is not None else Columns()
        self.fins = bytearray()
        self.held = 0
        self.detail = True  # frames carry the queue offset and raw size before the body
        self.last = time.monotonic()

    def collect(self, want, idle_timeout=POLL):
        got = super().collect(want, idle_timeout)
        if got:
            self.last = time.monotonic()
        return got

    def idle_too_long(self):
        return time.monotonic() - self.last > IDLE_LIMIT
