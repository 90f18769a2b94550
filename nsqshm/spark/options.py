"""The "nsqshm" data source's options (case-insensitive, as Spark passes
them), modelled on Kafka's source:

    topic                  topic(s) to read, comma-separated; the topic to write
                           (rows may carry their own in a `topic` column);
                           Kafka's `subscribe` is the same
    subscribePattern       read every log topic whose whole name the regular
                           expression matches (as Kafka's); one of topic,
                           subscribe, subscribePattern
    channel                channel to read from (default "spark")
    dataPath / shmPrefix   find the broker on this host: shared memory
    nsqdTcpAddress         host:port: TCP when the broker is not on this host
    nsqdHttpAddress        host:port of its HTTP API (depth for batch reads,
                           creating the channel); default: TCP port + 1
    transport              auto (shared memory where the broker is local, else
                           TCP), shm or tcp
    maxMessagesPerTrigger  streaming: at most this many messages per micro-batch
                           (Kafka's maxOffsetsPerTrigger)
    maxMessages            batch read: at most this many messages
    startingOffsets        earliest (default: what the channel holds) or latest
                           (skip messages published before the query started)
    startingTimestamp      ms since the epoch: skip messages published before it
    numPartitions          shards per channel: Spark partitions per topic (default 2)
    batchSize              rows per Arrow batch (default 65536)
    msgTimeout             streaming: the due time given to a batch's messages, how
                           long a dead driver's batches wait for a restarted
                           application before the broker redelivers them (where it
                           honours it: local_clients.dead_arenas); default: the
                           broker's --msg-timeout
    idleTimeout            TCP batch read: stop after this many seconds without a
                           message (default 1.0)

Log topics (docs/spark.md, "Log topics"), named as Kafka's source names them:

    startingOffsets        earliest, latest or JSON {"topic":{"0":23,"1":-2}}
                           (-2 earliest, -1 latest); default latest for a stream,
                           earliest for a batch read
    startingOffsetsByTimestamp / startingTimestamp
                           JSON {"topic":{"0":ms}} / one ms for every partition:
                           the first message published at or after it
    endingOffsets          batch: latest (default) or JSON (-1 latest)
    endingOffsetsByTimestamp / endingTimestamp   batch: as the starting ones
    maxOffsetsPerTrigger   stream: at most this many offsets per micro-batch
                           (maxMessagesPerTrigger is the same)
    minOffsetsPerTrigger   stream: wait for at least this many (ReadMinRows)
    maxTriggerDelay        stream, with minOffsetsPerTrigger: trigger anyway once
                           this long has passed since the last batch (Spark's time
                           string: 500ms, 30s, 15m (the default), 1h, 1d)
    minPartitions          split the partitions' ranges into at least this many
                           Spark partitions
    includeHeaders         true: a `headers` column, Kafka's type (array of key
                           string, value binary; null for a message without
                           headers): an ext topic's JSON headers (docs/headers.md)
    failOnDataLoss         true (default): fail when planned offsets were removed
                           by retention; false: skip them, logging a warning
    channel                given: the channel whose cursor follows the committed
                           offsets (/channel/setoffset), so its lag shows in /stats

Messages skipped by a starting position are consumed (finished) without
being returned, as Kafka's offsets skip them.
"""

import json
import re
import time
from dataclasses import dataclass, field

from nsqshm.nsqd.names import is_valid_name

DEFAULT_CHANNEL = "spark"


class OptionError(ValueError):
    pass


def _int(opts, name, default, minimum=0):
    raw = opts.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise OptionError(f"option {name}={raw!r} must be >= {minimum}")
    return value


def _float(opts, name, default):
    raw = opts.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise OptionError(f"option {name}={raw!r} is not a number") from None
    if value < 0:
        raise OptionError(f"option {name}={raw!r} must be >= 0")
    return value


# JavaUtils.timeStringAsMs's suffixes (a bare number is milliseconds)
TIME_SUFFIXES_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000,
                    "h": 3_600_000, "d": 86_400_000}
TIME_STRING = re.compile(r"([0-9]+)([a-z]+)?")


