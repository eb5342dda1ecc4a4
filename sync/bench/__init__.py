"""`lakesync bench`: how close Lakesync comes to this machine's ceiling, and to its peers.

One run, on the embedded stack named by the environment (`make bench` gives it its own
home and ports), in this order so no two Spark drivers compete while one is timed:
  1. Stack up; the demo schema seeded; the runner started and brought fresh. Then the
     small-change latency: one customer row updated on the idle stack, timed until the
     freshness barrier returns (every projection fresh), SMALL_CHANGES times.
  2. Freshness: a steady load (`--rate` change events/s for `--seconds`, bank transfers
     beside it) with the runner applying as it goes; the barrier; the freshness read
     from the tables at once (sync/bench/latency.py). Then, the load going on, OPTIMIZE
     compacts the orders mirror from this process while the runner writes it (a conflict
     would fail the runner: it is reported). Then the barrier.
  3. Capture: the runner stopped and the connector paused, a backlog of `--events`
     change events (plus transfers) is written to Postgres; the connector resumes and
     the clock runs until it has captured up to the WAL position after the backlog.
  4. Apply per projection kind: the runner starts on that backlog; each projection's
     clock stops when its checkpoint covers what its inputs held. The barrier, then
     `verify` against Postgres: the figures count only if the result is right.
  5. With the runner stopped, in this process' Spark session, over the same records
     (the mirrors' topics from offset zero): the ceiling (read and drop), our rebuild of
     the mirrors from offset zero (a new generation, thrown away after), and the merge
     rate against mirrors of each `--sizes` row count.
  6. The same on a Spark standalone cluster (`--workers` N, 0 skips it): this process'
     session stopped, a master and N one-core workers started on this machine
     (sync/stack/spark_cluster.py), the ceiling, the rebuild and the merge rate into a
     1M-row mirror measured again with the driver on the cluster, the cluster stopped.
  7. The hand-written peer (confluent-kafka + delta-rs MERGE) over the same records; its
     row counts are checked against Postgres.
  8. Spark Declarative Pipelines' AUTO CDC flow: it cannot run on open-source Spark 4.2
     with Delta (SDP_REASON); the JSON says why instead of a figure.
  9. JSON, markdown table and plots written to bench/results (sync/bench/report.py).
"""

from __future__ import annotations

import dataclasses
import random
import re
import shutil
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from sync.config import ROOT, Settings
from sync.errors import LakesyncError
from sync.projection import KafkaTopics
from sync.stack.background import start_background, stop_background
from sync.stack.capture import BARRIER_ROW, touch_heartbeat

RESULTS = ROOT / "bench" / "results"
DEFAULT_SIZES = [100_000, 1_000_000, 10_000_000]
APPLY_ROWS = 1_000_000  # the mirror size `apply_events_per_s` is measured at
DEFAULT_WORKERS = 2  # step 6's cluster: one worker per core of the machine the bench was made on
SMALL_CHANGES = 7  # one-row changes timed on the idle stack (step 1)
ALL_TOPICS = r"lakesync\.(public|events)\..+"  # every captured table and every outbox event topic


class BenchFailed(LakesyncError):
    exit_code = 1


