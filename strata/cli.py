"""The `strata` command: parse the arguments, load the configuration, run, print the summary.

Errors a user can act on print one clear message and exit non-zero, never a
traceback: 2 for configuration, 3 when another run holds the lock, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

from strata.config import PipelineConfig, load_pipeline
from strata.config.secrets import redact, redact_json
from strata.errors import StrataError, root_cause
from strata.log import configure as configure_logging

if TYPE_CHECKING:
    from strata.batch.outcome import RunOutcome


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
        help="move where reading goes on in a partition, recorded (seek)",
        description="Move where the next batch starts reading a partition (or every "
        "partition of a topic), recorded in the ledger with who and why. Forward skips "
        "offsets (recorded like a loss); back to the start is for a topic deleted and "
        "created again under the same name. Refused while a batch is unfinished.",
    )
    ledger.add_argument("action", choices=["seek"])
    _common(ledger)
    ledger.add_argument("--topic", required=True, help="the topic")
    ledger.add_argument("--partition", type=int, default=None, help="default: every partition")
    ledger.add_argument(
        "--to", required=True, help="an offset, earliest or latest (the log's start or end now)"
    )
    ledger.add_argument("--reason", required=True, help="why; recorded in the ledger")
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `strata` command.

    Args:
        argv: Arguments; `sys.argv[1:]` if None.

    Returns:
        The exit code.
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
    configure_logging()
    handler: Handler = {
        "run": _run,
        "status": _status,
        "completeness": _completeness,
        "register": _register,
        "publish": _register,
        "sql": _sql,
        "backfill": _reprocess,
        "replay": _reprocess,
        "quality": _quality,
        "plan": _plan,
        "ledger": _ledger,
        "compact": _compact,
        "checkpoint": _checkpoint,
        "vacuum": _vacuum,
    }[args.command]

    def command() -> tuple[str, dict[str, Any]]:
        """The command on the pipeline, or on each of its tables if it routes to tables."""
        from strata.edge import each_table

        cfg = load_pipeline(args.pipeline, args.conf_dir)
        if getattr(args, "prometheus", False):
            return _prometheus(cfg, args)
        if args.command == "sql" and args.what == "query":
            # One query over every table at once (a routed pipeline's too), not one per table.
            return _sql_query(cfg, args)
        together = partial(_run_tables, args=args) if args.command == "run" else None
        return each_table(cfg, args.command, lambda one: handler(one, args), together)

    # Loading is guarded too: a bad config is a `ConfigError`, exit code 2.
    return run_guarded(command, args.json)


Handler = Callable[[PipelineConfig, argparse.Namespace], tuple[str, dict[str, Any]]]


def run_guarded(action: Callable[[], tuple[str, dict[str, Any]]], as_json: bool) -> int:
    """Run a command, print its text (and JSON line), and map its errors to exit codes.

    Everything printed goes through `redact`: a message of ours or of a client
    library (librdkafka, delta-rs, Spark) may quote a credential of the configuration.

    Args:
        action: The command; returns the text for people and the JSON-ready body.
        as_json: End the output with the body (or the error) as one JSON line.

    Returns:
        The exit code.
    """
    try:
        text, body = action()
    except StrataError as exc:
        return _fail(str(exc), exc.exit_code, as_json)
    except Exception as exc:  # noqa: BLE001 - Spark wraps task errors; surface their cause
        return _fail(*root_cause(exc), as_json)
    print(redact(text), flush=True)
    # A run whose batch committed but whose tables could not be registered still fails:
    # the data is safe, and the exit code makes the scheduler retry the registration.
    # A status without the brokers shows the ledger, and fails for the lag it lacks.
    error = (
        body.get("register_error")
        or body.get("gate_error")
        or body.get("tables_error")
        or _broker_error(body)
    )
    if error:
        print(f"strata: error: {redact(error)}", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps(redact_json(body), sort_keys=True), flush=True)
    return 1 if error else 0


def _broker_error(body: dict[str, Any]) -> str | None:
    """Why the brokers could not be asked, for the pipeline or the first table that says."""
    tables = body.get("tables")
    bodies = [body, *(tables.values() if isinstance(tables, dict) else [])]
    return next((b["broker_error"] for b in bodies if b.get("broker_error")), None)


def _fail(message: str, code: int, as_json: bool) -> int:
    message = redact(message)
    print(f"strata: error: {message}", file=sys.stderr, flush=True)
    if as_json:
        print(json.dumps({"status": "failed", "error": message, "exit_code": code}), flush=True)
    return code


def _run(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from strata.edge import alone

    return alone(partial(_run_tables, args=args), cfg)


def _run_tables(
    tables: list[PipelineConfig], args: argparse.Namespace
) -> list[tuple[str, dict[str, Any]] | Exception]:
    """`strata run` on pipelines (the tables of a routed one), their reads in one Spark job.

    Each table's batch, quality suite, metrics and completeness are its own: one that
    fails is answered by its error, and the others go on.
    """
    from strata.edge import then_each
    from strata.run import run_batches

    accepted = None if args.accept_loss is None else f"{_who()}: {args.accept_loss}"
    outcomes = run_batches(tables, max_offsets=args.max_offsets, accept_loss=accepted)
    return then_each(tables, outcomes, partial(_after_run, args=args))


def _after_run(
    cfg: PipelineConfig, outcome: RunOutcome, args: argparse.Namespace
) -> tuple[str, dict[str, Any]]:
    """What follows a pipeline's batch: its quality suite, metrics and completeness."""
    from strata.edge import status_settings
    from strata.operations.metrics import after_run
    from strata.operations.report import render_summary, summary_dict

    result = None
    if outcome.batch is not None and cfg.quality.gate != "off" and not args.no_quality:
        from strata.quality.run import run_quality

        result = run_quality(
            cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse, outcome.batch
        )
    # After the commit and the quality suite, whose result the metrics count.
    gate_failed = result is not None and not result.success and cfg.quality.gate == "fail"
    after_run(cfg.places(), status_settings(cfg), cfg.metrics, outcome, gate_failed)
    text, body = render_summary(outcome), summary_dict(outcome)
    if result is not None:
        from strata.quality.checks import render_quality

        text += "\n" + render_quality(result)
        body["quality"] = {
            "success": result.success,
            "failed": [f"{c.name} {c.column or ''}".strip() for c in result.failed],
            "docs": result.docs,
        }
        if gate_failed:
            body["gate_error"] = (
                f"batch {outcome.batch} is committed but failed its quality checks (gate: fail)"
            )
    if outcome.batch is not None:
        # After the gate: a partition it holds gets no marker.
        from strata.catalog.register import publish_completeness
        from strata.edge import registration

        found, problems = publish_completeness(
            registration(cfg), outcome.batch, facts=outcome.facts
        )
        if found is not None and found.completed:
            text += f"\ncomplete now: {', '.join(found.completed)}"
            body["completed"] = found.completed
        for problem in problems:
            text += f"\nwarning: {problem}"
    return text, body


