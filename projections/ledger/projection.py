"""The ledger: every posting event of the bank, appended once, hash-chained per account.

Input:  lakesync.events.account, the outbox router's topic for aggregate type `account`
        (sync/outbox.py, sync/demo/bank.py): one event per posting, keyed by account, with a
        per-account sequence number assigned in the application's transaction. The
        topic is never compacted nor deleted by time, so a rebuild reads all of it.
        With the other aggregate types' topics and the source's transaction boundaries:
        a batch appends whole source transactions only (step 0).
Key:    the event id. Redelivered events (a Connect crash, a replayed batch) carry the
        same event id and the same (account, seq), and never make a second entry.
Target: <lake>/ledger, append-only (`delta.appendOnly=true`: Delta itself refuses
        UPDATE and DELETE), one row per posting: amount as decimal(20,4), event time
        (when it happened, from the event), recorded time (its Postgres commit), the
        provenance (topic, partition, offset, commit LSN, LSN, txid) and the chain:
        hash = SHA-256(previous hash || canonical entry) (projections/ledger/chain.py).
        Corrections are new, compensating postings; nothing is ever rewritten.
        <lake>/ledger_balances: one row per account, the sum of its postings.
Apply:  per batch, on the driver (a batch of postings is small; the chain is sequential
        per account anyway), in order:
          0. Hold the events of source transactions not yet whole (sync/cdc/transactions.py):
             END counts the changes of the outbox's sequence table, one per event `emit`
             wrote in the transaction, so a transaction is whole when that many events of
             it, of any aggregate type, have been read (they carry its id in header
             `transaction`; an event written before the connector gave transaction
             metadata has none and is not held). So every version of the ledger and its
             balances holds a prefix of the source's transactions: each operation's
             postings all, or none.
          1. Parse each record; one that is not a well-formed posting goes to the dead
             letters with the reason.
          2. Per account, in seq order: seq <= the recorded head is a redelivery (its
             event id must equal the recorded one at that seq, else it is a conflict and
             a dead letter); head + 1 is new and is chained; anything above leaves a gap
             (an event is missing) and goes to the dead letters, never chained over.
          3. Append the new entries, tagged txnAppId `ledger` / batch id (commit.py).
          4. MERGE the balances of the accounts touched, guarded by each account's
             last_seq, so a posting is added once even when step 3 was done by a run
             that crashed before this step.
          5. Publish the ledger's point: both tables' versions, at the source transaction
             the batch applied through (sync/delta/points.py).
        The chain heads are read once per run and then kept on the driver.
Oracle: verify recomputes every chain, checks that each operation's postings sum to zero,
        and compares each account's entry count with Postgres' outbox_sequence; the
        balances must equal the application's `accounts.balance`.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Callable

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from projections.ledger import AGGREGATE, MAX_AMOUNT, SCALE, audit, balances_path, chain, ledger_path
from sync import lake
from sync.cdc import transactions
from sync.cdc.ordering import parse_sequence
from sync.compare import Report, compare
from sync.config import EVENTS_TOPIC_PREFIX, TOPIC_PREFIX, Settings
from sync.delta import catalog, deadletters, points
from sync.delta.commit import BatchCommit
from sync.delta.deadletters import DeadLetter
from sync.delta.fencing import Fence
from sync.delta.merge import ensure_table
from sync.delta.reader import Readers
from sync.lake import LakePath
from sync.outbox import sequence_table, topic
from sync.projection import KafkaTopics, Projection, Target
from sync.streaming.batch import Batch
from sync.streaming.offsets import BatchPartitions
from sync.streaming.progress import Outcome, Steps
from sync.streaming.spark import one_of
from sync.streaming.stream import Ranges, read_ranges, read_topics, run_batches

NAME = "ledger"
KIND = "ledger"
TOPICS = KafkaTopics(topic(AGGREGATE).replace(".", r"\."), headers=True)
# What the ledger reads: every aggregate type's events (a source transaction's events are
# counted whole, whatever their type: step 0) and the source's transaction boundaries.
WHOLE_TRANSACTIONS = KafkaTopics(transactions.with_boundaries(f"{re.escape(EVENTS_TOPIC_PREFIX)}.*"), headers=True)
SCHEMA = ("event_id string, account bigint, seq bigint, amount decimal(20,4), currency string, "
          "event_type string, operation string, operation_id string, counterparty bigint, corrects string, "
          "event_time timestamp, recorded_at timestamp, `_topic` string, `_partition` int, `_offset` bigint, "
          "`_commit_lsn` bigint, `_lsn` bigint, `_txid` bigint, prev_hash string, hash string, "
          "`_applied_at` timestamp")
BALANCES_SCHEMA = "account bigint, currency string, balance decimal(20,4), last_seq bigint, `_applied_at` timestamp"
# No deletion vectors on either table: delta-rs, the auditor's reader, cannot read them
# (nothing is deleted from the ledger; the balances are one small row per account).
NO_DELETION_VECTORS = {"delta.enableDeletionVectors": "false"}
# The log is kept (almost) forever: `ledger verify --digest` time-travels to the digest's
# version, and Delta would otherwise drop log entries older than 30 days.
PROPERTIES = {"delta.appendOnly": "true", **NO_DELETION_VECTORS,
              "delta.logRetentionDuration": "interval 36500 days",
              "delta.checkpointRetentionDuration": "interval 36500 days"}
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
BALANCES_ORACLE = (
    "SELECT a.id AS account, a.currency::text AS currency, a.balance, s.last_seq "
    "FROM accounts a LEFT JOIN outbox_sequence s "
    f"ON s.aggregate_type = '{AGGREGATE}' AND s.aggregate_id = a.id::text "
    "WHERE s.last_seq IS NOT NULL OR a.balance <> 0")


# -- step 1: one Kafka record -> one entry (pure; unit-tested) --

def parse_posting(value: bytes | None, source_header: bytes | None, topic_name: str, partition: int,
                  offset: int) -> dict[str, Any]:
    """The ledger entry a record carries (without its hashes); ValueError says why not."""
    if value is None:
        raise ValueError("a record without a value on an event topic")
    try:
        envelope = json.loads(value)["payload"]
        event = envelope["payload"]
        event = json.loads(event) if isinstance(event, str) else event
        source = json.loads(source_header) if source_header else None
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"not an outbox event ({error})") from None
    if not isinstance(event, dict) or not isinstance(envelope, dict):
        raise ValueError("not an outbox event (payload is not an object)")
    if not isinstance(source, dict):
        raise ValueError("no `source` header: the connector's outboxSource transform is missing")
    position = parse_sequence(source.get("sequence"))
    if position is None or source.get("txId") is None or source.get("ts_us") is None:
        raise ValueError("the source header has no sequence, txId or ts_us")
    try:
        event_id = str(envelope["event_id"])
        amount = Decimal(str(event["amount"]))
        account = _bigint(envelope["aggregate_id"])
        seq = _bigint(envelope["seq"])
        event_time = datetime.fromisoformat(envelope["occurred_at"]).astimezone(timezone.utc)
        counterparty = event.get("counterparty")
        counterparty = _bigint(counterparty) if counterparty is not None else None
    except (KeyError, ValueError, TypeError, InvalidOperation) as error:
        raise ValueError(f"malformed posting ({type(error).__name__}: {error})") from None
    if not amount.is_finite() or amount != amount.quantize(SCALE) or abs(amount) >= MAX_AMOUNT:
        raise ValueError(f"amount {event['amount']!r} is not an exact numeric(20,4)")
    if str(event.get("account", account)) != str(account):
        raise ValueError(f"payload account {event.get('account')} differs from the aggregate id {account}")
    currency = event.get("currency")
    if not isinstance(currency, str) or len(currency) != 3:
        raise ValueError(f"currency {currency!r} is not a 3-letter code")
    return {
        "event_id": event_id, "account": account, "seq": seq, "amount": amount,
        "currency": currency, "event_type": str(envelope.get("event_type")),
        "operation": event.get("operation"), "operation_id": event.get("operation_id"),
        "counterparty": counterparty, "corrects": event.get("corrects"),
        "event_time": event_time,
        "recorded_at": EPOCH + timedelta(microseconds=int(source["ts_us"])),
        "_topic": topic_name, "_partition": partition, "_offset": offset,
        "_commit_lsn": position[0], "_lsn": position[1], "_txid": int(source["txId"]),
    }


def _bigint(value) -> int:
    number = int(value)
    if not -2 ** 63 <= number < 2 ** 63:
        raise ValueError(f"{value} does not fit a bigint")
    return number


# -- step 0 --

def transaction_rule(settings: Settings) -> transactions.Rule:
    """Step 0's rule: END's count of the sequence table's changes is the number of events
    the transaction emitted, and an event carries its change's transaction block in header
    `transaction` (jvm/smt SourceToHeader)."""
    sequence_topic = f"{TOPIC_PREFIX}.{sequence_table(settings.outbox_table)}"
    return transactions.Rule(counted=lambda name: name == sequence_topic,
                             xid=lambda: transactions.xid_of(_header("transaction").cast("string"), "$.id"),
                             sequence=lambda: F.get_json_object(_header("source").cast("string"), "$.sequence"),
                             count_as=lambda name: sequence_topic, compacted=False)


def _header(key: str):
    """A record's header `key` (null where it has none: a transaction boundary's record)."""
    return F.get(F.filter("headers", lambda h: h["key"] == key), 0)["value"]


# -- steps 0-5 --

class LedgerBatch(Batch):
    def __init__(self, settings: Settings, fence: Fence,
                 read_again: Callable[[SparkSession, Ranges], DataFrame] | None = None):
        super().__init__(NAME, settings, fence)
        self.heads: dict[int, tuple[int, str, str]] = {}  # account -> (seq, hash, event_id), read by `open`
        self.transaction_rule = transaction_rule(settings)
        self.align = points.aligner(settings, NAME)  # stop where the projections it follows stand
        # The held events of incomplete source transactions, read again (sync/cdc/transactions.py).
        self.read_again = read_again or (lambda spark, ranges: read_ranges(spark, settings, ranges, headers=True))

    def open(self, spark: SparkSession) -> None:
        ledger = ledger_path(self.settings)
        ensure_table(spark, ledger, SCHEMA, {**PROPERTIES, **self.fence.properties})
        ensure_table(spark, balances_path(self.settings), BALANCES_SCHEMA,
                     {**NO_DELETION_VECTORS, **self.fence.properties})
        self.heads = read_heads(spark, ledger)

    def apply(self, batch: DataFrame, commit: BatchCommit, steps: Steps) -> Outcome:
        spark = commit.spark
        ledger, balances = ledger_path(self.settings), balances_path(self.settings)
        # 0. whole source transactions only
        checkpoint = catalog.checkpoint(self.settings, NAME)
        gated, held = transactions.gate(batch, commit.batch_id, checkpoint,
                                        self.transaction_rule, self.read_again,
                                        BatchPartitions(self.settings, checkpoint, commit.batch_id),
                                        self.settings.whole_transactions,
                                        until=self.settings.transactions_until, align=self.align)
        gated = gated.where(F.col("topic") == topic(AGGREGATE))
        records = gated.select("key", "value", "topic", "partition", "offset", _header("source").alias("source"))
        # (Sorted here: Spark's sort cost a sampling job and a shuffle per batch.)
        rows = sorted(records.collect(), key=lambda row: (row["topic"], row["partition"], row["offset"]))

        # 1. parse
        errors: list[DeadLetter] = []
        by_account: dict[int, list[dict]] = {}
        seen: set[str] = set()
        for row in rows:
            try:
                entry = parse_posting(row["value"], row["source"], row["topic"], row["partition"], row["offset"])
            except ValueError as error:
                errors.append(DeadLetter(row["topic"], row["partition"], row["offset"], NAME, str(error)))
                continue
            if entry["event_id"] not in seen:  # a repeat inside the batch: the first one counts
                seen.add(entry["event_id"])
                by_account.setdefault(entry["account"], []).append(entry)

        # 2. sort each account's events into redelivered, new and gapped
        new: list[dict] = []
        redelivered: list[dict] = []
        placed: dict[tuple[int, int], str] = {}  # (account, seq) -> event id, chained in this batch
        heads = dict(self.heads)
        for account, entries in sorted(by_account.items()):
            seq, prev_hash, _ = heads.get(account, (0, chain.GENESIS, ""))
            fresh = []
            for entry in sorted(entries, key=lambda e: e["seq"]):
                if (account, entry["seq"]) in placed:  # two events claim one place in this batch
                    errors.append(DeadLetter(entry["_topic"], entry["_partition"], entry["_offset"], NAME,
                                             f"account {account} entry {entry['seq']} is already event "
                                             f"{placed[(account, entry['seq'])]}, not {entry['event_id']}"))
                elif entry["seq"] <= seq:
                    redelivered.append(entry)
                elif entry["seq"] == seq + 1:
                    fresh.append(entry)
                    placed[(account, entry["seq"])] = entry["event_id"]
                    seq += 1
                else:
                    errors.append(DeadLetter(entry["_topic"], entry["_partition"], entry["_offset"], NAME,
                                             f"sequence gap: account {account} expected entry {seq + 1}, "
                                             f"got {entry['seq']}"))
            linked = list(chain.link(fresh, prev_hash))
            if linked:
                heads[account] = (linked[-1]["seq"], linked[-1]["hash"], linked[-1]["event_id"])
            new.extend(linked)
        recorded, conflicts = self._recorded(spark, ledger, redelivered)
        errors.extend(conflicts)

        # 3. append, 4. balances
        applied_at = datetime.now(timezone.utc)
        if new:
            frame = spark.createDataFrame([{**e, "_applied_at": applied_at} for e in new], SCHEMA)
            commit.append(frame, ledger)
        self.heads = heads
        touched = new + recorded
        if touched:
            self._merge_balances(commit, balances, touched, applied_at)
        dead = deadletters.write(commit, self.settings, gated, errors)
        if self.settings.whole_transactions:  # 5.
            points.publish(catalog.root(self.settings, NAME), NAME, commit.batch_id, held,
                           points.tables_now(PROJECTION.targets(self.settings)), self.fence)
        return Outcome(applied={NAME: len(new), "balances": len({e["account"] for e in touched})},
                       dead_letters={NAME: dead} if dead else {}, held_transactions=len(held.xids),
                       stopped_short=held.stopped_short)

    def _recorded(self, spark: SparkSession, ledger: str, redelivered: list[dict]):
        """Split redelivered events into those the ledger holds (same event id at that
        account and seq) and conflicts (another event holds that place)."""
        if not redelivered:
            return [], []
        wanted = spark.createDataFrame([(e["account"], e["seq"]) for e in redelivered], "account bigint, seq bigint")
        held = {(r["account"], r["seq"]): r["event_id"] for r in
                spark.read.format("delta").load(ledger).join(wanted, ["account", "seq"])
                .select("account", "seq", "event_id").collect()}
        recorded, conflicts = [], []
        for entry in redelivered:
            holder = held.get((entry["account"], entry["seq"]))
            if holder == entry["event_id"]:
                recorded.append(entry)
            else:
                conflicts.append(DeadLetter(entry["_topic"], entry["_partition"], entry["_offset"], NAME,
                                            f"account {entry['account']} entry {entry['seq']} is already event "
                                            f"{holder}, not {entry['event_id']}"))
        return recorded, conflicts

    def _merge_balances(self, commit: BatchCommit, path: str, entries: list[dict], applied_at: datetime) -> None:
        """Add each posting to its account's balance once: the MERGE only takes postings
        above the row's last_seq, so a batch replayed after a crash adds nothing twice."""
        spark = commit.spark
        accounts = sorted({e["account"] for e in entries})
        updated = {r["account"]: (r["balance"], r["last_seq"]) for r in
                   spark.read.format("delta").load(path).where(one_of("account", accounts)).collect()}
        currency = {}
        for entry in sorted(entries, key=lambda e: (e["account"], e["seq"])):
            balance, last_seq = updated.get(entry["account"], (Decimal(0), 0))
            if entry["seq"] == last_seq + 1:
                updated[entry["account"]] = (balance + entry["amount"], entry["seq"])
            currency[entry["account"]] = entry["currency"]
        source = spark.createDataFrame(
            [(account, currency[account], balance, last_seq, applied_at)
             for account, (balance, last_seq) in updated.items()], BALANCES_SCHEMA)

        def merge() -> None:
            (DeltaTable.forPath(spark, path).alias("t").merge(source.alias("s"), "t.account = s.account")
             .whenMatchedUpdateAll(condition="s.last_seq > t.last_seq")
             .whenNotMatchedInsertAll().execute())

        commit(merge, "balances")


