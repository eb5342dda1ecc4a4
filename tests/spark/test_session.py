"""The Spark session every command and test starts (it maps the class archive `make jars` wrote), and `one_of`."""

import time

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


def test_every_projections_scheduler_pool_is_declared(spark):
    """The FAIR scheduler's pools are declared (`POOLS`): one not declared would be made on
    its first job with a warning in the runner's log."""
    scheduler = spark.sparkContext._jsc.sc()
    for name in config.PROJECTIONS:
        pool = scheduler.getPoolForName(name)
        assert pool.isDefined(), name
        assert (pool.get().schedulingMode().toString(), pool.get().weight(), pool.get().minShare()) == ("FIFO", 1, 0)


def test_the_lake_is_written_without_a_process_per_file_as_hadoop_would(spark, tmp_path):
    """jvm/hadoop: the file: scheme's two file systems (FileSystem for Spark and Parquet,
    FileContext for Delta's commits and the streaming checkpoints) set permissions and tell
    links apart without forking chmod and readlink, and otherwise behave as Hadoop's own: a
    file gets the default mode under the umask, a rename never replaces what exists (Delta's
    commit protocol rests on it), and a path through a symbolic link is followed."""
    jvm, gateway = spark._jvm, spark.sparkContext._gateway
    hadoop = jvm.org.apache.hadoop.fs
    conf = spark._jsc.hadoopConfiguration()
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    folder = hadoop.Path((tmp_path / "linked").as_uri())
    assert folder.getFileSystem(conf).getRawFileSystem().getClass().getName() == "io.lakesync.hadoop.NoForkRawLocalFileSystem"
    context = hadoop.FileContext.getFileContext(folder.toUri(), conf)
    assert context.getDefaultFileSystem().getClass().getName() == "io.lakesync.hadoop.NoForkLocalFs"

    def create(name: str):
        flags = jvm.java.util.EnumSet.of(hadoop.CreateFlag.CREATE)
        stream = context.create(hadoop.Path(folder, name), flags, gateway.new_array(hadoop.Options.CreateOpts, 0))
        stream.write(bytearray(b"x"))
        stream.close()

    create("a")
    create("b")
    assert (tmp_path / "real" / "a").stat().st_mode & 0o777 == 0o644
    no_overwrite = gateway.new_array(hadoop.Options.Rename, 1)
    no_overwrite[0] = hadoop.Options.Rename.NONE
    with pytest.raises(Exception, match="FileAlreadyExists"):
        context.rename(hadoop.Path(folder, "a"), hadoop.Path(folder, "b"), no_overwrite)
    context.rename(hadoop.Path(folder, "a"), hadoop.Path(folder, "c"), no_overwrite)
    assert sorted(p.name for p in (tmp_path / "real").iterdir() if not p.name.endswith(".crc")) == ["b", "c"]

    table = str(tmp_path / "linked" / "table")
    spark.range(3).write.format("delta").save(table)
    spark.range(3, 5).write.format("delta").mode("append").save(table)
    assert sorted(r.id for r in spark.read.format("delta").load(table).collect()) == [0, 1, 2, 3, 4]


def test_one_of_selects_what_isin_selects_built_in_one_call(spark):
    rows = spark.createDataFrame([("it's",), ("back\\slash",), ("plain",), (None,), ("'; DROP",)], "v string")
    for wanted in (["it's", "back\\slash"], ["'; DROP", "absent"], []):
        assert sorted(r.v for r in rows.where(spark_session.one_of("v", wanted)).collect()) == \
            sorted(r.v for r in rows.where(rows.v.isin(wanted)).collect()), wanted
    numbers = spark.range(10)
    assert [r.id for r in numbers.where(spark_session.one_of("id", [3, 7, 11])).collect()] == [3, 7]
    assert numbers.where(~spark_session.one_of("id", [])).count() == 10
    # Thousands of values, as a batch may hold, in well under the seconds isin takes.
    many = [str(n) for n in range(20_000)]
    started = time.monotonic()
    condition = spark_session.one_of("v", many)
    assert time.monotonic() - started < 1
    assert rows.where(condition).count() == 0
