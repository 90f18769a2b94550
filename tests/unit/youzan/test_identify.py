"""Youzan's IDENTIFY fields (youzan/nsq nsqd/client_v2.go IdentifyDataV2, SetDesiredTag;
nsqd/ext_filter.go ExtFilterData; nsqdserver/protocol_v2.go IDENTIFY)."""

import pytest

from nsqshm.nsqd.errors import ClientErr
from nsqshm.youzan import identify as i

DATA = "client_v2.go IdentifyDataV2 (json.Unmarshal into a struct)"
DECODE = (b"E_BAD_BODY IDENTIFY failed to decode JSON body", True)

CASES = [
    ({}, i.IdentifyExt("", False, {}), DATA),
    ({"desired_tag": "tagA", "extend_support": True}, i.IdentifyExt("tagA", True, {}),
     DATA + "; go-nsq conn.go identify"),
    ({"desired_tag": None, "extend_support": None, "ext_filter": None},
     i.IdentifyExt("", False, {}), DATA + " (null: the zero value)"),
    ({"ext_filter": {"type": 2, "inverse": True, "filter_ext_key": "k", "filter_data": "^a"}},
     i.IdentifyExt("", False, {"type": 2, "inverse": True, "filter_ext_key": "k",
                               "filter_data": "^a"}), "ext_filter.go ExtFilterData"),
    ({"desired_tag": "x" * 100}, i.IdentifyExt("x" * 100, False, {}),
     "client_v2.go SetDesiredTag: len > MAX_TAG_LEN (100)"),
    ({"desired_tag": "x" * 101}, (b"E_BAD_BODY IDENTIFY invalid tag len 101, exceed limit 100",
                                  True), "client_v2.go SetDesiredTag; protocol_v2.go IDENTIFY"),
    ({"desired_tag": "\u00e9" * 51}, (b"E_BAD_BODY IDENTIFY invalid tag len 102, exceed limit 100",
                                      True), "SetDesiredTag: len() counts bytes"),
    ({"desired_tag": 5}, DECODE, DATA),
    ({"extend_support": "true"}, DECODE, DATA),
    ({"ext_filter": {"type": "1"}}, DECODE, "ExtFilterData.Type int"),
    ({"ext_filter": {"type": True}}, DECODE, "ExtFilterData.Type int (a bool is not)"),
    ({"ext_filter": {"filter_data_list": [{"filter_data": 1}]}}, DECODE, "MultiFilterData"),
    ({"ext_filter": []}, DECODE, DATA),
]


@pytest.mark.parametrize("data,expected,src", CASES)
def test_parse_identify_ext(data, expected, src):
    try:
        got = i.parse_identify_ext(data)
    except ClientErr as e:
        got = (e.wire, e.fatal)
    assert got == expected


def test_identify_response_extra():
    # protocol_v2.go IDENTIFY: DesiredTag `json:"desired_tag,omitempty"`, the last field
    assert i.identify_response_extra(i.IdentifyExt("t", False, {})) == {"desired_tag": "t"}
    assert i.identify_response_extra(i.IdentifyExt("", True, {})) == {}
