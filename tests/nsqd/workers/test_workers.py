"""`nsqshm start --workers N`: the supervisor, topic-sharded workers, and
messages that survive the death of a worker or of the whole broker."""

import json
import os
import random
import signal
import socket
import threading
import time
import zlib

import psutil
import pytest

from nsqshm import protocol as p
from tests.nsqd.conftest import http_on_each_worker, http_on_worker, wait_for
from tests.nsqd.transport import client_context, https_port, tls_args

pytest_plugins = ["tests.nsqd.transport_fixtures"]  # certs

# -- a small blocking client -----------------------------------------------------------

class Client:
    def __init__(self, server, timeout=5):
        self.sock = socket.create_connection(server.tcp, timeout=timeout)
        self.sock.sendall(p.MAGIC_V2)
        self.dec = p.FrameDecoder()
        self.pending = []

    def send(self, data):
        self.sock.sendall(data)

    def frame(self):
        while not self.pending:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed")
            self.dec.feed(data)
            self.pending.extend(self.dec.frames())
        return self.pending.pop(0)

    def response(self):
        """The next response or error frame, answering heartbeats."""
        while True:
            kind, data = self.frame()
            if kind == p.FRAME_TYPE_RESPONSE and data == b"_heartbeat_":
                self.send(p.nop())
                continue
            if kind != p.FRAME_TYPE_MESSAGE:
                return kind, data

    def message(self):
        while True:
            kind, data = self.frame()
            if kind == p.FRAME_TYPE_MESSAGE:
                return p.decode_message(data)
            if data == b"_heartbeat_":
                self.send(p.nop())

    def close(self):
        self.sock.close()


def stats(server):
    _, body = server.get("/stats?format=json&include_mem=false")
    return json.loads(body)


def worker_of_http(server):
    """Which worker answers a new HTTP connection."""
    _, body = server.get("/debug/nsqshm/worker")
    return json.loads(body)


def workers(server):
    return [c.pid for c in psutil.Process(server.proc.pid).children()]


def all_workers_answer(server, n):
    seen = {}
    for _ in range(200):
        info = worker_of_http(server)
        seen[info["index"]] = info
        if len(seen) == n:
            return seen
    raise AssertionError(f"only workers {sorted(seen)} answered 200 connections")


def client_on_worker(server, index, topic, channel=None, identify=None):
    """A connection that landed on worker `index` (the kernel spreads them);
    identify: an IDENTIFY body sent first."""
    for _ in range(100):
        c = Client(server)
        if identify is not None:
            c.send(p.identify(identify))
            assert c.response()[0] == p.FRAME_TYPE_RESPONSE
        if channel is None:  # a publisher shows in /stats once it has published
            c.send(p.pub("probe", b"probe"))
        else:
            c.send(p.sub(topic, channel))
        assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        port = c.sock.getsockname()[1]
        mine = _stats_entries(server, port)
        if mine and mine[0]["nsqshm_worker"] == index:
            return c
        c.close()
        # gone before the next try: a channel's consumer count (--max-channel-consumers)
        # drops only once its worker has seen the close
        assert wait_for(lambda port=port: not _stats_entries(server, port), 10)
    raise AssertionError(f"no connection landed on worker {index}")


def _stats_entries(server, port):
    """The /stats producer and client entries of the connection from `port`."""
    doc = stats(server)
    entries = list(doc["producers"] or [])
    for t in doc["topics"]:
        for ch in t["channels"]:
            entries += ch["clients"] or []
    return [e for e in entries if e["remote_address"].endswith(f":{port}")]


# -- topology and routing --------------------------------------------------------------

def test_message_published_on_one_worker_is_consumed_on_another(nsqd_factory):
    server = nsqd_factory("--workers=2")
    consumer = client_on_worker(server, 0, "cross", "ch")
    publisher = client_on_worker(server, 1, "cross")
    consumer.send(p.rdy(10))
    bodies = [f"m{i}".encode() for i in range(5)]
    publisher.send(p.mpub("cross", bodies))
    assert publisher.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    got = []
    while len(got) < 5:
        msg = consumer.message()
        got.append(msg.body)
        consumer.send(p.fin(msg.id))
    assert got == bodies
    topic = next(t for t in stats(server)["topics"] if t["topic_name"] == "cross")
    assert topic["message_count"] == 5
    (channel,) = topic["channels"]
    assert channel["client_count"] == 1 and channel["message_count"] == 5


