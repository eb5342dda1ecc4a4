"""The `lakesync` command line.

Expected failures (a service down, a port taken, Java missing, a projection behind) are
LakesyncError subclasses and end as one line on stderr with a non-zero exit; anything
else is a bug and keeps its traceback.

Each command imports its module when it runs: `--help` and the `ledger` commands need not
load Spark's and Delta's Python libraries, which the other commands pull in.
(tests/unit/test_layers.py checks that none of these imports would be a cycle.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from sync import config, lake
from sync.errors import LakesyncError


def _utc() -> None:
    # PySpark turns timestamps into naive datetimes in the process' local zone; make it UTC.
    os.environ["TZ"] = "UTC"
    time.tzset()


def cmd_up(settings, args) -> int:
    from sync import stack

    if args.external:
        print("using your own Postgres, Kafka and Connect (addresses from the environment)")
        stack.connect_external(settings)
        return 0
    print(f"starting the embedded stack in {settings.home}")
    took = stack.up(settings)
    print(f"stack is up in {took:.1f}s: postgres {config.safe_dsn(settings.pg_dsn)}, "
          f"kafka {settings.kafka_bootstrap}, connect {settings.connect_url}")
    return 0


def cmd_down(settings, args) -> int:
    from sync import stack

    stack.down(settings)
    return 0


def cmd_run(settings, args) -> int:
    from sync.commands import runner

    runner.run(settings, once=args.once)
    return 0


def cmd_wait(settings, args) -> int:
    from sync.commands import freshness, projection_named

    names = {projection_named(settings, name, "wait for").name for name in args.names} or None
    took = freshness.wait(settings, timeout=args.timeout, names=names)
    which = f"{', '.join(sorted(names))} reflect{'s' * (len(names) == 1)}" if names else "every projection reflects"
    print(f"fresh: {which} Postgres as of the call ({took:.1f}s)")
    return 0


def cmd_verify(settings, args) -> int:
    from sync.commands import verify
    from sync.compare import readable

    reports = verify.verify(settings)
    ok = all(r.differences == 0 for r in reports)
    if args.json:
        print(json.dumps({"ok": ok, "projections": [r.as_json() for r in reports]}, indent=2, default=str))
    else:
        width = max([28, *(len(r.name) for r in reports)])  # (a user's table names can be long)
        print(f"{'projection':<{width}} {'kind':<8} {'postgres':>9} {'delta':>9} {'differences':>12}")
        for r in reports:
            print(f"{r.name:<{width}} {r.kind:<8} {r.source_rows:>9} {r.target_rows:>9} {r.differences:>12}")
            for s in r.sample:  # (--json keeps each value whole)
                shown = {side: json.dumps(readable(s[side]), default=str, ensure_ascii=False)
                         for side in ("key", "source", "target")}
                print(f"    key {shown['key']}: postgres {shown['source']} | delta {shown['target']}")
        print("verify: no difference" if ok else "verify: DIFFERENCES FOUND")
    return 0 if ok else 1


def cmd_status(settings, args) -> int:
    from sync.commands import status

    report = status.collect(settings)
    print(json.dumps(report, indent=2) if args.json else status.render(report))
    return 0 if status.healthy(report) else 1


def cmd_snapshot(settings, args) -> int:
    from dataclasses import asdict

    from sync.commands import snapshot

    point = snapshot.latest(settings, tuple(name.strip() for name in args.of.split(",") if name.strip()))
    if not args.json:
        print(snapshot.render(point))
        return 0
    shown = asdict(point)
    for table in shown["tables"].values():  # how DuckDB and delta-rs name it (s3:// for a bucket's)
        table["reader_path"] = lake.reader_uri(table["path"])
    print(json.dumps(shown, indent=2))
    return 0


def cmd_capture(settings, args) -> int:
    from sync.commands import capture

    if args.action == "add":
        capture.add(settings, args.entries)
    elif args.action == "remove":
        capture.remove(settings, args.entries)
    else:
        rows = capture.listing(settings)
        if args.json:
            print(json.dumps(rows, indent=2))
        for row in [] if args.json else rows:
            print(f"{row['entry']:<32} {row['from']:<17} {', '.join(row['mirrors']) or '(no table yet)'}")
    return 0


def cmd_resnapshot(settings, args) -> int:
    from sync.commands.resnapshot import resnapshot

    print("taking a fresh snapshot; the mirrors are rebuilt from it")
    resnapshot(settings)
    print("done: start the runner again (`lakesync run`), then `lakesync wait` and `lakesync verify`")
    return 0


def cmd_rebuild(settings, args) -> int:
    from sync.commands import rebuild
    from sync.compare import readable

    comparisons = rebuild.rebuild(settings, args.names, verify=args.verify, swap=args.swap)
    if not args.verify:
        return 0
    width = max([28, *(len(c.name) for c in comparisons)])
    print(f"{'table':<{width}} {'live':>9} {'rebuilt':>9} {'differences':>12}")
    for c in comparisons:
        print(f"{c.name:<{width}} {c.live_rows:>9} {c.rebuilt_rows:>9} {c.differences:>12}")
        for key in c.sample:
            print(f"    differs: {json.dumps(readable(key), default=str, ensure_ascii=False)}")
    same = not any(c.differences for c in comparisons)
    print("verify: the rebuilt projection is identical" if same else "verify: DIFFERENCES FOUND")
    return 0 if same else 1


def cmd_ledger(settings, args) -> int:
    """The auditor's commands (projections/ledger/audit.py): they only read the lake."""
    from projections.ledger import audit, balances_path, ledger_path

    path = ledger_path(settings)
    if args.action == "verify":
        problems, summary = audit.verify(path, args.digest, balances_path(settings))
        if problems:
            print(f"ledger verify: BROKEN at {problems[0]}")
            for more in problems[1:5]:
                print(f"  also: {more}")
            return 1
        covered = f", and unchanged since digest {args.digest}" if args.digest else ""
        print(f"ledger verify: OK: {summary['entries']} entries in {summary['accounts']} chains "
              f"recomputed at Delta version {summary['version']}{covered}")
        return 0
    if args.action == "digest":
        digest, summary = audit.digest(path)
        print(digest)
        print(f"covers {summary['entries']} entries in {summary['accounts']} chains at Delta version "
              f"{summary['version']}; keep it where the lake's writers cannot change it", file=sys.stderr)
        return 0
    if args.action == "history":
        if args.version is not None and args.as_of is not None:
            raise audit.RefusedQuery("give --as-of or --version, not both")
        entries = audit.history(path, args.account, args.version, args.as_of)
        print(audit.format_entries(entries) if entries else f"account {args.account} has no entries then")
        return 0
    columns, rows = audit.query(settings, args.sql)
    print("\t".join(columns))
    for row in rows:
        print("\t".join("" if v is None else str(v) for v in row))
    return 0


