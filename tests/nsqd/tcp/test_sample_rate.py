"""sample_rate (IDENTIFY, 1-99): each message the channel hands a consumer
is kept with nsqd's odds, rand.Int31n(100) <= rate; a message sampled out
is consumed from the channel for that client and dropped, neither sent nor
put in flight (nsqd's messagePump `continue`)."""

import pytest

from nsqshm import protocol as p
from tests.nsqd.transport import Conn, mpublish, run_client, stats

N = 2000


def consume_all(conn, timeout=1.0):
    """Messages until none comes for `timeout` seconds."""
    got = []
    while True:
        try:
            got.extend(conn.messages(1, timeout=timeout))
        except TimeoutError:
            return got


def test_identify_reports_the_sample_rate(nsqd):
    assert Conn(nsqd).identify(sample_rate=20)["sample_rate"] == 20
    assert Conn(nsqd).identify()["sample_rate"] == 0


@pytest.mark.parametrize("rate, low, high", [(20, 300, 550), (1, 5, 90), (90, 1700, 1900)])
def test_sample_rate_statistics(nsqd, rate, low, high):
    """The kept share is (rate+1)/100: 21% of 2000 is 420 (sd 18)."""
    topic = f"sampled{rate}"
    c = Conn(nsqd)
    c.identify(sample_rate=rate)
    c.send(p.sub(topic, "c")).ok()
    mpublish(nsqd, topic, [b"m%d" % i for i in range(N)])
    c.send(p.rdy(2500))
    got = consume_all(c)
    assert low <= len(got) <= high, len(got)
    assert len({m.body for m in got}) == len(got)
    assert all(m.attempts == 1 for m in got)
    ch = stats(nsqd, topic)["topics"][0]["channels"][0]
    # the channel is drained: what was not sent is gone, not in flight or queued
    assert (ch["message_count"], ch["depth"], ch["in_flight_count"]) == (N, 0, len(got))
    [client] = ch["clients"]
    assert (client["sample_rate"], client["message_count"], client["in_flight_count"]) == \
        (rate, len(got), len(got))
    c.send(b"".join(p.fin(m.id) for m in got))
    c.send(p.nop())
    ch = stats(nsqd, topic)["topics"][0]["channels"][0]
    assert ch["in_flight_count"] == 0 and ch["clients"][0]["finish_count"] == len(got)


def test_rate_zero_gets_everything(nsqd):
    c = Conn(nsqd)
    c.identify(sample_rate=0)
    c.send(p.sub("all", "c")).ok()
    mpublish(nsqd, "all", [b"m%d" % i for i in range(500)])
    c.send(p.rdy(2500))
    assert len(consume_all(c)) == 500


def test_rdy_still_bounds_in_flight(nsqd):
    """Sampled-out messages take no RDY: the consumer gets up to RDY kept ones."""
    c = Conn(nsqd)
    c.identify(sample_rate=50)
    c.send(p.sub("bounded", "c")).ok()
    mpublish(nsqd, "bounded", [b"m%d" % i for i in range(N)])
    c.send(p.rdy(100))
    got = consume_all(c, timeout=0.5)
    assert len(got) == 100


@pytest.mark.parametrize("library", ["pynsq", "gnsq"])
def test_clients_with_a_sample_rate(nsqd, library):
    r = run_client(library, "sampled", nsqd, f"{library}-sampled", n=N, opts={"sample_rate": 20})
    assert r["errors"] == [] and r["published"] == N
    assert 300 <= len(r["received"]) <= 550, len(r["received"])
    assert len({b for _, b, _ in r["received"]}) == len(r["received"])
