"""Local shared-memory clients (nsqshm.local) as the broker shows them: in
/stats like TCP clients, whichever worker answers."""

import json

from nsqshm.local import Consumer, Producer
from tests.nsqd.conftest import wait_for


def channel(server, topic, name):
    doc = json.loads(server.get("/stats?format=json&include_mem=false")[1])
    t = next(t for t in doc["topics"] if t["topic_name"] == topic)
    return next(c for c in t["channels"] if c["channel_name"] == name)


def test_local_consumer_shows_in_stats_of_every_worker(nsqd_factory):
    server = nsqd_factory("--workers=2")
    with Producer("lc", shm_prefix=server.prefix) as producer, \
            Consumer("lc", "ch", shm_prefix=server.prefix, max_in_flight=100,
                     client_id="spark-exec-1") as consumer:
        producer.publish_many([b"x"] * 50)
        held = 0
        while held < 30:
            held += len(consumer.fetch(30 - held, timeout=2))
        for _ in range(6):  # new connections: both workers answer
            ch = channel(server, "lc", "ch")
            (client,) = [c for c in ch["clients"] if c["client_id"] == "spark-exec-1"]
            assert client["remote_address"].startswith("shm:")
            assert client["in_flight_count"] == 30 and ch["in_flight_count"] == 30
            assert ch["client_count"] == 1
    wait_for(lambda: channel(server, "lc", "ch")["client_count"] == 0)
    assert channel(server, "lc", "ch")["depth"] == 50  # closing put the 30 back


def test_local_consumer_drains_a_disk_backlog(nsqd_factory):
    server = nsqd_factory("--workers=2", "--mem-queue-size=0")
    assert server.post("/topic/create?topic=spilled")[0] == 200
    assert server.post("/channel/create?topic=spilled&channel=ch")[0] == 200
    bodies = [f"s{i}".encode() for i in range(1000)]
    assert server.post("/mpub?topic=spilled", b"\n".join(bodies))[0] == 200
    wait_for(lambda: channel(server, "spilled", "ch")["backend_depth"] == 1000)
    got = []
    with Consumer("spilled", "ch", shm_prefix=server.prefix, max_in_flight=300) as consumer:
        while len(got) < 1000:
            batch = consumer.fetch(300, timeout=5)  # each empty ring nudges the owner
            assert len(batch), f"stalled after {len(got)} of 1000"
            got += [bytes(batch.body(i)) for i in range(len(batch))]
            batch.finish()
    assert sorted(got) == sorted(bodies)


def test_paused_channel_delivers_nothing_to_a_local_consumer(nsqd_factory):
    server = nsqd_factory("--workers=2")
    with Producer("pl", shm_prefix=server.prefix) as producer, \
            Consumer("pl", "ch", shm_prefix=server.prefix) as consumer:
        assert server.post("/channel/pause?topic=pl&channel=ch")[0] == 200
        producer.publish_many([b"p"] * 10)
        wait_for(lambda: channel(server, "pl", "ch")["depth"] == 10)
        assert len(consumer.fetch(10, timeout=0.5)) == 0
        assert server.post("/channel/unpause?topic=pl&channel=ch")[0] == 200
        assert len(consumer.fetch(10, timeout=5)) == 10
