"""--node-id goes into every message ID as nsqd's guid does (issue 14), and a
broker restarted on its data path -- with its ID segment kept, or gone --
never issues an ID it issued before."""

import json
import os

import pytest

from nsqshm import protocol as p
from nsqshm._core.codec import LEASE_FILE, NSQD_EPOCH_MS, id_to_int
from tests.nsqd.conftest import wait_for
from tests.nsqd.workers.test_workers import Client

pytestmark = pytest.mark.timeout(120)

COUNT = 2000


def round_trip(server, topic):
    """Publish COUNT messages (both workers take connections) and consume
    them: their IDs."""
    pubs = [Client(server) for _ in range(4)]
    for k, pub in enumerate(pubs):
        pub.send(p.mpub(topic, [b"m%d" % i for i in range(k, COUNT, len(pubs))]))
    for pub in pubs:
        assert pub.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
        pub.close()
    sub = Client(server)
    sub.send(p.sub(topic, "c"))
    assert sub.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    sub.send(p.rdy(1000))
    ids = []
    while len(ids) < COUNT:
        msg = sub.message()
        ids.append(msg.id)
        sub.send(p.fin(msg.id))
    # every FIN read before the stop: one the broker had not read yet puts its
    # message back, and the next round would see that ID again (at least once)
    assert wait_for(lambda: in_flight(server, topic) == 0, timeout=10)
    sub.close()
    return ids


def in_flight(server, topic):
    _, body = server.get(f"/stats?format=json&topic={topic}&include_clients=false")
    stats = json.loads(body)
    return sum(c["in_flight_count"] + c["depth"]
               for t in stats["topics"] for c in t["channels"])


def test_message_ids_carry_the_node_id_and_never_repeat_across_restarts(nsqd_factory,
                                                                         tmp_path):
    server = nsqd_factory("--workers=2", "--node-id=777", data_path=tmp_path)
    issued = round_trip(server, "ids")
    values = [id_to_int(i) for i in issued]
    assert {(v >> 12) & 0x3FF for v in values} == {777}
    ms = max(values) >> 22
    assert abs(ms + NSQD_EPOCH_MS - os.path.getmtime(tmp_path / LEASE_FILE) * 1000) < 120_000
    assert server.stop() == 0
    # restarted with its ID segment kept, then after a reboot took it
    for gone in (False, True):
        if gone:
            os.unlink(f"/dev/shm/{server.prefix}.ids")
        server = nsqd_factory("--workers=2", "--node-id=777", data_path=tmp_path,
                              prefix=server.prefix)
        after = round_trip(server, "ids")
        assert server.stop() == 0
        assert {(id_to_int(i) >> 12) & 0x3FF for i in after} == {777}
        assert not set(after) & set(issued)
        assert min(map(id_to_int, after)) > max(map(id_to_int, issued))
        issued += after
    assert len(set(issued)) == 3 * COUNT


def test_two_brokers_with_different_node_ids_issue_different_ids(nsqd_factory, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = nsqd_factory("--workers=2", "--node-id=1", data_path=tmp_path / "a")
    second = nsqd_factory("--workers=2", "--node-id=2", data_path=tmp_path / "b")
    a, b = round_trip(first, "t"), round_trip(second, "t")
    assert {(id_to_int(i) >> 12) & 0x3FF for i in a} == {1}
    assert {(id_to_int(i) >> 12) & 0x3FF for i in b} == {2}
    assert not set(a) & set(b)
