"""The `strata-local` command: the local stack a developer starts by hand.

`strata-local up|down|status|events` runs the playground: a broker, a metastore and,
if asked, a Schema Registry, a Trino and an Airflow that stay up between commands, with
`strata` pointed at them (`strata.local.playground`). `strata-local metastore
up|status|down` runs the Hive Metastore thrift service from the pyspark jars in the
background; `strata-local demo` is `make demo`. Output and exit codes follow the `strata` command's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from strata.cli import leave, run_guarded
from strata.local import playground
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
    _playground_parsers(sub)
    return parser


def _playground_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`up`, `down`, `status` and `events`: the playground that stays up."""
    up = sub.add_parser(
        "up",
        help="start the playground in the background: broker, metastore, seeded `clicks`",
        description="Start a broker (Tansu) and a Hive Metastore (with --registry the "
        "local Schema Registry, with --trino a Trino on the metastore, with --airflow an "
        "Airflow scheduling the project's airflow_dags/) in the background on loopback "
        "ports, create the topic `clicks` and seed it with click events if it is new, "
        "and write conf/local/playground.yaml so that `strata` uses them. Services "
        "already up are left alone; ones that stopped are started again.",
    )
    up.add_argument("--registry", action="store_true", help="start the Schema Registry too")
    up.add_argument(
        "--trino",
        action="store_true",
        help="start Trino too (catalogs delta, hive and iceberg on the metastore; about a "
        "minute), and point `strata sql query` at it (trino.url)",
    )
    up.add_argument(
        "--airflow",
        action="store_true",
        help="start Airflow too (API server and UI, scheduler, DAG processor, triggerer), "
        "scheduling airflow_dags/ with the settings of --conf-dir",
    )
    labels = {
        "schema_registry": "schema registry",
        "trino": "Trino server",
        "airflow": "Airflow UI and API",
    }
    for name, port in playground.DEFAULT_PORTS.items():
        flag = "--registry-port" if name == "schema_registry" else f"--{name}-port"
        up.add_argument(
            flag,
            dest=f"{name}_port",
            type=int,
            default=None,
            metavar="PORT",
            help=f"loopback port of the {labels.get(name, name)} (0: a free one; default: "
            f"the one it had, else {port})",
        )
    up.add_argument(
        "--conf-dir",
        default="conf",
        help="configuration directory whose local/ gets playground.yaml (default: conf)",
    )
    down = sub.add_parser(
        "down",
        help="stop the playground; its tables and metastore stay unless --purge",
        description="Stop what `strata-local up` started (each recorded process, only if "
        "it is still that process) and remove conf/local/playground.yaml.",
    )
    down.add_argument(
        "--purge", action="store_true", help="delete the tables and the metastore's database too"
    )
    status = sub.add_parser(
        "status", help="each service of the playground, up or down, and its address"
    )
    events = sub.add_parser(
        "events",
        help="produce new click events to the playground's `clicks`, for the next run",
        description="Produce new click events spread over the last --hours hours (some late "
        "and malformed) to the playground's broker, and seal the partitions, so that the "
        "next `strata run --pipeline clicks` lands them all.",
    )
    events.add_argument(
        "--count", type=_at_least(1), default=2_000, help="valid events (default 2000)"
    )
    events.add_argument(
        "--hours", type=_at_least(1), default=2, help="hours they span, ending now (default 2)"
    )
    events.add_argument(
        "--late", type=_at_least(0), default=5, help="late events among them (default 5)"
    )
    events.add_argument(
        "--malformed", type=_at_least(0), default=3, help="malformed messages (default 3)"
    )
    where = playground.DEFAULT_DIR
    for parser in (up, down, status, events):
        parser.add_argument("--dir", default=where, help=f"the playground's data (default {where})")
        parser.add_argument("--json", action="store_true", help="end the output with one JSON line")


def _at_least(minimum: int) -> Callable[[str], int]:
    """An argument type: a whole number of at least `minimum`."""

    def whole(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            number = minimum - 1
        if number < minimum:
            raise argparse.ArgumentTypeError(f"takes a whole number of at least {minimum}")
        return number

    return whole


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
    if args.command == "metastore":
        return run_guarded(lambda: _metastore(args), args.json)
    return run_guarded(lambda: _playground(args), args.json)


def _playground(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    # `--conf-dir` is `up`'s alone: the others find the settings file in the state file.
    ground = playground.Playground(Path(args.dir), Path(getattr(args, "conf_dir", "conf")))
    if args.command == "up":
        ports = {n: getattr(args, f"{n}_port") for n in playground.DEFAULT_PORTS}
        return playground.up(ground, ports, args.registry, args.airflow, args.trino)
    if args.command == "down":
        return playground.down(ground, args.purge)
    if args.command == "status":
        return playground.status(ground)
    return playground.more_events(ground, args.count, args.hours, args.late, args.malformed)


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
