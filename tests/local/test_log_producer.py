"""nsqshm.local's Producer on a log topic (docs/local.md, "Log topics"): each
call's messages go into one partition's inbound ring (named, or the next in
turn), the partition's owner appends them to its log in the order pushed;
what was pushed survives the death of every broker process, and a graceful
restart under a publishing producer (log and classic topics); an ordered
topic takes named partitions only; a broker in cluster mode refuses.  On real
servers of one and two workers."""

import json
import os
import signal
import threading
import time

import psutil
import pytest

from nsqshm._core.commitlog import LogReader, partition_dir
from nsqshm._core.logcursor import decode_message_id
from nsqshm.local import Consumer, LocalError, Producer
from nsqshm.local.broker import Broker

from .conftest import started, wait_for
from .test_log_consumer import create, fetch_all

WORKER_COUNTS = (1, 2)


def topic_stats(server, topic):
    doc = json.loads(server.get(f"/stats?format=json&topic={topic}")[1])
    return next(t for t in doc["topics"] if t["topic_name"] == topic)


def end_offsets(server, topic):
    return [p["end_offset"] for p in topic_stats(server, topic)["partitions"]]


def by_partition(got):
    """{partition: [bodies in log order]} of fetched (body, id, attempts)."""
    out = {}
    for body, msg_id, _ in sorted(got, key=lambda m: decode_message_id(m[1])):
        out.setdefault(decode_message_id(msg_id)[0], []).append(body)
    return out


def test_each_call_goes_to_one_partition_in_turn_or_the_one_named(nsqd_factory):
    server = started(nsqd_factory())
    create(server, "lt", 3)
    with Consumer("lt", "c", shm_prefix=server.prefix) as c, \
            Producer("lt", shm_prefix=server.prefix) as producer:
        for call in range(3):  # no partition: 0, 1, 2 in turn, a call's messages together
            assert producer.publish_many([b"r%d-%03d" % (call, i) for i in range(100)]) == 100
        assert producer.publish_many([b"n%03d" % i for i in range(50)], partition=2) == 50
        producer.publish(b"one", partition=0)
        assert wait_for(lambda: end_offsets(server, "lt") == [101, 100, 150], 10), \
            end_offsets(server, "lt")
        got = by_partition(fetch_all(c, 351))
    assert got == {0: [b"r0-%03d" % i for i in range(100)] + [b"one"],
                   1: [b"r1-%03d" % i for i in range(100)],
                   2: [b"r2-%03d" % i for i in range(100)] + [b"n%03d" % i for i in range(50)]}
    # counted as published, once, whichever worker answers /stats
    entry = topic_stats(server, "lt")
    assert entry["message_count"] == 351
    assert entry["message_bytes"] == 300 * 6 + 50 * 4 + 3


def test_bad_partitions_and_an_ordered_topic(nsqd_factory):
    server = started(nsqd_factory())
    create(server, "lt", 2)
    assert server.post("/topic/create?topic=ord&partition_num=2&orderedmulti=true")[0] == 200
    with Producer(shm_prefix=server.prefix) as producer:
        for bad in (2, -1, True, "0"):
            with pytest.raises(ValueError, match=r"invalid partition .*: topic 'lt' has 2 "
                                                 r"partitions"):
                producer.publish(b"x", topic="lt", partition=bad)
        with pytest.raises(ValueError, match=r"topic 'classic' is a classic topic: it has "
                                             r"no partitions"):
            producer.publish(b"x", topic="classic", partition=0)
        with pytest.raises(LocalError, match=r"topic 'ord' is ordered: a publish to it names "
                                             r"its partition"):
            producer.publish(b"x", topic="ord")
        producer.publish_many([b"o1", b"o2"], topic="ord", partition=1)
        assert wait_for(lambda: end_offsets(server, "ord") == [0, 2], 10)
    assert end_offsets(server, "lt") == [0, 0]  # nothing of the refused calls went in


