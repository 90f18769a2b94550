"""nsqlookupd's /lookup, byte for byte (youzan/nsq nsqlookupd/http.go doLookup;
youzan/go-nsq consumer.go and producer.go nextLookupdEndpoint, lookupResp)."""

import pytest

from nsqshm.nsqd.errors import ClientErr
from nsqshm.youzan import lookup as h
from nsqshm.youzan.http import HTTPError

LOOKUP = "nsqlookupd/http.go doLookup"


def outcome(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except HTTPError as e:
        return (e.status, e.text)


LOOKUP_CASES = [
    ({"topic": "t"}, h.LookupQuery("t", "*", "r", False), LOOKUP),
    ({"topic": "t", "access": "w", "metainfo": "true", "partition": "1"},
     h.LookupQuery("t", "1", "w", True), LOOKUP + "; go-nsq producer.go nextLookupdEndpoint"),
    ({"access": "r"}, (400, "MISSING_ARG_TOPIC"), LOOKUP),
    ({"topic": "t", "access": "rw"}, (400, "INVALID_ACCESS_MODE"), LOOKUP),
]


@pytest.mark.parametrize("query,expected,src", LOOKUP_CASES)
def test_lookup_query(query, expected, src):
    assert outcome(h.lookup_query, query) == expected


NODE = {"id": "n1", "remote_address": "127.0.0.1:5000", "hostname": "h",
        "broadcast_address": "b", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0",
        "distributed_id": ""}


def test_lookup_json():
    # doLookup returns a map (Go sorts keys: channels, meta, partitions, producers);
    # meta's keys sorted too; PeerInfo in its struct order; partition keys are strings
    shuffled = dict(reversed(list(NODE.items())))
    got = h.lookup_json(["c1"], [shuffled], {10: shuffled, 2: NODE},
                        {"partition_num": 11, "replica": 1, "extend_support": True})
    node = (b'{"id":"n1","remote_address":"127.0.0.1:5000","hostname":"h","broadcast_address":'
            b'"b","tcp_port":4150,"http_port":4151,"version":"1.3.0","distributed_id":""}')
    assert got == (b'{"channels":["c1"],"meta":{"extend_support":true,"partition_num":11,'
                   b'"replica":1},"partitions":{"10":' + node + b',"2":' + node
                   + b'},"producers":[' + node + b"]}")
    assert h.lookup_json([], [], {}) == b'{"channels":[],"partitions":{},"producers":[]}'


PROTO = "nsqlookupd/lookup_protocol_v1.go getTopicChan"
OLD = "nsqlookupd/lookup_protocol_v1.go REGISTER: IsOldPeer -> getTopicChanFromOld"

REG_CASES = [
    # (words after REGISTER, old peer, expected, source)
    ("t 0", False, h.Registration("t", "0", ""), PROTO + "; go-nsq command.go Register"),
    ("t 3 c", False, h.Registration("t", "3", "c"), PROTO),
    ("t -11 c", False, h.Registration("t", "-11", "c"), PROTO + " GetValidPartitionID: OLD_VERSION_PID"),
    ("t", False, (b"E_INVALID REGISTER insufficient number of params", True), PROTO),
    ("t c", False, (b"E_BAD_PARTITIONID REGISTER partition id 'c' is not valid", True), PROTO),
    ("t 255", False, (b"E_BAD_PARTITIONID REGISTER partition id '255' is not valid", True),
     PROTO + " 0 <= id < 255"),
    ("t! 0", False, (b"E_BAD_TOPIC REGISTER topic name 't!' is not valid", True), PROTO),
    ("t 0 c!", False, (b"E_BAD_CHANNEL REGISTER channel name 'c!' is not valid", True), PROTO),
    ("t c", True, h.Registration("t", "-11", "c"), OLD),
    ("t", True, h.Registration("t", "-11", ""), OLD),
    ("t 0", True, h.Registration("t", "0", ""), OLD + " (the new form first)"),
    ("t c!", True, (b"E_BAD_CHANNEL REGISTER channel name 'c!' is not valid", True), OLD),
]


@pytest.mark.parametrize("line,old,expected,src", REG_CASES)
def test_parse_registration(line, old, expected, src):
    try:
        got = h.parse_registration("REGISTER", line.split(" "), old)
    except ClientErr as e:
        got = (e.wire, e.fatal)
    assert got == expected


@pytest.mark.parametrize("distributed_id,version,old", [
    ("", "1.3.0", True), ("", "0.3.7-HA.1.5.4", False), ("node1", "1.3.0", False)])
def test_is_old_peer(distributed_id, version, old):
    # registration DB PeerInfo.IsOldPeer
    assert h.is_old_peer(distributed_id, version) is old
