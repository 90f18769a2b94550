"""How a process on the same host finds a running broker: its shared-memory
prefix, and a small JSON file beside its segments in /dev/shm.

    /dev/shm/<prefix>.instance   (mode 0600, replaced atomically)
    {"pid": 123, "prefix": "nsqshm.0123456789ab", "data_path": "/abs/path",
     "tcp_address": "127.0.0.1:4150", "http_address": "127.0.0.1:4151",
     "workers": 2, "max_msg_size": 1048576, "msg_timeout": 60.0, "cluster": false}

The prefix is --shm-prefix, or nsqshm.<first 12 hex digits of the sha1 of
the absolute data path>, so a broker restarted on the same data path (and a
local client given that path) finds the same segments.
"""

import hashlib
import json
import os

from nsqshm.consistence.options import cluster_mode

SHM_DIR = "/dev/shm"


def prefix_for(data_path=None, shm_prefix=None):
    if shm_prefix:
        return shm_prefix
    path = os.path.abspath(data_path or ".")
    return f"nsqshm.{hashlib.sha1(path.encode()).hexdigest()[:12]}"


def info_path(prefix):
    from nsqshm._core.arena import validate_name

    validate_name(prefix)  # the prefix becomes a file name
    return os.path.join(SHM_DIR, f"{prefix}.instance")


def record(prefix, data_path, tcp_address, http_address, workers, opts):
    """What write() stores for a broker started with `opts` (the supervisor's and a
    single worker's alike).  cluster: its log topics are replicated, so local
    producers refuse them (their OK waits for the ISR)."""
    return {"pid": os.getpid(), "prefix": prefix, "data_path": data_path,
            "tcp_address": tcp_address, "http_address": http_address, "workers": workers,
            "max_msg_size": opts.max_msg_size, "msg_timeout": opts.msg_timeout,
            "cluster": cluster_mode(opts)}


def write(prefix, info):
    path = info_path(prefix)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.rename(tmp, path)


def remove(prefix, pid=None):
    """Remove the instance file (only if it is pid's, when pid is given)."""
    path = info_path(prefix)
    try:
        if pid is not None:
            with open(path) as f:
                if json.load(f).get("pid") != pid:
                    return
        os.unlink(path)
    except (OSError, ValueError):
        pass


class NoBroker(LookupError):
    pass


def find(data_path=None, shm_prefix=None):
    """The running broker's instance information, found by its data path or
    prefix; NoBroker when none runs there."""
    prefix = prefix_for(data_path, shm_prefix)
    try:
        with open(info_path(prefix)) as f:
            info = json.load(f)
    except FileNotFoundError:
        raise NoBroker(f"no nsqshm broker runs with shared-memory prefix {prefix!r} "
                       f"(data path {os.path.abspath(data_path or '.')!r})") from None
    except ValueError as err:
        raise NoBroker(f"{info_path(prefix)}: unreadable ({err})") from None
    pid = info.get("pid")
    try:
        os.kill(pid, 0)
    except (OSError, TypeError):
        raise NoBroker(f"the nsqshm broker with prefix {prefix!r} (pid {pid}) is gone") from None
    return info
