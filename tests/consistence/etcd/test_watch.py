"""Watches against a real etcd: events in order with previous values, history replayed
from a past revision, compaction reported (resuming across etcd restarts is in
test_session.py)."""

from tests.consistence.wait import wait_for


def test_watch_sees_puts_and_deletes_with_previous_values(sessions):
    s, writer = sessions(), sessions()
    events = []
    w = s.watch("/w/", events.extend, prefix=True)
    assert w.ready.wait(5)
    writer.put("/w/x", b"1")
    writer.put("/w/x", b"2")
    writer.put("/other", b"not watched")
    writer.delete("/w/x")
    assert wait_for(lambda: len(events) == 3, 5), events
    assert [(e.type, e.kv.key, e.kv.value) for e in events] == [
        ("PUT", "/w/x", b"1"), ("PUT", "/w/x", b"2"), ("DELETE", "/w/x", b"")]
    assert events[1].prev.value == b"1" and events[2].prev.value == b"2"


def test_watch_from_a_past_revision_replays_history(sessions):
    s = sessions()
    first = s.put("/h", b"a")
    s.put("/h", b"b")
    events = []
    s.watch("/h", events.extend, start_revision=first)
    assert wait_for(lambda: len(events) == 2, 5)
    assert [e.kv.value for e in events] == [b"a", b"b"]


def test_watch_of_a_compacted_revision_says_so(sessions):
    s = sessions()
    first = s.put("/cmp", b"a")
    last = s.put("/cmp", b"b")
    s.gateway.call("kv/compaction", {"revision": str(last), "physical": True})
    events = []
    s.watch("/cmp", events.extend, start_revision=first)
    assert wait_for(lambda: events, 5)
    assert events[0].type == "COMPACTED"
