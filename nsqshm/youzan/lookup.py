"""nsqlookupd's GET /lookup as Youzan's answers it (youzan/nsq nsqlookupd/http.go doLookup,
the registration DB's PeerInfo): the query, and the JSON from plain values.

    {"channels":[...], "meta":{...}, "partitions":{"<id>":<peer>,...}, "producers":[<peer>,...]}

a Go map, so keys sorted ("meta" only when asked with metainfo); partition ids are
strings, sorted as strings ("10" before "2"). And the TCP side that fills it: an nsqd
registers a topic's partition with "REGISTER <topic> <partition> [<channel>]".
"""

from typing import NamedTuple

from nsqshm.nsqd.errors import FatalClientErr
from nsqshm.nsqd.monitoring.stats import go_json
from nsqshm.nsqd.names import is_valid_name
from nsqshm.youzan.go_strconv import atoi
from nsqshm.youzan.http import HTTPError, get


class LookupQuery(NamedTuple):
    topic: str
    partition: str          # "*": all
    access: str             # "r": every node; "w": only nodes taking writes
    metainfo: bool


def lookup_query(query):
    topic = get(query, "topic")
    if topic == "":
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    access = get(query, "access") or "r"
    if access not in ("r", "w"):
        raise HTTPError(400, "INVALID_ACCESS_MODE")
    return LookupQuery(topic, get(query, "partition") or "*", access,
                       get(query, "metainfo") != "")


# access=w and every node of the topic filtered for having no channel
NO_CHANNEL_FOR_WRITE = (404, "Topic has no channel, should init at least one for the new topic")

# nsqlookupd's PeerInfo, in its field order (registration_db.go)
PEER_FIELDS = ("id", "remote_address", "hostname", "broadcast_address", "tcp_port",
               "http_port", "version", "distributed_id")


def peer(info):
    """A producer as Youzan's lookupd writes it: PEER_FIELDS order, fields absent from
    info left out (nsqio's lookupd has no id / distributed_id)."""
    out = {k: info[k] for k in PEER_FIELDS if k in info}
    out.update((k, v) for k, v in info.items() if k not in out)
    return out


def lookup_data(channels, producers, partitions, meta=None):
    """doLookup's answer (a Go map: keys sorted). partitions: {partition id: producer};
    meta: None, or {"partition_num", "replica", "extend_support"} (given when the
    query had metainfo: Youzan's standalone lookupd never gives it; go-nsq's ordered
    publish needs partition_num)."""
    data = {"channels": list(channels)}
    if meta is not None:
        data["meta"] = {"extend_support": bool(meta["extend_support"]),
                        "partition_num": meta["partition_num"], "replica": meta["replica"]}
    data["partitions"] = {str(p): peer(partitions[p])
                          for p in sorted(partitions, key=lambda p: str(p))}
    data["producers"] = [peer(p) for p in producers]
    return data


def lookup_json(channels, producers, partitions, meta=None):
    return go_json(lookup_data(channels, producers, partitions, meta))


# --- nsqlookupd TCP: REGISTER / UNREGISTER with a partition (lookup_protocol_v1.go) ---

OLD_VERSION_PID = "-11"     # the partition of a registration from an "old" nsqd
MAX_PARTITION_ID = 255      # nsqlookupd/http.go GetValidPartitionID: 0 <= id < 255


class Registration(NamedTuple):
    topic: str
    partition: str          # as sent ("0", "12"), or OLD_VERSION_PID
    channel: str            # "": the topic itself


def is_old_peer(distributed_id, version):
    """PeerInfo.IsOldPeer: an nsqd that IDENTIFYed without a distributed_id and with a
    version not containing "HA" may register without partitions (nsqio's form)."""
    return distributed_id == "" and "HA" not in version


def _valid_partition_id(raw):
    try:
        pid = atoi(raw)
    except ValueError:
        return False
    return 0 <= pid < MAX_PARTITION_ID or pid == int(OLD_VERSION_PID)


def parse_registration(command, params, old_peer):
    """REGISTER / UNREGISTER's words after the verb: "<topic> <partition> [<channel>]";
    an old peer whose words do not fit falls back to nsqio's "<topic> [<channel>]"
    (partition OLD_VERSION_PID). Errors are fatal, texts quoted with '%s' as Youzan's."""
    try:
        return _new_form(command, params)
    except FatalClientErr:
        if not old_peer:
            raise
    if len(params) <= 0:
        raise FatalClientErr("E_INVALID", f"{command} insufficient number of params")
    topic = params[0]
    channel = params[1] if len(params) >= 2 else ""
    _check_names(command, topic, channel)
    return Registration(topic, OLD_VERSION_PID, channel)


def _check_names(command, topic, channel):
    if not is_valid_name(topic):
        raise FatalClientErr("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
    if channel != "" and not is_valid_name(channel):
        raise FatalClientErr("E_BAD_CHANNEL", f"{command} channel name '{channel}' is not valid")


def _new_form(command, params):
    if len(params) <= 1:
        raise FatalClientErr("E_INVALID", f"{command} insufficient number of params")
    topic, pid = params[0], params[1]
    channel = params[2] if len(params) >= 3 else ""
    _check_names(command, topic, channel)
    if not _valid_partition_id(pid):
        raise FatalClientErr("E_BAD_PARTITIONID", f"{command} partition id '{pid}' is not valid")
    return Registration(topic, pid, channel)
