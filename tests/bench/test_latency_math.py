"""The open-loop schedule and the percentiles of the latency suite."""

from nsqshm.bench.latency import NS, due_count, percentiles, scheduled_ns


def test_schedule_at_fixed_rates():
    t0 = 5 * NS
    for rate in (1_000, 10_000, 100_000, 3):
        assert scheduled_ns(t0, 0, rate) == t0
        assert scheduled_ns(t0, rate, rate) == t0 + NS  # one second later, exactly
        for i in (1, 7, rate // 2):
            at = scheduled_ns(t0, i, rate)
            assert due_count(t0, at, rate) == i + 1      # message i is due at its time
            assert due_count(t0, at - 1, rate) == i      # and not a nanosecond before
    assert due_count(t0, t0 - 1, 1000) == 0


def test_no_drift_over_long_runs():
    # integer schedule: a million messages at 3 msg/s end where they should
    assert scheduled_ns(0, 3_000_000, 3) == 1_000_000 * NS


def test_percentiles_nearest_rank():
    samples = [i * 1000 for i in range(1, 1001)]  # 1 .. 1000 us
    p = percentiles(samples)
    assert (p["p50_us"], p["p99_us"], p["p999_us"], p["max_us"]) == (500, 990, 999, 1000)
    assert p["samples"] == 1000
    assert percentiles([]) == {"samples": 0}


def test_a_stall_shows_from_the_schedule_not_from_the_send():
    """1 k msg/s for 10 s; the sender stalls 200 ms once and then sends the
    backlog at once.  Measured from each message's send, only the message
    that waited looks slow; from the schedule, every message due during the
    stall does, as a client would have seen."""
    rate, t0, delivery = 1000, 0, 50_000  # 50 us from send to delivery
    stall_at, stall = 5 * NS, 200_000_000
    from_send, from_schedule = [], []
    for i in range(10 * rate):
        sched = scheduled_ns(t0, i, rate)
        sent = stall_at + stall if stall_at <= sched < stall_at + stall else sched
        from_send.append(delivery)  # the closed-loop view: time since the send
        from_schedule.append(sent + delivery - sched)
    assert percentiles(from_send)["p99_us"] == 50
    p = percentiles(from_schedule)
    assert p["p99_us"] > 100_000 and p["max_us"] == 200_050  # the stall, as it was
