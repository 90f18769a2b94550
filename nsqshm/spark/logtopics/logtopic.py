"""A log topic as the Spark source sees it (docs/logtopics.md): its
partitions and their offsets, found in the broker's data path when the
broker is on this host (the partition logs are read there, through mmap),
else through its HTTP API.

    LogTopic.find(o, topic)      None for a classic topic
    LogTopic.names(o)            every log topic's name (subscribePattern)
    .partitions                  the partition count
    .offsets()                   {partition: (start, end)} msg offsets now
    .offset_for_time(p, ms)      the first offset at or after ms since the epoch
"""

from urllib.parse import quote

from nsqshm.nsqd.logtopics.logspecs import find_spec, load_specs
from nsqshm.spark.connect import http_json, local_broker, topic_is_ext
from nsqshm.spark.options import OptionError
from nsqshm.youzan.offset import count_of, offset_of_count


def _stats(address, topic):
    doc = http_json(address, f"/stats?format=json&topic={quote(topic, safe='')}")
    for t in doc.get("topics") or []:
        if t.get("topic_name") == topic:
            return t
    return None


class LogTopic:
    def __init__(self, name, partitions, data_path=None, http_address=None, tcp_address=None,
                 ext=False, ordered=False):
        self.name = name
        self.partitions = partitions
        self.ext = ext                      # made with ext=true: records carry headers
        self.ordered = ordered              # orderedmulti: publishes name their partition
        self.data_path = data_path          # set: the logs are on this host
        self.http_address = http_address
        self.tcp_address = tcp_address
        self.assigned = None                # Kafka's assign: the partitions read (None: all)
        self._readers = {}

    def __getstate__(self):
        return {**self.__dict__, "_readers": {}}

    @classmethod
    def find(cls, o, topic):
        """The log topic `topic` of the broker options `o` name, or None when
        it is a classic topic (or does not exist yet)."""
        broker = local_broker(o)
        if broker is not None:
            data_path = broker.info.get("data_path")
            spec = find_spec(data_path, topic)
            if spec is None:
                return None
            return cls(topic, int(spec["partition_num"]), data_path=data_path,
                       http_address=o.http_address or broker.http_address,
                       tcp_address=o.tcp_address or broker.info.get("tcp_address"),
                       ext=topic_is_ext(o, topic, broker), ordered=bool(spec.get("ordered")))
        if not o.http_address:
            raise OptionError("a broker not on this host needs nsqdHttpAddress")
        t = _stats(o.http_address, topic)
        if t is None or "partitions" not in t:
            return None
        return cls(topic, len(t["partitions"]), http_address=o.http_address,
                   tcp_address=o.tcp_address, ext=bool(t.get("is_ext")),
                   ordered=bool(t.get("ordered")))

    @staticmethod
    def names(o):
        """The names of the broker's log topics: from its data path on this
        host, else from its /stats."""
        broker = local_broker(o)
        if broker is not None:
            return [spec["name"] for spec in load_specs(broker.info.get("data_path"))
                    if spec.get("name")]
        if not o.http_address:
            raise OptionError("a broker not on this host needs nsqdHttpAddress")
        doc = http_json(o.http_address, "/stats?format=json&include_clients=false")
        return [t["topic_name"] for t in doc.get("topics") or [] if "partitions" in t]

    @property
    def local(self):
        """The driver found the broker on its host; an executor checks its own
        (reader() is None there when the logs are not on its host)."""
        return self.data_path is not None

    # -- the logs on this host ------------------------------------------------------------

    def reader(self, partition):
        """The partition's LogReader (None while its owner has not made the log)."""
        from nsqshm._core.commitlog import LogError, LogReader, partition_dir

        r = self._readers.get(partition)
        if r is None:
            try:
                r = LogReader(partition_dir(self.data_path, self.name, partition))
            except (OSError, LogError):
                return None
            self._readers[partition] = r
        return r

    def close(self):
        for r in self._readers.values():
            r.close()
        self._readers = {}

    # -- positions -------------------------------------------------------------------------

    def offsets(self):
        """{partition: (start, end)}: what each log read holds now (with
        assign, only the partitions assigned)."""
        if self.local:
            out = {}
            for p in range(self.partitions):
                if self.assigned is None or p in self.assigned:
                    r = self.reader(p)
                    out[p] = (r.start_offset, r.end_offset) if r is not None else (0, 0)
            return out
        t = _stats(self.http_address, self.name)
        if t is None:
            raise OptionError(f"log topic {self.name!r} is gone")
        return {int(e["partition"]): (int(e["start_offset"]), int(e["end_offset"]))
                for e in t.get("partitions") or []
                if self.assigned is None or int(e["partition"]) in self.assigned}

    def offset_for_time(self, partition, ms):
        """The first msg offset whose message was published at or after `ms`
        (ms since the epoch); the end offset when there is none.  Remote: the
        broker's /message/get searches by whole seconds, so the result is
        refined by reading the messages of that second."""
        if self.local:
            r = self.reader(partition)
            if r is None:
                return 0
            return max(r.start_offset, r.find_offset_by_time(int(ms) * 1_000_000))
        return self._remote_offset_for_time(partition, ms)

    def _remote_offset_for_time(self, partition, ms):
        start, end = self.offsets()[partition]
        offset = self._message_get(partition, "timestamp", int(ms) // 1000)
        if offset is None:
            return end
        offset = max(offset, start)
        while offset < end:  # step over the same second's earlier messages
            msg = self._message_get_doc(partition, "count", count_of(offset))
            if msg is None or int(msg["timestamp"]) >= int(ms) * 1_000_000:
                break
            offset += 1
        return offset

    def _message_get_doc(self, partition, mode, pos):
        import urllib.error

        try:
            return http_json(self.http_address,
                             f"/message/get?topic={quote(self.name, safe='')}"
                             f"&partition={partition}&search_mode={mode}&search_pos={pos}")
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise

    def _message_get(self, partition, mode, pos):
        doc = self._message_get_doc(partition, mode, pos)
        return None if doc is None else offset_of_count(int(doc["queue_cnt_index"]))
