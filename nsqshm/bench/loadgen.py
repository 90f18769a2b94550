"""The load generator: publisher and consumer processes that keep Python off
the per-message path, so the server is what is measured.

A publisher resends one prebuilt MPUB command (the server assigns IDs), with
up to --window batches outstanding, flat out or paced open-loop to --rate.
A consumer turns each chunk it receives into FIN lines in one C call
(nsqshm._core.wire.scan_deliveries).  Each process reports its CPU time, and
the suites run the same generator against the raw-socket baseline
(baseline.py), so a generator-bound figure shows as such.

Modes, after NSQ's bench tools: publish then consume (bench_writer, then
bench_reader: run_phases), with one channel or several (fan-out: every
channel gets every message), and both at once for a while (pubsub:
run_pubsub, flat out or at a paced rate).
"""

import functools
import os
import select
import socket
import struct
import time
import uuid

from nsqshm import protocol as p
from nsqshm._core.wire import drop_front, mix_commands, recv_append, scan_deliveries, send_lines

from . import baseline
from .common import CTX, stop_all


def connect(address):
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(p.MAGIC_V2)
    return sock


class Conn:
    """A client connection; decode (TLS, snappy, deflate) is set by
    transport.negotiate.  `wire` counts the bytes received on the socket."""

    def __init__(self, sock):
        self.sock = sock
        self.encode = self.decode = None
        self.pending = b""
        self.wire = 0

    def send(self, data):
        self.sock.sendall(self.encode(data) if self.encode else data)

    def recv(self):
        data = self.sock.recv(1 << 20)
        if not data:
            raise EOFError
        self.wire += len(data)
        return self.decode(data) if self.decode else data

    def read_exact(self, n):
        buf = b""
        while len(buf) < n:
            data = self.sock.recv(n - len(buf))
            if not data:
                raise EOFError
            buf += data
        return buf

    def read_frames(self, want):
        """Read until `want` whole frames arrived; what follows stays in pending."""
        buf = bytearray(self.pending)
        while True:
            pos = frames = 0
            while len(buf) - pos >= 8:
                size = struct.unpack_from(">I", buf, pos)[0]
                if len(buf) - pos - 4 < size:
                    break
                if struct.unpack_from(">I", buf, pos + 4)[0] == p.FRAME_TYPE_ERROR:
                    raise RuntimeError(bytes(buf[pos + 8:pos + 4 + size]).decode())
                pos += 4 + size
                frames += 1
            if frames >= want:
                self.pending = bytes(buf[pos:])
                return
            buf += self.recv()


def open_plain(address, **identify):
    conn = Conn(connect(address))
    conn.send(p.identify({"feature_negotiation": False, "user_agent": "nsqshm-bench",
                          **identify}))
    conn.read_frames(1)
    return conn


def opener_with(**identify):
    """An opener for run_phases whose IDENTIFY carries these fields too (say
    output_buffer_timeout: how long nsqd holds a batch smaller than the
    output buffer while the client is ready for more)."""
    return functools.partial(open_plain, **identify)


def read_responses(sock, n, dec):
    """Read until at least n responses came; returns how many did."""
    got = 0
    while got < n:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        dec.feed(data)
        for ftype, payload in dec.frames():
            if ftype == p.FRAME_TYPE_ERROR:
                raise RuntimeError(payload.decode())
            if payload != p.HEARTBEAT:
                got += 1
    return got


class Shared:
    """Counters the parent reads while the processes run."""

    def __init__(self, n):
        self.msgs = CTX.RawArray("Q", n)
        self.cpu = CTX.RawArray("d", n)
        self.wire = CTX.RawArray("Q", n)


