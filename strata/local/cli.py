"""The `strata-local` command: the local stack a developer starts by hand.

`strata-local metastore up|status|down` runs the Hive Metastore thrift service from
the pyspark jars in the background; `strata-local demo` is `make demo`. Output and
exit codes follow the `strata` command's.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from strata.cli import leave, run_guarded
from strata.local.metastore import metastore_down, metastore_running, metastore_up
from strata.log import configure as configure_logging


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with a subcommand per part of the local stack."""
    parser = argparse.ArgumentParser(
        prog="strata-local", description="The local stack for development and the demo."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    metastore = sub.add_parser(
        "metastore",
        help="start or stop a local Hive Metastore (Derby, loopback)",
        description="Run the Hive Metastore thrift service from the jars the pyspark wheel "
        "ships, on Derby, on a loopback port, in the background.",
    )
    metastore.add_argument("action", choices=["up", "down", "status"])
    metastore.add_argument(
        "--dir", default=".strata/metastore", help="where its Derby database and log live"
    )
    metastore.add_argument("--port", type=int, default=9083, help="port to listen on (up)")
    metastore.add_argument("--json", action="store_true", help="end the output with one JSON line")
    sub.add_parser(
        "demo",
        help="a local broker and metastore, seeded click events, one batch (make demo)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `strata-local` command.

    Args:
        argv: Arguments; `sys.argv[1:]` if None.

    Returns:
        The exit code.
    """
    args = build_parser().parse_args(argv)
    configure_logging()
    if args.command == "demo":
        from strata.local.demo import main as demo

        return demo()
    return run_guarded(lambda: _metastore(args), args.json)


def _metastore(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    directory = Path(args.dir).resolve()
    if args.action == "up":
        directory.mkdir(parents=True, exist_ok=True)
        state = metastore_up(directory, args.port)
        text = (
            f"metastore running at {state['uri']} (pid {state['pid']}, data in {directory})\n"
            f"export STRATA_METASTORE_URI={state['uri']}"
        )
        return text, {"status": "up", **state}
    if args.action == "down":
        stopped = metastore_down(directory)
        return ("metastore stopped" if stopped else "no metastore was running"), {
            "status": "down",
            "stopped": stopped,
        }
    running = metastore_running(directory)
    if running is None:
        return "no metastore running", {"status": "down"}
    return f"metastore running at {running['uri']} (pid {running['pid']})", {
        "status": "up",
        **running,
    }


def entry() -> None:
    """The `strata-local` console script; ends as `strata` does (see `strata.cli.leave`)."""
    leave(main())
