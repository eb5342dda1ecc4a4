"""`lakesync rebuild NAME [NAME ...] [--verify] [--swap]`: projections rebuilt from offset
zero beside the live ones, proved equal to them, and switched in for every reader at once.

The steps, in order (for several projections, side by side in one Spark session):
  1. Build. A new generation of the projection (sync/delta/catalog.py) is written by the code
     the runner runs, in this process' own Spark session, from the earliest Kafka offsets
     (the views: from the first version of the changelog and the ledger, the bronze
     record that still holds every version compaction removed from Kafka), with
     availableNow triggers. The live generation keeps serving and the live runner keeps
     applying. A progress line shows what is done and what is to go, the rate, the ETA.
     A new generation reads only live tables besides its own (new views read the live
     mirrors, even when new mirrors are built beside them): each is swapped on its own.
  2. Verify (--verify). Both sides must reflect the same source position, so capture is
     held still for the comparison:
       a. pause the connector: no record reaches Kafka; Postgres keeps taking writes,
          which wait in the replication slot. If a projection that applies whole
          transactions then holds some it has read (the pause cut one, or its batch
          stopped where the one it follows stood), capture takes one more transaction
          and pauses again (`_pause`);
       b. wait until the live runner has applied everything Kafka holds (the barrier's
          steps 4 to 6, sync/commands/freshness.py);
       c. bring the new generation to the same position (one more availableNow run);
       d. compare every table both ways, every column but `_applied_at` (when our job
          ran), read by DuckDB: equal, or the keys that differ;
       e. resume the connector, whatever happened above.
  3. Swap (--swap; after --verify only when it found no difference):
       a. without --verify, catch the new generation up once more, the live runner still
          running, so that it has less to catch up after the swap (after --verify, step 2c
          brought it to where capture paused moments ago: in the rebuild test one more
          run found nothing and took 25 s, three queries started and stopped);
       b. if a runner runs, hand c and d over to it (sync/commands/runner.py
          `hand_over_swap`): it stops its queries between batches, and starts them again
          after d, in the same warm process, from the new generations' checkpoints;
       c. point the catalog at the new generation: one atomic rename, after which every
          reader resolves the new tables (none ever sees a half-built one);
       d. retire the old generation: its tables, checkpoint, progress, fencing epochs.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from duckdb import DuckDBPyConnection
from pyspark.sql import SparkSession

from projections import changelog
from projections.ledger import projection as ledger
from sync import lake
from sync.cdc.transactions import held_after
from sync.commands import all_projections, freshness, projection_named
from sync.commands.runner import hand_over_swap
from sync.commands.snapshot import PUBLISHERS
from sync.config import CONNECTOR_NAME, Settings
from sync.delta import catalog, fencing, reader
from sync.errors import LakesyncError
from sync.projection import Projection, Target
from sync.stack.connect import rest, wait_for_state
from sync.stack.process import read_pid
from sync.streaming import offsets
from sync.streaming import spark as spark_session
from sync.streaming.offsets import Offsets
from sync.streaming.stream import EXECUTOR_LOSS_RESTARTS, executor_lost

VOLATILE = {"_applied_at"}  # when our job wrote the row, not what it wrote
VERIFY_DRAIN_SECONDS = 600  # how long step 2b waits for the live runner
PAUSE_ATTEMPTS = 10  # step 2a: pauses that may each find a projection holding transactions
LIVE, REBUILT = "_lakesync_live", "_lakesync_rebuilt"  # step 2d's count of a row on each side


class RebuildFailed(LakesyncError):
    exit_code = 1


@dataclass
class Comparison:
    name: str
    live_rows: int
    rebuilt_rows: int
    differences: int
    sample: list = field(default_factory=list)   # keys that differ


def projection_of(settings: Settings, name: str) -> Projection:
    """The projection a rebuild of NAME builds (`projection_named`); never the changelog."""
    found = projection_named(settings, name, "rebuild")
    if found is changelog.PROJECTION:
        raise LakesyncError("the changelog is the bronze record: Kafka compaction has removed older "
                            "versions it keeps, so it is never rebuilt from Kafka")
    return found


def rebuild(settings: Settings, names: list[str], verify: bool, swap: bool, say=print) -> list[Comparison]:
    """Rebuild the projections `names` name, side by side in one Spark session (one pause
    of capture for all of them when verifying, one stop of the runner's queries when swapping)."""
    wanted = {projection_of(settings, name) for name in names}
    projections = [p for p in all_projections(settings) if p in wanted]  # the runner's order: views last
    if swap and ledger.PROJECTION in projections:
        raise LakesyncError("the ledger is never replaced: auditors' digests name versions of this table. "
                            "`--verify` proves a rebuild equals it")
    builds = []
    for projection in projections:
        live = catalog.entry(settings, projection.name)
        shadow = catalog.building(settings, projection.name, live["generation"] + 1)
        folder = catalog.root(shadow, projection.name)
        lake.remove_tree(folder)  # left by an interrupted rebuild: start from zero
        say(f"rebuilding {projection.name} from offset zero into generation {live['generation'] + 1} "
            f"({folder}); generation {live['generation']} keeps serving")
        builds.append(Build(projection, shadow, live["generation"] + 1))
    spark = spark_session.session(settings, "lakesync-rebuild")
    for build in builds:
        build.fence = fencing.take(spark, build.shadow, build.projection.name, [])
    _run(spark, builds, say)
    comparisons: list[Comparison] = []
    if verify:
        comparisons = _verify(spark, settings, builds, say)
        if any(c.differences for c in comparisons):
            say("verify: the rebuilt projection DIFFERS; its generation is kept and not swapped")
            return comparisons
    if swap and not verify:
        _run(spark, builds, say)  # 3a
    for build in builds:
        build.fence.close()  # its query has stopped: the runner taking it over need not stamp
    if swap:
        _swap(settings, builds, say)
    return comparisons


@dataclass
class Build:
    projection: Projection
    shadow: Settings          # writes the new generation, reads everything else live
    generation: int
    fence: fencing.Fence | None = None


def _run(spark: SparkSession, builds: list[Build], say) -> None:
    """One availableNow run of every new generation, side by side, showing progress. A
    query whose batch lost an executor (a worker of a cluster gone) starts again from its
    checkpoint and replays the batch, as the runner's do."""
    running = []
    for build in builds:
        projection, shadow = build.projection, build.shadow
        if not projection.ready(shadow):
            raise RebuildFailed(f"{projection.name} reads tables that do not exist yet; start the runner first")
        unit = "offsets" if projection.source(shadow).unit == "records" else "table versions"
        progress = _Progress(projection.name, unit, offsets.input_ends(shadow, projection),
                             offsets.processed(shadow, projection))
        running.append((build, progress, _start(spark, build)))
    losses = {build.projection.name: 0 for build in builds}
    bar = _Line()
    while any(query.isActive for *_, query in running):
        time.sleep(1)
        bar.show(" | ".join(progress.line(offsets.processed(build.shadow, build.projection))
                            for build, progress, _ in running))
        for index, (build, progress, query) in enumerate(running):
            error = None if query.isActive else query.exception()
            lost = executor_lost(error) if error is not None else None
            if lost and losses[build.projection.name] < EXECUTOR_LOSS_RESTARTS:
                losses[build.projection.name] += 1
                bar.end()
                say(f"  {build.projection.name}: its batch lost an executor ({lost}); replaying it "
                    f"({losses[build.projection.name]}/{EXECUTOR_LOSS_RESTARTS})")
                running[index] = (build, progress, _start(spark, build))
    bar.end()
    for build, progress, query in running:
        error = query.exception()
        if error is not None:
            text = str(getattr(error, "desc", None) or error).strip().splitlines()
            raise RebuildFailed(f"the rebuild of {build.projection.name} failed: {text[0][:500] if text else error}")
        say(progress.summary(offsets.processed(build.shadow, build.projection)))


def _start(spark: SparkSession, build: Build):
    # A pool per projection, as in the runner: the FAIR scheduler shares the cores.
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", build.projection.name)
    return build.projection.start(spark, build.shadow, True, build.fence)


def _pause(settings: Settings, say) -> None:
    """Step 2a. Connect commits each poll's records at once, and a poll can end inside a
    source transaction (Debezium hands over what it has decoded so far). Paused there,
    the rest of it and its END wait in the slot, and the projections that apply whole
    transactions hold what came of it. A batch of one that follows another
    (`Settings.aligned`) can also hold whole transactions, to stop where the one it
    follows stood; only its next batch applies them, and no batch comes while capture is
    paused. Either way it would never reach Kafka's end: capture then takes one more
    transaction (the heartbeat row, touched) and pauses again."""
    for _ in range(PAUSE_ATTEMPTS):
        rest(settings, "PUT", f"/connectors/{CONNECTOR_NAME}/pause")
        wait_for_state(settings, "PAUSED")
        holding = _holding(settings)
        if not holding:
            return
        say(f"verify: {', '.join(holding)} holds source transactions with capture paused; "
            "capture takes one more transaction and pauses again")
        rest(settings, "PUT", f"/connectors/{CONNECTOR_NAME}/resume")
        wait_for_state(settings, "RUNNING")
        started = time.monotonic()
        freshness.captured(settings, started, started + VERIFY_DRAIN_SECONDS)
    raise RebuildFailed(f"capture paused where a projection held source transactions {PAUSE_ATTEMPTS} times; "
                        "the live and the rebuilt projections cannot meet at one source position")


def _holding(settings: Settings) -> list[str]:
    """The projections that apply whole source transactions and, once each has read
    everything Kafka holds (waiting for it as step 2b would), still hold some."""
    if not settings.whole_transactions:
        return []
    found = []
    for projection in all_projections(settings):
        if projection.name not in PUBLISHERS:
            continue
        checkpoint = catalog.checkpoint(settings, projection.name)
        ends = offsets.input_ends(settings, projection)  # (capture is paused: they stay)
        deadline = time.monotonic() + VERIFY_DRAIN_SECONDS
        while time.monotonic() < deadline and read_pid(settings.runner_pidfile) is not None:
            last = offsets.last_batch(checkpoint)
            if last is not None:
                read = offsets.batch_ends(checkpoint, last)
                if all(read.get(part, 0) >= end for part, end in ends.items()):
                    if held_after(checkpoint, last).xids:
                        found.append(projection.name)
                    break
            time.sleep(0.2)
    return found  # (one still behind at the deadline: step 2b says so)


def _verify(spark: SparkSession, settings: Settings, builds: list[Build], say) -> list[Comparison]:
    """Step 2."""
    say("verify: pausing capture, so the live and the rebuilt projections reach the same source position")
    try:
        _pause(settings, say)
        if read_pid(settings.runner_pidfile) is None:
            raise RebuildFailed("verify compares with the live projections at Kafka's end: start the runner "
                                "(`lakesync run`) first")
        started = time.monotonic()
        freshness.drain(settings, started, started + VERIFY_DRAIN_SECONDS, {b.projection.name for b in builds})
        _run(spark, builds, say)
        duck = reader.connect()
        try:
            comparisons = [compare(duck, live, rebuilt) for build in builds
                           for live, rebuilt in _pairs(settings, build.shadow, build.projection)]
        finally:
            duck.close()
    finally:
        rest(settings, "PUT", f"/connectors/{CONNECTOR_NAME}/resume")
        say("verify: capture resumed")
    return comparisons


def _pairs(settings: Settings, shadow: Settings, projection: Projection) -> list[tuple[Target | None, Target | None]]:
    """(live target, rebuilt target) per Delta table, matched by name; a table only one
    side has is compared with nothing."""
    live = {t.name: t for t in projection.targets(settings) if t.delta}
    rebuilt = {t.name: t for t in projection.targets(shadow) if t.delta}
    return [(live.get(n), rebuilt.get(n)) for n in sorted(set(live) | set(rebuilt))]


def compare(duck: DuckDBPyConnection, live: Target | None, rebuilt: Target | None) -> Comparison:
    """Every row of one table against the other, both ways (a multiset difference), in one
    pass over each, read by DuckDB (sync/delta/reader.py: a reader apart from the Spark that
    wrote both): the two sides' rows are grouped together, each group counts its rows on
    either side, and a group whose counts differ is a difference (every key in it, or each
    surplus row of a table without keys). Only a difference is read again, for the sample."""
    def load(target) -> tuple[str, list[str]] | None:
        """(what delta_scan takes, the compared columns in name order) of a table; None: none."""
        if target is None or not (lake.at(target.table) / "_delta_log").is_dir():
            return None
        path = reader.scan(duck, target.table)
        names = [name for (name, *_) in duck.execute("DESCRIBE SELECT * FROM delta_scan(?)", [path]).fetchall()]
        return path, sorted(c for c in names if c not in VOLATILE)

    name = (live or rebuilt).name
    keys = (live or rebuilt).keys
    left, right = load(live), load(rebuilt)

    def count(side) -> int:
        return duck.execute("SELECT count(*) FROM delta_scan(?)", [side[0]]).fetchone()[0]
    if left is None or right is None:
        rows = count(left or right) if (left or right) else 0
        return Comparison(name, rows if left is not None else 0, rows if right is not None else 0, rows,
                          ["(the table exists on one side only)"] if rows else [])
    if left[1] != right[1]:
        return Comparison(name, count(left), count(right), 1,
                          [f"columns differ: live {left[1]}, rebuilt {right[1]}"])
    listed = ", ".join(map(reader.quoted, left[1]))
    on_left, on_right = reader.quoted(LIVE), reader.quoted(REBUILT)
    duck.execute(f"""CREATE OR REPLACE TEMP TABLE compared AS
        SELECT {listed}, sum({on_left}) AS {on_left}, sum({on_right}) AS {on_right} FROM (
            SELECT {listed}, 1 AS {on_left}, 0 AS {on_right} FROM delta_scan($live)
            UNION ALL
            SELECT {listed}, 0, 1 FROM delta_scan($rebuilt))
        GROUP BY {listed}""", {"live": left[0], "rebuilt": right[0]})
    key_columns = ", ".join(map(reader.quoted, keys))
    differs = f"{on_left} != {on_right}"
    counted = (f"count(DISTINCT row({key_columns})) FILTER (WHERE {differs})" if keys
               else f"sum(abs({on_left} - {on_right})) FILTER (WHERE {differs})")
    totals = duck.execute(f"SELECT sum({on_left}), sum({on_right}), {counted} FROM compared").fetchone()
    live_rows, rebuilt_rows, differences = (int(value or 0) for value in totals)
    sample = []
    if differences:
        shown = key_columns if keys else listed
        found = duck.execute(f"SELECT DISTINCT {shown} FROM compared WHERE {differs} LIMIT 5").to_arrow_table()
        sample = [reader.utc_naive(row) for row in found.to_pylist()]  # (Arrow: as reader.rows reads)
    duck.execute("DROP TABLE compared")
    return Comparison(name, live_rows, rebuilt_rows, differences, sample)


def _swap(settings: Settings, builds: list[Build], say) -> None:
    """Steps 3b to 3d: by the running runner (sync/commands/runner.py `hand_over_swap`),
    else here."""
    generations = {b.projection.name: (b.generation, str(catalog.root(b.shadow, b.projection.name))) for b in builds}
    said = hand_over_swap(settings, generations)
    if said is not None:
        for line in said:
            say(line)
        return
    for build in builds:
        name = build.projection.name
        if catalog.entry(settings, name)["generation"] == build.generation:
            # A runner that exited mid-swap had swapped it in, perhaps not retired the old one.
            catalog.retire_replaced(settings, build.projection, say)
            continue
        catalog.swap_in(settings, build.projection, build.generation, catalog.root(build.shadow, name), say)


class _Progress:
    """One projection's progress towards `goal` (its inputs' ends when the run began):
    done and to go, rate, time left."""

    def __init__(self, name: str, unit: str, goal: Offsets, processed: Offsets):
        self.name, self.unit, self.goal = name, unit, goal
        self.total = sum(goal.values())
        self.first = self.done(processed)
        self.started = time.monotonic()

    def done(self, processed: Offsets) -> int:
        return sum(min(processed.get(tp, 0), end) for tp, end in self.goal.items())

    def line(self, processed: Offsets) -> str:
        done, elapsed = self.done(processed), time.monotonic() - self.started
        rate = (done - self.first) / elapsed if elapsed > 0 else 0.0
        share = 100.0 * done / self.total if self.total else 100.0
        eta = f"{(self.total - done) / rate:.0f} s" if rate > 0 else "-"
        return f"{self.name} {done:,}/{self.total:,} {self.unit} ({share:.0f} %) {_rate(rate)} ETA {eta}"

    def summary(self, processed: Offsets) -> str:
        done, elapsed = self.done(processed), time.monotonic() - self.started
        return (f"  {self.name}: {done - self.first:,} {self.unit} read in {elapsed:.1f} s "
                f"({_rate((done - self.first) / elapsed if elapsed else 0.0)}), at {done:,} of {self.total:,}")


class _Line:
    """The progress line: rewritten in place each second on a terminal, else printed
    every 10 s."""

    def __init__(self):
        self.tty = sys.stdout.isatty()
        self.started = self.shown = time.monotonic()

    def show(self, text: str) -> None:
        now = time.monotonic()
        if self.tty:
            print(f"\r  {text} [{now - self.started:.0f} s]\033[K", end="", flush=True)
        elif now - self.shown >= 10:
            self.shown = now
            print(f"  {text} [{now - self.started:.0f} s]", flush=True)

    def end(self) -> None:
        if self.tty:
            print()


def _rate(per_second: float) -> str:
    return f"{per_second:,.0f}/s" if per_second >= 10 else f"{per_second:.2f}/s"
