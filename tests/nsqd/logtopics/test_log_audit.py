"""The loss audit of the workers issue (test_workers.py) on a log topic: 2
partitions, 2 workers, publishers and slow consumers of a plain and an
ordered channel (SUB_ORDERED) while random workers are SIGKILLed, then the
whole group; restarted on the same data and drained.  Every acknowledged
message must be delivered on both channels, and each partition of the
ordered channel in log order (a message again only as a redelivery of the
one in flight, never one before it)."""

import threading
import time

import pytest

from nsqshm import protocol as p
from nsqshm._core.logcursor import decode_message_id
from tests.nsqd.logtopics.test_log_topics import create, detail
from tests.nsqd.workers.test_workers import (
    AUDIT_ARGS,
    Client,
    Load,
    drain,
    kill_workers_then_the_group,
)

ORDERED_TIMEOUT_MS = 3000  # an ordered message held by a dead worker's client comes back soon


class LogLoad(Load):
    """Load (publishers, plain consumers of "ch") plus ordered consumers of
    "ord", whose deliveries are kept in arrival order: ((partition,
    offset), body)."""

    def __init__(self, server, ordered_consumers=2):
        self.ordered = []
        self.ordered_lock = threading.Lock()
        super().__init__(server, pause=0.02)
        extra = [threading.Thread(target=self.consume_ordered, daemon=True)
                 for _ in range(ordered_consumers)]
        self.threads += extra
        for t in extra:
            t.start()

    def consume_ordered(self):
        while not self.stop.is_set():
            try:
                c = subscribe_ordered(self.server, timeout=3)
                while not self.stop.is_set():
                    msg = c.message()
                    with self.ordered_lock:
                        self.ordered.append(where_and_body(msg))
                    time.sleep(0.001)
                    c.send(p.fin(msg.id))
            except (OSError, ConnectionError):
                self.errors += 1
                time.sleep(0.05)


def subscribe_ordered(server, timeout=5):
    c = Client(server, timeout=timeout)
    c.send(p.identify({"msg_timeout": ORDERED_TIMEOUT_MS}))
    assert c.response()[0] == p.FRAME_TYPE_RESPONSE
    c.send(b"SUB_ORDERED audit ord\n")
    if c.response() != (p.FRAME_TYPE_RESPONSE, b"OK"):
        raise ConnectionError("SUB_ORDERED refused")
    c.send(p.rdy(25))
    return c


def where_and_body(msg):
    return decode_message_id(msg.id), detail(msg)[2]


def out_of_order(deliveries):
    """Deliveries that came after a later offset of their partition."""
    highest, bad = {}, []
    for (partition, offset), body in deliveries:
        if offset < highest.get(partition, -1):
            bad.append((partition, offset, highest[partition], body))
        highest[partition] = max(offset, highest.get(partition, -1))
    return bad


@pytest.mark.parametrize("kills", [pytest.param(3, id="3-kills"),
                                   pytest.param(20, id="20-kills", marks=pytest.mark.soak)])
def test_log_topic_loss_audit_sigkill_workers_then_the_whole_broker(
        tmp_path, nsqd_factory, kills):
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory(*AUDIT_ARGS, data_path=data)
    create(server, "audit", 2)
    for channel in ("ch", "ord"):  # before the first publish: a new channel starts at the end
        assert server.post(f"/channel/create?topic=audit&channel={channel}")[0] == 200
    load = LogLoad(server)
    kill_workers_then_the_group(server, kills)
    load.finish()
    assert len(load.acked) > 2000, "the load did not run"
    assert load.ordered, "the ordered consumers got nothing"

    again = nsqd_factory(*AUDIT_ARGS, data_path=data, prefix=server.prefix)
    plain = load.delivered + drain(again, "audit", "ch")
    ordered = load.ordered + drain(again, "audit", "ord", subscribe=subscribe_ordered,
                                   record=where_and_body)
    lost_plain = load.acked - set(plain)
    lost_ordered = load.acked - {body for _, body in ordered}
    unordered = out_of_order(ordered)
    print(f"log topic loss audit, {kills} worker kills then the whole group: "
          f"{len(load.acked)} acknowledged; plain channel: {len(plain)} delivered, "
          f"{len(lost_plain)} lost, {len(plain) - len(set(plain))} duplicates; ordered "
          f"channel: {len(ordered)} delivered ({len(load.ordered)} before the restart), "
          f"{len(lost_ordered)} lost, "
          f"{len(ordered) - len({b for _, b in ordered})} duplicates, "
          f"{len(unordered)} out of order")
    assert not lost_plain, f"plain: {len(lost_plain)} lost, e.g. {sorted(lost_plain)[:5]}"
    assert not lost_ordered, f"ordered: {len(lost_ordered)} lost, e.g. {sorted(lost_ordered)[:5]}"
    assert not unordered, unordered[:10]