def test_each_topic_has_one_owner_by_a_stable_hash(nsqd_factory):
    server = nsqd_factory("--workers=2")
    names = [f"topic{i}" for i in range(12)]
    for name in names:
        assert server.post(f"/topic/create?topic={name}")[0] == 200
    wait_for(lambda: len(sum((w["owned_topics"] for w in
                              all_workers_answer(server, 2).values()), [])) == 12)
    seen = all_workers_answer(server, 2)
    for index, info in seen.items():
        assert info["owned_topics"] == sorted(n for n in names
                                              if zlib.crc32(n.encode()) % 2 == index)
        assert info["workers"] == 2 and info["arena"].startswith(f"{server.prefix}.f.w{index}.")
    assert set(seen[0]["owned_topics"]).isdisjoint(seen[1]["owned_topics"])


def test_stats_on_any_worker_show_every_workers_clients(nsqd_factory):
    server = nsqd_factory("--workers=2")
    a = client_on_worker(server, 0, "seen", "ch")
    b = client_on_worker(server, 1, "seen", "ch")
    for _ in range(10):  # new connections: both workers answer over ten tries
        (topic,) = stats(server)["topics"]
        (channel,) = topic["channels"]
        assert channel["client_count"] == 2
        assert sorted(c["nsqshm_worker"] for c in channel["clients"]) == [0, 1]
    a.close()
    b.close()


def test_max_channel_consumers_counts_every_workers_consumers(nsqd_factory):
    server = nsqd_factory("--workers=2", "--max-channel-consumers=1")
    first = client_on_worker(server, 0, "cap", "ch")
    for _ in range(10):  # new connections: some land on worker 1
        c = Client(server)
        c.send(p.sub("cap", "ch"))
        assert c.response() == (p.FRAME_TYPE_ERROR,
                                b"E_SUB_FAILED SUB failed consumers for cap:ch exceeds limit of 1")
        c.close()
    first.close()


def test_fin_of_a_message_in_flight_on_another_worker(nsqd_factory):
    """nsqd's answer whichever worker holds the message: not this client's."""
    server = nsqd_factory("--workers=2")
    holder = client_on_worker(server, 0, "own", "ch")
    other = client_on_worker(server, 1, "own", "ch")
    http_on_worker(server, 0).request("POST", "/pub?topic=own", body=b"x")
    holder.send(p.rdy(1))
    msg = holder.message()
    for cmd in (p.fin(msg.id), p.req(msg.id, 0), p.touch(msg.id)):
        other.send(cmd)
        kind, data = other.response()
        assert kind == p.FRAME_TYPE_ERROR and data.endswith(b"failed client does not own message")
    other.send(p.fin(b"0" * 16))
    assert other.response()[1].endswith(b"failed ID not in flight")
    holder.send(p.fin(msg.id) + p.nop() + p.pub("own", b"y"))
    assert holder.response() == (p.FRAME_TYPE_RESPONSE, b"OK")


def post(conn, path):
    conn.request("POST", path, body=b"")
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_pause_made_on_one_worker_holds_on_the_other(nsqd_factory):
    server = nsqd_factory("--workers=2")
    consumer = client_on_worker(server, 1, "pz", "ch")
    http0 = http_on_worker(server, 0)
    assert post(http0, "/channel/pause?topic=pz&channel=ch")[0] == 200
    time.sleep(0.3)  # the change reaches worker 1
    consumer.send(p.rdy(10))
    http0.request("POST", "/pub?topic=pz", body=b"held")
    assert http0.getresponse().read() == b"OK"
    consumer.sock.settimeout(1.0)
    with pytest.raises(TimeoutError):
        consumer.message()
    assert post(http0, "/channel/unpause?topic=pz&channel=ch")[0] == 200
    consumer.sock.settimeout(5)
    assert consumer.message().body == b"held"
    (topic,) = stats(server)["topics"]
    assert topic["channels"][0]["paused"] is False