def run(settings: Settings, events: int, rate: float, seconds: float, sizes: list[int], merge_batch: int,
        json_path: Path | None, workers: int = DEFAULT_WORKERS, say=print) -> dict:
    from sync import stack
    from sync.bench import report

    workdir = settings.home / "bench"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    figures: dict = {"machine": report.machine(), "events": events,
                     "taken_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     # the mirrors, the changelog and the ledger hold what is not a whole source transaction yet
                     "whole_transactions": settings.whole_transactions,
                     "topic_partitions": settings.topic_partitions}  # of each table and event topic
    say(f"1/9 stack up in {settings.home}; seeding; runner started")
    stack.up(settings, say=lambda text: None)
    _seed(settings)
    _runner(settings, start=True)
    _barrier(settings)
    figures.update(_small_change_latency(settings, say))

    say(f"2/9 freshness: {rate:,.0f} change events/s for {seconds:.0f} s; then a mirror compacted under that load")
    window, figures["steady_events_per_s"] = _steady(settings, rate, seconds, say)
    _barrier(settings)
    delays = _freshness(settings, window, figures, say)
    figures["compaction"] = _compaction_under_load(settings, rate, seconds, say)
    _barrier(settings)
    _runner(settings, start=False)

    say(f"3/9 capture: a backlog of {events:,} change events, the connector paused meanwhile")
    backlog, capture = _capture(settings, events, say)
    figures.update(capture)

    say("4/9 apply: the runner catches up on the backlog, each projection timed; then verify")
    figures["apply_by_kind"] = _catch_up(settings, backlog, say)
    _barrier(settings)
    figures["verified"] = _verify(settings)
    _runner(settings, start=False)

    say("5/9 ceiling, rebuild and merge scaling, in one Spark session")
    from sync.streaming import spark as spark_session

    spark = spark_session.session(settings, "lakesync-bench")
    replay = _replay_ranges(settings)
    figures.update(_spark_figures(spark, settings, replay, sizes, merge_batch, workdir, say))

    say(f"6/9 the same on a Spark standalone cluster of {workers} workers on this machine")
    figures["cluster"] = _on_cluster(spark, settings, replay, merge_batch, workers, workdir, say)

    say("7/9 the hand-written peer: confluent-kafka + delta-rs MERGE, same records")
    figures.update(_peer(settings, replay, workdir, say))

    say("8/9 Spark Declarative Pipelines' AUTO CDC flow")
    figures.update(_sdp(say))

    say("9/9 writing bench/results")
    result = report.summarise(figures)
    for path in report.write(result, RESULTS, json_path, delays):
        say(f"  wrote {path}")
    say(report.markdown(result))
    return result


def _seed(settings: Settings) -> None:
    from sqlalchemy.orm import Session

    from sync import config, demo
    from sync.config import ROLES
    from sync.demo import bank, schema

    schema.create(settings)
    rng = random.Random(7)
    with demo.app_connect(settings) as conn:
        conn.autocommit = True
        demo.seed(conn, rng, customers=2_000, products=200, orders=1_000)
    engine = bank.engine(config.role_dsn(settings, ROLES["app"]))
    with Session(engine) as session:
        demo.open_accounts(session, rng)
    engine.dispose()


def _runner(settings: Settings, start: bool) -> None:
    if start:
        start_background(settings)
    else:
        stop_background(settings)


def _runner_running(settings: Settings) -> bool:
    from sync.stack.process import read_pid

    return read_pid(settings.runner_pidfile) is not None


def _barrier(settings: Settings) -> None:
    from sync.commands import freshness

    freshness.wait(settings, timeout=1800)


def _small_change_latency(settings: Settings, say) -> dict:
    """Step 1: one row committed, on a stack with nothing else to do, until `wait` returns;
    a customer, so the change goes through the mirrors, the changelog and the views."""
    from sync import demo
    from sync.bench import report

    seconds = []
    with demo.app_connect(settings) as conn:
        conn.autocommit = True
        for run in range(SMALL_CHANGES):
            started = time.monotonic()
            conn.execute("UPDATE customers SET tier = %s, updated_at = now() WHERE id = %s",
                         (("gold", "silver")[run % 2], 1 + run))
            _barrier(settings)
            seconds.append(round(time.monotonic() - started, 3))
    p50 = round(report.percentile(seconds, 50), 3)
    say(f"  small change until fresh: p50 {p50} s ({', '.join(map(str, seconds))} s)")
    return {"small_change_latency_p50_s": p50, "small_change_latency_runs_s": seconds}


def _steady(settings: Settings, rate: float, seconds: float, say) -> tuple[tuple[datetime, datetime], float]:
    """Step 2: the paced load, bank transfers beside it."""
    from sync import demo
    from sync.bench.workload import Load

    transfers = threading.Thread(target=demo.bank_clients, args=(settings, 11),
                                 kwargs={"clients": 1, "operations": int(seconds * 5)})
    start = datetime.now(timezone.utc)
    with demo.app_connect(settings) as conn:
        transfers.start()
        counts = Load(conn, random.Random(1)).steady(rate, seconds)
    end = datetime.now(timezone.utc)
    transfers.join()
    achieved = counts.events / (end - start).total_seconds()
    say(f"  {counts.events:,} change events in {(end - start).total_seconds():.0f} s ({achieved:,.0f}/s)")
    return (start, end), round(achieved)


