"""nsqshm.nsqd.local.clients: local clients as /stats shows them, and the
arenas the broker must recover."""

import json
import subprocess
import sys
import time
import uuid

import pyarrow as pa
import pytest

from nsqshm._core.arena import Arena
from nsqshm._core.codec import encode_message, int_to_id
from nsqshm.local import Consumer, Producer
from nsqshm.nsqd.local.clients import dead_arenas, local_client_stats
from nsqshm.nsqd.monitoring import stats

from .conftest import started, wait_for


class _TcpClient:
    """Enough of a TCP client for nsqd's stats.client_stats."""
    client_id = hostname = user_agent = remote_address = "x"
    state = ready_count = in_flight = message_count = finish_count = requeue_count = 0
    connect_time = sample_rate = 0
    deflate = snappy = False


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_local_consumer_in_stats_shape(broker):
    with Producer("t", shm_prefix=broker.prefix) as p, \
            Consumer("t", "c", shm_prefix=broker.prefix, max_in_flight=500,
                     client_id="worker-7") as c:
        p.publish_many([b"m"] * 100)
        got = 0
        while got < 30:
            got += len(c.fetch(30 - got, timeout=2))
        done = c.fetch(20, timeout=2)
        done.finish()
        doc = local_client_stats(broker.prefix)
        (client,) = doc[("t", "c")]
        assert list(client) == list(stats.client_stats(_TcpClient()))  # nsqd's keys, in order
        assert client["client_id"] == "worker-7"
        assert client["remote_address"] == f"shm:{c._pid}"
        assert (client["state"], client["version"]) == (3, "V2")
        assert client["ready_count"] == 500
        assert client["in_flight_count"] == 30
        assert client["message_count"] == 50 and client["finish_count"] == 20
        assert abs(client["connect_ts"] - time.time()) < 60
        assert dead_arenas(broker.prefix) == []
    assert local_client_stats(broker.prefix) == {}


def test_dead_owners_and_the_spark_grace():
    prefix = f"nsqshm-test-{uuid.uuid4().hex[:10]}"  # no broker: none recovers them meanwhile
    dead = dead_pid()
    names = {kind: f"{prefix}.f.{kind}{uuid.uuid4().hex[:12]}.1.0" for kind in ("l", "s")}
    names["held"] = f"{prefix}.f.s{uuid.uuid4().hex[:12]}.2.0"
    arenas = []
    try:
        for kind, name in names.items():
            a = Arena.create(name, size=1 << 20, max_queues=1, owner_pid=dead)
            arenas.append(a)
            q = a.queue_index("t:c")
            a.set_client_info(queue="t:c", client_id=kind)
            from nsqshm._core.inflight import InFlight

            table = InFlight()
            table.use_arena(a, "t:c")
            # a Spark batch in its grace (due in the future) is not recovered yet
            due_mono = time.monotonic_ns() + (int(3600e9) if kind == "held" else -int(1e9))
            table.add(encode_message(int_to_id(1), 1, 1, b"x"), 0, due_mono)
            assert q == 0
            arenas.append(table)
        found = dead_arenas(prefix)
        assert names["l"] in found and names["s"] in found and names["held"] not in found
        assert local_client_stats(prefix) == {}  # dead clients are not listed
    finally:
        for name in names.values():
            Arena.unlink_segment(name)


@pytest.mark.parametrize("workers", [1, 2])
def test_local_publishes_count_in_the_topics_message_count(nsqd_factory, workers):
    # a local producer writes the topic ring directly: its messages count in
    # /stats as a PUB's do, once, whichever worker owns the topic
    broker = started(nsqd_factory(f"--workers={workers}", "--mem-queue-size=100000"))
    assert broker.post("/topic/create?topic=counted")[0] == 200
    with Producer("counted", shm_prefix=broker.prefix) as p:
        p.publish_many([b"0123456789"] * 100)
        p.publish_arrow(pa.array([b"abc", b"de"]))
    for _ in range(3):
        assert broker.post("/pub?topic=counted", b"fives")[0] == 200

    def topic():
        _, body = broker.get("/stats?format=json&topic=counted")
        return json.loads(body)["topics"][0]

    assert wait_for(lambda: topic()["message_count"] == 105, timeout=10), topic()
    assert topic()["message_bytes"] == 100 * 10 + 3 + 2 + 3 * 5


@pytest.mark.parametrize("log", [False, True], ids=["classic", "log"])
@pytest.mark.parametrize("workers", [1, 2])
def test_local_requeues_and_timeouts_count_in_the_channels_counts(nsqd_factory, workers, log):
    # what a local consumer puts back or lets time out counts in the channel's
    # requeue_count and timeout_count in /stats, once, whichever worker owns it
    broker = started(nsqd_factory(f"--workers={workers}", "--mem-queue-size=100000"))
    create = "/topic/create?topic=rq" + ("&partition_num=2" if log else "")
    assert broker.post(create)[0] == 200
    with Consumer("rq", "c", shm_prefix=broker.prefix, msg_timeout=0.3) as c:
        assert broker.post("/mpub?topic=rq", b"\n".join(b"m%d" % i for i in range(10)))[0] == 200
        held = []
        while len(held) < 10:
            held += list(c.fetch(10 - len(held), timeout=2))
        for m in held[:4]:
            m.requeue()
        # the other 6 are held past the 0.3 s timeout: they go back too
        assert wait_for(lambda: c.timeout_count == 6, timeout=10), c.timeout_count

        def channel():
            _, body = broker.get("/stats?format=json&topic=rq")
            return json.loads(body)["topics"][0]["channels"][0]

        assert wait_for(lambda: (channel()["requeue_count"], channel()["timeout_count"])
                        == (4, 6), timeout=10), channel()
