"""Streaming read: micro-batches of a channel, each finished only after
Spark committed it, so delivery is at-least-once.

Shared memory.  The stream reader runs in one Python process beside the
Spark driver.  latestOffset(start) moves up to maxMessagesPerTrigger
messages from each channel ring into the next micro-batch's arenas, one per
shard,

    <prefix>.f.s<reader>.<seq>.<part>

owned by the Spark driver (the JVM whose child the reader's process is; the
reader itself when there is none): Columns.take moves them under the
ring's consumer lock, so they are in an arena before they leave the ring.  The offset is
{"reader": id, "seq": n, "since": ns}: the reader id is drawn once by
initialOffset() and lives on in the checkpoint.  Each arena is one input
partition; an executor reads it into Arrow batches.

Finishing.  Spark calls latestOffset(start) for the batch after `start`
only once the batch ending at `start` is in its commit log (a replayed
batch runs first), so latestOffset unlinks the arenas up to start.seq:
their messages are finished.  commit(end) does the same, but Spark sends it
a batch late, and never for the last batch of a query (availableNow).

Nothing depends on stop(): a stopped or dead reader leaves its arenas
behind, still owned by the driver.  A query restarted from its checkpoint
in the same application takes them up: a replayed batch reads the same
arenas, a batch Spark had committed is finished by the first latestOffset,
so a restart repeats nothing.  When the driver dies the broker puts the
messages back into their channels.  Each batch's messages carry a due time
(msgTimeout after they were taken): nsqshm.nsqd.local.clients.dead_arenas
waits for it, so that an application restarted meanwhile adopts its
predecessor's batches too.  Not for asyncProgressTrackingEnabled, whose
commit log lags the offsets.

TCP.  The reader holds one connection per topic; a micro-batch is what
arrived (at most nsqd's max_rdy_count in flight, which includes the batch
not yet committed), shipped to the executors inside the input partition,
and FINed at commit.  A reader that dies closes its connections and nsqd
redelivers what was not finished.
"""

import os
import socket
import time
import uuid

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from nsqshm import __version__
from nsqshm.spark.connect import create_channel, local_broker, topic_is_ext
from nsqshm.spark.options import starting_ns

ARENA_SIZE = 1 << 32           # sparse: pages only as used
PUMP_WAIT = 2.0                # s an availableNow batch waits for the topic's pump
USER_AGENT = f"nsqshm.spark/{__version__}"


class ArenaPartition(InputPartition):
    def __init__(self, name, topic, channel, since_ns, batch_size, ext=False, headers=False):
        self.name = name
        self.topic = topic
        self.channel = channel
        self.since_ns = since_ns
        self.batch_size = batch_size
        self.ext = ext              # the messages carry Youzan's ext part
        self.headers = headers      # includeHeaders


