"""The `strata` command's arguments: a subcommand per operation, and what each takes.

`strata.cli` runs the command; here its parser is built (the reference pages are
generated from it) and the combinations argparse cannot express are refused, each with
a usage error (exit code 2) naming the option.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pipeline", required=True, help="pipeline name (conf/pipelines/NAME.yaml)"
    )
    parser.add_argument(
        "--conf-dir", default="conf", help="configuration directory (default: conf)"
    )
    parser.add_argument("--json", action="store_true", help="end the output with one JSON line")


def _range_args(parser: argparse.ArgumentParser, required: bool) -> None:
    """One partition's offset range and the reason, as backfill and replay take them."""
    parser.add_argument("--topic", required=required, help="topic of the range")
    parser.add_argument("--partition", type=int, required=required, help="partition of the range")
    parser.add_argument("--from", dest="start", type=int, required=required, help="first offset")
    parser.add_argument("--to", dest="end", type=int, required=required, help="first offset after")
    parser.add_argument("--reason", required=True, help="why; recorded in the ledger")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with a subcommand per operation."""
    parser = argparse.ArgumentParser(
        prog="strata", description="Batch ingestion from Kafka into event-time Delta tables."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run",
        help="plan and run the next batch (or finish an unfinished one)",
        description="Plan the next batch from the ledger and the brokers' watermarks, read it "
        "with Spark, commit it exactly once, and print a summary. Exits 0 with no JVM "
        "started when there is nothing new.",
    )
    _common(run)
    run.add_argument(
        "--max-offsets", type=int, default=None, help="cap on offsets per partition for this batch"
    )
    run.add_argument(
        "--accept-loss",
        metavar="REASON",
        default=None,
        help="go on when retention deleted unread offsets, recording the loss, who accepted "
        "it and REASON in the ledger (default: stop before reading)",
    )
    run.add_argument(
        "--no-quality",
        action="store_true",
        help="skip the batch's data-quality suite (an Airflow DAG runs it as its own task)",
    )
    status = sub.add_parser(
        "status",
        help="committed ranges, recent batches and lag",
        description="Committed ranges per partition (from the ledger), recent batches, and lag "
        "against the brokers' high watermarks.",
    )
    _common(status)
    status.add_argument("--history", type=int, default=10, help="how many recent batches to list")
    status.add_argument(
        "--prometheus",
        action="store_true",
        help="print the lag, time to retention and last batch as Prometheus metrics (the text "
        "exposition format) instead",
    )
    complete = sub.add_parser(
        "completeness",
        help="which event-time partitions are complete, the watermark, and late rows",
        description="From the ledger: the watermark (the lowest newest event time among the "
        "Kafka partitions that hold it back) and the one holding it, each partition of the "
        "data table complete or not (and since which batch), the partitions a failed "
        "quality gate holds, and the rows that landed after a partition was complete.",
    )
    _common(complete)
    complete.add_argument(
        "--limit", type=int, default=48, help="newest partitions to list (--json lists all)"
    )
    register = sub.add_parser(
        "register",
        aliases=["publish"],
        help="register the pipeline's tables in the Hive Metastore",
        description="Create or correct the metastore entries of the pipeline's data, raw, "
        "quarantine and ledger tables. Idempotent; every run does it after its commit.",
    )
    _common(register)
    backfill = sub.add_parser(
        "backfill",
        help="re-ingest one committed offset range, replacing its rows",
        description="Re-read [--from, --to) of one partition (from Kafka, or from the raw "
        "copy when Kafka no longer holds it), and replace that range's rows in the data, "
        "quarantine and raw tables in one transaction per table. Rows outside the range "
        "are untouched; the ledger records the backfill and its reason.",
    )
    _common(backfill)
    _range_args(backfill, required=True)
    replay = sub.add_parser(
        "replay",
        help="re-decode committed batches from the raw copy with the current schema",
        description="Re-decode the messages of batches --from-batch to --to-batch (or of "
        "[--from, --to) of one partition) from the raw copy, with the current schema and "
        "decoder, and replace their rows in the data and quarantine tables, one transaction "
        "per table. Kafka is not contacted. Typically run after a schema or decoder fix: "
        "quarantined messages that now decode move into the data table.",
    )
    _common(replay)
    replay.add_argument("--from-batch", type=int, help="first batch to replay")
    replay.add_argument("--to-batch", type=int, help="last batch to replay (default: --from-batch)")
    replay.add_argument(
        "--rebuild",
        action="store_true",
        help="replay every committed batch into a data table and quarantine made afresh, "
        "where one is gone or replaced (`strata status` says which)",
    )
    _range_args(replay, required=False)
    plan = sub.add_parser(
        "plan",
        help="abandon the saved plan of an unfinished batch (drop)",
        description="Abandon the saved plan of the unfinished batch when it can no longer be "
        "finished (Kafka's retention deleted its offsets before its raw copy was committed, "
        "or its file is damaged). The batch is recorded in the ledger as abandoned, with who "
        "and why, and reads nothing; the next run plans afresh. A partly committed batch is "
        "finished, not dropped, unless --force removes the rows it committed.",
    )
    plan.add_argument("action", choices=["drop"])
    _common(plan)
    plan.add_argument("--batch", type=int, required=True, help="the unfinished batch")
    plan.add_argument("--reason", required=True, help="why; recorded in the ledger")
    plan.add_argument(
        "--force",
        action="store_true",
        help="drop a partly committed ingest batch too: the rows it committed are removed "
        "and its offsets are read again by the next batch",
    )
    ledger = sub.add_parser(
        "ledger",
        help="move where reading goes on (seek), or restore or reset a table, recorded",
        description="seek: move where the next batch starts reading a partition (or every "
        "partition of a topic), recorded in the ledger with who and why. Forward skips "
        "offsets (recorded like a loss); back to the start is for a topic deleted and "
        "created again under the same name. reset: accept that a table the ledger vouches "
        "for is gone, replaced or an older copy; recorded with who and why, the table "
        "starts afresh. restore: register an Iceberg table dropped from the metastore "
        "again, from its own newest metadata file. seek and reset are refused while a batch "
        "is unfinished.",
    )
    ledger.add_argument("action", choices=["seek", "reset", "restore"])
    _common(ledger)
    ledger.add_argument("--topic", help="seek: the topic")
    ledger.add_argument(
        "--partition", type=int, default=None, help="seek: the partition (default: every one)"
    )
    ledger.add_argument(
        "--to", help="seek: an offset, earliest or latest (the log's start or end now)"
    )
    ledger.add_argument(
        "--table",
        choices=["table", "raw", "quarantine"],
        help="reset, restore: the data table, the raw copy or the quarantine",
    )
    ledger.add_argument("--reason", help="seek, reset: why; recorded in the ledger")
    ledger.add_argument(
        "--reread",
        action="store_true",
        help="allow going back over committed offsets of the same topic (they land twice)",
    )
    quality = sub.add_parser(
        "quality",
        help="run the data-quality suite on a batch and write its reports",
        description="Validate a committed batch (the latest by default) with the pipeline's "
        "Great Expectations suite and reconcile it against the ledger and the tables; write "
        "its JSON result and Data Docs page and refresh the summary page. Exits 1 when a "
        "check fails under quality.gate: fail.",
    )
    _common(quality)
    quality.add_argument("--batch", type=int, default=None, help="batch to check")
    sql = sub.add_parser(
        "sql",
        help="print Trino SQL for the pipeline (ddl), or run a Trino query on its tables (query)",
        description="ddl: print the Trino statements that register or create the pipeline's "
        "tables: register_table calls for Delta, CREATE TABLE and partition sync for Parquet. "
        "query: run one Trino query (a ready query by name, --file or -e) on the pipeline's "
        "tables, embedded (DuckDB, no server) or, with trino.url or --trino, in Trino. The "
        "tables are named as in Trino: <database>.<pipeline>, _raw, _quarantine, _ledger "
        "and _quality; one nothing was committed to yet is there, empty. Only queries run: "
        "any other statement is refused (exit code 2).",
    )
    sql.add_argument("what", choices=["ddl", "query"])
    sql.add_argument(
        "name",
        nargs="?",
        metavar="QUERY",
        help="query: a ready query, written for the demo's strata.clicks and run on this "
        "pipeline's tables (see `strata sql query --list`)",
    )
    _common(sql)
    given = sql.add_mutually_exclusive_group()
    given.add_argument("--file", metavar="PATH", help="query: run the query in this file")
    given.add_argument("-e", "--execute", metavar="SQL", help="query: run this query")
    given.add_argument("--list", action="store_true", help="query: list the ready queries")
    sql.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="query: aligned columns (default), CSV with a header, or a JSON list of objects",
    )
    where = sql.add_mutually_exclusive_group()
    where.add_argument(
        "--trino",
        action="store_true",
        help="query: send the statement to the Trino of trino.url (the default when it is set)",
    )
    where.add_argument(
        "--embedded",
        action="store_true",
        help="query: run it embedded (DuckDB) even where trino.url is set",
    )
    compact = sub.add_parser(
        "compact",
        help="merge small files of settled partitions into target-sized ones",
        description="Merge the small files of settled event-time partitions (and of the "
        "raw, quarantine and ledger tables) into files of limits.target_file_mb, sorted as "
        "the writer wrote them; one Delta transaction per partition, marked as no data "
        "change, so readers and ingest go on undisturbed. A plain Parquet partition moves "
        "to a new directory, and the metastore with it.",
    )
    _common(compact)
    compact.add_argument("--partition", help="only this data partition, dt=YYYY-MM-DD[/hr=HH]")
    compact.add_argument(
        "--older-than", metavar="DURATION", help="settle time instead of maintenance.settle"
    )
    compact.add_argument("--dry-run", action="store_true", help="report; change nothing")
    checkpoint = sub.add_parser(
        "checkpoint",
        help="checkpoint every Delta table's log and delete its expired commits",
        description="Write a Delta checkpoint of the data, raw, quarantine and ledger "
        "tables, so opening them replays few commits, and delete log entries past Delta's "
        "log retention that the checkpoint covers.",
    )
    _common(checkpoint)
    vacuum = sub.add_parser(
        "vacuum",
        help="delete removed files past the retention, and files never committed",
        description="Delete files that compaction, a backfill or a replay removed longer "
        "than maintenance.vacuum_retention ago (for plain Parquet, the directories compacted "
        "partitions moved away from), and files of killed attempts that can never be "
        "committed. Files this pipeline did not write are left and listed.",
    )
    _common(vacuum)
    vacuum.add_argument("--dry-run", action="store_true", help="list; delete nothing")
    return parser


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's arguments, checked; a usage error exits 2.

    Args:
        argv: Arguments; `sys.argv[1:]` if None.
    """
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command == "sql" and args.name is None and len(extra) == 1:
        # `sql query --pipeline P NAME`: argparse gives the optional QUERY nothing once
        # options stand between it and `query`, and leaves NAME over.
        args.name = extra.pop()
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "prometheus", False) and args.json:
        parser.error("--prometheus prints the exposition format alone; leave out --json")
    if args.command == "sql":
        _check_sql_args(parser, args)
    if args.command == "ledger":
        _check_ledger_args(parser, args)
    if args.command == "replay" and args.rebuild:
        given = [args.from_batch, args.to_batch, args.topic, args.partition, args.start, args.end]
        if any(v is not None for v in given):
            parser.error("--rebuild replays every committed batch; leave out the batches and range")
    return args


