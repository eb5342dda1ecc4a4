"""The auditor's commands: `lakesync ledger verify | digest | history | query`.

They only read: the Delta table through delta-rs (no Spark, no Postgres, no Kafka), so
an auditor needs nothing but read access to the lake, and the commands answer in about
a second. What each one proves:

- verify: every data file the Delta log lists is there with the size the log recorded,
  every account's chain recomputes from its first entry (sequence 1, 2, ... with no
  gap or repeat, each hash = SHA-256(previous hash || canonical entry), no event id
  twice), and each balance in ledger_balances is the sum of its account's entries up
  to the sequence it records. The first entry that fails is named. Entries cut off at
  the end of a chain (or a whole last commit removed) leave a shorter, valid chain:
  only a digest taken before proves their absence. That every operation's postings
  sum to zero is checked by `lakesync verify`, after the freshness barrier, because a
  live ledger may hold one posting of an operation whose other is still on its way.
- digest: a short value (the Delta version and one hash over every chain head) to keep
  somewhere the lake's writers cannot reach. `verify --digest D` later proves that
  nothing D covers has changed: the chains as of D's version recompute to the same
  heads, and today's chains still pass through those heads.
- history: one account's entries as of a Delta version or a time (Delta time travel).
- query: one read-only SQL statement (SELECT or WITH) over `ledger` and
  `ledger_balances` (DataFusion's SQL dialect).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from urllib.parse import unquote

from projections.ledger import balances_path, chain, ledger_path
from sync import lake
from sync.config import Settings
from sync.errors import LakesyncError


class NotALedger(LakesyncError):
    exit_code = 2


class RefusedQuery(LakesyncError):
    exit_code = 2


def _table(path: str, version: int | None = None, as_of: datetime | None = None):
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError

    try:
        table = DeltaTable(lake.reader_uri(path), version=version,
                           storage_options=lake.reader_options() if lake.on_object_storage(path) else None)
        if as_of is not None:
            table.load_as_version(as_of)
    except TableNotFoundError:
        raise NotALedger(f"no ledger at {path} (has the ledger projection run?)") from None
    except (DeltaError, OSError, ValueError) as error:
        raise NotALedger(f"cannot read the ledger at {path} as asked: {error}") from None
    return table


def load(path: str, version: int | None = None, as_of: datetime | None = None, table=None) -> list[dict]:
    """Every entry, sorted by (account, seq)."""
    return _rows(path, table or _table(path, version, as_of), sort=["account", "seq"])


def _rows(path: str, table, columns: list[str] | None = None, sort: list[str] | None = None) -> list[dict]:
    """The rows of the data files `table` (a version of the table at `path`) lists.

    The files are read with pyarrow's own reader, not through delta-rs' pyarrow dataset:
    that one aborts the interpreter at exit now and then ("terminate called without an
    active exception", delta-rs #2184). Both tables have no partitions, no deletion
    vectors and no column mapping, so the files listed are the rows. Spark writes
    timestamps as INT96 (UTC); they are read back as UTC with microseconds.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = [lake.at(path) / unquote(p) for p in
             pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()]
    try:  # (a bucket's file read whole: the ledger's files are small)
        parts = [pq.read_table(str(file) if isinstance(file, Path) else pa.BufferReader(file.read_bytes()),
                               columns=columns) for file in files]
    except OSError as error:
        raise NotALedger(f"cannot read the ledger's data files: {error}") from None
    if not parts:
        return []
    data = pa.concat_tables(parts, promote_options="default")
    data = data.cast(pa.schema([pa.field(f.name, pa.timestamp("us", tz="UTC")) if pa.types.is_timestamp(f.type)
                                else f for f in data.schema]))
    if sort:
        data = data.sort_by([(column, "ascending") for column in sort])
    return data.to_pylist()


def file_problems(path: str, table) -> list[str]:
    """Data files the log lists that are missing or not the size the log recorded."""
    import pyarrow as pa

    problems = []
    for action in pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"]).to_pylist():
        file = lake.at(path) / unquote(action["path"])
        if not file.is_file():
            problems.append(f"data file {action['path']} is listed in the Delta log but missing")
        elif file.stat().st_size != action["size_bytes"]:
            problems.append(f"data file {action['path']} has {file.stat().st_size} bytes; "
                            f"the Delta log recorded {action['size_bytes']} (it was replaced or edited)")
    return problems


def heads(entries: list[dict]) -> dict[int, tuple[int, str]]:
    """account -> (seq, hash) of its last entry (entries sorted by account, seq)."""
    return {e["account"]: (e["seq"], e["hash"]) for e in entries}


def digest_of(version: int, entries: list[dict]) -> str:
    return f"{version}:{chain.heads_digest((a, s, h) for a, (s, h) in heads(entries).items())}"


def verify(path: str, digest: str | None = None, balances: str | None = None) -> tuple[list[str], dict]:
    """(problems, summary). No problem means the ledger is intact (see the module docstring)."""
    table = _table(path)
    problems = file_problems(path, table)
    if problems:  # the entries cannot be trusted, nor maybe read
        return problems, {"version": table.version()}
    entries = load(path, table=table)
    problems = [str(p) for p in chain.check(entries)]
    if balances and not problems and (lake.at(balances) / "_delta_log").is_dir():
        problems = _balance_problems(balances, entries)
    summary = {"version": table.version(), "entries": len(entries), "accounts": len(heads(entries))}
    if digest and not problems:
        problems = _digest_problems(path, digest, entries)
    return problems, summary


def _digest_problems(path: str, digest: str, entries: list[dict]) -> list[str]:
    match = re.fullmatch(r"(\d+):([0-9a-f]{64})", digest.strip())
    if not match:
        raise NotALedger(f"not a ledger digest: {digest!r} (expected VERSION:SHA256 from `lakesync ledger digest`)")
    version = int(match.group(1))
    then_table = _table(path, version=version)
    problems = file_problems(path, then_table)
    if problems:
        return problems
    then = load(path, table=then_table)
    problems = [f"as of version {version}: {p}" for p in chain.check(then)]
    if problems:
        return problems
    if digest_of(version, then) != digest.strip():
        return [f"the chains as of version {version} do not end in the heads the digest covers "
                "(entries up to that version were rewritten)"]
    now = {(e["account"], e["seq"]): e["hash"] for e in entries}
    for account, (seq, head) in sorted(heads(then).items()):
        if now.get((account, seq)) != head:
            return [f"account {account}: entry {seq}, a head the digest covers, differs today"]
    return []


def _balance_problems(balances: str, entries: list[dict]) -> list[str]:
    """Each recorded balance must be its account's entries summed up to its last_seq (the
    balances may trail the ledger by a batch; they never disagree with it)."""
    table = _table(balances)
    problems = file_problems(balances, table)
    if problems:
        return problems
    running: dict[tuple[int, int], Decimal] = {}
    total: dict[int, Decimal] = {}
    for entry in entries:
        total[entry["account"]] = total.get(entry["account"], Decimal(0)) + entry["amount"]
        running[(entry["account"], entry["seq"])] = total[entry["account"]]
    for row in _rows(balances, table, columns=["account", "balance", "last_seq"]):
        expected = running.get((row["account"], row["last_seq"]))
        if expected != row["balance"]:
            return [f"ledger_balances: account {row['account']} holds {row['balance']} after entry "
                    f"{row['last_seq']}, but its entries sum to {expected}"]
    return []


def digest(path: str) -> tuple[str, dict]:
    """The digest of the ledger as it is now, after verifying it."""
    table = _table(path)
    problems = file_problems(path, table)
    entries = load(path, table=table) if not problems else []
    problems = problems or [str(p) for p in chain.check(entries)]
    if problems:
        raise NotALedger(f"the ledger does not verify, so no digest: {problems[0]}")
    return digest_of(table.version(), entries), {"version": table.version(), "entries": len(entries),
                                                  "accounts": len(heads(entries))}


def history(path: str, account: int, version: int | None = None, as_of: datetime | None = None) -> list[dict]:
    """The account's entries as of `version` or `as_of`, each with its running balance."""
    if as_of is not None and as_of.tzinfo is None:
        as_of = as_of.replace(tzinfo=timezone.utc)
    balance = Decimal(0)
    rows = []
    for entry in load(path, version, as_of):
        if entry["account"] == account:
            balance += entry["amount"]
            rows.append({**entry, "balance": balance})
    return rows


def format_entries(entries: list[dict]) -> str:
    """Entries as a table for people (what `ledger history` prints)."""
    header = (f"{'seq':>5}  {'event time (UTC)':<26}  {'operation':<10}  {'amount':>14}  {'balance':>14}  "
              f"{'txid':>8}  {'offset':>7}  hash")
    lines = [header]
    for e in entries:
        lines.append(f"{e['seq']:>5}  {e['event_time'].strftime('%Y-%m-%d %H:%M:%S.%f'):<26}  "
                     f"{e['operation'] or '':<10}  {e['amount']:>10} {e['currency']}  "
                     f"{e.get('balance', ''):>14}  {e['_txid']:>8}  {e['_offset']:>7}  {e['hash'][:16]}")
    return "\n".join(lines)


def unbalanced_operations(entries: list[dict]) -> list[tuple[str, Decimal]]:
    """Operations (a transfer, a deposit, ...) whose postings do not sum to zero."""
    totals: dict[tuple[str, str], Decimal] = {}
    for entry in entries:
        key = (entry["operation_id"], entry["currency"])
        totals[key] = totals.get(key, Decimal(0)) + entry["amount"]
    return [(op, total) for (op, _), total in sorted(totals.items(), key=lambda kv: str(kv[0])) if total != 0]


# -- query --

# Strings, quoted names and comments, in one left-to-right pass (so a '--' inside a string
# hides nothing); what is left is the statement's structure.
_LEXEMES = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.S)
_WRITES = re.compile(r"\b(insert|update|delete|merge|copy|create|drop|alter|truncate|grant|revoke|set|"
                     r"vacuum|optimize|restore|call|execute|attach|install|load)\b", re.I)


