"""etcd transactions: `if every compare holds then these ops else those ops`, applied
atomically at one revision.  Compare-and-set is a transaction whose compare is the
key's mod_revision (or value) as last read: of two writers that read the same
revision, exactly one succeeds.

    Compare.mod_revision(key, "=", 42)     the key was last changed at revision 42
    Compare.absent(key)                    the key does not exist (create_revision 0)
    Compare.value(key, "=", b"x")
    Op.put(key, value, lease=0) / Op.delete(key, prefix=False) / Op.get(key, prefix=False)
"""

from dataclasses import dataclass

from nsqshm.consistence.etcd.kv import KeyValue, b64, prefix_end

_RESULTS = {"=": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}


def _compare(key, op, target, field, value):
    if op not in _RESULTS:
        raise ValueError(f"compare op {op!r} not one of {sorted(_RESULTS)}")
    return {"key": b64(key), "target": target, "result": _RESULTS[op], field: value}


class Compare:
    @staticmethod
    def mod_revision(key, op, revision):
        return _compare(key, op, "MOD", "mod_revision", str(int(revision)))

    @staticmethod
    def create_revision(key, op, revision):
        return _compare(key, op, "CREATE", "create_revision", str(int(revision)))

    @staticmethod
    def version(key, op, version):
        return _compare(key, op, "VERSION", "version", str(int(version)))

    @staticmethod
    def value(key, op, value):
        return _compare(key, op, "VALUE", "value", b64(value))

    @staticmethod
    def absent(key):
        return Compare.create_revision(key, "=", 0)


class Op:
    @staticmethod
    def put(key, value, lease=0):
        req = {"key": b64(key), "value": b64(value)}
        if lease:
            req["lease"] = str(int(lease))
        return {"request_put": req}

    @staticmethod
    def delete(key, prefix=False):
        req = {"key": b64(key)}
        if prefix:
            req["range_end"] = b64(prefix_end(key))
        return {"request_delete_range": req}

    @staticmethod
    def get(key, prefix=False):
        req = {"key": b64(key)}
        if prefix:
            req["range_end"] = b64(prefix_end(key))
        return {"request_range": req}


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool  # the compares held: the success ops ran
    revision: int  # the store's revision after the transaction
    ranges: tuple  # per Op.get of the branch that ran: a tuple of KeyValue

    @classmethod
    def from_json(cls, answer):
        ranges = []
        for resp in answer.get("responses", ()):
            if "response_range" in resp:
                kvs = resp["response_range"].get("kvs", ())
                ranges.append(tuple(KeyValue.from_json(kv) for kv in kvs))
        return cls(succeeded=bool(answer.get("succeeded", False)),
                   revision=int(answer.get("header", {}).get("revision", 0)),
                   ranges=tuple(ranges))
