"""One real local[2] SparkSession for the Spark tests (startup is slow), and
real brokers (tests/nsqd/conftest.py's nsqd_factory)."""

import os
import sys

import pytest

from tests.local.conftest import started
from tests.nsqd.conftest import (  # noqa: F401
    nsqd_factory,
    nsqd_workers,
    pytest_generate_tests,
    wait_for,
)


@pytest.fixture(scope="session")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from nsqshm.spark import register

    session = (SparkSession.builder.master("local[2]").appName("nsqshm-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def broker(nsqd_factory):  # noqa: F811
    return started(nsqd_factory("--mem-queue-size=200000"))


def read_options(broker, **extra):
    return {"shmPrefix": broker.prefix, **extra}
