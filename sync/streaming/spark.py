"""The Spark session: local jars only, Delta enabled, UTC, small shuffles.

Every jar comes from build/jvm/spark (resolved ahead of time by Maven); a jar whose
artifact pyspark already ships is left out, so one version of each library is loaded.
Nothing is resolved online when Spark starts.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from sync.config import Settings
from sync.errors import StackError

_VERSION = re.compile(r"-\d[\w.\-]*\.jar$")


def artifact(jar: Path) -> str:
    """'jackson-core-2.13.5.jar' -> 'jackson-core'."""
    return _VERSION.sub("", jar.name)


def spark_jars(settings: Settings) -> list[str]:
    import pyspark

    folder = settings.jars / "spark"
    ours = sorted(folder.glob("*.jar"))
    if not any(j.name.startswith("delta-spark") for j in ours):
        raise StackError(f"the Delta and Kafka jars are missing in {folder}; run `make jars` (needs Maven)")
    shipped = {artifact(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [str(j) for j in ours if artifact(j) not in shipped]


def session(settings: Settings, app_name: str = "lakesync"):
    """A Spark session for the runner, verify and the tests (one per process)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(settings.spark_master)
        .config("spark.jars", ",".join(spark_jars(settings)))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.scheduler.mode", "FAIR")
        # Compiled generated code, by source. The default 100 entries thrash under five
        # queries' plans (a profile of the runner under a trickle: Janino compiling 8.8% of
        # the JVM's CPU; 1.8% with this).
        .config("spark.sql.codegen.cache.maxEntries", "5000")
        # Delta's own settings: its log state is small here; 50 partitions (the default)
        # cost seconds per commit on two cores.
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.databricks.delta.merge.repartitionBeforeWrite.enabled", "true")
        # MERGE would copy its source to disk first (1.3 s of a 3.7 s merge here) to guard
        # against a source that changes between its two passes; ours is a persisted,
        # deterministic function of the batch's offsets.
        .config("spark.databricks.delta.merge.materializeSource", "none")
        .config("spark.sql.warehouse.dir", str(settings.home / "spark-warehouse"))
        .config("spark.driver.extraJavaOptions",
                f"-Duser.timezone=UTC -Dderby.system.home={settings.home / 'derby'}")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