def publisher(address, topic, spec, count, ready, go, out, idx, bodies=None):
    """MPUB batches of spec.batch: `count` messages, or for spec.runfor
    seconds; paced so batch n leaves at start + n * batch / rate when
    spec.rate (msg/s, this process's share) is set.  out.msgs counts acked
    messages."""
    sock = connect(address)
    batch = spec.batch
    command = p.mpub(topic, bodies or [b"x" * spec.size] * batch)
    # k commands are a slice of `window` of them made once: a large message's
    # batch is not copied again for each send
    window = memoryview(command * spec.window)
    step = len(command)
    dec = p.FrameDecoder()
    rate = spec.rate
    ready.wait()
    go.wait()
    t0 = os.times()
    start = time.monotonic()
    deadline = start + spec.runfor if not count else None
    batches = count // batch if count else None
    sent = outstanding = 0
    while True:
        now = time.monotonic()
        if (batches is not None and sent >= batches) or (deadline and now >= deadline):
            break
        k = spec.window - outstanding
        if batches is not None:
            k = min(k, batches - sent)
        if rate:
            k = min(k, int((now - start) * rate / batch) + 1 - sent)
        if k > 0:
            sock.sendall(window[:k * step])
            sent += k
            outstanding += k
        if outstanding:
            got = read_responses(sock, 1, dec)
            outstanding -= got
            out.msgs[idx] += got * batch
        else:  # only when paced: sleep until the next batch is due
            time.sleep(max(0.0, start + sent * batch / rate - time.monotonic()))
    if outstanding:
        read_responses(sock, outstanding, dec)
        out.msgs[idx] += outstanding * batch
    t1 = os.times()
    out.cpu[idx] = (t1.user - t0.user) + (t1.system - t0.system)
    sock.close()


class Pattern:
    """How a consumer answers, as the clients people run do.

    fin_per_write: each FIN (REQ, TOUCH) in its own send(), as go-nsq,
    pynsq and gnsq write and flush every command; else every answer to a
    chunk in one send.  req_every / touch_every (0: never): every n-th
    message delivered is REQ'd with no delay (it comes back: a run ends when
    every message is finished), or TOUCHed before its FIN."""

    def __init__(self, fin_per_write=False, req_every=0, touch_every=0, gap_us=0.0):
        self.fin_per_write = fin_per_write
        self.gap_us = gap_us
        self.req_every = req_every
        self.touch_every = touch_every

    @property
    def name(self):
        parts = ["FIN per write" if self.fin_per_write else "FINs per chunk"]
        if self.req_every:
            parts.append(f"REQ 1 in {self.req_every}")
        if self.touch_every:
            parts.append(f"TOUCH 1 in {self.touch_every}")
        if self.fin_per_write and self.gap_us:
            parts.append(f"{self.gap_us:g} us apart")
        return ", ".join(parts)


BATCHED = Pattern()


def consumer(address, topic, channel, rdy, ready, go, stop, out, idx, opener=None,
             pattern=BATCHED):
    """SUB, then RDY rdy once `go` is set, answer every message as `pattern`
    says until `stop`.  out.msgs counts the messages finished."""
    conn = (opener or open_plain)(address)
    conn.send(p.sub(topic, channel))
    conn.read_frames(1)
    ready.wait()
    go.wait()
    t0 = os.times()
    conn.send(p.rdy(rdy))
    buf = bytearray(conn.pending)
    fins, answers = bytearray(), bytearray()
    mixed = pattern.req_every or pattern.touch_every
    per_write = pattern.fin_per_write and conn.encode is None
    fd = conn.sock.fileno()
    counter = 0
    conn.sock.settimeout(0.2)
    plain = conn.decode is None  # read straight onto buf (recv_append: one copy, the kernel's)
    while not stop.is_set():
        try:
            if plain:
                n = recv_append(fd, buf, 1 << 20)
                if n == 0:
                    break
                if n < 0:
                    select.select([fd], [], [], 0.2)
                    continue
                conn.wire += n
            else:
                buf += conn.recv()
        except TimeoutError:
            continue
        except (EOFError, OSError):
            break
        used, messages, _ = scan_deliveries(buf, fins)
        drop_front(buf, used, 4 << 20)
        finished = messages
        if mixed and fins:
            counter, finished, _, _ = mix_commands(fins, answers, pattern.touch_every,
                                                   pattern.req_every, counter)
            fins, answers = answers, fins
            del answers[:]
        if fins:
            if per_write:
                send_lines(fd, fins, int(pattern.gap_us * 1000))
            else:
                conn.send(fins)
            del fins[:]
        out.msgs[idx] += finished
    t1 = os.times()
    out.cpu[idx] = (t1.user - t0.user) + (t1.system - t0.system)
    out.wire[idx] = conn.wire
    conn.sock.close()