class FramesPartition(InputPartition):
    def __init__(self, frames, topic, channel, since_ns, ext=False, headers=False):
        self.frames = frames
        self.topic = topic
        self.channel = channel
        self.since_ns = since_ns
        self.ext = ext              # frames sent for extend_support
        self.headers = headers


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options):
        self.o = options
        self._pid = None

    # -- state of the reader's process (not pickled into tasks) ---------------------------

    def __getstate__(self):
        return {"o": self.o, "_pid": None}

    def _setup(self):
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self.owner = driver_pid()
        self.broker = local_broker(self.o)
        self.rings = {}
        self.owned = {}          # seq -> [Arena] this process holds
        self.target = None       # availableNow: messages still to take
        self.client = None       # the reader's counters arena (for /stats)
        self.reader_id = None
        self.takers = {}         # TCP: topic -> Taker
        self.tcp_batches = {}    # TCP: seq -> [(topic, frames, fins)]
        self.finished = 0
        self.msg_timeout = self.o.msg_timeout or (
            self.broker.msg_timeout if self.broker else 60.0)
        for topic in self.o.topics:
            create_channel(self.o, topic, self.broker)
        self.ext = {t: topic_is_ext(self.o, t, self.broker) for t in self.o.topics}

    def _topic_depth(self, topic):
        ring = self.broker.attach(self.broker.topic_ring_name(topic))
        try:
            return ring.depth
        finally:
            ring.close()

    def _wait_for_data(self, timeout):
        """Sleep on the channel rings' wake FIFOs until one has messages, or
        timeout (no CPU while waiting; an armed ring is also what asks a
        channel's owner to refill it from its disk queue)."""
        import select

        rings = [self._ring(t) for t in self.o.topics]
        end = time.monotonic() + timeout
        for ring in rings:
            ring.arm()
        try:
            poller = select.poll()
            for ring in rings:
                poller.register(ring.fileno(), select.POLLIN)
            while not any(r.depth for r in rings):
                remaining = end - time.monotonic()
                if remaining <= 0:
                    return
                poller.poll(remaining * 1000)
                for ring in rings:
                    ring.drain()
                    ring.arm()  # a wake clears the request: ask again
        finally:
            for ring in rings:
                ring.disarm()

    def _ring(self, topic):
        ring = self.rings.get(topic)
        if ring is None:
            ring = self.rings[topic] = self.broker.attach(
                self.broker.channel_ring_name(topic, self.o.channel))
        return ring

    # -- offsets --------------------------------------------------------------------------

    def initialOffset(self):
        return {"reader": uuid.uuid4().hex[:16], "seq": 0, "since": starting_ns(self.o)}

    def getDefaultReadLimit(self):
        if self.o.max_per_trigger:
            return ReadMaxRows(self.o.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self):
        """What the channels hold now, their disk queues included, and what
        their topics hold (on its way to the channels): the query stops
        once it took that many.  Batches a previous run took and Spark never
        logged are added when they are put back (_drop_stale)."""
        from nsqshm.spark.connect import queued

        self._setup()
        http = self.broker.http_address if self.broker is not None else self.o.http_address
        self.target = 0
        for topic in self.o.topics:
            depth = queued(http, topic, self.o.channel) if http else None
            if depth is None:  # no HTTP listener: what the rings hold
                depth = self._ring(topic).depth + self._topic_depth(topic)
            self.target += depth

    def latestOffset(self, start, limit):
        self._setup()
        reader, seq = start["reader"], int(start["seq"])
        self._start(reader)
        # Spark asks for the batch after `seq` only once batch `seq` is in its
        # commit log: finish up to it now rather than at commit(), which comes
        # a batch later, or never for the last batch of a query
        self._finish_upto(reader, seq)
        if self.broker is not None:
            back = self._drop_stale(reader, seq)
            if self.target is not None:
                self.target += back  # they were there before availableNow started
        want = limit.max_rows if isinstance(limit, ReadMaxRows) else float("inf")
        if self.target is not None:
            want = min(want, self.target)
        taken = 0
        if want > 0 and self.broker is not None:
            taken = self._take_shm(reader, seq + 1, want)
            if not taken and (self.target or self._backlog()):
                # messages on their way: from the topic's pump, or from a disk
                # queue into the ring (its owner refills it for waiting consumers)
                self._wait_for_data(PUMP_WAIT if self.target else 0.2)
                taken = self._take_shm(reader, seq + 1, want)
        elif want > 0:
            taken = self._take_tcp(seq + 1, want)
        if self.target is not None:
            self.target -= taken
        if not taken:
            return start
        return {"reader": reader, "seq": seq + 1, "since": int(start.get("since", 0))}

    def _start(self, reader):
        if self.reader_id == reader:
            return
        from nsqshm.local import arenas

        self.reader_id = arenas.check_reader_id(reader)
        if self.broker is not None:
            self._client_arena()

    # -- shared memory --------------------------------------------------------------------

    def _client_arena(self):
        """The reader's counters, for /stats (no messages in it)."""
        from nsqshm._core.arena import Arena
        from nsqshm.local import arenas

        name = arenas.spark_client_name(self.broker.prefix, self.reader_id)
        Arena.unlink_segment(name)  # a previous process's counters
        self.client = Arena.create(name, size=16384, max_queues=1, owner_pid=self.owner,
                                   label=f"spark reader {os.getpid()}")
        self.client.set_client_info(
            client_id=f"spark-{self.reader_id}", hostname=socket.gethostname(),
            user_agent=USER_AGENT, queue=f"{self.o.topics[0]}:{self.o.channel}",
            connect_ts=int(time.time()), message_count=0, finish_count=0, in_flight=0)

    def _batch_arena(self, name, queue, taken_ns):
        """(arena, new): a new batch arena `name`, or (new False) the arena an
        earlier process left under that name with messages _drop_stale could
        not put back, which joins the batch as it is."""
        import posix_ipc

        from nsqshm._core.arena import Arena

        for _attempt in range(3):
            try:
                arena = Arena.create(name, size=ARENA_SIZE, max_queues=1,
                                     owner_pid=self.owner, label="spark")
                break
            except posix_ipc.ExistentialError:
                left = self._attach_left(name)
                if left is None:  # half made, now unlinked: try again
                    continue
                if left.owner_alive() and left.owner_pid != self.owner:
                    left.close()
                    raise RuntimeError(f"batch arena {name} belongs to live process "
                                       f"{left.owner_pid}: two readers on one checkpoint?") from None
                left.set_owner(self.owner)
                return left, False
        else:
            raise RuntimeError(f"batch arena {name} cannot be created")
        arena.set_client_info(client_id=f"spark-{self.reader_id}", hostname=socket.gethostname(),
                              user_agent=USER_AGENT, queue=queue, connect_ts=taken_ns // 10**9)
        return arena, True

    def _drop_stale(self, reader, seq):
        """Arenas of batches after `seq`: taken by an earlier latestOffset whose
        batch Spark never logged.  Their messages go back to the channels;
        returns how many."""
        from nsqshm.local import arenas

        back = 0
        for later, names in arenas.spark_batch_arenas(self.broker.prefix, reader).items():
            if later > seq:
                for arena in self.owned.pop(later, []):
                    arena.close()
                for name in names:
                    back += self._put_back(name)
        return back

    def _attach_left(self, name):
        """An arena an earlier process of this reader left as `name`, or None.
        A segment whose creator died before it wrote the header (a kill inside
        Arena.create) never held a message: it is unlinked so that the name
        can be used again."""
        from nsqshm._core.arena import Arena, ArenaError

        try:
            return Arena.attach(name)
        except ArenaError:
            Arena.unlink_segment(name)
        except Exception:  # noqa: BLE001 - gone meanwhile
            pass
        return None

    def _put_back(self, name):
        from nsqshm.local import arenas

        arena = self._attach_left(name)
        if arena is None:
            return 0
        done = 0
        try:
            if arena.owner_alive() and arena.owner_pid != self.owner:
                return 0  # another application's, alive: not ours to move
            for queue in {arena.queue_name(q) for q in arena.blocks_by_queue()}:
                topic, _, channel = queue.partition(":")
                ring = self.broker.attach(self.broker.channel_ring_name(topic, channel))
                try:
                    n, left = arenas.put_back(arena, ring, queue, timeout=5.0)
                finally:
                    ring.close()
                done += n
                if left:
                    return done  # keep the arena: the broker recovers it later
            arena.unlink()
        finally:
            arena.close()
        return done

    def _backlog(self):
        """Whether a channel's owner has messages on disk (it refills the ring)."""
        return any(getattr(self._ring(t), "disk_backlog", False) for t in self.o.topics)

    def _take_shm(self, reader, seq, want):
        from nsqshm._core.localbatch import Columns
        from nsqshm.local import arenas

        depths = {t: self._ring(t).depth for t in self.o.topics}
        avail = sum(depths.values())
        want = int(min(want, avail))
        if want <= 0:
            return 0
        now = time.time_ns()
        due = now + int(self.msg_timeout * 1e9)
        cols = Columns()
        held = self.owned.setdefault(seq, [])
        part = 0
        total = 0
        for topic in self.o.topics:
            share = min(want - total, -(-want * depths[topic] // avail))
            per = -(-share // self.o.partitions)
            queue = f"{topic}:{self.o.channel}"
            for _ in range(self.o.partitions):
                if share <= 0:
                    break
                name = arenas.spark_batch_name(self.broker.prefix, reader, seq, part)
                part += 1
                arena, new = self._batch_arena(name, queue, now)
                if not new:  # the name holds what an earlier process left
                    held.append(arena)
                    total += arena.live_blocks
                    if self.target is not None:
                        self.target += arena.live_blocks  # were there before; not a take
                    continue
                got = cols.take(self._ring(topic), arena, arena.queue_index(queue),
                                min(per, share), 1 << 62, due, False)
                if not got:
                    arena.unlink()
                    arena.close()
                    break
                held.append(arena)
                share -= got
                total += got
        if not held:
            self.owned.pop(seq, None)
        if total and self.client is not None:
            info = self.client.client_info()
            self.client.set_client_info(message_count=info["message_count"] + total)
        return total

    # -- planning and reading ---------------------------------------------------------------

    def partitions(self, start, end):
        self._setup()
        first, last = int(start["seq"]) + 1, int(end["seq"])
        since = int(end.get("since", 0))
        if self.broker is None:
            headers = self.o.include_headers
            return [FramesPartition(frames, topic, self.o.channel, since,
                                    self.ext[topic] and headers, headers)
                    for seq in range(first, last + 1)
                    for topic, frames, _ in self.tcp_batches.get(seq, [])]
        from nsqshm.local import arenas

        parts = []
        on_disk = None
        for seq in range(first, last + 1):
            names = [a.name for a in self.owned.get(seq, [])]
            if not names:  # a batch of an earlier process: adopt what is left of it
                if on_disk is None:
                    on_disk = arenas.spark_batch_arenas(self.broker.prefix, end["reader"])
                names = sorted(on_disk.get(seq, []), key=lambda n: int(n.rpartition(".")[2]))
                self._adopt(seq, names)
            for name in names:
                topic = self._topic_of(name)
                parts.append(ArenaPartition(name, topic, self.o.channel, since,
                                            self.o.batch_size, self.ext.get(topic, False),
                                            self.o.include_headers))
        return parts

    def _adopt(self, seq, names):
        from nsqshm._core.arena import Arena

        for name in names:
            try:
                arena = Arena.attach(name)
            except Exception:
                continue
            if not arena.owner_alive():  # an earlier application's: ours now
                arena.set_owner(self.owner)
            self.owned.setdefault(seq, []).append(arena)

    def _topic_of(self, name):
        for arenas_ in self.owned.values():
            for arena in arenas_:
                if arena.name == name:
                    return arena.client_info()["queue"].partition(":")[0]
        return self.o.topic

    def read(self, partition):
        if isinstance(partition, FramesPartition):
            return _read_frames(partition)
        return _read_arena(partition)

    # -- commit and stop ----------------------------------------------------------------------

    def commit(self, end):
        self._setup()
        self._finish_upto(end["reader"], int(end["seq"]))

    def _finish_upto(self, reader, upto):
        """Finish the batches up to `upto`: Spark committed them."""
        if self.broker is None:
            for seq in [s for s in self.tcp_batches if s <= upto]:
                for topic, _, fins in self.tcp_batches.pop(seq):
                    self.takers[topic].finish(fins)
            return
        from nsqshm._core.arena import Arena
        from nsqshm.local import arenas

        done = 0
        for seq in [s for s in self.owned if s <= upto]:
            for arena in self.owned.pop(seq):
                done += arena.live_blocks
                arena.unlink()
                arena.close()
        # batches an earlier process left behind and Spark had committed
        for seq, names in arenas.spark_batch_arenas(self.broker.prefix, reader).items():
            if seq <= upto:
                for name in names:
                    Arena.unlink_segment(name)
        self.finished += done
        if self.client is not None and done:
            self.client.set_client_info(finish_count=self.finished)

    def stop(self):
        """Close handles; the arenas stay (see the module docstring)."""
        if self._pid != os.getpid():
            return
        for held in self.owned.values():
            for arena in held:
                arena.close()
        self.owned = {}
        for ring in self.rings.values():
            ring.close()
        self.rings = {}
        for taker in self.takers.values():
            taker.close()
        self.takers = {}
        if self.client is not None:
            self.client.unlink()
            self.client.close()
            self.client = None

    # -- TCP ------------------------------------------------------------------------------------

    def _take_tcp(self, seq, want):
        from nsqshm.spark.tcp import Taker

        total = 0
        for topic in self.o.topics:
            taker = self.takers.get(topic)
            if taker is None:
                taker = self.takers[topic] = Taker(
                    self.o.tcp_address, topic, self.o.channel, self.o.msg_timeout or None,
                    extend_support=self.ext[topic] and self.o.include_headers)
            frames, fins, n = taker.take(int(min(want - total, 1 << 30)), self.o.idle_timeout)
            if n:
                self.tcp_batches.setdefault(seq, []).append((topic, frames, fins))
                total += n
            if total >= want:
                break
        return total


def driver_pid():
    """The Spark driver's pid: the nearest ancestor running java (the reader
    runs as a child of the driver's JVM), else this process."""
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            break
        comm = stat[stat.index(b"(") + 1:stat.rindex(b")")]
        if comm == b"java":
            return pid
        pid = int(stat[stat.rindex(b")") + 2:].split()[1])
    return os.getpid()


def _read_arena(p):
    from nsqshm._core.arena import Arena
    from nsqshm._core.localbatch import Columns
    from nsqshm.local.arrow import with_headers

    try:
        arena = Arena.attach(p.name)
    except Exception:
        return  # put back already (the broker recovered it): redelivered later
    try:
        cols = Columns(ext=p.ext, headers=p.headers)
        cols.since_ns = p.since_ns
        offset = 0
        while True:
            offset = cols.add_arena(arena, offset, p.batch_size)
            if len(cols):
                yield with_headers(cols.export(), p.topic, p.channel, p.headers)
            if not offset:
                break
    finally:
        arena.close()


def _read_frames(p):
    from nsqshm._core.localbatch import Columns
    from nsqshm.local.arrow import with_headers

    cols = Columns(ext=p.ext, headers=p.headers)
    cols.since_ns = p.since_ns
    cols.add_frames(p.frames)
    if len(cols):
        yield with_headers(cols.export(), p.topic, p.channel, p.headers)
