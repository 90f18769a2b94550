"""The leader side of a replicated partition: the gate a leading partition holds
(nsqd/logtopics/replica.py) and one sender greenlet per other replica.

    PUB -> Partition.append: gate.check_writable (fenced? lease alive?)
                             log.append_packed (local log, the records get offsets)
                             gate.committed(end): wait until every ISR member acked end
    sender (one per follower or catch-up replica):
        probe the follower's end; then loop: read_into(next) from the leader's log ->
        one APPEND frame with the whole batch -> ACK(end); acked[node] = end
        and, at most every CURSOR_INTERVAL, the channels' cursors that moved since
        the last ones it sent (one CURSORS frame): a follower's channels take them,
        so after a failover consumers go on from there.  While the partition is
        busy (an append or a cursor move in the last ACTIVE_SPAN) an idle sender
        looks at the cursors every CURSOR_INTERVAL; after a quiet ACTIVE_SPAN
        every IDLE_CURSOR_WAIT, so an idle broker does not spin
    monitor (every MONITOR_INTERVAL):
        an ISR follower that has not caught up (held everything the leader's log
        held at some moment) for longer than lag_timeout (dead, cut off, slow) is
        moved out of the ISR in etcd (epoch bumped): the PUBs that waited for it are
        answered; a catch-up replica caught up in the last JOIN_FRESH, and that took
        every channel's cursor in the last JOIN_CURSORS_FRESH, joins the ISR:
        PUBs wait for it from then on, and once it has the log's end as it was then
        (within JOIN_WAIT) it holds every message acknowledged, and goes in.
    move (an operator's MoveRequest in etcd, or a graceful stop):
        the new replica joins the catch-up list and, once it has caught up, the
        ISR; then the old one leaves the replicas, or, for the leadership, the
        hand-off: writes refused (E_FAILED_ON_NOT_LEADER), the new leader has the
        log's end and the channels' cursors sent after the refusal began, it is
        made the designated leader (who goes first at the election), and this
        leader resigns its session: the election is immediate, not a TTL later.

Batching: a sender reads as many records as the log holds past the follower's end
(up to BATCH_BYTES) into one buffer, in C, and sends it as one frame; the follower
appends it with one append_packed.  PUBs that arrive while a frame is on the wire
go out together in the next one.  No Python object is made per message.

Fencing: the gate refuses writes (E_FAILED_ON_NOT_LEADER) once the leader knows it
is deposed: an ISR change refused by etcd (Fenced), a follower that answers FENCED
(it saw a newer write epoch), or the node's lease past its local deadline (etcd may
have expired it and elected another leader).  A PUB already appended to the local
log but not acknowledged is answered with an error: the client retries (at least
once); the record may stay in this log only.
"""

import time

import gevent
import gevent.event

from nsqshm._core.commitlog import LogError
from nsqshm.consistence import rpc
from nsqshm.consistence.errors import CoordinationError, EtcdUnavailable, Fenced
from nsqshm.nsqd.logtopics.partition import MAX_RECORD
from nsqshm.nsqd.logtopics.replica import NotLeader

BATCH_BYTES = MAX_RECORD + 4 + (2 << 20)  # the largest record fits, with room for more
MONITOR_INTERVAL = 0.2
MAX_TOMBSTONES = 1024  # deleted channel names kept per partition (the rest forgotten)
JOIN_FRESH = 0.5  # s: a catch-up replica caught up this recently is tried for the ISR
JOIN_WAIT = 1.0  # s: how long PUBs may wait for a joining replica to take the end
RETRY = 0.3
CURSOR_INTERVAL = 0.05  # s: cursors go at most this often while the partition is busy
ACTIVE_SPAN = 1.0  # s: busy for this long after an append sent or a cursor move
IDLE_CURSOR_WAIT = 1.0  # s: how often a quiet partition's cursors are looked at
# s: a catch-up replica joins the ISR only if it took every channel's cursor this
# recently (a quiet partition's are sent every IDLE_CURSOR_WAIT)
JOIN_CURSORS_FRESH = IDLE_CURSOR_WAIT + 0.5
MOVE_TIMEOUT = 60.0  # s: a moved replica has this long to catch up (Youzan's minute)
HAND_OFF_TIMEOUT = 2.0  # s: the new leader has this long to take the end and the cursors
RESIGN_RETRY = 0.5  # s: a hand-off's resign that etcd did not answer is sent again after
_BUFFERS = []  # batch buffers not on the wire, shared by the senders of this process
_DELETED = object()  # in a connection's `sent`: the channel's deletion was sent
_COMMITTED = object()  # a connection's `sent` key: the committed end it was told


