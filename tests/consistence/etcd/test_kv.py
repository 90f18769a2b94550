"""The gateway's byte helpers: prefix ranges and base64 round trips."""

from nsqshm.consistence.etcd.kv import KeyValue, b64, prefix_end, unb64


def test_prefix_end_is_the_first_key_past_the_prefix():
    assert prefix_end("/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"  # every key


def test_base64_round_trip_and_absent_fields():
    assert unb64(b64("\u00e9")) == "\u00e9".encode()
    kv = KeyValue.from_json({"key": b64("/k")})  # a deleted key's event: no value, no counts
    assert (kv.key, kv.value, kv.mod_revision, kv.lease) == ("/k", b"", 0, 0)
