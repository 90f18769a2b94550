"""The log topics a broker has, as worker 0 keeps them in
<data-path>/nsqshm.logtopics.json (logtopic.py: what a spec holds):

    {"topics": [{"name": "t", "partition_num": 2, "retention_days": -1,
                 "retention_bytes": -1, "sync_every": 0, "ordered": false}, ...],
     "version": 1}

No gevent here: the local clients and the Spark source read it too."""

import json
import os
import random

LOG_TOPICS_FILE = "nsqshm.logtopics.json"


def load_specs(data_path):
    """The log topics of nsqshm.logtopics.json ([] when there is none)."""
    path = os.path.join(data_path, LOG_TOPICS_FILE)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return []
    except ValueError as err:
        raise RuntimeError(f"failed to parse {path} - {err}") from None
    return list(data.get("topics") or [])


def write_specs(data_path, specs):
    path = os.path.join(data_path, LOG_TOPICS_FILE)
    tmp = f"{path}.{random.getrandbits(31)}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump({"topics": specs, "version": 1}, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def find_spec(data_path, name):
    """The spec of log topic `name`, or None (a classic topic, or none yet)."""
    for spec in load_specs(data_path):
        if spec.get("name") == name:
            return spec
    return None
