"""Spark integration: the "nsqshm" Python data source (batch and streaming
reads and writes, shared memory when the broker is local, TCP otherwise).
See docs/spark.md."""

from nsqshm.spark.source import NsqshmDataSource


def register(spark):
    """Register the "nsqshm" format with a SparkSession."""
    spark.dataSource.register(NsqshmDataSource)


__all__ = ["NsqshmDataSource", "register"]
