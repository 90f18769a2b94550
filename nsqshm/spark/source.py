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
string, channel string.  Options: nsqshm.spark.options.
"""

from pyspark.sql.datasource import DataSource

from nsqshm.spark.options import parse
from nsqshm.spark.schema import SCHEMA


class NsqshmDataSource(DataSource):
    @classmethod
    def name(cls):
        return "nsqshm"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        from nsqshm.spark.batch_read import BatchReader

        return BatchReader(parse(self.options))

    def streamReader(self, schema):
        from nsqshm.spark.stream import StreamReader

        return StreamReader(parse(self.options))

    def writer(self, schema, overwrite):
        from nsqshm.spark.write import Writer

        return Writer(parse(self.options, reading=False), schema)

    def streamWriter(self, schema, overwrite):
        from nsqshm.spark.write import StreamWriter

        return StreamWriter(parse(self.options, reading=False), schema)