def read_heads(spark: SparkSession, path: str) -> dict[int, tuple[int, str, str]]:
    """account -> (seq, hash, event_id) of its latest entry."""
    last = F.max_by(F.struct("seq", "hash", "event_id"), "seq").alias("head")
    return {r["account"]: tuple(r["head"]) for r in
            spark.read.format("delta").load(path).groupBy("account").agg(last).collect()}


class Ledger(Projection):
    name = NAME
    kind = KIND

    def source(self, settings: Settings) -> KafkaTopics:
        return TOPICS

    def targets(self, settings: Settings) -> list[Target]:
        return [Target(name=NAME, kind=KIND, table=ledger_path(settings), keys=["event_id"],
                       source=topic(AGGREGATE)),
                Target(name=f"{NAME}.balances", kind="balances", table=balances_path(settings), keys=["account"],
                       oracle_sql=BALANCES_ORACLE, source="accounts")]

    def state_paths(self, settings: Settings) -> list[LakePath]:
        """The ledger's consistent points (sync/delta/points.py): they name its tables' versions."""
        return [points.folder(catalog.root(settings, NAME), NAME)]

    def start(self, spark: SparkSession, settings: Settings, once: bool, fence: Fence) -> StreamingQuery:
        # Created before the first event arrives: the views stream from this table.
        ensure_table(spark, ledger_path(settings), SCHEMA, {**PROPERTIES, **fence.properties})
        return run_batches(read_topics(spark, settings, WHOLE_TRANSACTIONS), NAME, LedgerBatch(settings, fence),
                           settings, once)

    def check(self, settings: Settings, readers: Readers, conn, target: Target) -> Report:
        """verify's comparison for the ledger: each account's entry count against Postgres'
        outbox_sequence, every chain recomputed, and every operation summing to zero (the
        entries read by delta-rs: projections/ledger/audit.py)."""
        expected = conn.execute("SELECT aggregate_id::bigint, last_seq FROM outbox_sequence "
                                "WHERE aggregate_type = %s AND aggregate_id ~ '^-?[0-9]{1,18}$'",
                                (AGGREGATE,)).fetchall()
        exists = (lake.at(target.table) / "_delta_log").is_dir()
        entries = audit.load(target.table) if exists else []
        counts: dict[int, int] = {}
        for entry in entries:
            counts[entry["account"]] = max(counts.get(entry["account"], 0), entry["seq"])
        report = compare(target, expected, sorted(counts.items()), ["account", "last_seq"], ["bigint", "bigint"],
                         ["account"])
        problems = list(chain.check(entries))
        unbalanced = audit.unbalanced_operations(entries)
        if problems or unbalanced:
            report.differences += len(problems) + len(unbalanced)
            report.error = "; ".join([str(p) for p in problems[:3]] +
                                     [f"operation {op} sums to {total}, not 0" for op, total in unbalanced[:3]])
        return report

    def checks_with_spark(self, target: Target) -> bool:
        return False


PROJECTION = Ledger()
