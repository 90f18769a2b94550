"""GET /metrics on nsqd's HTTP port (Prometheus text format), parsed with
prometheus_client's own parser, with values checked after publishing and
consuming, and against /stats."""

import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.nsqd.conftest import wait_for
from tests.nsqd.test_http_api import TCP, request


def scrape_each_worker(server):
    """{worker index: samples} of GET /metrics asked of each worker."""
    from tests.nsqd.conftest import http_call, http_on_each_worker

    out = {}
    for index, conn in http_on_each_worker(server).items():
        status, body = http_call(conn, "GET", "/metrics")
        assert status == 200
        samples = {}
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        out[index] = samples
        conn.close()
    return out


def scrape(server):
    status, headers, body = request(server, "GET", "/metrics")
    assert status == 200
    assert headers["content-type"] == "text/plain; version=1.0.0; charset=utf-8"
    samples = {}
    types = {}
    for family in text_string_to_metric_families(body.decode()):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def channel_values(samples, topic, channel):
    labels = {"topic": topic, "channel": channel}
    return {k: value(samples, f"nsq_channel_{k}", **labels) for k in (
        "depth", "backend_depth", "in_flight", "deferred", "messages_total", "requeued_total",
        "timed_out_total", "clients", "paused")}


def stats_channel(server, topic, channel):
    doc = json.loads(request(server, "GET", f"/stats?format=json&topic={topic}")[2])
    (t,) = doc["topics"]
    (c,) = [c for c in t["channels"] if c["channel_name"] == channel]
    return t, c


def test_empty_broker(nsqd):
    samples, types = scrape(nsqd)
    assert value(samples, "nsq_clients") == 0
    assert value(samples, "nsq_producers") == 0
    assert value(samples, "nsq_health") == 1
    assert value(samples, "nsq_info", version="1.3.0") == 1
    assert not [k for k in samples if k[0].startswith(("nsq_topic", "nsq_channel"))]
    assert types["nsq_topic_messages"] == "counter"
    assert types["nsq_channel_in_flight"] == "gauge"
    assert value(samples, "process_resident_memory_bytes") > 0


def test_values_after_publishing_and_consuming(nsqd):
    nsqd.post("/topic/create?topic=m")
    nsqd.post("/channel/create?topic=m&channel=c")
    nsqd.post("/mpub?topic=m", b"m0\nm1\nm2\nm3")
    nsqd.post("/pub?topic=m&defer=60000", b"later")
    producer = TCP(nsqd)
    producer.pub("m", b"m4")
    assert wait_for(lambda: stats_channel(nsqd, "m", "c")[1]["depth"] == 5)

    samples, _ = scrape(nsqd)
    assert value(samples, "nsq_topic_messages_total", topic="m") == 6
    assert value(samples, "nsq_topic_message_bytes_total", topic="m") == 15
    assert value(samples, "nsq_topic_depth", topic="m") == 0
    assert value(samples, "nsq_topic_paused", topic="m") == 0
    assert channel_values(samples, "m", "c") == {
        "depth": 5, "backend_depth": 0, "in_flight": 0, "deferred": 1, "messages_total": 6,
        "requeued_total": 0, "timed_out_total": 0, "clients": 0, "paused": 0}
    assert (value(samples, "nsq_clients"), value(samples, "nsq_producers")) == (1, 1)

    consumer = TCP(nsqd)
    consumer.identify(msg_timeout=1000)
    consumer.sub("m", "c")
    consumer.send(b"RDY 2")
    first, second = consumer.message(), consumer.message()
    consumer.send(b"RDY 0")
    consumer.send(b"FIN " + first[0])
    consumer.send(b"REQ " + second[0] + b" 0")
    assert wait_for(lambda: stats_channel(nsqd, "m", "c")[1]["requeue_count"] == 1)
    samples, _ = scrape(nsqd)
    assert channel_values(samples, "m", "c") == {
        "depth": 4, "backend_depth": 0, "in_flight": 0, "deferred": 1, "messages_total": 6,
        "requeued_total": 1, "timed_out_total": 0, "clients": 1, "paused": 0}
    assert value(samples, "nsq_clients") == 2

    consumer.send(b"RDY 1")
    consumer.message()  # never finished: times out after 1 s, then comes again
    time.sleep(1.2)
    assert wait_for(lambda: stats_channel(nsqd, "m", "c")[1]["timeout_count"] == 1)
    nsqd.post("/channel/pause?topic=m&channel=c")
    samples, _ = scrape(nsqd)
    got = channel_values(samples, "m", "c")
    assert (got["timed_out_total"], got["in_flight"], got["paused"]) == (1, 1, 1)
    # every number is the /stats number
    topic, channel = stats_channel(nsqd, "m", "c")
    assert got == {
        "depth": channel["depth"], "backend_depth": channel["backend_depth"],
        "in_flight": channel["in_flight_count"], "deferred": channel["deferred_count"],
        "messages_total": channel["message_count"], "requeued_total": channel["requeue_count"],
        "timed_out_total": channel["timeout_count"], "clients": channel["client_count"],
        "paused": 1}
    assert value(samples, "nsq_topic_depth", topic="m") == topic["depth"]

    consumer.close()
    producer.close()
    assert wait_for(lambda: value(scrape(nsqd)[0], "nsq_clients") == 0)
    samples, _ = scrape(nsqd)
    assert channel_values(samples, "m", "c")["clients"] == 0
    # as in nsqd, a gone consumer's message stays in flight until it times out
    assert wait_for(lambda: channel_values(scrape(nsqd)[0], "m", "c")["in_flight"] == 0)
    assert channel_values(scrape(nsqd)[0], "m", "c")["timed_out_total"] == 2
    nsqd.post("/topic/delete?topic=m")
    samples, _ = scrape(nsqd)
    assert value(samples, "nsq_topic_depth", topic="m") is None