def _who() -> str:
    """The operator, as the ledger records who accepted or edited something."""
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}"


def _plan(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from dataclasses import asdict

    from strata.operations.recovery import drop_plan, render_edit

    edit = drop_plan(cfg.places(), cfg.schemas(), args.batch, args.reason, _who(), args.force)
    return render_edit(edit), asdict(edit)


def _ledger(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from dataclasses import asdict

    from strata.operations.recovery import render_edit, seek

    edit = seek(
        cfg.places(),
        cfg.source(),
        cfg.schemas(),
        args.topic,
        args.partition,
        args.to,
        args.reason,
        _who(),
        args.reread,
    )
    return render_edit(edit), asdict(edit)


def _register(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from dataclasses import asdict

    from strata.catalog.register import register_tables, render_registration
    from strata.edge import registration
    from strata.quality.table import register_written

    # Asked for by hand: every partition is compared, not only those changed since.
    report = register_tables(registration(cfg), full=True)
    register_written(cfg.places(), cfg.metastore, cfg.warehouse, report)
    return render_registration(report), asdict(report)


def _reprocess(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """`strata backfill` (one range) and `strata replay` (batches, or one range)."""
    from strata.operations.backfill import replay_targets
    from strata.operations.report import render_summary, summary_dict
    from strata.run import reprocess
    from strata.store.ranges import OffsetRange

    if args.command == "backfill":
        targets = [OffsetRange(args.topic, args.partition, args.start, args.end)]
    else:
        by_range = (args.topic, args.partition, args.start, args.end)
        targets = replay_targets(cfg.places(), args.from_batch, args.to_batch, by_range)
    outcome = reprocess(cfg, args.command, targets, args.reason)
    return render_summary(outcome), summary_dict(outcome)


def _quality(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from dataclasses import asdict

    from strata.quality.checks import render_quality
    from strata.quality.run import run_quality

    result = run_quality(
        cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse, args.batch
    )
    body = asdict(result)
    if not result.success and cfg.quality.gate == "fail":
        body["gate_error"] = f"batch {result.batch} failed its quality checks (gate: fail)"
    return render_quality(result), body


def _sql(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from strata.catalog.sql import pipeline_ddl

    trino = cfg.trino
    ddl = pipeline_ddl(
        cfg.places(),
        cfg.schemas(),
        cfg.metastore,
        trino.delta_catalog,
        trino.hive_catalog,
        trino.iceberg_catalog,
    )
    return ddl.rstrip("\n"), {"pipeline": cfg.name, "ddl": ddl}


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


def _sql_query(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """`strata sql query`: one Trino query, embedded or in Trino."""
    from pathlib import Path

    from strata.edge import answer_query
    from strata.errors import QueryError

    if args.list:
        from strata.catalog.query import ready_query_names

        names = ready_query_names()
        return "\n".join(names), {"queries": names}
    text = None
    if args.file is not None:
        try:
            text = Path(args.file).read_text()
        except OSError as exc:
            raise QueryError(f"cannot read the query file {args.file}: {exc}") from None
    engine = "trino" if args.trino else "embedded" if args.embedded else None
    return answer_query(cfg, args.name, text, args.execute, args.format, engine)


def _compact(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from strata.edge import compact_pipeline
    from strata.maintenance.compact import render_compaction

    report = compact_pipeline(cfg, args.partition, args.older_than, args.dry_run)
    return render_compaction(report), report.as_dict()


def _checkpoint(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from strata.maintenance.vacuum import checkpoint, render_maintenance

    report = checkpoint(cfg.places())
    return render_maintenance("checkpoint", report), report


def _vacuum(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from strata.maintenance.vacuum import render_maintenance, vacuum

    report = vacuum(cfg.places(), cfg.maintenance.vacuum_retention, cfg.metastore, args.dry_run)
    return render_maintenance("vacuum" + (" (dry run)" if args.dry_run else ""), report), report


def _completeness(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from strata.catalog.completeness import completeness, render_completeness

    found = completeness(
        cfg.places(), cfg.completeness, cfg.partitioning, cfg.quality.gate, cfg.asset_uri
    )
    return render_completeness(found, args.limit), found.as_dict()


def _status(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from strata.edge import status_settings
    from strata.operations.status import pipeline_status, render_status

    status = pipeline_status(cfg.places(), status_settings(cfg), args.history)
    return render_status(status), status


def _prometheus(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """`status --prometheus`: one exposition, of the pipeline or of all its tables."""
    from strata.edge import status_settings, table_configs
    from strata.operations.metrics import status_metrics
    from strata.operations.status import pipeline_status

    if not cfg.routed:
        status = pipeline_status(cfg.places(), status_settings(cfg), args.history)
        return status_metrics([status]).decode().rstrip("\n"), status
    from strata.batch.kafka import asked_together

    # A table that cannot run (a clash) has no figures of its own to show.
    ready = {n: t for n, t in table_configs(cfg) if not isinstance(t, Exception)}
    with asked_together([t.source() for t in ready.values()], retention=True):
        tables = {
            name: pipeline_status(table.places(), status_settings(table), args.history)
            for name, table in ready.items()
        }
    text = status_metrics(tables.values()).decode().rstrip("\n")
    return text, {"pipeline": cfg.name, "tables": tables}


def entry() -> None:
    """The `strata` console script: run, then `leave`."""
    leave(main())


def leave(code: int) -> NoReturn:
    """Flush the output and end the process without interpreter teardown.

    Native thread pools (Arrow's, delta-rs's) can abort the process while Python
    finalises modules after the work is done and reported, turning a successful run
    into exit code -6. Everything a command does is committed and flushed by then,
    and the run lock is the kernel's, so the process ends with its own exit code.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
