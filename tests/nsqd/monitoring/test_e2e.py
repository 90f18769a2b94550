"""e2e processing latency percentiles (publish to FIN) in /stats."""

import json
import time

from nsqshm import protocol as p
from tests.nsqd.tcp.test_protocol_v2 import Conn, publish


def e2e(server, topic):
    _, body = server.get(f"/stats?format=json&topic={topic}")
    t = json.loads(body)["topics"][0]
    return t["e2e_processing_latency"], t["channels"][0]["e2e_processing_latency"]


def test_latency_percentiles_after_fin(nsqd_factory):
    server = nsqd_factory("--e2e-processing-latency-percentile=0.5,0.99",
                          "--e2e-processing-latency-window-time=60s")
    c = Conn(server).subscribe("t", "c", rdy=100)
    publish(server, "t", *[f"m{i}".encode() for i in range(40)])
    time.sleep(0.5)  # every message waits at least this long before its FIN
    msgs = c.messages(40)
    c.send(b"".join(p.fin(m.id) for m in msgs))  # a window of FINs: the C batch path
    c.send(p.nop() + p.pub("other", b"x"))
    assert c.frame() == (0, b"OK")
    topic, channel = e2e(server, "t")
    assert channel["count"] == 40 and topic["count"] == 40
    q = {x["quantile"]: x["value"] for x in channel["percentiles"]}
    assert set(q) == {0.5, 0.99}
    assert 0.5e9 <= q[0.5] <= q[0.99] < 30e9


def test_no_percentiles_configured_keeps_nsqds_empty_shape(nsqd):
    publish(nsqd, "t", b"x")
    c = Conn(nsqd).subscribe("t", "c", rdy=1)
    [m] = c.messages(1)
    c.send(p.fin(m.id))
    topic, channel = e2e(nsqd, "t")
    assert channel == {"count": 0, "percentiles": None}
