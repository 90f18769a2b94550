"""The row schema of the "nsqshm" source (the Arrow form: nsqshm.local.arrow)."""

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA = StructType([
    StructField("body", BinaryType()),
    StructField("id", StringType()),
    StructField("timestamp", TimestampType()),
    StructField("attempts", IntegerType()),
    StructField("topic", StringType()),
    StructField("channel", StringType()),
])

# a log topic's rows add where each message is in its log (Kafka's columns)
LOG_SCHEMA = StructType([*SCHEMA.fields,
                         StructField("partition", IntegerType()),
                         StructField("offset", LongType())])

# includeHeaders: Kafka's headers column (KafkaRecordToRowConverter.headersType)
HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()),
                                     StructField("value", BinaryType())]))


def schema_of(log, include_headers):
    base = LOG_SCHEMA if log else SCHEMA
    if not include_headers:
        return base
    return StructType([*base.fields, StructField("headers", HEADERS_TYPE)])
