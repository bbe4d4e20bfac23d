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

from strata._arguments import build_parser as build_parser
from strata._arguments import parse
from strata.config import PipelineConfig, load_pipeline
from strata.config.secrets import redact, redact_json
from strata.errors import StrataError, root_cause
from strata.log import configure as configure_logging

if TYPE_CHECKING:
    from strata.batch.outcome import RunOutcome


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `strata` command.

    Args:
        argv: Arguments; `sys.argv[1:]` if None.

    Returns:
        The exit code.
    """
    args = parse(argv)
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
        or body.get("identity_error")
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
            "docs_location": result.docs_location,
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

    from strata.operations.recovery import render_edit, reset_table, restore_table, seek

    if args.action == "restore":
        done = restore_table(cfg.places(), args.table)
        return done, {"pipeline": cfg.name, "restored": args.table, "note": done}
    if args.action == "reset":
        edit = reset_table(cfg.places(), cfg.schemas(), args.table, args.reason, _who())
        return render_edit(edit), asdict(edit)
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
    from strata.operations.backfill import rebuild_request, replay_targets
    from strata.operations.report import render_summary, summary_dict
    from strata.run import reprocess
    from strata.store.ranges import OffsetRange

    rebuild: tuple[str, ...] = ()
    if args.command == "backfill":
        targets = [OffsetRange(args.topic, args.partition, args.start, args.end)]
    elif args.rebuild:
        targets, rebuild = rebuild_request(cfg.places())
    else:
        by_range = (args.topic, args.partition, args.start, args.end)
        targets = replay_targets(cfg.places(), args.from_batch, args.to_batch, by_range)
    outcome = reprocess(cfg, args.command, targets, args.reason, rebuild=rebuild)
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
        register_tables=trino.register_delta_tables,
    )
    return ddl.rstrip("\n"), {"pipeline": cfg.name, "ddl": ddl}


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
    from strata.maintenance.report import render_checkpoint
    from strata.maintenance.vacuum import checkpoint

    report = checkpoint(cfg.places())
    return render_checkpoint(report), report.as_dict()


def _vacuum(cfg: PipelineConfig, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    from strata.maintenance.report import render_vacuum
    from strata.maintenance.vacuum import vacuum

    report = vacuum(cfg.places(), cfg.maintenance.vacuum_retention, cfg.metastore, args.dry_run)
    return render_vacuum(report), report.as_dict()


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
