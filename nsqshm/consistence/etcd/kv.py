"""A key-value pair as etcd returns it, and the byte helpers of the gateway's JSON
(keys and values are base64, int64 fields are decimal strings)."""

import base64
from dataclasses import dataclass


def b64(data):
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode("ascii")


def unb64(text):
    return base64.b64decode(text) if text else b""


def prefix_end(prefix):
    """The range_end that makes [prefix, end) every key starting with prefix
    (etcd's clientv3.GetPrefixRangeEnd: the last byte below 0xff incremented)."""
    key = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    for i in range(len(key) - 1, -1, -1):
        if key[i] < 0xFF:
            key[i] += 1
            return bytes(key[: i + 1])
    return b"\0"  # all keys


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int  # 0: the key does not exist
    mod_revision: int  # the revision of its last change: what compare-and-set compares
    version: int  # changes since creation
    lease: int  # 0: not attached to a lease

    @classmethod
    def from_json(cls, kv):
        return cls(key=unb64(kv.get("key")).decode("utf-8", "surrogateescape"),
                   value=unb64(kv.get("value")),
                   create_revision=int(kv.get("create_revision", 0)),
                   mod_revision=int(kv.get("mod_revision", 0)),
                   version=int(kv.get("version", 0)),
                   lease=int(kv.get("lease", 0)))
