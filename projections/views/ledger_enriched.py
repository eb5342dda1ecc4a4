"""The enriched ledger: every ledger entry with its customer as they were at the entry.

A temporal stream-table join. The entry's source position (the commit and change LSN of
its outbox row) picks the customer's version whose [valid-from, valid-to) holds it, in
the customer history (projections/views/customer_history.py). A join with the customers as
they are when the batch runs would be wrong whenever a customer changed between the
event's commit and its processing, and a rebuild would then differ from the live table.

Input:  the ledger's new entries and the batch's customer versions and account changes
        (via projections/views/projection.py).
Key:    event_id.
Target: <lake>/ledger_enriched: the entry's identity, amount and position, the account's
        customer, the customer's name and tier at that position, and the version used.
Apply:  one MERGE per batch over the affected entries only, each (re)computed from the
        ledger, the accounts mirror and the history:
          - the batch's new entries;
          - entries of a customer with a new version, from that version's position on
            (a change that reached the history after the entry was enriched);
          - entries of an account changed in this batch, from that change's position on
            (each posting updates its account's balance in the same transaction, so the
            account's mirror row exists by then).
        Whatever order the two inputs arrive in, each entry ends joined with the version
        its position falls in: the result does not depend on timing.
        An account's customer is its current customer_id: accounts never change owner.
Oracle: the same join computed in batch over the whole ledger and history (`check`).
"""

from __future__ import annotations

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from projections.ledger import ledger_path
from projections.mirrors import mirror_path
from projections.views import customer_history
from projections.views.context import Context
from sync.compare import Report, compare
from sync.config import Settings
from sync.delta import catalog
from sync.delta.fencing import Fence
from sync.delta.merge import ensure_table
from sync.projection import Target

NAME = "ledger_enriched"
ENTRY = ["event_id", "account", "seq", "amount", "currency", "event_type", "event_time", "_commit_lsn", "_lsn"]
CUSTOMER = ["customer_id", "customer_name", "customer_tier", "customer_valid_from_commit_lsn",
            "customer_valid_from_lsn"]
SCHEMA = ("event_id string, account bigint, seq bigint, amount decimal(20,4), currency string, event_type string, "
          "event_time timestamp, `_commit_lsn` bigint, `_lsn` bigint, customer_id bigint, customer_name string, "
          "customer_tier string, customer_valid_from_commit_lsn bigint, customer_valid_from_lsn bigint, "
          "`_applied_at` timestamp")
COMPARED = [*ENTRY, *CUSTOMER]
COMPARED_TYPES = ["text", "bigint", "bigint", "numeric", "text", "text", "timestamp without time zone",
                  "bigint", "bigint", "bigint", "text", "text", "bigint", "bigint"]


def path(settings: Settings) -> str:
    return str(catalog.root(settings, "views") / "ledger_enriched")


def targets(settings: Settings) -> list[Target]:
    return [Target(name="ledger.enriched", kind="temporal join", table=path(settings), keys=["event_id"],
                   source="ledger, customer_history")]


def ensure(spark: SparkSession, settings: Settings, fence: Fence) -> None:
    ensure_table(spark, path(settings), SCHEMA, fence.properties)


def at_position(entries: DataFrame, accounts: DataFrame, history: DataFrame) -> DataFrame:
    """Entries joined with their account's customer version as of each entry's position."""
    entry_pos = F.struct(F.col("e._commit_lsn"), F.col("e._lsn"))
    starts = F.struct(F.col("h.valid_from_commit_lsn"), F.col("h.valid_from_lsn"))
    ends = F.struct(F.col("h.valid_to_commit_lsn"), F.col("h.valid_to_lsn"))
    owned = entries.alias("e").join(accounts.alias("a"), F.col("e.account") == F.col("a.id"), "left")
    joined = owned.join(history.alias("h"), (F.col("h.id") == F.col("a.customer_id")) & (starts <= entry_pos)
                        & (F.col("h.valid_to_commit_lsn").isNull() | (entry_pos < ends)), "left")
    return joined.select(*[F.col(f"e.{c}").alias(c) for c in ENTRY],
                         F.col("a.customer_id").alias("customer_id"),
                         F.col("h.name").alias("customer_name"), F.col("h.tier").alias("customer_tier"),
                         F.col("h.valid_from_commit_lsn").alias("customer_valid_from_commit_lsn"),
                         F.col("h.valid_from_lsn").alias("customer_valid_from_lsn"))


def _accounts(context: Context) -> DataFrame:
    return context.mirror("accounts", "id bigint, customer_id bigint")


def apply(context: Context) -> int:
    if not (context.contents.entries or context.history_changed is not None or context.holds("accounts")):
        return 0  # no entry is new or re-enriched
    spark = context.spark
    ledger = context.ledger()
    accounts = _accounts(context)
    since = []  # (account, commit LSN, LSN): re-enrich this account's entries from there on
    if context.history_changed is not None:
        since.append(context.history_changed.join(accounts.withColumnRenamed("id", "account")
                                                  .withColumnRenamed("customer_id", "id"), "id")
                     .select("account", "since_commit_lsn", "since_lsn"))
    account_changes = (context.changes_of("accounts")
                       .groupBy(F.get_json_object("key", "$.id").cast("bigint").alias("account"))
                       .agg(F.min(F.struct("_commit_lsn", "_lsn")).alias("since"))
                       .select("account", F.col("since._commit_lsn").alias("since_commit_lsn"),
                               F.col("since._lsn").alias("since_lsn")))
    since.append(account_changes)
    starts = since[0] if len(since) == 1 else since[0].unionByName(since[1])
    reopened = (ledger.join(F.broadcast(starts), "account")
                .where(F.struct("_commit_lsn", "_lsn") >= F.struct("since_commit_lsn", "since_lsn"))
                .select("event_id"))
    affected = context.entries.select("event_id").unionByName(reopened).distinct()
    entries = ledger.join(affected, "event_id")
    history = context.view(customer_history.path(context.settings))
    enriched = (at_position(entries, accounts, history).withColumn("_applied_at", F.current_timestamp())
                .localCheckpoint())
    if enriched.isEmpty():
        return 0
    differs = " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in CUSTOMER)
    builder = (DeltaTable.forPath(spark, path(context.settings)).alias("t")
               .merge(enriched.alias("s"), "t.event_id = s.event_id")
               .whenMatchedUpdate(condition=differs, set={c: f"s.{c}" for c in [*CUSTOMER, "_applied_at"]})
               .whenNotMatchedInsertAll())
    metrics = context.commit.merge(builder, path(context.settings), NAME)
    return int(metrics.get("num_affected_rows", 0))


def check(settings: Settings, spark: SparkSession, conn, target: Target) -> Report:
    """Streaming equals batch: the whole join recomputed at rest, compared row by row."""
    def load(location) -> DataFrame | None:
        return (spark.read.format("delta").load(str(location))
                if DeltaTable.isDeltaTable(spark, str(location)) else None)

    ledger, accounts = load(ledger_path(settings)), load(mirror_path(settings, "accounts"))
    history, table = load(customer_history.path(settings)), load(target.table)
    expected = []
    if ledger is not None and accounts is not None and history is not None:
        expected = at_position(ledger, accounts.select("id", "customer_id"), history).select(*COMPARED)
        expected = (tuple(r) for r in expected.toLocalIterator())
    actual = (tuple(r) for r in table.select(*COMPARED).toLocalIterator()) if table is not None else []
    return compare(target, expected, actual, COMPARED, COMPARED_TYPES, ["event_id"])
