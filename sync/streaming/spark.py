"""The Spark session: local jars only, Delta enabled, UTC, small shuffles; and `one_of`.

Every jar comes from build/jvm/spark (resolved ahead of time by Maven); a jar whose
artifact pyspark already ships is left out, so one version of each library is loaded.
Nothing is resolved online when Spark starts.

Every Spark process (the runner, a rebuild, verify, the tests' session) starts a JVM that
loads and verifies some 16,000 classes of Spark, Delta and Kafka before its first batch.
`make jars` records them once in a class archive (`archive_classes`: the JVM's
class-data sharing, written by a session doing what the projections do), and every
session maps it instead: from start to the first Delta write and read back 12.4 s
without, 9.0 s with (docs/benchmark.md). A JDK or jar that no longer matches the archive
makes the JVM ignore it silently (the logging options below), and start as it would
without.
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from functools import lru_cache
from typing import TYPE_CHECKING, Callable, Iterable, TypeVar

from sync import lake
from sync.config import PROJECTIONS, Settings
from sync.errors import StackError
from sync.stack.jvm import QUIET_CDS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

_VERSION = re.compile(r"-\d[\w.\-]*\.jar$")
Built = TypeVar("Built")


def artifact(jar: Path) -> str:
    """'jackson-core-2.13.5.jar' -> 'jackson-core'."""
    return _VERSION.sub("", jar.name)


def hadoop_file_system_jar(settings: Settings) -> Path:
    """jvm/hadoop's jar: the file: scheme without a process per file."""
    return settings.jars / "spark" / "lakesync-hadoop.jar"