def _timestamp(text: str):
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO-8601 time: {text!r} (e.g. 2026-11-22T10:15:00Z)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def cmd_bench(settings, args) -> int:
    from sync import bench

    result = bench.run(settings, events=args.events, rate=args.rate, seconds=args.seconds, sizes=args.sizes,
                       merge_batch=args.merge_batch, json_path=args.json, workers=args.workers)
    missed = [goal["what"] for goal in result["goals"].values() if goal["met"] is False]
    print("bench: every goal met" if not missed else "bench: goals missed: " + "; ".join(missed))
    return 0


def _positive(kind, or_zero: bool = False):
    """A parser of a number above zero (or zero too: `or_zero`)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = -1
        if value < 0 or (value == 0 and not or_zero):
            raise argparse.ArgumentTypeError(f"not a {'whole' if or_zero else 'positive'} number: {text!r}")
        return value
    return parse


def cmd_demo(settings, args) -> int:
    from sync import demo

    return demo.main(settings, external=args.external)


def parser() -> argparse.ArgumentParser:
    from sync.bench import DEFAULT_SIZES, DEFAULT_WORKERS

    top = argparse.ArgumentParser(prog="lakesync", description="Postgres -> Debezium -> Kafka -> Spark -> Delta")
    top.add_argument("--verbose", action="store_true",
                     help="the JVM's log lines (Spark's) on this terminal too, not only in the stack's logs folder")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)
    up = sub.add_parser("up", help="start the embedded stack (idempotent)")
    up.add_argument("--external", action="store_true",
                    help="start nothing: run the migrations and register the connector on the "
                         "services the environment points at")
    up.set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop the embedded stack and the runner (idempotent)").set_defaults(func=cmd_down)
    run = sub.add_parser("run", help="run every projection")
    run.add_argument("--once", action="store_true", help="process what is in Kafka now, then exit")
    run.set_defaults(func=cmd_run)
    demo = sub.add_parser("demo", help="up, seed, workload, run, summary")
    demo.add_argument("--external", action="store_true",
                      help="on the services the environment points at (docker-compose.yml): `up --external` "
                           "instead of the embedded stack")
    demo.set_defaults(func=cmd_demo)
    status = sub.add_parser("status", help="health, slot lag, connector tasks, per-projection lag")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)
    wait = sub.add_parser("wait", help="return once every projection (or those named) reflects Postgres as of now")
    wait.add_argument("names", nargs="*", metavar="NAME", help="a projection or one of its targets")
    wait.add_argument("--timeout", type=float, default=180.0, metavar="S")
    wait.set_defaults(func=cmd_wait)
    snapshot = sub.add_parser("snapshot", help="the latest consistent point: every projection's Delta versions "
                                               "(mirrors, ledger, changelog, views, event time) at one source "
                                               "transaction")
    snapshot.add_argument("--json", action="store_true")
    snapshot.add_argument("--of", default="", metavar="PROJECTION,...",
                          help="only these projections (and those they read): a fresher point")
    snapshot.set_defaults(func=cmd_snapshot)
    verify = sub.add_parser("verify", help="compare every projection with its Postgres oracle")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(func=cmd_verify)
    capture = sub.add_parser("capture", help="the capture set while everything runs: add (a table that holds "
                                             "rows is snapshotted alone), remove, list")
    entries = capture.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, text in (("add", "capture these too; existing tables get an incremental snapshot"),
                         ("remove", "stop capturing entries `capture add` added (their mirrors stay)")):
        step = entries.add_parser(action, help=text)
        step.add_argument("entries", nargs="+", metavar="ENTRY", help="a schema, or schema.TABLE_PATTERN")
    entries.add_parser("list", help="each entry, where it comes from, the mirrors it keeps").add_argument(
        "--json", action="store_true")
    capture.set_defaults(func=cmd_capture)
    sub.add_parser("resnapshot", help="after a lost replication slot: new snapshot, mirrors rebuilt from it"
                   ).set_defaults(func=cmd_resnapshot)
    rebuild = sub.add_parser("rebuild", help="rebuild a projection from offset zero beside the live one")
    rebuild.add_argument("names", nargs="+", metavar="NAME",
                         help="mirrors, ledger, views, event_time, or one of their targets; "
                              "several are rebuilt side by side")
    rebuild.add_argument("--verify", action="store_true",
                         help="compare it with the live one at the same source position (pauses capture meanwhile)")
    rebuild.add_argument("--swap", action="store_true", help="then make it the one readers see, and retire the old")
    rebuild.set_defaults(func=cmd_rebuild)
    bench = sub.add_parser("bench", help="throughput, freshness, merge scaling and rebuild rate, against "
                                         "the ceiling and the peers (writes bench/results)")
    bench.add_argument("--events", type=_positive(int), default=100_000, metavar="N",
                       help="change events in the backlog (default 100,000; the issue's 1,000,000 takes "
                            "over an hour at today's apply rate)")
    bench.add_argument("--json", type=Path, metavar="PATH", help="where the JSON goes (default bench/results/bench.json)")
    bench.add_argument("--rate", type=_positive(float), default=1000.0, metavar="R",
                       help="change events/s of the steady load the freshness is measured at")
    bench.add_argument("--seconds", type=_positive(float), default=60.0, metavar="S", help="how long the steady load lasts")
    bench.add_argument("--sizes", type=_positive(int), nargs="+", metavar="ROWS",
                       default=DEFAULT_SIZES, help="mirror sizes the merge rate is measured against")
    bench.add_argument("--merge-batch", type=_positive(int), default=50_000, metavar="B",
                       help="change events per merge batch")
    bench.add_argument("--workers", type=_positive(int, or_zero=True), default=DEFAULT_WORKERS, metavar="N",
                       help="also measure on a Spark standalone cluster of N workers started on this machine "
                            f"(default {DEFAULT_WORKERS}; 0: not)")
    bench.set_defaults(func=cmd_bench)
    ledger = sub.add_parser("ledger", help="the auditor's commands over the hash-chained ledger (read-only)")
    actions = ledger.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser("verify", help="recompute every chain; exit 1 naming the first broken entry")
    check.add_argument("--digest", metavar="D", help="also prove nothing covered by digest D has changed")
    actions.add_parser("digest", help="print the Delta version and a hash over every chain head")
    history = actions.add_parser("history", help="one account's entries, now or as of a time or version")
    history.add_argument("account", type=int, metavar="ACCOUNT")
    history.add_argument("--as-of", type=_timestamp, metavar="TIMESTAMP", help="ISO-8601, UTC unless a zone is given")
    history.add_argument("--version", type=int, metavar="N", help="a Delta version of the ledger")
    query = actions.add_parser("query", help='one read-only SQL query over ledger and ledger_balances')
    query.add_argument("sql", metavar="SQL")
    ledger.set_defaults(func=cmd_ledger)
    return top


def main(argv: list[str] | None = None) -> int:
    _utc()
    args = parser().parse_args(argv)
    try:
        settings = config.load()
        return args.func(replace(settings, verbose=True) if args.verbose else settings, args)
    except LakesyncError as error:
        print(f"lakesync {args.command}: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
