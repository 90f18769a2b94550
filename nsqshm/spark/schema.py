"""The row schema of the "nsqshm" source (the Arrow form: nsqshm.local.arrow)."""

from pyspark.sql.types import (
    BinaryType,
    IntegerType,
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
