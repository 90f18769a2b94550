"""The PySpark data source "nsqshm" (PySpark 4.3's Python Data Source API).

    from nsqshm.spark import NsqshmDataSource
    spark.dataSource.register(NsqshmDataSource)

    df = spark.read.format("nsqshm").option("topic", "events") \\
        .option("dataPath", "/var/lib/nsq").load()                  # what is queued now
    stream = spark.readStream.format("nsqshm").option("topic", "events") \\
        .option("shmPrefix", "nsqshm.0123456789ab") \\
        .option("maxMessagesPerTrigger", 100000).load()
    df.select("body").write.format("nsqshm").option("topic", "out") \\
        .option("dataPath", "/var/lib/nsq").mode("append").save()

Rows: body binary, id string, timestamp timestamp, attempts int, topic
string, channel string; a log topic's rows add partition int, offset long
(and are read by offset ranges: logbatch, logstream); includeHeaders adds
headers array<struct<key string, value binary>> (an ext topic's headers).
Options: nsqshm.spark.options.
"""

from pyspark.sql.datasource import DataSource

from nsqshm.spark.logtopics.logtopic import LogTopic
from nsqshm.spark.options import OptionError, parse
from nsqshm.spark.schema import schema_of

LOG_ONLY = ("assign", "startingOffsetsByTimestamp", "endingOffsets", "endingOffsetsByTimestamp",
            "endingTimestamp", "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions",
            "failOnDataLoss")


def log_topics(o):
    """{topic: LogTopic} when every topic read is a log topic, {} when none
    is; reading both kinds in one query is refused.  subscribePattern: the
    log topics whose whole name it matches now (Kafka's consumer also picks
    up topics made later; here a query reads those it found at its start)."""
    if o.pattern is not None:
        o.topics = sorted(n for n in LogTopic.names(o) if o.pattern.fullmatch(n))
        if not o.topics:
            raise OptionError(f"subscribePattern {o.pattern.pattern!r} matches no log topic")
    found = {t: LogTopic.find(o, t) for t in o.topics}
    logs = {t: lt for t, lt in found.items() if lt is not None}
    if logs and len(logs) != len(found):
        classic = sorted(t for t, lt in found.items() if lt is None)
        raise OptionError(f"topics {sorted(logs)} are log topics and {classic} are not: "
                          "read them in separate queries")
    if logs and o.assigned is not None:
        for t, parts in o.assigned.items():
            lt = logs[t]
            beyond = [p for p in parts if p >= lt.partitions]
            if beyond:
                raise OptionError(f"assign names partitions {beyond} of log topic {t!r}, which "
                                  f"has partitions 0..{lt.partitions - 1}")
            lt.assigned = frozenset(parts)
    if not logs:
        given = {k.lower() for k in o.raw}
        used = [k for k in LOG_ONLY if k.lower() in given]
        if used or (o.starting_raw or "").lstrip().startswith("{"):
            raise OptionError(f"{used or ['startingOffsets JSON']} need a log topic "
                              f"(topic/create?partition_num=N); {o.topics} are classic topics")
    return logs


class NsqshmDataSource(DataSource):
    @classmethod
    def name(cls):
        return "nsqshm"

    def schema(self):
        o = parse(self.options)
        return schema_of(bool(log_topics(o)), o.include_headers)

    def reader(self, schema):
        o = parse(self.options)
        logs = log_topics(o)
        if logs:
            from nsqshm.spark.logtopics.logbatch import LogBatchReader

            return LogBatchReader(o, logs)
        from nsqshm.spark.batch_read import BatchReader

        return BatchReader(o)

    def streamReader(self, schema):
        o = parse(self.options)
        logs = log_topics(o)
        if logs:
            from nsqshm.spark.logtopics.logstream import LogStreamReader

            return LogStreamReader(o, logs)
        from nsqshm.spark.stream import StreamReader

        return StreamReader(o)

    def writer(self, schema, overwrite):
        from nsqshm.spark.write import Writer

        return Writer(parse(self.options, reading=False), schema)

    def streamWriter(self, schema, overwrite):
        from nsqshm.spark.write import StreamWriter

        return StreamWriter(parse(self.options, reading=False), schema)