# -- worker death and recovery ------------------------------------------------------------

def test_in_flight_messages_of_a_killed_worker_are_delivered_again(nsqd_factory):
    server = nsqd_factory("--workers=2")
    holder = client_on_worker(server, 0, "held", "ch")
    http1 = http_on_worker(server, 1)
    for i in range(20):
        http1.request("POST", "/pub?topic=held", body=f"h{i}".encode())
        assert http1.getresponse().read() == b"OK"
    holder.send(p.rdy(100))
    first = [holder.message() for _ in range(20)]
    assert all(m.attempts == 1 for m in first)
    pid = worker_of_pid(server, 0)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: len(workers(server)) == 2 and pid not in workers(server), timeout=15)
    wait_for(lambda: any("RECOVERY: 20 messages" in line for line in server.lines), timeout=15)
    again = Client(server)
    again.send(p.sub("held", "ch"))
    assert again.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    again.send(p.rdy(100))
    second = [again.message() for _ in range(20)]
    assert sorted(m.body for m in second) == sorted(m.body for m in first)
    assert all(m.attempts == 2 for m in second)


def worker_of_pid(server, index):
    for _ in range(200):
        info = worker_of_http(server)
        if info["index"] == index:
            return info["pid"]
    raise AssertionError(f"worker {index} never answered")


def answering(server, index):
    """A kept-alive HTTP connection to worker `index`, or None while it starts."""
    try:
        return http_on_worker(server, index, tries=20)
    except AssertionError:
        return None


@pytest.mark.parametrize("killed", [0, 1])
def test_a_replaced_worker_keeps_the_options_put_at_run_time(nsqd_factory, lookupd, killed):
    """A worker started after PUT /config takes the options from a running
    peer (with the topology), not the flags the broker started with; worker
    0 then registers with the lookupd it was told about."""
    server = nsqd_factory("--workers=2", "--broadcast-address=127.0.0.1")
    assert post(http_on_worker(server, 0), "/topic/create?topic=kept")[0] == 200
    body = json.dumps([lookupd.tcp_address]).encode()
    conn = http_on_worker(server, 1 - killed)
    conn.request("PUT", "/config/nsqlookupd_tcp_addresses", body=body)
    assert conn.getresponse().read() == body
    conn.request("PUT", "/config/log_level", body=b"warn")
    assert conn.getresponse().read() == b"3"
    pid = worker_of_pid(server, killed)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: len(workers(server)) == 2 and pid not in workers(server), timeout=15)
    fresh = wait_for(lambda: answering(server, killed), timeout=15)
    assert fresh, "".join(server.lines[-20:])
    for opt, want in (("nsqlookupd_tcp_addresses", body), ("log_level", b"3")):
        fresh.request("GET", f"/config/{opt}")
        assert fresh.getresponse().read() == want
    assert wait_for(lambda: lookupd.producers("kept") == [("127.0.0.1", server.tcp_port)])


def test_a_hung_worker_is_killed_and_replaced(nsqd_factory):
    server = nsqd_factory("--workers=2", env={"NSQSHM_WORKER_TIMEOUT": "1.5"})
    victim = workers(server)[0]
    os.kill(victim, signal.SIGSTOP)  # alive, but its loop never runs
    wait_for(lambda: victim not in workers(server) and len(workers(server)) == 2, timeout=15)
    assert any("silent for" in line for line in server.lines)
    assert server.get("/ping")[1] == b"OK"


def test_a_worker_that_keeps_dying_stops_the_broker(nsqd_factory):
    server = nsqd_factory("--workers=2", env={"NSQSHM_FAULT_WORKER_CRASH": "0.2"})
    assert server.proc.wait(60) == 4  # EXIT_CRASH_LOOP, not a restart loop forever
    text = "".join(server.lines)
    assert "workers in a row died within" in text
    assert text.count("starting a new one") == 4  # the fifth death stops the broker


def test_a_worker_that_cannot_start_stops_the_broker(tmp_path, nsqd_factory):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(RuntimeError, match="did not come up"):
        nsqd_factory("--workers=2", data_path=blocker)


