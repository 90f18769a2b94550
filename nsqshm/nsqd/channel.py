"""A channel: its shared-memory ring, in-flight table, deferred queue and
subscribed clients (nsqd's channel.go).

Every message the topic pumps in lands in the channel's ring.  One
dispatcher greenlet per channel moves messages from the ring to ready
clients, each client getting at most RDY minus in-flight, in one C call per
client per round (pop_many_into + InFlight.deliver: frames built, attempts
counted and the message put in flight without a Python object per
message).  Timeouts and deferrals are found by the broker's scan loop
through next_deadline(), never by a timer per message.
"""

import time

import gevent
import gevent.event
from gevent.socket import wait_read

from nsqshm._core.inflight import NOT_IN_FLIGHT, NOT_OWNER, DeferredQueue, InFlight
from nsqshm.nsqd.names import is_ephemeral

DELIVER_BATCH = 1024
STATUS_TEXT = {NOT_IN_FLIGHT: "ID not in flight", NOT_OWNER: "client does not own message"}


class ChannelError(Exception):
    pass


class Channel:
    def __init__(self, topic, name):
        self.topic = topic
        self.nsqd = topic.nsqd
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.ring = self.nsqd.make_ring(f"c.{topic.name}:{name}")
        self.inflight = InFlight()
        self.deferred = DeferredQueue()
        self.clients = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.e2e = None
        self._ready = gevent.event.Event()
        self._scratch = bytearray(max(1 << 20, 2 * (self.ring.max_record + 4)))
        self._dispatcher = gevent.spawn(self._dispatch)

    def __repr__(self):
        return f"<Channel {self.topic.name}:{self.name}>"

    # -- clients --------------------------------------------------------------------

    def add_client(self, client):
        if self.exiting:
            raise ChannelError("exiting")
        limit = self.nsqd.opts.max_channel_consumers
        if limit and client.id not in self.clients and len(self.clients) >= limit:
            raise ChannelError(f"consumers for {self.topic.name}:{self.name} exceeds limit of {limit}")
        self.clients[client.id] = client
        self.wake()

    def remove_client(self, client):
        if self.clients.pop(client.id, None) is None:
            return
        if not self.clients and self.ephemeral:
            self.topic.delete_channel(self.name)

    def wake(self):
        """Something changed that may let the dispatcher deliver."""
        self._ready.set()

    # -- FIN / REQ / TOUCH --------------------------------------------------------------

    def finish(self, client, msg_id):
        status = self.inflight.finish(msg_id, client.id)
        if status:
            raise ChannelError(STATUS_TEXT[status])
        client.in_flight -= 1
        client.finish_count += 1
        self._ready.set()

    def finished(self, client, n):
        """n messages of client were finished in a batch (wire.fin_lines)."""
        client.in_flight -= n
        client.finish_count += n
        self._ready.set()

    def requeue(self, client, msg_id, delay):
        msg = self.inflight.requeue(msg_id, client.id)
        if isinstance(msg, int):
            raise ChannelError(STATUS_TEXT[msg])
        client.in_flight -= 1
        client.requeue_count += 1
        self.requeue_count += 1
        if delay > 0:
            self.defer(msg, delay)
        else:
            self.put_records(len(msg).to_bytes(4, "little") + msg, new=False)
        self._ready.set()

    def touch(self, client, msg_id):
        """Move the deadline to now + msg_timeout, but never past delivery +
        --max-msg-timeout (the deadline set at delivery tells when that was)."""
        first = self.inflight.get_first_deadline(msg_id)
        if first < 0:
            raise ChannelError(STATUS_TEXT[NOT_IN_FLIGHT])
        delivered = first - client.msg_timeout_ns
        new_deadline = min(time.monotonic_ns() + client.msg_timeout_ns,
                           delivered + int(self.nsqd.opts.max_msg_timeout * 1e9))
        status = self.inflight.touch(msg_id, client.id, new_deadline)
        if status:
            raise ChannelError(STATUS_TEXT[status])
        self.nsqd.schedule_scan(new_deadline)

    # -- putting messages in -------------------------------------------------------------

    def put_records(self, packed, new=True):
        """Push packed records into the ring.  `new` messages (from the topic
        pump) count in message_count; requeues, timeouts and deferred
        messages coming due do not, as in nsqd."""
        view = memoryview(packed)
        while view:
            done, used = self.ring.push_packed(view)
            if not done:
                done, used = self.ring.push_packed_wait(view)
            if new:
                self.message_count += done
            view = view[used:]

    def put_deferred(self, msg, due):
        """A DPUB message for this channel: counted now, delivered when due."""
        self.deferred.push(msg, due)
        self.message_count += 1
        self.nsqd.schedule_scan(due)

    def defer(self, msg, delay_s):
        due = time.monotonic_ns() + int(delay_s * 1e9)
        self.deferred.push(msg, due)
        self.nsqd.schedule_scan(due)

    # -- the dispatcher -----------------------------------------------------------------

    def _dispatch(self):
        ring = self.ring
        scratch = self._scratch
        while not self.exiting:
            ready = [] if self.paused else [c for c in self.clients.values() if c.is_ready()]
            if not ready:
                self._ready.clear()
                self._ready.wait()
                continue
            if ring.depth == 0:
                ring.arm()
                if ring.depth == 0:
                    wait_read(ring.fileno())
                ring.drain()
                ring.disarm()
                continue
            now = time.monotonic_ns()
            earliest = None
            for client in ready:
                room = client.ready_count - client.in_flight
                if room <= 0 or client.closed:
                    continue
                n, nbytes = ring.pop_many_into(scratch, min(room, DELIVER_BATCH))
                if not n:
                    break
                deadline = now + client.msg_timeout_ns
                self.inflight.deliver(scratch, n, client.out, client.id, deadline)
                client.in_flight += n
                client.message_count += n
                client.kick()
                if earliest is None or deadline < earliest:
                    earliest = deadline
            if earliest is not None:
                self.nsqd.schedule_scan(earliest)
            gevent.idle()  # let writers and readers run between rounds

    # -- the scan loop's work ---------------------------------------------------------

    def process_timeouts(self, now):
        """Requeue messages whose in-flight deadline passed; returns how many."""
        total = 0
        scratch = self._scratch
        while True:
            n, nbytes = self.inflight.pop_expired(now, scratch)
            if not n:
                break
            total += n
            self.put_records(memoryview(scratch)[:nbytes], new=False)
        if total:
            self.timeout_count += total
            for client in self.clients.values():
                client.in_flight = self.inflight.client_count(client.id)
            self._ready.set()
        return total

    def process_deferred(self, now):
        total = 0
        scratch = self._scratch
        while True:
            n, nbytes = self.deferred.pop_due(now, scratch)
            if not n:
                break
            total += n
            self.put_records(memoryview(scratch)[:nbytes], new=False)
        return total

    def next_deadline(self):
        deadlines = [d for d in (self.inflight.next_deadline(), self.deferred.next_due()) if d >= 0]
        return min(deadlines) if deadlines else -1

    # -- pause, empty, delete ------------------------------------------------------------

    def pause(self):
        self.paused = True

    def unpause(self):
        self.paused = False
        self._ready.set()

    @property
    def depth(self):
        return self.ring.depth

    def empty(self):
        scratch = self._scratch
        while self.ring.pop_many_into(scratch)[0]:
            pass
        while self.inflight.drain(scratch)[0]:
            pass
        while self.deferred.drain(scratch)[0]:
            pass
        for client in self.clients.values():
            client.in_flight = 0
        self._ready.set()

    def close(self, delete=False):
        """Stop the dispatcher; on delete, drop the ring and close clients."""
        self.exiting = True
        self._dispatcher.kill(block=False)
        if delete:
            for client in list(self.clients.values()):
                client.close()
            self.clients.clear()
            self.ring.unlink()
        else:
            self.requeue_all()
        self.ring.close()

    def requeue_all(self):
        """Put in-flight and deferred messages back into the ring (shutdown)."""
        scratch = self._scratch
        for table in (self.inflight, self.deferred):
            while True:
                n, nbytes = table.drain(scratch)
                if not n:
                    break
                done, used = self.ring.push_packed(memoryview(scratch)[:nbytes])
                if used < nbytes:
                    break