def _time_ms(opts, name, default):
    """A Spark time string (Kafka's maxTriggerDelay) in milliseconds; name
    as the user writes it (the keys are lower-case)."""
    raw = (opts.get(name.lower()) or default).strip().lower()
    m = TIME_STRING.fullmatch(raw)
    if m is None or (m.group(2) or "ms") not in TIME_SUFFIXES_MS:
        raise OptionError(f"option {name}={raw!r} is not a time (500ms, 30s, 15m, 1h, 1d)")
    return int(int(m.group(1)) * TIME_SUFFIXES_MS[m.group(2) or "ms"])


def _name(kind, value):
    if not is_valid_name(value):
        raise OptionError(f"invalid {kind} name {value!r}")
    return value


@dataclass
class Options:
    topics: list = field(default_factory=list)
    channel: str = DEFAULT_CHANNEL
    data_path: str | None = None
    shm_prefix: str | None = None
    tcp_address: str | None = None
    http_address: str | None = None
    transport: str = "auto"
    max_per_trigger: int = 0
    max_messages: int = 0
    since_ns: int = 0
    latest: bool = False
    partitions: int = 2
    batch_size: int = 65536
    msg_timeout: float = 0.0
    idle_timeout: float = 1.0
    raw: dict = field(default_factory=dict)   # the options as given (lower-case keys)
    # log topics (raw forms, resolved against the logs by logoffsets)
    channel_given: bool = False
    starting_raw: str | None = None
    starting_by_time: str | None = None
    starting_ms: int | None = None
    ending_raw: str | None = None
    ending_by_time: str | None = None
    ending_ms: int | None = None
    min_per_trigger: int = 0
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int = 0
    fail_on_data_loss: bool = True
    include_headers: bool = False
    pattern: re.Pattern | None = None   # subscribePattern: topics found by logtopic.names
    assigned: dict | None = None        # assign: {topic: [partition, ...]}

    @property
    def topic(self):
        return self.topics[0] if self.topics else None


# Kafka's subscription strategies (KafkaSourceProvider.STRATEGY_OPTION_KEYS), with
# nsqshm's `topic`
STRATEGIES = ("topic", "subscribe", "subscribepattern", "assign")
STRATEGY_NAMES = "topic, subscribe, subscribePattern, assign"
ASSIGN_EXAMPLE = '{"topicA":[0,1],"topicB":[0,1]}'


def _assignment(raw):
    """Kafka's assign: {"topic": [partition, ...]} -> {topic: sorted partitions}
    (JsonUtils.partitions' error text for anything else)."""
    if not raw.strip().startswith("{"):
        raise OptionError("No topicpartitions to assign as specified value for option "
                          f"'assign' is '{raw}'")
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(
            isinstance(ps, list) and all(isinstance(p, int) and not isinstance(p, bool)
                                         and p >= 0 for p in ps) for ps in doc.values()):
        raise OptionError(f"Expected e.g. {ASSIGN_EXAMPLE}, got {raw}")
    out = {_name("topic", t): sorted(set(ps)) for t, ps in doc.items() if ps}
    if not out:
        raise OptionError("No topicpartitions to assign as specified value for option "
                          f"'assign' is '{raw}'")
    return out


def _subscription(opts, o, reading):
    """The topics (or the pattern) to read, as Kafka's source checks them."""
    given = [k for k in STRATEGIES if opts.get(k) is not None]
    if len(given) > 1:
        raise OptionError("Only one of the following options can be specified for nsqshm "
                          f"source: {STRATEGY_NAMES}. See the docs for more details.")
    if given == ["assign"]:  # given partitions of log topics (source.log_topics checks them)
        o.assigned = _assignment(opts["assign"])
        o.topics = list(o.assigned)
        return
    if given == ["subscribepattern"]:
        raw = opts["subscribepattern"]
        if not raw.strip():
            raise OptionError("Pattern to subscribe is empty as specified value for option "
                              f"'subscribePattern' is '{raw}'")
        try:
            o.pattern = re.compile(raw.strip())
        except re.error as err:
            raise OptionError(f"option subscribePattern={raw!r} is not a regular expression: "
                              f"{err}") from None
        return
    if not given:
        if reading:
            raise OptionError("One of the following options must be specified for nsqshm "
                              f"source: {STRATEGY_NAMES}. See the docs for more details.")
        return
    raw = opts[given[0]]
    o.topics = [_name("topic", t) for t in (t.strip() for t in raw.split(",")) if t]
    if reading and not o.topics:
        name = "subscribe" if given[0] == "subscribe" else "topic"
        raise OptionError(f"No topics to subscribe to as specified value for option "
                          f"'{name}' is '{raw}'")