def _compaction_under_load(settings: Settings, rate: float, seconds: float, say) -> dict:
    """Step 2, after the measured window: OPTIMIZE a mirror while the load goes on and the
    runner writes it. A conflict with the live MERGE would fail the runner: a finding,
    reported (and the runner started again), not a crash of the benchmark."""
    from sync import demo
    from sync.bench.workload import Load

    failures: list[BaseException] = []

    def steady(conn) -> None:
        try:
            Load(conn, random.Random(3)).steady(rate, seconds)
        except BaseException as failure:  # re-raised below, not lost with the thread
            failures.append(failure)

    with demo.app_connect(settings) as conn:
        load = threading.Thread(target=steady, args=(conn,))
        load.start()
        compaction = _compact(settings)
        load.join()
    if failures:
        raise failures[0]
    if not _runner_running(settings):
        compaction["runner_failed"] = (settings.logs / "runner.log").read_text().splitlines()[-3:]
        _runner(settings, start=True)
    say(f"  compaction: {compaction}")
    return compaction


def _compact(settings: Settings) -> dict:
    """OPTIMIZE the orders mirror while the runner writes it, from a second Spark driver."""
    from projections.mirrors import mirror_path
    from sync.streaming import spark as spark_session

    spark = spark_session.session(settings, "lakesync-bench")
    path = str(mirror_path(settings, "orders"))
    before = int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"])
    try:
        spark.sql(f"OPTIMIZE delta.`{path}`").collect()
        error = None
    except Exception as failure:  # a conflict with the live MERGE is a finding, not a crash
        error = str(failure).splitlines()[0][:300]
    after = int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["numFiles"])
    return {"table": "mirror.orders", "files_before": before, "files_after": after, "optimize_error": error,
            "runner_alive_after": _runner_running(settings)}