def test_metrics_route_follows_nsqd_routing(nsqd):
    status, headers, body = request(nsqd, "POST", "/metrics")
    assert (status, body) == (405, b'{"message":"METHOD_NOT_ALLOWED"}')
    assert headers["allow"] == "GET, OPTIONS"
    status, headers, _ = request(nsqd, "GET", "/metrics/")
    assert (status, headers["location"]) == (301, "/metrics")
    assert request(nsqd, "GET", "/stats")[1]["content-type"] == "text/plain; charset=utf-8"


@pytest.mark.workers(2)
def test_metrics_on_each_worker_describe_the_whole_broker(nsqd_factory):
    """Clients and producers of both workers, and the processes of the broker
    (the supervisor and both workers), whichever worker answers the scrape."""
    from tests.nsqd.workers.test_workers import client_on_worker

    server = nsqd_factory()
    clients = [client_on_worker(server, i, "whole", "ch") for i in (0, 1)]
    clients += [client_on_worker(server, i, "whole") for i in (0, 1)]  # producers (PUB probe)
    for index, samples in scrape_each_worker(server).items():
        assert value(samples, "nsq_clients") == 4, index
        assert value(samples, "nsq_producers") == 2, index
        assert value(samples, "nsq_workers") == 2, index
        assert channel_values(samples, "whole", "ch")["clients"] == 2, index
        rss = {name: value(samples, "nsqshm_process_resident_memory_bytes", process=name)
               for name in ("supervisor", "worker 0", "worker 1")}
        assert all(v > 0 for v in rss.values()), rss
        assert value(samples, "process_resident_memory_bytes") == sum(rss.values())
        assert value(samples, "nsq_memory_heap_objects") > 0
    for c in clients:
        c.close()


@pytest.mark.workers(1, 2)
def test_a_log_topics_partitions_and_cursors(nsqd_factory):
    """A log topic's partitions (start and end offsets) and its channel's
    cursor per partition (confirmed offset, lag), as /stats has them, on
    whichever worker answers."""
    server = nsqd_factory()
    assert request(server, "POST", "/topic/create?topic=mlog&partition_num=2")[0] == 200
    assert request(server, "POST", "/channel/create?topic=mlog&channel=c")[0] == 200
    for part, n in ((0, 7), (1, 3)):
        body = b"\n".join(b"m%d" % i for i in range(n))
        assert request(server, "POST", f"/mpub?topic=mlog&partition={part}", body)[0] == 200

    def ends():  # (an MPUB a worker without the partition took is acknowledged from its
        # inbound ring, before the owner appends it: a position past the log's end is refused)
        entry = next(t for t in json.loads(request(server, "GET", "/stats?format=json")[2])[
            "topics"] if t["topic_name"] == "mlog")
        return [p["end_offset"] for p in entry["partitions"]]
    assert wait_for(lambda: ends() == [7, 3]), ends()
    assert request(server, "POST", "/channel/setoffset?topic=mlog&channel=c&partition=0",
                   b"msgcount:6")[0] == 200
    want = {("nsq_partition_end_offset", "0"): 7, ("nsq_partition_end_offset", "1"): 3,
            ("nsq_partition_start_offset", "0"): 0, ("nsq_partition_start_offset", "1"): 0}
    for index, samples in scrape_each_worker(server).items():
        got = {(name, p): value(samples, name, topic="mlog", partition=p) for name, p in want}
        assert got == want, index
        cursor = {p: (value(samples, "nsq_channel_partition_confirmed_offset", topic="mlog",
                            channel="c", partition=p),
                      value(samples, "nsq_channel_partition_lag", topic="mlog", channel="c",
                            partition=p)) for p in ("0", "1")}
        assert cursor == {"0": (5, 2), "1": (0, 3)}, index
    request(server, "POST", "/topic/create?topic=mclassic")  # a classic topic: none of them
    samples = scrape(server)[0]
    assert value(samples, "nsq_topic_depth", topic="mclassic") == 0
    assert not [k for k in samples if "partition" in k[0] and ("topic", "mclassic") in k[1]]
