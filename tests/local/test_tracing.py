"""Tracing for local consumers (nsqshm/local/tracing.py): a local Consumer
of a traced channel records DELIVERED, FIN, REQ, TOUCH and TIMEOUT in a log
of its process, which the broker's GET /message/trace reads with the
workers'; an untraced one writes nothing; on one and two workers."""

import os
import time

from nsqshm.local import Consumer
from nsqshm.nsqd.tracing.tracefiles import TRACE_DIR
from tests.nsqd.test_ext import history

from .conftest import started, wait_for

WORKER_COUNTS = (1, 2)


def fetch(c, n, timeout=10.0):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        batch = c.fetch(n - len(got), timeout=0.5)
        got += [(bytes(m.body), m.id, batch) for m in batch]
    return got


def events(server, msg_id, last, n):
    """The message's event names once its history has n events ending in `last`."""
    names = []
    for _ in range(200):
        found = history(server, f"topic=t&id={msg_id.decode()}")
        names = [e["event"] for e in found]
        if len(names) == n and names[-1] == last:
            return found
        time.sleep(0.05)
    raise AssertionError(names)


def broker_tracing(nsqd_factory, tmp_path, topic):
    """A broker on a data path of the test's, with tracing on for `topic`."""
    data = tmp_path / "data"
    data.mkdir()
    server = started(nsqd_factory(data_path=data))
    assert server.post(f"/topic/create?topic={topic}")[0] == 200
    assert server.post(f"/message/trace/enable?topic={topic}")[0] == 200  # (PUB too)
    return server, data


def test_a_local_consumer_of_a_traced_channel_records_its_events(nsqd_factory, tmp_path):
    server, data = broker_tracing(nsqd_factory, tmp_path, "t")
    assert server.post("/channel/create?topic=t&channel=c")[0] == 200
    me = f"shm:{os.getpid()}"
    with Consumer("t", "c", shm_prefix=server.prefix, msg_timeout=0.5) as c:
        assert server.post("/mpub?topic=t", b"m0\nm1\nm2")[0] == 200
        got = {body: (msg_id, batch) for body, msg_id, batch in fetch(c, 3)}
        ids = {body: msg_id for body, (msg_id, _) in got.items()}
        c.finish(ids[b"m0"])
        c.requeue(ids[b"m1"], delay=0.1)
        # m2 times out (0.5 s); m1 comes back after 0.1 s
        again = fetch(c, 2)
        assert sorted(body for body, _, _ in again) == [b"m1", b"m2"]
        c.touch(ids[b"m1"])
        for batch in {id(b): b for _, _, b in again}.values():
            batch.finish()

        m0 = events(server, ids[b"m0"], "FIN", 3)
        assert [e["event"] for e in m0] == ["PUB", "DELIVERED", "FIN"]
        assert m0[1]["client"] == me and m0[1]["worker"] == me and m0[1]["attempt"] == 1
        m1 = events(server, ids[b"m1"], "FIN", 6)
        assert [e["event"] for e in m1] == ["PUB", "DELIVERED", "REQ", "DELIVERED", "TOUCH",
                                            "FIN"]
        assert m1[2]["delay_ms"] == 100 and m1[3]["attempt"] == 2
        m2 = events(server, ids[b"m2"], "FIN", 5)
        assert [e["event"] for e in m2] == ["PUB", "DELIVERED", "TIMEOUT", "DELIVERED", "FIN"]
        assert all(e["client"] == me for e in m2[1:])
    assert os.path.exists(data / TRACE_DIR / f"l{os.getpid()}.events")


def test_an_untraced_local_consumer_writes_nothing_until_switched_on(nsqd_factory, tmp_path):
    server, data = broker_tracing(nsqd_factory, tmp_path, "other")
    with Consumer("t", "c", shm_prefix=server.prefix) as c:
        assert server.post("/mpub?topic=t", b"a\nb")[0] == 200
        for _, _, batch in fetch(c, 2):
            batch.finish()
        assert not [n for n in os.listdir(data / TRACE_DIR) if n.startswith("l")]
        # switched on while it runs: seen within tracing.SWITCH_CHECK
        assert server.post("/message/trace/enable?topic=t")[0] == 200
        time.sleep(0.6)
        assert server.post("/pub?topic=t", b"traced")[0] == 200
        (body, msg_id, batch), = fetch(c, 1)
        batch.finish()
        assert wait_for(lambda: [e["event"] for e in history(
            server, f"topic=t&id={msg_id.decode()}")] == ["PUB", "DELIVERED", "FIN"], 5)
    names = os.listdir(data / TRACE_DIR)
    assert f"l{os.getpid()}.events" in names
    assert not any(n.startswith("l") and n != f"l{os.getpid()}.events"
                   and n != f"l{os.getpid()}.streams" for n in names)