def test_supervisor_and_workers_have_process_titles(nsqd_factory):
    server = nsqd_factory("--workers=2")
    titles = [" ".join(psutil.Process(pid).cmdline()) for pid in workers(server)]
    assert sorted(t.split(" (")[0] for t in titles) == ["nsqshm: worker 0", "nsqshm: worker 1"]
    assert " ".join(psutil.Process(server.proc.pid).cmdline()).startswith(
        "nsqshm: supervisor of 2 workers")


def test_sighup_rereads_the_config_in_every_worker(tmp_path, nsqd_factory):
    config = tmp_path / "nsqd.toml"
    config.write_text('log_level = "info"\n')
    server = nsqd_factory("--workers=2", f"--config={config}")
    config.write_text('log_level = "warn"\n')
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: sum("reload: configuration re-read" in line
                         for line in server.lines) == 2, timeout=10)
    for index, conn in http_on_each_worker(server).items():
        conn.request("GET", "/config/log_level")
        assert conn.getresponse().read() == b"3", index  # warn, on every worker
        conn.close()
    server.lines.clear()
    for _ in range(5):
        server.get("/ping")
    time.sleep(0.3)
    assert not any("INFO" in line for line in server.lines)  # now at warn


def test_idle_broker_with_1000_topic_channel_pairs_uses_no_cpu(nsqd_factory):
    server = nsqd_factory("--workers=2")
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)  # kept alive
    for i in range(1000):
        assert post(conn, f"/topic/create?topic=idle{i}")[0] == 200
        assert post(conn, f"/channel/create?topic=idle{i}&channel=c")[0] == 200
    wait_for(lambda: len(stats(server)["topics"]) == 1000, timeout=30)
    procs = [psutil.Process(server.proc.pid)] + [psutil.Process(p) for p in workers(server)]

    def cpu():
        return sum(p.cpu_times().user + p.cpu_times().system for p in procs)

    # the other worker may still be creating what it was told about (rings, disk
    # queues, nsqd.dat): wait until a whole second passes quietly, then measure
    for _ in range(60):
        before = cpu()
        time.sleep(1.0)
        if cpu() - before < 0.02:
            break

    before = cpu()
    time.sleep(3)
    used = cpu() - before
    print(f"idle: 1000 topic/channel pairs, 2 workers: {used * 1000:.1f} ms of CPU in 3 s")
    # ~0 %: what heartbeats cost (a few ms), against 6 s of two cores
    assert used < 0.03, f"{used:.3f} s of CPU in 3 s idle"


# -- the loss audit -----------------------------------------------------------------------

class Load:
    """Publishers and slow consumers in threads, reconnecting after errors;
    `acked` holds every body whose MPUB was answered OK."""

    def __init__(self, server, topic="audit", channel="ch", publishers=2, consumers=2,
                 pause=0.002):
        self.server = server
        self.pause = pause  # between a publisher's MPUBs
        self.topic, self.channel = topic, channel
        self.acked, self.delivered = set(), []
        self.stop = threading.Event()
        self.errors = 0
        self.threads = [threading.Thread(target=self.publish, args=(i,), daemon=True)
                        for i in range(publishers)]
        self.threads += [threading.Thread(target=self.consume, daemon=True)
                         for _ in range(consumers)]
        for t in self.threads:
            t.start()

    def publish(self, n):
        seq = 0
        while not self.stop.is_set():
            try:
                c = Client(self.server, timeout=3)
                while not self.stop.is_set():
                    bodies = [f"p{n}-{seq + i}".encode() for i in range(20)]
                    c.send(p.mpub(self.topic, bodies))
                    seq += 20
                    if c.response() == (p.FRAME_TYPE_RESPONSE, b"OK"):
                        self.acked.update(bodies)
                    time.sleep(self.pause)
            except (OSError, ConnectionError):
                self.errors += 1
                time.sleep(0.05)

    def consume(self):
        while not self.stop.is_set():
            try:
                c = Client(self.server, timeout=3)
                c.send(p.sub(self.topic, self.channel))
                c.response()
                c.send(p.rdy(25))
                while not self.stop.is_set():
                    msg = c.message()
                    self.delivered.append(msg.body)
                    time.sleep(0.001)  # slow: a backlog builds up
                    c.send(p.fin(msg.id))
            except (OSError, ConnectionError):
                self.errors += 1
                time.sleep(0.05)

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(5)


