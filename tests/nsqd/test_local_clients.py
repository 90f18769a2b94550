"""Local shared-memory clients (nsqshm.local) as the broker shows them: in
/stats like TCP clients, whichever worker answers."""

import json

from nsqshm.local import Consumer, Producer

from .conftest import wait_for


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