def _take_buffer():
    return _BUFFERS.pop() if _BUFFERS else bytearray(BATCH_BYTES)


class PartitionLeader:
    writable = True

    def __init__(self, coordinator, partition, state):
        self.coordinator = coordinator
        self.partition = partition
        self.state = state  # the PartitionState it holds: epoch for its ISR changes
        self.epoch = state.replicas.epoch_for_write  # sent with every APPEND
        self.me = coordinator.node.id
        self.lag_timeout = coordinator.lag_timeout
        self.acked = {}  # node ID -> end offset it acknowledged
        # what this node heard was committed while it followed (CURSORS frames): every
        # ISR member holds it, so the channels deliver up to it before the first acks
        # (an ISR member that died with the old leader would hold them back until the
        # monitor takes it out of the ISR); never past this log's own end
        self.floor = min(coordinator.committed_heard(partition),
                         coordinator.host.end_offset(partition))
        # node ID -> the last monotonic time it held everything the leader's log held
        # then (an ACK of a frame that took the log to its end as read at that time, or
        # an ACK equal to the end): under steady PUBs a follower is nearly always a
        # frame behind the end, so "behind at the check" would drop a healthy one
        self.caught_up = {}
        self.joining = None  # a catch-up node moving into the ISR: PUBs wait for it too
        self.fenced = None  # why this leader may acknowledge nothing more
        self.handing_off = None  # the node it hands its leadership to: writes refused
        # the leader session (its create_revision) a hand-off gave up, while etcd has
        # not yet answered the resign: the role watch does not make it a leader again
        self.resigning = None
        self.cursors_synced = {}  # node ID -> when it last held every cursor (monotonic)
        self._channels = set()  # the durable channels at the last cursor send
        # channels deleted on this partition's leaders (tombstones), kept in etcd so
        # that a follower that missed a deletion hears of it from the next leader too
        self._deleted = self._load_deleted()
        self._deleted_kept = set(self._deleted)
        self._moving = None  # the create_revision of the MoveRequest being carried out
        self._progress = gevent.event.Event()  # set (and replaced) at each ack or change
        self._wakes = {}  # node ID -> Event: wakes its sender at an append
        self._senders = {}
        self._monitor = gevent.spawn(self._monitor_loop)
        self._update_senders()
        if state.move is not None:  # (asked of the last leader: carried out or given up)
            self._moving = state.move.create_revision
            gevent.spawn(self._move, state.move)

    def __repr__(self):
        return f"<PartitionLeader {self.partition.topic.name}-{self.partition.index} " \
               f"epoch {self.epoch}>"

    # -- the gate (nsqd/logtopics/replica.py) ------------------------------------------------------

    def check_writable(self, partition):
        if self.fenced is not None:
            raise NotLeader(f"{self._name} {self.fenced}")
        if self.handing_off is not None:
            raise NotLeader(f"{self._name} hands its leadership to {self.handing_off}")
        if not self.coordinator.lease_alive():
            raise NotLeader(f"{self._name} lost its etcd lease")

    def committed(self, partition, end):
        """Block the PUB until every ISR member (and a joining one) has `end`."""
        for wake in self._wakes.values():
            wake.set()
        while True:
            if self.fenced is not None:
                raise NotLeader(f"{self._name} {self.fenced}")
            if all(self.acked.get(n, 0) >= end for n in self._required()):
                if not self.coordinator.lease_alive():
                    raise NotLeader(f"{self._name} lost its etcd lease")
                return
            self._progress.wait(1.0)

    def committed_end(self, partition):
        """The end every ISR member (and a joining one) has acknowledged, or
        the committed end this node heard as a follower if that is more: the
        channels deliver up to here (Partition.readable_end), never a record
        a new leader might not hold.  Alone in the ISR: the log's end."""
        required = self._required()
        if not required:
            return partition.log.end_offset
        return max(self.floor, min(self.acked.get(n, 0) for n in required))

    @property
    def _name(self):
        return f"{self.partition.topic.name}-{self.partition.index}"

    def _required(self):
        isr = [n for n in self.state.replicas.isr if n != self.me]
        return isr + [self.joining] if self.joining else isr

    def _notify(self):
        old, self._progress = self._progress, gevent.event.Event()
        old.set()
        # an ack or an ISR change may move the committed end: the channels look again
        self.partition.topic.appended(self.partition)

    # -- life ------------------------------------------------------------------------------

    def fence(self, why):
        if self.fenced is None:
            self.fenced = why
            self.coordinator.logf("warn", f"{self._name}: fenced, acknowledging nothing: {why}")
        self._notify()

    def stop(self, why="stopped leading"):
        self.fence(why)
        self._monitor.kill(block=False)
        for g in self._senders.values():
            g.kill(block=False)
        self._senders.clear()

    def set_state(self, state):
        """A newer state of the partition (our own ISR change, or read by the watch)."""
        if state.epoch >= self.state.epoch:
            self.state = state
            self._update_senders()
            self._notify()
            move = state.move
            if move is not None and move.create_revision != self._moving \
                    and self.fenced is None:
                self._moving = move.create_revision
                gevent.spawn(self._move, move)

    def _update_senders(self):
        wanted = {n for n in (*self.state.replicas.isr, *self.state.replicas.catchup)
                  if n != self.me}
        for node in list(self._senders):
            if node not in wanted:
                self._senders.pop(node).kill(block=False)
                self._wakes.pop(node, None)
        for node in wanted:
            if node not in self._senders:
                self._wakes[node] = gevent.event.Event()
                self._senders[node] = gevent.spawn(self._send_loop, node, self._wakes[node])

    # -- senders ---------------------------------------------------------------------------

    def _send_loop(self, node, wake):
        topic, index = self.partition.topic.name, self.partition.index
        host = self.coordinator.host
        last_error = None
        while self.fenced is None:
            client = None
            sent = {}  # channel -> the cursor last sent on this connection
            covers, covers_at = -1, 0.0  # the last frame that reached the log's end
            next_cursors = 0.0
            busy_until = 0.0  # a busy partition's cursors are looked at often
            streaming = False  # this connection's last APPEND was taken (see rpc.py)
            try:
                client = self.coordinator.connect(node, topic, index)
                status, end, crc = self._control(client, rpc.PROBE)
                if status == rpc.MISMATCH and self._diverged(end, crc):
                    status, end, crc = self._repair(client, node, end)
                elif status == rpc.MISMATCH and end < host.start_offset(self.partition):
                    status, end, crc = self._reset(
                        client, node, end, f"ends at {end}, below this log's start "
                                           f"{host.start_offset(self.partition)} (retention)")
                while self.fenced is None:
                    if status == rpc.FENCED:
                        self.fence(f"{node} knows a newer leader or epoch")
                        return
                    if status == rpc.UNKNOWN:
                        raise rpc.RPCError(f"{node} has no {topic}-{index} yet")
                    seen_at = time.monotonic()
                    leader_end = host.end_offset(self.partition)
                    if end > leader_end:  # (it grew since the probe: not from us)
                        raise rpc.RPCError(f"{node}'s log ends at {end}, past {leader_end}")
                    if end == leader_end:
                        self.caught_up[node] = seen_at
                    elif end >= covers:  # the frame took it to the end as read at covers_at
                        self.caught_up[node] = max(self.caught_up.get(node, 0.0), covers_at)
                    if self.acked.get(node) != end:
                        self.acked[node] = end
                        self._notify()
                    now = time.monotonic()
                    if now >= next_cursors or self.handing_off == node:
                        next_cursors = now + CURSOR_INTERVAL
                        answer = self._send_cursors(client, sent, node)
                        if answer == rpc.FENCED:
                            status = rpc.FENCED
                            continue
                        if answer is not None:  # moved: FINs are coming
                            busy_until = now + ACTIVE_SPAN
                    if end == leader_end:  # up to date: wait for the next append
                        wake.clear()
                        if host.end_offset(self.partition) == end:
                            # (the cursors then go within CURSOR_INTERVAL while busy)
                            wake.wait(max(next_cursors - now, 0.0) if now < busy_until
                                      else IDLE_CURSOR_WAIT)
                        continue
                    busy_until = now + ACTIVE_SPAN  # records to send: consumers follow
                    buf = _take_buffer()  # only while a batch is on the wire
                    try:
                        _, nbytes, after = host.read(self.partition, end, buf, BATCH_BYTES)
                        if not nbytes:  # (cannot happen: a batch holds the largest record)
                            raise rpc.RPCError(f"record {end} larger than a batch")
                        if after >= leader_end:
                            covers, covers_at = after, seen_at
                        sent_at = end
                        # (the follower checks it only where this connection's stream
                        # does not continue: its first APPEND after a probe or repair)
                        status, end, _ = client.append(
                            rpc.encode_append(topic, index, self.epoch, end, nbytes,
                                              0 if streaming else
                                              host.tail_crc(self.partition, end)),
                            memoryview(buf)[:nbytes])
                        streaming = status == rpc.OK
                    finally:
                        _BUFFERS.append(buf)
                    if status == rpc.MISMATCH:  # its log changed, not by us (another
                        # leader's late frame), or its record before sent_at is not
                        # ours: probe it again, and repair it if it diverged
                        raise rpc.RPCError(f"{node} took no records at {sent_at} "
                                           f"(its log ends at {end}): probing it again")
            except (rpc.RPCError, OSError, CoordinationError, ValueError, LogError) as err:
                # (LogError: retention moved this log's start past its end meanwhile:
                # the next probe resets it)
                if str(err) != last_error:  # once per kind of failure, not per retry
                    self.coordinator.logf("info", f"{self._name}: replica {node}: {err}")
                last_error = str(err)
            finally:
                if client is not None:
                    client.close()
            gevent.sleep(RETRY)

    def _load_deleted(self):
        try:
            return self.coordinator.topology.deleted_channels(self.partition.topic.name,
                                                              self.partition.index)
        except CoordinationError as err:
            self.coordinator.logf("warn", f"{self._name}: deleted channels not read: {err}")
            return set()

    def _keep_deleted(self):
        """The tombstones into etcd when they changed (at most MAX_TOMBSTONES)."""
        if self._deleted == self._deleted_kept:
            return
        if len(self._deleted) > MAX_TOMBSTONES:
            self._deleted = set(sorted(self._deleted)[:MAX_TOMBSTONES])
        try:
            # (not written when this leader's session is gone: nothing to try again)
            self.coordinator.topology.set_deleted_channels(
                self.partition.topic.name, self.partition.index, self._deleted,
                self.state.leader_session.create_revision)
            self._deleted_kept = set(self._deleted)
        except CoordinationError as err:  # (tried again at the next send)
            self.coordinator.logf("info", f"{self._name}: deleted channels not kept: {err}")

    def _send_cursors(self, client, sent, node):
        """The cursors that moved since `sent` (this connection's last), with the
        committed end, in one CURSORS frame: the ACK's status, or None when
        neither the cursors nor the committed end moved."""
        topic, index = self.partition.topic.name, self.partition.index
        host = self.coordinator.host
        read_at = time.monotonic()
        committed = self.committed_end(self.partition)
        states = host.cursor_states(self.partition)
        # every offset those cursors name is below this end (read after them)
        leader_end = host.end_offset(self.partition)
        # a channel gone since the last send was deleted here: so on every follower, each
        # connection told once (a channel made again is sent as any other)
        names = set(states)
        self._deleted = (self._deleted | (self._channels - names)) - names
        self._channels = names
        self._keep_deleted()
        moved = [name for name, state in states.items() if sent.get(name) != state]
        deleted = [name for name in self._deleted if sent.get(name) is not _DELETED]
        if not moved and not deleted and committed <= sent.get(_COMMITTED, 0):
            self.cursors_synced[node] = read_at
            return None
        frame = rpc.encode_cursors(topic, index, self.epoch, committed, [
            (name, states[name][0], states[name][1] if states[name][1].strip(b"\0") else b"",
             states[name][2], states[name][3])
            for name in moved] + [(name, rpc.DELETED, b"", b"", 0) for name in deleted])
        status, follower_end = client.cursors(frame)
        # the follower takes a cursor only as far as its log goes: one it could not
        # take whole is sent again (next interval) until its log has caught up
        if status == rpc.OK:
            sent[_COMMITTED] = committed
            for name in deleted:
                sent[name] = _DELETED
            if not moved:  # (only the committed end went: it holds every cursor already)
                self.cursors_synced[node] = read_at
        if status == rpc.OK and follower_end >= leader_end:
            for name in moved:
                sent[name] = states[name]
            self.cursors_synced[node] = read_at
        return status

    # -- moves -----------------------------------------------------------------------------

    def _move(self, move):
        """Carry out an operator's MoveRequest (in its own greenlet), then delete it."""
        topology = self.coordinator.topology
        key = (self.partition.topic.name, self.partition.index)
        try:
            error = self._carry_out(move)
        except (CoordinationError, ValueError) as err:
            error = str(err)
        if error:
            self.coordinator.logf("warn", f"{self._name}: move of {move.from_} to {move.to} "
                                          f"given up: {error}")
        try:
            topology.end_move(*key, move)
        except CoordinationError:
            pass

    def _carry_out(self, move):
        """-> None when done, else why not (Youzan's texts where it has them)."""
        leadership = self.coordinator.leadership
        replicas = self.state.replicas
        if move.from_ == move.to:
            return "move to and from node can not be the same"
        if move.leader and move.from_ != self.me:
            return "move from not the topic leader"
        if not move.leader and move.from_ == self.me:
            return "can not move leader without moveleader param"
        if self.handing_off is not None:  # (its designation must stand)
            return f"hands its leadership to {self.handing_off}"
        if move.to not in replicas.isr:
            if move.to not in replicas.catchup:
                self.set_state(leadership.add_catchup(self.state, move.to))
            deadline = time.monotonic() + MOVE_TIMEOUT
            while move.to not in self.state.replicas.isr:  # (the monitor moves it in)
                if self.fenced is not None:
                    return f"no longer leading: {self.fenced}"
                current = self.state.move
                if current is None or current.create_revision != move.create_revision:
                    # withdrawn: the lookupd answered the operator "timeout" already (a
                    # leader elected during the move started its clock later); `to`
                    # goes on catching up, as after a timeout here, `from_` stays
                    return "withdrawn by the nsqlookupd that asked for it"
                if time.monotonic() > deadline:
                    return "timeout waiting move data"
                gevent.sleep(0.1)
        if move.leader:
            return self.hand_off(move.to, move)
        if self.handing_off is not None:  # (began while `to` caught up: it must stand)
            return f"hands its leadership to {self.handing_off}"
        replicas = self.state.replicas
        if move.from_ in replicas.isr or move.from_ in replicas.catchup:
            # the node that takes the preferred leader's replica is preferred after it
            self.set_state(leadership.update_replicas(
                self.state, [n for n in replicas.isr if n != move.from_],
                [n for n in replicas.catchup if n != move.from_],
                preferred=move.to if replicas.preferred == move.from_ else None))
        return None

    def hand_off(self, to, move=None, timeout=HAND_OFF_TIMEOUT):
        """Give the leadership to `to`, an ISR member: refuse writes, wait (at most
        `timeout`) until it has this log's end and the cursors read after the refusal
        began, make it the designated leader, end the move, resign.  Past the timeout
        it is handed anyway: as an ISR member it holds every acknowledged message,
        and the cursors of the last interval at least.  -> None, or why not (then it
        leads on); raises when etcd did not answer the designation (then it stepped
        down all the same: _step_down)."""
        if self.fenced is not None:
            return f"no longer leading: {self.fenced}"
        if to not in self.state.replicas.isr:
            return f"{to} is not in the ISR"
        self.handing_off = to
        try:
            return self._hand_off(to, move, timeout)
        finally:
            if self.fenced is None:  # not handed (etcd refused the designation): it
                self.handing_off = None  # leads on, and takes writes again

    def _hand_off(self, to, move, timeout):
        host = self.coordinator.host
        leadership = self.coordinator.leadership
        began = time.monotonic()
        while time.monotonic() - began < timeout and self.fenced is None:
            if self.acked.get(to, -1) >= host.end_offset(self.partition) \
                    and self.cursors_synced.get(to, 0.0) > began:
                break
            wake = self._wakes.get(to)
            if wake is not None:
                wake.set()
            gevent.sleep(0.05)
        if self.fenced is not None:
            return f"no longer leading: {self.fenced}"
        replicas = self.state.replicas
        # a move (an operator's, the master's) makes `to` the preferred leader too, or the
        # master would hand the leadership back (migrator.rebalance); a graceful stop's
        # hand-off keeps the preference: back, this node leads again
        # from the moment the designation is sent this session leads no more: once
        # written, the followers take `to` for this write epoch's leader and refuse our
        # frames (fencing this leader), and the role watch must not make it one again
        self.resigning = self.state.leader_session.create_revision
        try:
            self.set_state(leadership.update_replicas(
                self.state, replicas.isr, replicas.catchup, designated=to,
                preferred=to if move is not None else None))
        except EtcdUnavailable:
            # not answered: etcd may have written it; leading on, this node could
            # neither replicate nor be replaced (its session alive)
            self._step_down(f"handed its leadership to {to} (etcd did not answer)")
            raise
        except CoordinationError:
            self.resigning = None  # refused (a compare, etcd's answer): not written, it
            raise                  # leads on (Fenced: whoever deposed it fences it)
        if move is not None:
            try:
                self.coordinator.topology.end_move(self.partition.topic.name,
                                                   self.partition.index, move)
            except CoordinationError:
                pass  # _move ends it after us; else the lookupd withdraws it
        self.coordinator.logf("info", f"{self._name}: hands its leadership to {to} "
                                      f"({time.monotonic() - began:.2f}s)")
        self._step_down(f"handed its leadership to {to}")
        return None

    def _step_down(self, why):
        """Acknowledge nothing more and give up the leader session the hand-off held:
        retried (RESIGN_RETRY) until etcd answers, for until the session is deleted no
        election runs.  Only that session: if this node is elected again meanwhile
        (a new session), the retry's compare fails and it stops."""
        held = self.state
        try:
            self.coordinator.leadership.resign(held)
        except CoordinationError as err:
            self.coordinator.logf("warn", f"{self._name}: resign not answered ({err}); "
                                          f"retrying")
            gevent.spawn(self._resign_until_answered, held)
        self.fence(why)

    def _resign_until_answered(self, held):
        coordinator = self.coordinator
        # (a lease lost takes the session with it; a node that stops revokes its lease)
        while not coordinator.stopped and coordinator.lease_alive():
            gevent.sleep(RESIGN_RETRY)
            try:
                coordinator.leadership.resign(held)
                return
            except CoordinationError:
                continue

    def successor(self):
        """The ISR follower that has acknowledged the most (a graceful stop's pick)."""
        followers = [n for n in self.state.replicas.isr if n != self.me and n in self.acked]
        return max(followers, key=lambda n: self.acked[n], default=None)

    def _diverged(self, end, crc):
        """Whether a follower's log, ending at `end` with a last record of crc32 `crc`,
        is not a prefix of ours: longer, or as long but another record at end - 1 (it
        led before and kept records nobody acknowledged)."""
        host = self.coordinator.host
        ours = host.end_offset(self.partition)
        return end > ours or (end > host.start_offset(self.partition)
                              and crc != host.tail_crc(self.partition, end))

    def _control(self, client, kind, body=b""):
        """A PROBE, TRUNCATE or RESET (an APPEND whose first offset says which, its
        body in place of records: rpc.py): (status, end, crc) as the follower answers."""
        return client.append(rpc.encode_append(self.partition.topic.name, self.partition.index,
                                               self.epoch, kind, len(body)), body)

    def _repair(self, client, node, end):
        """A follower whose log diverged from ours: once out of the ISR, it removes
        what it holds from where the two part (found by _parting, a binary search),
        and is copied from there; RESET when they part at our start."""
        if node in self.state.replicas.isr:
            raise rpc.RPCError(f"{node}'s log diverges at offset {end - 1}: it is cut "
                               f"once out of the ISR")
        keep = self._parting(client, end)
        if keep > self.coordinator.host.start_offset(self.partition):
            self.coordinator.logf("warn", f"{self._name}: {node}'s log diverges at offset "
                                          f"{keep}: it removes what it holds from there, "
                                          f"and copies this one")
            status, end, crc = self._control(client, rpc.TRUNCATE, rpc.AT.pack(keep))
            if status != rpc.MISMATCH or end == keep:
                return status, end, crc
            # (it holds nothing below keep after all: its own retention)
        return self._reset(client, node, end, f"diverges at offset {keep}")

    def _parting(self, client, end):
        """The first msg offset where a follower's log, ending at `end`, differs from
        ours (or our end, or theirs): records match at an offset only if every record
        before matches too (a follower takes an APPEND only where its record before
        the first is the leader's: the frame's prev crc), so a binary search on the
        crc of the record before an offset finds it in log2(length) PROBEs."""
        host = self.coordinator.host
        lo = host.start_offset(self.partition)  # (matches by definition: nothing held)
        hi = min(end, host.end_offset(self.partition))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            status, _, crc = self._control(client, rpc.PROBE, rpc.AT.pack(mid))
            if status == rpc.FENCED:
                raise rpc.RPCError("fenced while looking where the logs part")
            if crc is not None and crc == host.tail_crc(self.partition, mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _reset(self, client, node, end, why):
        """Have a follower whose log diverged from ours, or ends below our start,
        remove it and begin an empty one at our start (it is then copied from ours):
        only once it is out of the ISR, where a member must hold every acknowledged
        message."""
        host = self.coordinator.host
        if node in self.state.replicas.isr:
            raise rpc.RPCError(f"{node}'s log {why}: it is reset once out of the ISR")
        start = host.start_offset(self.partition)
        self.coordinator.logf("warn", f"{self._name}: {node}'s log {why}: it removes it and "
                                      f"copies this one from offset {start}")
        status, end, crc = self._control(
            client, rpc.RESET, rpc.RESET_START.pack(start, host.start_virtual(self.partition)))
        if status == rpc.MISMATCH and (self._diverged(end, crc) or end < start):
            raise rpc.RPCError(f"{node} did not reset its log (it ends at {end})")
        return status, end, crc

    # -- the ISR ---------------------------------------------------------------------------

    def _monitor_loop(self):
        leadership = self.coordinator.leadership
        while self.fenced is None:
            gevent.sleep(MONITOR_INTERVAL)
            try:
                self._check_isr(leadership)
            except Fenced as err:
                if not self._still_leading():
                    self.fence(f"etcd refused an ISR change: {err}")
            except CoordinationError as err:
                self.coordinator.logf("info", f"{self._name}: ISR check failed: {err}")

    def _still_leading(self):
        """After etcd refused an ISR change: whether our leader session is still the
        partition's (the epoch moved under a change of our own -- a move's, in its
        greenlet -- not a newer leader's); then the state read goes on."""
        try:
            state = self.coordinator.topology.partition(self.partition.topic.name,
                                                        self.partition.index)
        except CoordinationError:
            return False
        own = self.state.leader_session
        if state.leader_session is None or own is None \
                or state.leader_session.create_revision != own.create_revision:
            return False
        self.set_state(state)
        return True

    def _check_isr(self, leadership):
        if self.handing_off is not None:  # (its designated-leader change comes next)
            return
        end = self.coordinator.host.end_offset(self.partition)
        now = time.monotonic()
        replicas = self.state.replicas
        for node in replicas.isr:
            if node == self.me:
                continue
            since = self.caught_up.setdefault(node, now)  # (a new leader's grace)
            if self.acked.get(node, 0) >= end or now - since <= self.lag_timeout:
                continue
            self.coordinator.logf("warn", f"{self._name}: {node} is {end - self.acked.get(node, 0)} "
                                          f"behind, not caught up for {now - since:.1f}s: "
                                          f"out of the ISR")
            self.set_state(leadership.shrink_isr(self.state, node))
            return
        for node in replicas.catchup:
            if now - self.caught_up.get(node, -JOIN_FRESH - 1) > JOIN_FRESH:
                continue
            # nor before it holds the channels' cursors: elected after the others'
            # loss, it would deliver again what they had finished (its channels at
            # the log's start), where an ISR member redelivers only what was in
            # flight and what was finished since the last CURSOR_INTERVAL
            if now - self.cursors_synced.get(node, -JOIN_CURSORS_FRESH - 1) > JOIN_CURSORS_FRESH:
                continue
            # from here on PUBs wait for it too; once it has the end as it is now it
            # holds every message acknowledged before (within JOIN_WAIT, else PUBs go on
            # without it and it is tried again)
            self.joining = node
            try:
                if not self._wait_acked(node, self.coordinator.host.end_offset(self.partition),
                                        JOIN_WAIT):
                    continue
                if self.handing_off is not None or self.fenced is not None:
                    return  # (a hand-off began meanwhile: its designated leader stands)
                self.set_state(leadership.expand_isr(self.state, node))
            finally:
                self.joining = None
                # the committed end waited for it too: without it, it may be higher now,
                # and a channel's feeder that read the lower one sleeps until woken
                # (with no append after, for good: the audit's ordered channel stalled)
                self._notify()
            self.coordinator.logf("info", f"{self._name}: {node} caught up: in the ISR")
            return

    def _wait_acked(self, node, end, timeout):
        """Wait until node has acknowledged `end` (False: not within timeout, or fenced)."""
        deadline = time.monotonic() + timeout
        wake = self._wakes.get(node)
        if wake is not None:
            wake.set()
        while self.acked.get(node, -1) < end:
            left = deadline - time.monotonic()
            if left <= 0 or self.fenced is not None:
                return False
            self._progress.wait(left)
        return True
