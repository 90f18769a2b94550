"""nsqshm.nsqlookupd.registration_db, as nsqlookupd's registration_db.go."""

import time

from nsqshm.nsqlookupd.registration_db import (
    PeerInfo,
    Producer,
    RegistrationDB,
    filter_by_active,
    filter_registrations,
    keys,
    subkeys,
)


def producer(peer_id):
    peer = PeerInfo(peer_id)
    peer.last_update = time.time_ns()
    return Producer(peer)


def test_add_remove_find():
    db = RegistrationDB()
    a, b = producer("a"), producer("b")
    assert db.add_producer(("topic", "t", ""), a) is True
    assert db.add_producer(("topic", "t", ""), producer("a")) is False  # same peer id
    assert db.add_producer(("topic", "t", ""), b) is True
    assert db.add_producer(("channel", "t", "c1"), a) is True
    assert db.add_producer(("channel", "t", "c2"), b) is True
    db.add_registration(("topic", "empty", ""))
    assert db.find_registrations("topic", "*", "") == [("topic", "t", ""), ("topic", "empty", "")]
    assert db.find_registrations("topic", "t", "") == [("topic", "t", "")]
    assert db.find_registrations("topic", "nope", "") == []
    assert subkeys(db.find_registrations("channel", "t", "*")) == ["c1", "c2"]
    assert keys(db.find_registrations("topic", "*", "")) == ["t", "empty"]
    assert db.find_producers("topic", "t", "") == [a, b]
    assert db.find_producers("channel", "t", "*") == [a, b]  # deduplicated by peer id
    assert db.find_producers("topic", "empty", "") == []
    assert db.lookup_registrations("a") == [("topic", "t", ""), ("channel", "t", "c1")]
    assert filter_registrations(db.lookup_registrations("a"), "topic", "*", "") == [
        ("topic", "t", "")]
    assert db.remove_producer(("topic", "t", ""), "a") == (True, 1)
    assert db.remove_producer(("topic", "t", ""), "a") == (False, 1)
    assert db.remove_producer(("topic", "x", ""), "a") == (False, 0)
    assert db.remove_producer(("topic", "t", ""), "b") == (True, 0)
    assert ("topic", "t", "") in db.registrations  # left behind, empty
    db.remove_registration(("topic", "t", ""))
    assert db.find_registrations("topic", "t", "") == []


def test_filter_by_active_and_tombstones():
    fresh, stale, tomb = producer("f"), producer("s"), producer("t")
    stale.peer_info.last_update -= int(10e9)
    tomb.tombstone()
    assert tomb.is_tombstoned(5) and not tomb.is_tombstoned(0)
    assert filter_by_active([fresh, stale, tomb], 5, 5) == [fresh]
    assert filter_by_active([fresh, stale, tomb], 5, 0) == [fresh, tomb]
    assert filter_by_active([fresh, stale, tomb], 60, 0) == [fresh, stale, tomb]