def test_what_was_pushed_survives_the_death_of_every_broker_process(nsqd_factory, tmp_path):
    """The owners stopped (SIGSTOP) while the producer pushes, then every process
    SIGKILLed: the next start's owners append what the rings held."""
    data = tmp_path / "data"
    data.mkdir()
    server = started(nsqd_factory(data_path=data))
    create(server, "lt", 2)
    producer = Producer("lt", shm_prefix=server.prefix)  # (asks the broker what "lt" is)
    workers = [proc.pid for proc in psutil.Process(server.proc.pid).children()]
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        with producer:
            for partition in (0, 1):
                producer.publish_many([b"%d-%03d" % (partition, i) for i in range(100)],
                                      partition=partition)
        time.sleep(0.2)
        assert end_offsets_on_disk(data, "lt") == [0, 0]  # (nothing appended yet)
    finally:
        for pid in [server.proc.pid, *workers]:
            os.kill(pid, signal.SIGKILL)
        server.proc.wait(10)
    again = started(nsqd_factory(data_path=data, prefix=server.prefix))
    assert wait_for(lambda: end_offsets(again, "lt") == [100, 100], 15), \
        end_offsets(again, "lt")
    with Consumer("lt", "c", shm_prefix=again.prefix) as c:
        got = by_partition(fetch_all(c, 200))
    assert got == {p: [b"%d-%03d" % (p, i) for i in range(100)] for p in (0, 1)}


def end_offsets_on_disk(data, topic):
    """The partitions' log ends as their files say (no broker process needed)."""
    ends = []
    for partition in range(2):
        reader = LogReader(partition_dir(str(data), topic, partition))
        try:
            ends.append(reader.end_offset)
        finally:
            reader.close()
    return ends


def test_a_broker_in_cluster_mode_refuses_a_log_topic(nsqd_factory):
    """Its instance file says whether it runs in cluster mode; standalone, it
    does not (a cluster's own tests start brokers in network namespaces)."""
    server = started(nsqd_factory())
    create(server, "lt", 2)
    with open(f"/dev/shm/{server.prefix}.instance") as f:
        assert json.load(f)["cluster"] is False
    broker = Broker(shm_prefix=server.prefix)
    broker.cluster = True  # as Broker() reads it from a cluster-mode broker's instance file
    with pytest.raises(LocalError, match=r"topic 'lt' is a replicated log topic \(the broker "
                                         r"runs in cluster mode\)"):
        Producer("lt", broker=broker)


@pytest.mark.parametrize("kind", ["classic", "log"])
def test_a_graceful_restart_under_a_publishing_producer_loses_nothing(nsqd_factory, tmp_path,
                                                                      kind):
    """The broker stopped (SIGTERM) and started again while a producer publishes:
    the stop retires the rings before their last drain or flush, a push then is
    refused whole and goes into the next broker's ring: every message a call
    returned for is there after the restart, once."""
    data = tmp_path / "data"
    data.mkdir()
    server = started(nsqd_factory(data_path=data))
    if kind == "log":
        create(server, "t", 2)
    else:
        assert server.post("/topic/create?topic=t")[0] == 200
        assert server.post("/channel/create?topic=t&channel=c")[0] == 200
    producer = Producer("t", shm_prefix=server.prefix, timeout=30)
    done = threading.Event()
    published = []

    def publish():
        i = 0
        while not done.is_set():
            published.append(producer.publish_many([b"%07d" % (i + k) for k in range(50)]))
            i += 50

    thread = threading.Thread(target=publish)
    thread.start()
    try:
        time.sleep(0.5)
        assert server.stop() == 0
        again = started(nsqd_factory(data_path=data, prefix=server.prefix))
        time.sleep(0.5)
    finally:
        done.set()
        thread.join(60)
        producer.close()
    total = sum(published)
    assert total > 0 and not thread.is_alive()
    if kind == "log":
        assert wait_for(lambda: sum(end_offsets(again, "t")) == total, 15), \
            (end_offsets(again, "t"), total)
    else:
        def depth():
            entry = topic_stats(again, "t")
            return next(c["depth"] for c in entry["channels"] if c["channel_name"] == "c")
        assert wait_for(lambda: depth() == total, 15), (depth(), total)