def _capture(settings: Settings, events: int, say) -> tuple[dict, dict]:
    """Step 3. Returns the backlog's Kafka ranges and the capture figures."""
    from sync import demo
    from sync.bench.workload import Load
    from sync.commands import freshness
    from sync.config import CONNECTOR_NAME
    from sync.stack.connect import rest, wait_for_state
    from sync.streaming.offsets import end_offsets

    rest(settings, "PUT", f"/connectors/{CONNECTOR_NAME}/pause")
    try:
        wait_for_state(settings, "PAUSED")
        before = end_offsets(settings, ALL_TOPICS)
        with demo.app_connect(settings) as conn:
            started = time.monotonic()
            counts = Load(conn, random.Random(2)).flat_out(events)
            written = time.monotonic() - started
        demo.bank_clients(settings, 12, clients=1, operations=max(1, events // 1000))
        target = touch_heartbeat(settings, BARRIER_ROW)
    finally:
        rest(settings, "PUT", f"/connectors/{CONNECTOR_NAME}/resume")
    resumed = time.monotonic()
    while freshness.connector_lsn(settings) < target:
        if time.monotonic() - resumed > 3600:
            raise BenchFailed("the connector did not capture the backlog within an hour")
        time.sleep(0.05)
    took = time.monotonic() - resumed
    after = end_offsets(settings, ALL_TOPICS)
    ranges = {tp: (before.get(tp, 0), end) for tp, end in after.items() if end > before.get(tp, 0)}
    records = sum(end - start for start, end in ranges.values())
    captured = records - counts.deletes  # each delete is followed by a tombstone record
    say(f"  Postgres took {counts.events:,} change events in {written:.1f} s; Debezium captured "
        f"{captured:,} records in {took:.1f} s ({captured / took:,.0f}/s)")
    return ranges, {"capture_events_per_s": round(captured / took), "capture_seconds": round(took, 3),
                    "capture_events": captured, "backlog_write_seconds": round(written, 3),
                    "backlog_events": counts.events}


def _catch_up(settings: Settings, backlog: dict, say) -> dict:
    """Step 4: per projection, the seconds from the runner's start until its checkpoint
    covers what its inputs held when it started (the views: once their inputs are done)."""
    from projections.views import projection as views
    from sync.commands import all_projections
    from sync.streaming import offsets, progress

    started = time.monotonic()
    _runner(settings, start=True)
    running = time.monotonic()
    projections = all_projections(settings)
    fed_by_kafka = [p for p in projections if isinstance(p.source(settings), KafkaTopics)]
    goals = {p.name: offsets.input_ends(settings, p) for p in fed_by_kafka}
    done_at: dict[str, float] = {}
    steps: dict[str, dict | None] = {}
    while len(done_at) < len(projections):
        if time.monotonic() - started > 3600:
            raise BenchFailed(f"the runner did not catch up within an hour: {sorted(set(goals) - set(done_at))}")
        if all(p.name in done_at for p in fed_by_kafka):
            # The views read the changelog and the ledger: their goal is those tables, complete.
            goals.update({p.name: offsets.input_ends(settings, p) for p in projections if p.name not in goals})
        for p in projections:
            if p.name in goals and p.name not in done_at:
                done = offsets.processed(settings, p)
                if all(done.get(tp, 0) >= end for tp, end in goals[p.name].items()):
                    done_at[p.name] = time.monotonic()
                    # Where its last catch-up batch's time went (mirrors, views), before
                    # a later batch replaces it.
                    steps[p.name] = progress.read(settings, p.name).get("last_batch_steps")
        time.sleep(0.1)
    by_kind = {}
    for p in projections:
        # The views read the changelog's rows of their tables, one per change record.
        source = p.source(settings)
        pattern = (source.pattern if isinstance(source, KafkaTopics)
                   else "|".join(re.escape(f"lakesync.{t}") for t in views.TABLES))
        events = sum(end - start for (topic, partition), (start, end) in backlog.items()
                     if _matches(pattern, topic))
        seconds = done_at[p.name] - running
        by_kind[p.name] = {"kind": p.kind, "seconds": round(seconds, 3), "records": events or None,
                           "events_per_s": round(events / seconds, 1) if events else None,
                           "last_batch_steps": steps[p.name]}
        say(f"  {p.name}: caught up in {seconds:.1f} s after the runner's start ({running - started:.0f} s)"
            + (f", {events:,} records, {events / seconds:,.1f}/s" if events else ""))
    return by_kind


def _verify(settings: Settings) -> bool:
    from sync.commands import verify

    reports = verify.verify(settings)
    wrong = [r.name for r in reports if r.differences]
    if wrong:
        raise BenchFailed(f"verify found differences in {wrong}: figures of a wrong result are not reported")
    return True


def _replay_ranges(settings: Settings) -> dict:
    """The mirrors' topics from offset zero to their end: what steps 5 and 6 replay."""
    from projections import mirrors
    from sync.streaming import offsets

    return {tp: (0, end) for tp, end in offsets.end_offsets(settings, mirrors.TOPICS.pattern).items() if end}


def _spark_figures(spark, settings: Settings, replay: dict, sizes: list[int], merge_batch: int,
                   workdir: Path, say) -> dict:
    from projections import mirrors
    from sync.bench import ceiling, merge_scaling
    from sync.commands import rebuild
    from sync.delta import catalog

    top = ceiling.measure(spark, settings, replay)
    say(f"  ceiling: {top['events']:,} change events read in {top['seconds']:.1f} s ({top['events_per_s']:,}/s)")
    started = time.monotonic()
    rebuild.rebuild(settings, ["mirrors"], verify=False, swap=False, say=lambda text: say(f"  {text}"))
    took = time.monotonic() - started
    live = catalog.entry(settings, "mirrors")
    shutil.rmtree(catalog.root(catalog.building(settings, "mirrors", live["generation"] + 1), "mirrors"))
    say(f"  rebuild of the mirrors from offset zero: {took:.1f} s ({top['events'] / took:,.0f} events/s)")
    files = {t.name: int(spark.sql(f"DESCRIBE DETAIL delta.`{t.table}`").first()["numFiles"])
             for t in mirrors.PROJECTION.targets(settings)}
    merge = merge_scaling.measure(spark, settings, sizes, merge_batch, workdir, say=say)
    return {"files_by_mirror": files, "ceiling_events_per_s": top["events_per_s"], "ceiling": top,
            "rebuild_events_per_s": round(top["events"] / took), "rebuild_seconds": round(took, 3),
            "merge_rate_by_rows": merge,
            "apply_events_per_s": merge.get(str(APPLY_ROWS), {}).get("events_per_s")}


def _on_cluster(spark, settings: Settings, replay: dict, merge_batch: int, workers: int, workdir: Path,
                say) -> dict:
    """Step 6: step 5's ceiling, rebuild and apply rate (into a 1M-row mirror) again, the
    driver on a standalone cluster of `workers` one-core workers started here, all of
    its cores to the bench (nothing else runs on it). On one machine the executors' JVMs
    and the driver-executor traffic share the cores with the driver: this measures what
    the deployment costs, not a speed-up. Skipped with `--workers 0`, and when the whole
    bench runs on a cluster already (LAKESYNC_SPARK_MASTER): no local figure to set beside."""
    from sync.stack.spark_cluster import SparkCluster
    from sync.streaming import spark as spark_session

    if not workers:
        return {"skipped": "--workers 0"}
    if not settings.spark_master.startswith("local"):
        return {"skipped": f"the whole bench ran on {settings.spark_master}"}
    with_workers = dataclasses.replace(settings, spark_workers=workers)
    cluster = SparkCluster(with_workers)
    on_cluster = dataclasses.replace(with_workers, spark_master=cluster.url)
    spark.stop()  # one Spark context per process: this one's driver goes to the cluster
    cluster.start()
    try:
        spark = spark_session.session(on_cluster, spark_session.BENCH_CLUSTER_APP)
        figures = _spark_figures(spark, on_cluster, replay, [APPLY_ROWS], merge_batch, workdir, say)
        spark.stop()
    finally:
        cluster.stop()
    result = {"workers": workers, "cores": spark_session.cluster_cores(on_cluster, spark_session.BENCH_CLUSTER_APP),
              "master": cluster.url,
              **{key: figures[key] for key in ("ceiling_events_per_s", "rebuild_events_per_s", "apply_events_per_s")}}
    say(f"  on the cluster: ceiling {result['ceiling_events_per_s']:,}/s, rebuild {result['rebuild_events_per_s']:,}/s, "
        f"apply into {APPLY_ROWS:,} rows {result['apply_events_per_s']:,}/s")
    return result


def _peer(settings: Settings, replay: dict, workdir: Path, say) -> dict:
    from sync.bench import peer
    from sync.stack.postgres import pg_connect

    result = peer.apply_topics(settings.kafka_bootstrap, replay, workdir / "peer")
    with pg_connect(settings) as conn:
        wrong = {table: (rows, conn.execute(f'SELECT count(*) FROM public."{table}"').fetchone()[0])
                 for table, rows in result.rows.items()}
    wrong = {table: pair for table, pair in wrong.items() if pair[0] != pair[1]}
    if wrong:
        raise BenchFailed(f"the peer's tables do not match Postgres (rows, postgres): {wrong}")
    say(f"  peer: {result.events:,} change events in {result.seconds:.1f} s "
        f"({result.events / result.seconds:,.0f}/s), {result.merges} merges; row counts equal Postgres'")
    return {"peer_events_per_s": round(result.events / result.seconds), "peer_seconds": round(result.seconds, 3)}


# Tried twice on this stack (docs/decisions/0001-declarative-pipelines-auto-cdc.md, and
# again for the benchmark with `spark-pipelines run` against a local Spark Connect
# server): the flow is refused at start, as Spark requires a DSv2 target with row-level
# operations and Delta supports MERGE through its own analyzer rules instead.
SDP_REASON = ("not run: open-source Spark 4.2.0 refuses the AUTO CDC flow on a Delta target "
              "([AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE] ... does not support row-level operations); "
              "apache/spark#56683 (SPARK-57623) removes that check; docs/decisions/0001-declarative-pipelines-auto-cdc.md")


def _sdp(say) -> dict:
    """Step 7: Spark Declarative Pipelines' AUTO CDC cannot run here yet (SDP_REASON)."""
    say(f"  {SDP_REASON}")
    return {"sdp_events_per_s": None, "sdp_reason": SDP_REASON}


def _freshness(settings: Settings, window: tuple[datetime, datetime], figures: dict, say) -> list[float]:
    """Step 2's figures, read from the tables right after the window (sync/bench/latency.py)."""
    from sync.bench import latency, report
    from sync.streaming import spark as spark_session

    spark = spark_session.session(settings, "lakesync-bench")
    start, end = window
    per_event = latency.changelog_delays(spark, settings, start, end)
    per_key = latency.mirror_delays(spark, settings, start, end)
    capture = latency.capture_delays(spark, settings, start, end)
    figures.update({
        "freshness_samples": len(per_event),
        **{f"freshness_p{q}_s": _round(report.percentile(per_event, q)) for q in (50, 95, 99)},
        "freshness_mirrors_samples": len(per_key),
        **{f"freshness_mirrors_p{q}_s": _round(report.percentile(per_key, q)) for q in (50, 99)},
        **{f"capture_delay_p{q}_s": _round(report.percentile(capture, q)) for q in (50, 99)},
    })
    say(f"  freshness per event (changelog): p50 {figures['freshness_p50_s']} s, p99 {figures['freshness_p99_s']} s "
        f"over {len(per_event):,} events; mirrors (last change per key): p50 {figures['freshness_mirrors_p50_s']} s; "
        f"capture's share p50 {figures['capture_delay_p50_s']} s")
    return per_event


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _matches(pattern: str, topic: str) -> bool:
    return re.fullmatch(pattern, topic) is not None