def _check_sql_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`sql ddl` takes none of the query's arguments; `sql query` takes one query."""
    query_args = {
        "QUERY": args.name,
        "--file": args.file,
        "--execute": args.execute,
        "--list": args.list or None,
        "--format": None if args.format == "table" else args.format,
        "--trino": args.trino or None,
        "--embedded": args.embedded or None,
    }
    if args.what == "ddl":
        extra = [name for name, value in query_args.items() if value is not None]
        if extra:
            parser.error(f"`sql ddl` takes no {', '.join(extra)}; those are for `sql query`")
        return
    if args.list and args.name is not None:
        parser.error("--list lists the ready queries; leave out QUERY")
    if args.name is not None and (args.file is not None or args.execute is not None):
        parser.error("give one query: a ready query's name, --file PATH or -e SQL")


def _check_ledger_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Each `ledger` action takes its own options, and only those."""
    needs = {
        "seek": {"--topic": args.topic, "--to": args.to, "--reason": args.reason},
        "reset": {"--table": args.table, "--reason": args.reason},
        "restore": {"--table": args.table},
    }[args.action]
    missing = [name for name, value in needs.items() if value is None]
    if missing:
        parser.error(f"`ledger {args.action}` needs {', '.join(missing)}")
    given = {
        "--topic": args.topic,
        "--partition": args.partition,
        "--to": args.to,
        "--table": args.table,
        "--reason": args.reason,
        "--reread": args.reread or None,
    }
    extra = [name for name, value in given.items() if value is not None and name not in needs]
    if args.action == "seek":
        extra = [name for name in extra if name not in ("--partition", "--reread")]
    if extra:
        parser.error(f"`ledger {args.action}` takes no {', '.join(extra)}")