def read_only(sql: str) -> str:
    """`sql` if it is one SELECT/WITH statement; RefusedQuery saying why otherwise."""
    if "$" in sql:
        raise RefusedQuery("refused: dollar-quoted text is not allowed in an auditor's query")
    bare = _LEXEMES.sub(lambda m: " " if m.group(0)[0] in "-/" else "''", sql)
    if "'" in bare.replace("''", "") or '"' in bare:
        raise RefusedQuery("refused: an unterminated string or quoted name")
    statements = [s for s in bare.split(";") if s.strip()]
    if len(statements) != 1:
        raise RefusedQuery(f"refused: one statement at a time, got {len(statements)}")
    first = statements[0].split(None, 1)[0].lower()
    if first not in ("select", "with"):
        raise RefusedQuery(f"refused: only SELECT or WITH queries may run here, not {first.upper()}")
    write = _WRITES.search(statements[0])
    if write:
        raise RefusedQuery(f"refused: {write.group(1).upper()} is not allowed in an auditor's query")
    return sql.strip().rstrip(";")


def query(settings: Settings, sql: str) -> tuple[list[str], list[tuple]]:
    """Run one read-only query over the ledger tables; (column names, rows)."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    statement = read_only(sql)
    builder = QueryBuilder()
    for name, path in (("ledger", ledger_path(settings)), ("ledger_balances", balances_path(settings))):
        if (lake.at(path) / "_delta_log").is_dir():
            builder = builder.register(name, _table(path))
    try:
        result = pa.table(builder.execute(statement).read_all())
    except Exception as error:  # DataFusion reports SQL errors as plain exceptions
        raise RefusedQuery(f"query failed: {str(error).strip().splitlines()[0]}") from None
    return result.column_names, list(zip(*(column.to_pylist() for column in result.columns)))