def channel_left(server, topic, channel):
    """Messages the broker still holds for the channel (all workers)."""
    for t in stats(server)["topics"]:
        if t["topic_name"] == topic:
            c = next(c for c in t["channels"] if c["channel_name"] == channel)
            return t["depth"] + c["depth"] + c["in_flight_count"] + c["deferred_count"]
    return 0


def drain(server, topic, channel, timeout=60, subscribe=None, record=None):
    """Every message left in the channel: consumed until the broker holds
    none.  subscribe(server): a subscribed client (default a SUB with RDY
    1000); record(message): what is kept of each (default its body)."""
    got = []
    if subscribe is None:
        c = Client(server)
        c.send(p.sub(topic, channel))
        c.response()
        c.send(p.rdy(1000))
    else:
        c = subscribe(server)
    c.sock.settimeout(0.5)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = c.message()
        except TimeoutError:
            if channel_left(server, topic, channel) == 0:
                return got
            continue
        got.append(msg.body if record is None else record(msg))
        c.send(p.fin(msg.id))
    raise AssertionError(f"{channel}: messages still held after {timeout}s: "
                         f"{channel_left(server, topic, channel)} ({len(got)} drained)")


def kill_group(server):
    pids = [server.proc.pid, *workers(server)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    server.proc.wait(10)


AUDIT_ARGS = ("--workers=2", "--mem-queue-size=5000")


def kill_workers_then_the_group(server, kills):
    """SIGKILL `kills` workers at random, 1.5 s apart, each replaced before
    the next; then the supervisor and every worker at once."""
    rng = random.Random(kills)
    born = {pid: 0.0 for pid in workers(server)}

    def grown_up():  # workers that ran 6 s: killing fresh ones in a row is a crash loop
        now = time.monotonic()
        return [pid for pid in workers(server) if now - born.setdefault(pid, now) > 6]

    for _ in range(kills):
        time.sleep(1.5)
        victim = rng.choice(wait_for(grown_up, timeout=20))
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda v=victim: v not in workers(server) and len(workers(server)) == 2,
                 timeout=15)
    time.sleep(1.5)
    kill_group(server)


def audit(label, load, server, nsqd_factory, data):
    """Restart on the same data, drain, and check every acknowledged message
    was delivered at least once; prints the figures."""
    assert len(load.acked) > 2000, "the load did not run"
    again = nsqd_factory(*AUDIT_ARGS, data_path=data, prefix=server.prefix)
    rest = drain(again, "audit", "ch")
    delivered = load.delivered + rest
    lost = load.acked - set(delivered)
    print(f"{label}: {len(load.acked)} acknowledged, {len(delivered)} delivered "
          f"({len(rest)} after restart), {len(lost)} lost, "
          f"{len(delivered) - len(set(delivered))} duplicates")
    if lost:
        for line in server.lines + again.lines:
            if any(w in line for w in ("ERROR", "RECOVERY", "DISKQUEUE", "WARN", "worker")):
                print(line.rstrip())
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"


@pytest.mark.parametrize("kills", [pytest.param(3, id="3-kills"),
                                   pytest.param(20, id="20-kills", marks=pytest.mark.soak)])
def test_loss_audit_sigkill_workers_then_the_whole_broker(tmp_path, nsqd_factory, kills):
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory(*AUDIT_ARGS, data_path=data)
    load = Load(server)
    kill_workers_then_the_group(server, kills)
    load.finish()
    audit(f"loss audit, {kills} worker kills then the whole group", load, server, nsqd_factory,
          data)


def test_graceful_restart_under_load_loses_nothing(tmp_path, nsqd_factory):
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory(*AUDIT_ARGS, data_path=data)
    load = Load(server)
    time.sleep(3)
    assert server.stop() == 0  # SIGTERM: clients closed, in-flight back, rings to disk
    load.finish()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(server.prefix + ".c.")]
    audit("graceful restart under load", load, server, nsqd_factory, data)


