"""Youzan's additions to IDENTIFY (youzan/nsq nsqd/client_v2.go IdentifyDataV2,
SetDesiredTag; nsqd/ext_filter.go ExtFilterData; nsqdserver/protocol_v2.go IDENTIFY).

The body is nsqd's JSON with, besides nsqd's fields:

    "desired_tag":    string, at most 100 bytes (MAX_TAG_LEN)
    "extend_support": bool
    "ext_filter":     {"type": int, "inverse": bool, "filter_ext_key": string,
                       "filter_data": string,
                       "filter_data_list": [{"filter_ext_key": string, "filter_data": string}]}

Go decodes the body into a struct, so a field of the wrong JSON type fails the whole
IDENTIFY with E_BAD_BODY "IDENTIFY failed to decode JSON body"; a tag too long fails it
with E_BAD_BODY "IDENTIFY invalid tag len <n>, exceed limit 100", checked after nsqd's own
fields. The answer (feature negotiation) ends with "desired_tag" when one was set.
"""

from typing import NamedTuple

from nsqshm.nsqd.errors import FatalClientErr

MAX_TAG_LEN = 100                  # internal/ext/ext.go
FILTER_EQUAL, FILTER_REGEXP, FILTER_GLOB = 1, 2, 3

_DECODE = ("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
_FILTER_FIELDS = {"type": int, "inverse": bool, "filter_ext_key": str, "filter_data": str,
                  "filter_data_list": list}


class IdentifyExt(NamedTuple):
    desired_tag: str
    extend_support: bool
    ext_filter: dict          # {} when none; the keys Youzan reads, as sent


def _typed(value, kind):
    """Go's json.Unmarshal into a typed field: null leaves the zero value."""
    if value is None:
        return kind()
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise FatalClientErr(*_DECODE)
    return value


def parse_identify_ext(data):
    """Youzan's fields of an IDENTIFY body already decoded as a JSON object."""
    tag = _typed(data.get("desired_tag"), str)
    support = _typed(data.get("extend_support"), bool)
    raw = data.get("ext_filter")
    ext_filter = {}
    if raw is not None:
        if not isinstance(raw, dict):
            raise FatalClientErr(*_DECODE)
        for key, kind in _FILTER_FIELDS.items():
            if key in raw:
                ext_filter[key] = _typed(raw[key], kind)
        for item in ext_filter.get("filter_data_list", []):
            if not isinstance(item, dict):
                raise FatalClientErr(*_DECODE)
            for key in ("filter_ext_key", "filter_data"):
                _typed(item.get(key), str)
    n = len(tag.encode("utf-8", "surrogateescape"))
    if n > MAX_TAG_LEN:
        raise FatalClientErr("E_BAD_BODY",
                             f"IDENTIFY invalid tag len {n}, exceed limit {MAX_TAG_LEN}")
    return IdentifyExt(tag, support, ext_filter)


def identify_response_extra(ext):
    """What Youzan's IDENTIFY answer adds after nsqd's fields (desired_tag omitempty)."""
    return {"desired_tag": ext.desired_tag} if ext.desired_tag else {}
