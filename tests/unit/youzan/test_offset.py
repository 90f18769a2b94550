"""The consume position shared by SUB_ADVANCED and /channel/setoffset
(youzan/nsq nsqdserver/protocol_v2.go ConsumeOffset.FromBytes; go-nsq command.go ToString)."""

import pytest

from nsqshm.youzan import offset as o

FROM = "nsqdserver/protocol_v2.go ConsumeOffset.FromBytes"

CASES = [
    (b"timestamp:1500000000", o.ConsumeOffset("timestamp", 1500000000), FROM),
    (b"virtual_queue:4096", o.ConsumeOffset("virtual_queue", 4096), FROM),
    (b"msgcount:0", o.ConsumeOffset("msgcount", 0), FROM),
    (b"special:-1", o.END, FROM + "; go-nsq SetToEnd"),
    (b"special:-2", o.EARLIEST, "nsqshm's earliest (parses as Youzan's; Youzan refuses it at set time)"),
    (b"count:5", "invalid consume offset:count:5", FROM + ' ("count" is commented out)'),
    (b"timestamp", "invalid consume offset:timestamp", FROM + " (len(values) != 2)"),
    (b"timestamp:1:2", "invalid consume offset:timestamp:1:2", FROM),
    (b"Timestamp:1", "invalid consume offset:Timestamp:1", FROM + " (case matters)"),
    (b"msgcount:", 'strconv.ParseInt: parsing "": invalid syntax', FROM + " ParseInt error text"),
    (b"msgcount:1e3", 'strconv.ParseInt: parsing "1e3": invalid syntax', FROM),
]


@pytest.mark.parametrize("raw,expected,src", CASES)
def test_parse_consume_offset(raw, expected, src):
    if isinstance(expected, str):
        with pytest.raises(ValueError) as e:
            o.parse_consume_offset(raw)
        assert str(e.value) == expected
    else:
        assert o.parse_consume_offset(raw) == expected
        assert str(expected).encode() == raw  # go-nsq ConsumeOffset.ToString round trip


@pytest.mark.parametrize("offset,ok", [
    (o.END, True), (o.EARLIEST, True), (o.ConsumeOffset("special", 0), False),
    (o.ConsumeOffset("timestamp", 1), True)])
def test_check_supported(offset, ok):
    # nsqdserver/context.go SetChannelOffset: special other than -1 -> "not supported offset type"
    if ok:
        assert o.check_supported(offset) is offset
    else:
        with pytest.raises(ValueError, match="^not supported offset type$"):
            o.check_supported(offset)


# consistence/nsqd_coordinator.go SearchLogByMsgCnt (seeks to count - 1 messages before)
# and diskqueue_snapshot.go ReadOne (CurCnt: the count after the read)
@pytest.mark.parametrize("count,offset", [(-5, 0), (0, 0), (1, 0), (2, 1), (1001, 1000)])
def test_a_youzan_count_names_a_msg_offset(count, offset):
    assert o.offset_of_count(count) == offset


@pytest.mark.parametrize("offset,count", [(0, 1), (1, 2), (1000, 1001)])
def test_a_msg_offset_has_a_youzan_count(offset, count):
    assert o.count_of(offset) == count
    assert o.offset_of_count(o.count_of(offset)) == offset