def spark_jars(settings: Settings) -> list[str]:
    import pyspark

    folder = settings.jars / "spark"
    ours = sorted(folder.glob("*.jar"))
    if not any(j.name.startswith("delta-spark") for j in ours) or not hadoop_file_system_jar(settings).is_file():
        raise StackError(f"the Delta, Kafka or Lakesync jars are missing in {folder}; run `make jars` (needs Maven)")
    shipped = {artifact(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [str(j) for j in ours if artifact(j) not in shipped]


def class_archive(settings: Settings) -> Path:
    return settings.jars / "spark-classes.jsa"


# The JIT compiles a method after 4 times the calls and loops it would by default. A Spark
# process runs so much of Spark's, Catalyst's and Delta's code a few times each that, in
# small batches, the compiler threads took 56% of the JVM's CPU over its first 2.5
# minutes (C2 42%, C1 15%), still some 3,400 compilations per 15 s at the end; with
# this, 47%, the process 11% less CPU, a small batch 7% less, a 50k-change MERGE into
# 1M rows as fast (docs/benchmark.md). Hot methods still reach C2, later.
JIT_OPTIONS = "-XX:CompileThresholdScaling=4"


CODE_FACTORY = "spark.sql.codegen.factoryMode"
# Projections made per task (a shuffle's partition key, a stage not fused into one
# generated function, Delta's replay of its log over the nested schema of its actions):
# generated, Spark writes and formats each one's Java source again in every task before it
# finds the compiled class in its cache, a fixed cost per task that is most of a small
# batch's; interpreted, each row costs more. So a session starts INTERPRETED, and a batch
# function switches its sessions to GENERATED for a large batch (sync/streaming/batch.py
# `code_for`; where the two cross, per projection, in docs/benchmark.md). Spark documents
# the setting as internal, for its tests; 4.2 reads it everywhere
# (CodeGeneratorWithInterpretedFallback), in a task from its job's SQL settings, so a
# session may change it between batches. Whole-stage code generation is unchanged.
INTERPRETED = "NO_CODEGEN"
GENERATED = "FALLBACK"  # (generated, interpreted only where it does not compile)


# The FAIR scheduler's pools, one per projection (the runner's queries and the rebuild's
# each set theirs), declared as Spark would make them (FIFO within, weight 1, no minimum
# share): a pool not declared is made all the same on its first job, but with a warning
# in the log that it "has not been configured".
POOLS = ("<?xml version=\"1.0\"?>\n<allocations>\n"
         + "".join(f'  <pool name="{name}"><schedulingMode>FIFO</schedulingMode><weight>1</weight>'
                   "<minShare>0</minShare></pool>\n" for name in PROJECTIONS)
         + "</allocations>\n")


def pools_file(settings: Settings) -> Path:
    """The pools' allocation file, in the stack's home, written when it differs."""
    path = settings.home / "spark-pools.xml"
    if not path.is_file() or path.read_text() != POOLS:
        path.parent.mkdir(parents=True, exist_ok=True)
        lake.replace_text(path, POOLS)
    return path


def session(settings: Settings, app_name: str = "lakesync", java_options: str = "", console: bool = False):
    """A Spark session for the runner, verify and the tests (one per process). The driver
    JVM maps the class archive, unless `java_options` says otherwise (`archive_classes`).
    Its output (Spark's log lines, the JVM's own warnings) goes to <logs>/<app_name>.log,
    named once on stderr, unless `console` (the runner: its output is its log) or
    `settings.verbose`."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    archive = class_archive(settings)
    if not java_options and archive.exists():
        java_options = f"-XX:SharedArchiveFile={archive} {QUIET_CDS}"
    builder = (
        SparkSession.builder.appName(app_name)
        .master(settings.spark_master)
        .config("spark.jars", ",".join(spark_jars(settings)))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.scheduler.allocation.file", str(pools_file(settings)))
        # Compiled generated code, by source. The default 100 entries thrash under five
        # queries' plans (a profile of the runner under a trickle: Janino compiling 8.8% of
        # the JVM's CPU; 1.8% with this).
        .config("spark.sql.codegen.cache.maxEntries", "5000")
        # PySpark's DataFrame debugging: every call of a PySpark function (F.col, F.when,
        # DataFrame.where, ...) first looks up the active session, reads a setting and sets
        # and clears the JVM's call-site origin, some seven more round trips to the JVM
        # each, so that an analysis error can name the Python line. A mirror's batch makes
        # hundreds of such calls per table (one expression per column); the errors it
        # reports name the table and Spark's message without that line.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        # The plan description every SQL execution posts to the listener bus (and adaptive
        # execution again at each stage it re-plans), the UI off or not: "formatted", the
        # default, prints every operator's output columns again below the tree, and Delta's
        # log replay has 12 nested actions of them. A small mirrors batch's driver threads
        # spent 5% of their samples writing these strings; "simple" is the tree alone: such
        # a batch 2-5% less JVM CPU in two runs (docs/benchmark.md).
        .config("spark.sql.ui.explainMode", "simple")
        # Tungsten's memory page, which every sort and hash-aggregate task allocates whole
        # however few its rows: by default the heap / cores / 16 rounded up (64 MB with a
        # 3 GB driver). Under the demo's workload the runner's old generation grew to 1.9 GB,
        # 1.1 GB of it such pages still live after a full GC, and G1 ran ~90 concurrent
        # cycles; with 2 MB pages 0.6-0.8 GB and ~17 (docs/benchmark.md). A larger record
        # still gets a page of its own size.
        .config("spark.buffer.pageSize", "2m")
        .config(CODE_FACTORY, INTERPRETED)  # (see CODE_FACTORY)
        # Delta's own settings: its log state is small here; 50 partitions (the default)
        # cost seconds per commit on two cores.
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.databricks.delta.merge.repartitionBeforeWrite.enabled", "true")
        # MERGE would copy its source to disk first (1.3 s of a 3.7 s merge here) to guard
        # against a source that changes between its two passes; ours is a persisted,
        # deterministic function of the batch's offsets.
        .config("spark.databricks.delta.merge.materializeSource", "none")
        # The file: scheme without a forked process per file created or renamed (jvm/hadoop): a
        # Delta commit forked about a dozen (chmod, readlink), 17-25 ms each on two busy cores.
        .config("spark.driver.extraClassPath", str(hadoop_file_system_jar(settings)))  # before spark.jars load
        .config("spark.hadoop.fs.file.impl", "io.lakesync.hadoop.NoForkLocalFileSystem")
        .config("spark.hadoop.fs.AbstractFileSystem.file.impl", "io.lakesync.hadoop.NoForkLocalFs")
        .config("spark.sql.warehouse.dir", str(settings.home / "spark-warehouse"))
        .config("spark.driver.extraJavaOptions",
                f"-Duser.timezone=UTC -Dderby.system.home={settings.home / 'derby'} {JIT_OPTIONS} {java_options}")
    )
    if lake.on_object_storage(settings.lake):  # S3A's endpoint, region and credentials (sync/lake.py)
        for key, value in lake.s3a_options().items():
            builder = builder.config(f"spark.hadoop.{key}", value)
    if settings.spark_workers:
        builder = builder.config("spark.cores.max", str(cluster_cores(settings, app_name)))
    if console or settings.verbose or SparkContext._active_spark_context is not None:  # (JVM already up)
        spark = builder.getOrCreate()
    else:
        log = settings.logs / f"{app_name}.log"
        with _output_to(log):
            spark = builder.getOrCreate()
        print(f"(Spark's log: {log})", file=sys.stderr)
    spark.sparkContext.setLogLevel("WARN")
    return spark


RUNNER_APP = "lakesync-runner"
BENCH_CLUSTER_APP = "lakesync-bench-cluster"  # the bench's step 6, alone on a cluster of its own


def cluster_cores(settings: Settings, app_name: str) -> int:
    """The cores an application takes of the cluster `up` starts (spark.cores.max): a
    standalone master gives the first application every core, and the next one none until
    it ends. So the runner takes all but one, which verify, rebuild or bench beside it
    take (with a single core, an application beside the runner waits for it to end). The
    bench's cluster arm, alone on a cluster it started, takes all."""
    cores = settings.spark_workers * settings.spark_worker_cores
    if app_name == BENCH_CLUSTER_APP:
        return cores
    return max(1, cores - 1) if app_name == RUNNER_APP else 1


@contextmanager
def _output_to(log: Path):
    """The process' stdout and stderr into `log` (appended) while the driver JVM starts:
    the JVM inherits them, and keeps writing there for its whole life, whatever its log
    configuration prints to the console; this process gets its own back after."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "ab") as file:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def archive_classes(settings: Settings) -> Path:
    """Write the class archive (`make jars`): a session on the same class path as every
    later one, doing what the projections do (a Kafka stream planned, Delta created,
    appended to with a transaction id, merged into, streamed from, read back), records
    every class it loaded as its JVM exits."""
    import shutil
    import tempfile

    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    archive = class_archive(settings)
    archive.unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lakesync-classes-"))
    spark = session(replace(settings, home=work), "lakesync-classes",
                    f"-XX:ArchiveClassesAtExit={archive} {QUIET_CDS}")
    try:
        table, copy = str(work / "table"), str(work / "copy")
        (spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
         .option("subscribePattern", "classes").load()
         .select(F.get_json_object(F.col("value").cast("string"), "$.payload.op")).schema)
        rows = spark.range(100).select("id", F.to_json(F.struct("id")).alias("value"))
        (rows.select("id", F.from_json("value", "id bigint").alias("parsed"), F.current_timestamp().alias("at"))
         .write.format("delta").option("txnAppId", "classes").option("txnVersion", 1).save(table))
        changes = spark.range(50, 150).select("id", F.lit(None).cast("struct<id:bigint>").alias("parsed"),
                                              F.current_timestamp().alias("at"))
        latest = changes.groupBy("id").agg(F.max_by("parsed", "at").alias("parsed"), F.max("at").alias("at"))
        (DeltaTable.forPath(spark, table).alias("t").merge(latest.localCheckpoint().alias("s"), "t.id = s.id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        query = (spark.readStream.format("delta").load(table).writeStream.trigger(availableNow=True)
                 .option("checkpointLocation", str(work / "checkpoint"))
                 .foreachBatch(lambda batch, _: batch.write.format("delta").mode("append").save(copy)).start())
        query.awaitTermination()
        spark.read.format("delta").load(copy).join(spark.read.format("delta").load(table), "id").count()
    finally:
        jvm = spark.sparkContext._gateway.proc
        spark.stop()
        jvm.stdin.close()  # the JVM exits when its parent's pipe closes, writing the archive:
        jvm.wait()         # wait for it, so no later JVM maps a half-written one
        shutil.rmtree(work, ignore_errors=True)
    return archive


def expressions(build: Callable[..., Built]) -> Callable[..., Built]:
    """`build`, which makes Spark columns (expressions) from hashable arguments such as a
    table's keys and columns, computed once per distinct arguments and kept: each PySpark
    function is a call into the JVM, and each proxy it leaves another when it is
    collected, some 2,000 per table in every batch when a batch's plans were built anew.
    A column is an unresolved expression, tied to no DataFrame or session, so one made
    for an earlier batch serves the next. What is returned is shared: not to be changed."""
    return lru_cache(maxsize=1024)(build)


def one_of(column: str, values: Iterable[str | int]) -> Column:
    """`column IN (values)` (strings or integers), built as one SQL expression: PySpark's
    `isin` makes one call into the JVM per value, a third of a millisecond each (7 s for
    the 21,600 source transactions one catch-up batch held)."""
    from pyspark.sql import functions as F

    literals = [str(v) if isinstance(v, int) else "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"
                for v in values]
    if not literals:
        return F.lit(False)
    return F.expr(f"`{column.replace('`', '``')}` IN ({', '.join(literals)})")


def in_task_slots(frame: DataFrame) -> DataFrame:
    """`frame` in at most as many partitions as Spark has task slots (merged, no shuffle).
    A task's fixed cost is the same whether its partition holds a thousand rows or none
    (mostly its projections' code written again before the cache of compiled code is
    looked up: CodegenContext.splitExpressions), and a Kafka batch has a partition per
    topic partition, most of them empty or nearly so; each pass over it pays for all."""
    return frame.coalesce(frame.sparkSession.sparkContext.defaultParallelism)


if __name__ == "__main__":  # make jars
    from sync.config import load

    print(f"class archive: {archive_classes(load())}")