def launch(consumers, publishers, ready):
    """Consumers first (SUB creates the channels), then publishers; both
    connected and waiting on their go events when this returns."""
    for x in consumers:
        x.start()
    time.sleep(0.3)
    for x in publishers:
        x.start()
    ready.set()
    time.sleep(0.3)


def wait_for(counter, total, procs, timeout):
    """Until the counters reach total; an error when the processes died or stalled."""
    last, since = -1, time.monotonic()
    while (now := sum(counter)) < total:
        if now != last:
            last, since = now, time.monotonic()
        if not any(x.is_alive() for x in procs):
            now = sum(counter)  # (a process counts its last acks just before it exits)
            if now >= total:
                break
            raise RuntimeError(f"every process exited after {now} of {total} messages")
        if time.monotonic() - since > timeout:
            raise RuntimeError(f"no progress for {timeout} s at {now} of {total} messages")
        time.sleep(0.001)


def publish(target, topic, spec):
    """Publish spec.messages with spec.publishers processes (to fill a topic
    for a reader that is measured apart); returns msg/s."""
    per = spec.messages // spec.publishers // spec.batch * spec.batch
    ready, go, out = CTX.Event(), CTX.Event(), Shared(spec.publishers)
    pubs = [CTX.Process(target=publisher, args=(target.tcp, topic, spec, per, ready, go, out, i))
            for i in range(spec.publishers)]
    try:
        launch([], pubs, ready)
        t0 = time.perf_counter()
        go.set()
        wait_for(out.msgs, per * spec.publishers, pubs, 60)
        return per * spec.publishers / (time.perf_counter() - t0)
    finally:
        stop_all(pubs)


def add_load_arguments(ap, messages):
    """The load's flags, as NSQ's bench_writer/bench_reader name them: the
    spec run_phases takes (--messages defaults to `messages`)."""
    ap.add_argument("--messages", type=int, default=messages)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch-size", "--batch", dest="batch", type=int, default=200)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--rdy", type=int, default=2500)
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--consumers", type=int, default=2)


