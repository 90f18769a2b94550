"""Where the broker is, decided in each process (driver, reader, executor):
shared memory when its instance file is on this host, else TCP."""

from nsqshm.local.broker import Broker, NoBroker
from nsqshm.spark.options import OptionError


def local_broker(o):
    """The Broker on this host for options `o`, or None to use TCP."""
    if o.transport == "tcp":
        return None
    if o.data_path is None and o.shm_prefix is None:
        if o.tcp_address:
            return None
        raise OptionError("give dataPath or shmPrefix (a broker on this host) "
                          "or nsqdTcpAddress (TCP)")
    try:
        return Broker(o.data_path, o.shm_prefix)
    except NoBroker:
        if o.transport == "shm" or not o.tcp_address:
            raise
        return None


def http_json(address, path):
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def http_post(address, path, body=b""):
    import urllib.request

    req = urllib.request.Request(f"http://{address}{path}", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read()


def _stats(address, topic):
    from urllib.parse import quote

    doc = http_json(address, f"/stats?format=json&topic={quote(topic, safe='')}")
    return (doc.get("topics") or [None])[0]


METADATA_FILE = "nsqd.dat"   # nsqshm.nsqd.nsqd.NSQD.metadata_path


def topic_is_ext(o, topic, broker=None, data_path=None):
    """Whether `topic` was made with ext=true (its messages carry Youzan's
    ext part): from nsqd.dat on the broker's host, else its /stats is_ext."""
    import json
    import os

    data_path = data_path or (broker.info.get("data_path") if broker is not None else None)
    if data_path:
        try:
            with open(os.path.join(data_path, METADATA_FILE)) as f:
                doc = json.load(f)
        except (OSError, ValueError):
            doc = None
        if doc is not None:
            return any(t.get("name") == topic and t.get("ext") is True
                       for t in doc.get("topics") or [])
    address = o.http_address or (broker.http_address if broker is not None else None)
    if not address:
        return False
    t = _stats(address, topic)
    return bool(t and t.get("topic_name") == topic and t.get("is_ext"))


def channel_depth_http(address, topic, channel):
    """The channel's depth (memory and disk) from the broker's /stats; 0 if
    it does not exist."""
    t = _stats(address, topic)
    for c in (t or {}).get("channels") or []:
        if c.get("channel_name") == channel:
            return int(c.get("depth", 0))
    return 0


def queued(address, topic, channel):
    """What a channel holds plus what its topic holds (on its way to the
    channels), memory and disk, from /stats; None if unreachable."""
    try:
        t = _stats(address, topic)
    except OSError:
        return None
    if t is None:
        return 0
    depth = int(t.get("depth", 0))
    for c in t.get("channels") or []:
        if c.get("channel_name") == channel:
            depth += int(c.get("depth", 0))
    return depth


def channel_depth_tcp(o, topic):
    return channel_depth_http(o.http_address, topic, o.channel)


def create_channel(o, topic, broker=None):
    from urllib.parse import quote

    if broker is not None:
        broker.create_channel(topic, o.channel)
    elif o.http_address:
        http_post(o.http_address, f"/topic/create?topic={quote(topic, safe='')}")
        http_post(o.http_address, f"/channel/create?topic={quote(topic, safe='')}"
                                  f"&channel={quote(o.channel, safe='')}")
