"""The Spark session every command and test starts: it maps the class archive `make jars` wrote."""

import pytest

from sync import config
from sync.streaming import spark as spark_session

pytestmark = pytest.mark.spark


def test_the_session_maps_the_class_archive_make_jars_wrote(spark):
    archive = spark_session.class_archive(config.load())
    assert archive.is_file(), f"{archive} is missing: `make jars` writes it"
    jvm = spark._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={archive}" in arguments, arguments
    assert "sharing" in jvm.java.lang.System.getProperty("java.vm.info")