def run_phases(target, spec, raw=False, opener=None, bodies=None, channels=1, topic=None,
               pattern=BATCHED, keep_topic=False):
    """Publish spec.messages (spec.publishers processes), then consume them
    (spec.consumers processes per channel, RDY spec.rdy, FIN each), as
    bench_writer then bench_reader.  The channels exist before publishing,
    so the publish phase includes the topic-to-channel fan-out; with several
    channels every one gets every message (fan-out).  raw=True runs the same
    processes against the raw-socket baseline instead (one channel).  topic:
    one made beforehand (and channels ch0..., e.g. with policies set, or a log topic:
    bench/logtopic.py), else a new name.  pattern: how consumers answer
    (Pattern; the raw-socket baseline counts FIN lines, so no REQ or TOUCH
    there).  keep_topic: the topic stays (e.g. for a measured run after a
    warm-up one), else it is deleted after the run."""
    per = spec.messages // spec.publishers // spec.batch * spec.batch
    total = per * spec.publishers
    ncons = spec.consumers * channels
    raw_proc = None
    if raw:
        raw_proc, address = baseline.start_throughput(spec.size, spec.rdy, total // ncons)
    else:
        address = target.tcp
    topic = topic or f"bench{uuid.uuid4().hex[:8]}"
    ready, go, pub_go, stop = CTX.Event(), CTX.Event(), CTX.Event(), CTX.Event()
    cout, pout = Shared(ncons), Shared(spec.publishers)
    cons = [CTX.Process(target=consumer, args=(address, topic, f"ch{i % channels}", spec.rdy,
                                               ready, go, stop, cout, i, opener, pattern))
            for i in range(ncons)]
    pubs = [CTX.Process(target=publisher, args=(address, topic, spec, per, ready, pub_go, pout, i,
                                                bodies))
            for i in range(spec.publishers)]
    try:
        launch(cons, pubs, ready)  # subscribed, but no RDY until the read phase
        cpu = None if raw else target.cpu_seconds
        s0 = cpu() if cpu else None
        t0 = time.perf_counter()
        pub_go.set()
        wait_for(pout.msgs, total, pubs, 60)
        t1 = time.perf_counter()
        for x in pubs:
            x.join()
        time.sleep(0.2)  # let the pump move the tail into the channels
        s1 = cpu() if cpu else None
        t1b = time.perf_counter()
        procs = None if raw else target.processes()
        go.set()
        wait_for(cout.msgs, total * channels, cons, 60)
        t2 = time.perf_counter()
        s2 = cpu() if cpu else None
        after = None if raw else target.settled(topic, "ch0")
    finally:
        stop_all(cons, stop)
        stop_all(pubs)
        failed = sum(x.exitcode not in (0, None) for x in cons + pubs)
        if raw_proc is not None:
            raw_proc.kill()
            raw_proc.join()
    if not raw and not keep_topic:
        target.delete_topic(topic)
    out = total * channels
    res = {
        "messages": total, "size": spec.size, "batch": spec.batch, "rdy": spec.rdy,
        "publishers": spec.publishers, "consumers": spec.consumers, "channels": channels,
        "in_msgs_per_s": total / (t1 - t0), "out_msgs_per_s": out / (t2 - t1b),
        "in_MB_per_s": total * spec.size / (t1 - t0) / 1e6,
        "out_MB_per_s": out * spec.size / (t2 - t1b) / 1e6,
        "client_cpu_in_s": sum(pout.cpu), "client_cpu_out_s": sum(cout.cpu),
        "wall_in_s": t1 - t0, "wall_out_s": t2 - t1b,
        "wire_bytes_per_msg": sum(cout.wire) / out,
        "channel_after": after, "server_processes": procs,
        "client_processes_failed": failed,  # the others carried the load; see stderr
    }
    if s0 is not None:
        res["server_cpu_in_s"], res["server_cpu_out_s"] = s1 - s0, s2 - s1
        res["server_cpu_us_per_msg_in"] = (s1 - s0) / total * 1e6
        res["server_cpu_us_per_msg_out"] = (s2 - s1) / out * 1e6
    return res


def run_pubsub(target, spec, channels=1, warmup=0.5):
    """Publish for spec.runfor seconds while spec.consumers consumers on each
    of `channels` channels FIN everything (every channel gets every message).
    Rates are measured between warmup and the end."""
    topic = f"bench{uuid.uuid4().hex[:8]}"
    names = [f"ch{c}" for c in range(channels)]
    ready, go, stop = CTX.Event(), CTX.Event(), CTX.Event()
    ncons = spec.consumers * channels
    cout, pout = Shared(ncons), Shared(spec.publishers)
    cons = [CTX.Process(target=consumer, args=(target.tcp, topic, names[i % channels], spec.rdy,
                                               ready, go, stop, cout, i))
            for i in range(ncons)]
    share = spec.rate / spec.publishers if spec.rate else 0
    pspec = type(spec)(**{**vars(spec), "rate": share})
    pubs = [CTX.Process(target=publisher, args=(target.tcp, topic, pspec, 0, ready, go, pout, i))
            for i in range(spec.publishers)]
    try:
        launch(cons, pubs, ready)
        go.set()
        time.sleep(min(warmup, spec.runfor / 4))
        sample = lambda: (time.perf_counter(), sum(pout.msgs), list(cout.msgs),  # noqa: E731
                          target.cpu_seconds())
        t0, a0, c0, s0 = sample()
        time.sleep(max(0.1, spec.runfor - min(warmup, spec.runfor / 4)))
        t1, a1, c1, s1 = sample()
        for x in pubs:
            x.join(spec.runfor + 30)
    finally:
        stop_all(cons, stop)
        stop_all(pubs)
    target.delete_topic(topic)
    per_channel = [sum(c1[i] - c0[i] for i in range(ncons) if i % channels == c) / (t1 - t0)
                   for c in range(channels)]
    out = sum(per_channel)
    res = {"channels": channels, "size": spec.size, "batch": spec.batch, "rdy": spec.rdy,
           "publishers": spec.publishers, "consumers_per_channel": spec.consumers,
           "rate": spec.rate, "seconds": t1 - t0,
           "in_msgs_per_s": (a1 - a0) / (t1 - t0), "out_msgs_per_s": out,
           "per_channel_msgs_per_s": per_channel,
           "client_cpu_s": sum(pout.cpu) + sum(cout.cpu)}
    if s0 is not None:
        res["server_cpu_us_per_msg_out"] = (s1 - s0) / max(1, out * (t1 - t0)) * 1e6
    return res


def run_consume_window(target, spec, pattern, seconds, warmup=0.3, raw=False):
    """Consume at steady state: spec.messages published first (not measured),
    then spec.consumers consumers (RDY spec.rdy, answering as `pattern`)
    measured from `warmup` s after they start for `seconds`, or until 90 %
    of the backlog is finished, whichever comes first: no start-up, no
    tail.  raw=True: the same consumers against the raw-socket baseline
    (which streams the backlog itself).  Returns finished msg/s, and the
    server's CPU per message when it is known."""
    per = spec.messages // spec.publishers // spec.batch * spec.batch
    total = per * spec.publishers
    raw_proc = None
    if raw:
        raw_proc, address = baseline.start_throughput(spec.size, spec.rdy, total // spec.consumers)
    else:
        address = target.tcp
    topic = f"bench{uuid.uuid4().hex[:8]}"
    ready, go, stop = CTX.Event(), CTX.Event(), CTX.Event()
    cout = Shared(spec.consumers)
    cons = [CTX.Process(target=consumer, args=(address, topic, "ch0", spec.rdy, ready, go, stop,
                                               cout, i, None, pattern))
            for i in range(spec.consumers)]
    cpu = None if raw else target.cpu_seconds
    try:
        launch(cons, [], ready)
        if not raw:
            publish(target, topic, spec)
        go.set()
        time.sleep(warmup)
        t0, m0, s0 = time.perf_counter(), sum(cout.msgs), cpu() if cpu else None
        end = t0 + seconds
        while time.perf_counter() < end and sum(cout.msgs) < 0.9 * total:
            if not any(x.is_alive() for x in cons):
                raise RuntimeError("every consumer exited")
            time.sleep(0.005)
        t1, m1, s1 = time.perf_counter(), sum(cout.msgs), cpu() if cpu else None
    finally:
        stop_all(cons, stop)
        if raw_proc is not None:
            raw_proc.kill()
            raw_proc.join()
    if not raw:
        target.delete_topic(topic)
    res = {"messages": m1 - m0, "seconds": t1 - t0, "out_msgs_per_s": (m1 - m0) / (t1 - t0),
           "out_MB_per_s": (m1 - m0) * spec.size / (t1 - t0) / 1e6,
           "client_cpu_out_s": sum(cout.cpu)}
    if s0 is not None and m1 > m0:
        res["server_cpu_us_per_msg_out"] = (s1 - s0) / (m1 - m0) * 1e6
    return res