def test_disk_backlog_reaches_a_consumer_on_a_worker_without_the_disk_queue(nsqd_factory):
    server = nsqd_factory("--workers=2", "--mem-queue-size=0")
    owner = zlib.crc32(b"spill") % 2
    consumer = client_on_worker(server, 1 - owner, "spill", "ch")  # not the owner's
    http = http_on_worker(server, owner)
    bodies = [f"d{i}".encode() for i in range(300)]
    http.request("POST", "/mpub?topic=spill", body=b"\n".join(bodies))
    assert http.getresponse().read() == b"OK"
    (channel,) = next(t for t in stats(server)["topics"] if t["topic_name"] == "spill")["channels"]
    assert channel["backend_depth"] == 300  # every message went through disk
    consumer.send(p.rdy(50))
    got = []
    while len(got) < 300:
        msg = consumer.message()
        got.append(msg.body)
        consumer.send(p.fin(msg.id))
    assert got == bodies  # in order, refilled by the owner when asked


def test_https_is_served_by_every_worker(nsqd_factory, certs):
    import http.client

    server = nsqd_factory("--workers=2", *tls_args(certs))
    port = https_port(server)
    seen = set()
    for _ in range(100):
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=client_context(certs),
                                           timeout=10)
        conn.request("GET", "/debug/nsqshm/worker")
        seen.add(json.loads(conn.getresponse().read())["index"])
        conn.close()
        if seen == {0, 1}:
            break
    assert seen == {0, 1}


def test_e2e_percentiles_merge_every_workers_finishes(nsqd_factory):
    # a consumer on each worker: one finishes at once, the other holds each
    # message ~50 ms; the broker's percentiles come from both workers' windows
    server = nsqd_factory("--workers=2", "--e2e-processing-latency-percentile=0.25,0.99")
    fast = client_on_worker(server, 0, "lat", "ch")
    slow = client_on_worker(server, 1, "lat", "ch")
    publisher = client_on_worker(server, 0, "lat")
    fast.send(p.rdy(1))
    slow.send(p.rdy(1))
    publisher.send(p.mpub("lat", [b"x"] * 40))
    assert publisher.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    done = {"fast": 0, "slow": 0}

    def consume(conn, name, hold):
        conn.sock.settimeout(0.5)
        while sum(done.values()) < 40:
            try:
                msg = conn.message()
            except TimeoutError:
                continue
            time.sleep(hold)
            conn.send(p.fin(msg.id))
            done[name] += 1

    threads = [threading.Thread(target=consume, args=(fast, "fast", 0.0)),
               threading.Thread(target=consume, args=(slow, "slow", 0.05))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(done.values()) == 40 and done["fast"] and done["slow"], done

    def channel():
        topic = next(t for t in stats(server)["topics"] if t["topic_name"] == "lat")
        return topic["channels"][0]["e2e_processing_latency"]

    # every worker's finishes (it was the one worker's with the most)
    assert wait_for(lambda: channel()["count"] == 40, timeout=10), channel()
    e2e = channel()
    assert list(e2e) == ["count", "percentiles"]  # the merge's sketches stay inside
    values = {q["quantile"]: q["value"] for q in e2e["percentiles"]}
    p25, p99 = values[0.25], values[0.99]
    assert p99 >= 40e6  # the slow worker's holds are in it
    assert p25 < 40e6 or done["fast"] < 10  # and the fast one's finishes


def test_only_handles_that_wait_take_a_rings_waiter_slot(nsqd_factory):
    # a ring has 64 waiter slots for every process's handles: a worker takes one
    # only where it waits (the topic's owner pumps; a dispatcher with a ready client)
    from nsqshm.ring import Ring

    server = nsqd_factory("--workers=2")
    c = client_on_worker(server, 0, "slots", "ch")
    c.send(p.rdy(1))
    assert wait_for(lambda: all_workers_answer(server, 2))
    topic = Ring.attach(f"{server.prefix}.t.slots")
    channel = Ring.attach(f"{server.prefix}.c.slots:ch")
    try:
        assert wait_for(lambda: channel.stats()["waiters"] == 1), channel.stats()  # worker 0's
        assert topic.stats()["waiters"] == 1, topic.stats()  # the owner's pump alone
    finally:
        topic.close()
        channel.close()