def parse(options, reading=True):
    """Options from Spark's option map; OptionError names what is wrong."""
    opts = {str(k).lower(): (None if v is None else str(v)) for k, v in dict(options).items()}
    o = Options()
    o.raw = {k: v for k, v in opts.items() if v}
    _subscription(opts, o, reading)
    o.channel = _name("channel", opts.get("channel") or DEFAULT_CHANNEL)
    o.channel_given = bool(opts.get("channel"))
    o.data_path = opts.get("datapath") or None
    o.shm_prefix = opts.get("shmprefix") or None
    o.tcp_address = opts.get("nsqdtcpaddress") or None
    o.http_address = opts.get("nsqdhttpaddress") or None
    if o.tcp_address and not o.http_address:
        host, _, port = o.tcp_address.rpartition(":")
        if not port.isdigit():
            raise OptionError(f"nsqdTcpAddress {o.tcp_address!r} is not host:port")
        o.http_address = f"{host}:{int(port) + 1}"
    o.transport = (opts.get("transport") or "auto").lower()
    if o.transport not in ("auto", "shm", "tcp"):
        raise OptionError(f"transport {o.transport!r} is not auto, shm or tcp")
    if o.transport == "tcp" and not o.tcp_address:
        raise OptionError("transport tcp needs nsqdTcpAddress")
    for key in ("maxoffsetspertrigger", "maxmessagespertrigger"):
        if opts.get(key):
            o.max_per_trigger = _int(opts, key, 0, 1)
    if opts.get("minoffsetspertrigger"):
        o.min_per_trigger = _int(opts, "minoffsetspertrigger", 0, 1)
    o.max_trigger_delay_ms = _time_ms(opts, "maxTriggerDelay", "15m")
    if opts.get("maxtriggerdelay") and not o.min_per_trigger:
        raise OptionError("maxTriggerDelay applies only with minOffsetsPerTrigger")
    o.min_partitions = _int(opts, "minpartitions", 0, 1) if opts.get("minpartitions") else 0
    fail = (opts.get("failondataloss") or "true").lower()
    if fail not in ("true", "false"):
        raise OptionError(f"failOnDataLoss {fail!r} is not true or false")
    o.fail_on_data_loss = fail == "true"
    headers = (opts.get("includeheaders") or "false").lower()
    if headers not in ("true", "false"):
        raise OptionError(f"includeHeaders {headers!r} is not true or false")
    o.include_headers = headers == "true"
    o.starting_raw = opts.get("startingoffsets") or None
    o.starting_by_time = opts.get("startingoffsetsbytimestamp") or None
    o.ending_raw = opts.get("endingoffsets") or None
    o.ending_by_time = opts.get("endingoffsetsbytimestamp") or None
    if opts.get("startingtimestamp"):
        o.starting_ms = _int(opts, "startingtimestamp", 0)
    if opts.get("endingtimestamp"):
        o.ending_ms = _int(opts, "endingtimestamp", 0)
    o.max_messages = _int(opts, "maxmessages", 0, 1) if opts.get("maxmessages") else 0
    starting = (opts.get("startingoffsets") or "earliest").strip().lower()
    if starting not in ("earliest", "latest") and not starting.startswith("{"):
        raise OptionError(f"startingOffsets {starting!r} is not earliest, latest or JSON")
    o.latest = starting == "latest"
    o.since_ns = _int(opts, "startingtimestamp", 0) * 1_000_000
    o.partitions = _int(opts, "numpartitions", 2, 1)
    o.batch_size = _int(opts, "batchsize", 65536, 1)
    o.msg_timeout = _float(opts, "msgtimeout", 0.0)
    o.idle_timeout = _float(opts, "idletimeout", 1.0)
    return o


def starting_ns(o):
    """The publish time before which messages are skipped, fixed when a
    query (or a batch read) starts."""
    return max(o.since_ns, time.time_ns() if o.latest else 0)
