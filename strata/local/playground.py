"""The playground: a local stack that stays up between commands (`strata-local up`).

`up` starts a broker (Tansu), a Hive Metastore and, if asked, the local Schema
Registry, a Trino on the metastore (`strata.local.trino`) and an Airflow
(`strata.local.airflow`: its API server, scheduler, DAG processor and triggerer),
detached from the command, on loopback ports; creates the topic `clicks` and seeds it
with click events; and writes `conf/local/playground.yaml`, which points every `strata`
command (and so every Airflow task, and `strata sql query`) at them. `down` stops
them and removes that file; `status` says what runs where; `events` produces more
click events to land.

Everything lives in one directory (`.strata/playground` by default): the state file
recording each service's pid, port and command line, their logs, the metastore's
Derby database, the warehouse, Trino's configuration and Airflow's home. The wheel's
Tansu keeps its log in memory (its SQLite and file engines are not built in), so the
topic's messages last while the broker runs; the tables, the ledger and the metastore
outlast `down`.

A pid is only ever signalled while its command line is the one recorded at start, so
a pid the system gave to another process since is never killed; nor is one of the
processes a service started (`strata.local.processes`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from strata.errors import StrataError
from strata.local.airflow import COMPONENTS, LocalAirflow
from strata.local.events import HOUR_MS, Message, click_events, produce
from strata.local.processes import process_command, stop_recorded
from strata.local.service import LocalService, port_open
from strata.log import get_logger

log = get_logger(__name__)

DEFAULT_DIR = ".strata/playground"
STATE_FILE = "playground.json"
CONF_FILE = "playground.yaml"
TOPIC = "clicks"
PARTITIONS = 4
LOOPBACK = "127.0.0.1"
# The ports the project's defaults and Kafka's, Hive's, Confluent's and Airflow's tools
# expect; Trino's own default, 8080, is Airflow's too, so it takes the next free hundred's.
DEFAULT_PORTS = {
    "broker": 9092,
    "metastore": 9083,
    "schema_registry": 8081,
    "trino": 8090,
    "airflow": 8080,
}
# Airflow's components, as the state file names them; only the API server has a port.
AIRFLOW = {component: "airflow_" + component.replace("-", "_") for component in COMPONENTS}
# The services that start one by one, as against Airflow's components that start as one.
# Trino after the metastore, whose address it is configured with.
_ALONE = ("broker", "metastore", "schema_registry", "trino")
SERVICES = (*_ALONE, *AIRFLOW.values())
_LABELS = {
    "schema_registry": "schema registry",
    "trino": "Trino server",
    "airflow": "Airflow API server",
    "airflow_api_server": "Airflow API server",
    "airflow_scheduler": "Airflow scheduler",
    "airflow_dag_processor": "Airflow DAG processor",
    "airflow_triggerer": "Airflow triggerer",
}
# What `up` seeds: six event hours before the current one, some late and malformed.
SEED_EVENTS = 5_000
SEED_HOURS = 6
_STOP_TIMEOUT_S = 30.0
_STRATA_ENV = ("STRATA_KAFKA_BOOTSTRAP", "STRATA_METASTORE_URI", "STRATA_WAREHOUSE")


class PlaygroundError(StrataError):
    """The playground is not in the state the command needs; the message says the way on."""

    exit_code = 2


@dataclass(frozen=True)
class Service:
    """One service `up` started, as the state file records it.

    Attributes:
        name: `broker`, `metastore`, `schema_registry` or an Airflow component
            (`airflow_api_server`, `airflow_scheduler`...).
        pid: Its process id.
        port: The loopback port it listens on; 0 for an Airflow component without one.
        address: What clients are given: `host:port`, `thrift://...` or `http://...`;
            empty without a port.
        command: Its command line when it started, to recognise the process by.
    """

    name: str
    pid: int
    port: int
    address: str
    command: str

    def alive(self) -> bool:
        """Whether the recorded process still runs, is that process, and listens."""
        if process_command(self.pid) != self.command:
            return False
        return not self.port or port_open(self.port)

    def where(self) -> str:
        """` at ADDRESS (pid N)`, or ` (pid N)` without an address: for status lines."""
        at = f" at {self.address}" if self.address else ""
        return f"{at} (pid {self.pid})"


@dataclass(frozen=True)
class Playground:
    """Where the playground keeps everything, and the `conf/` it points `strata` from.

    Attributes:
        directory: The state file, logs, metastore database, warehouse, Airflow's home.
        conf_dir: The configuration directory whose `local/` gets `playground.yaml`,
            and Airflow's `STRATA_CONF_DIR`.
        dags_folder: The DAG files Airflow schedules: the project's.
    """

    directory: Path
    conf_dir: Path = Path("conf")
    dags_folder: Path = Path("airflow_dags")

    def command(self, action: str) -> str:
        """The `strata-local` command line of an action on this playground."""
        here = "" if self.directory == Path(DEFAULT_DIR) else f" --dir {self.directory}"
        return f"strata-local {action}{here}"

    @property
    def state_file(self) -> Path:
        """The file recording each running service."""
        return self.directory / STATE_FILE

    @property
    def warehouse(self) -> Path:
        """The warehouse root the tables land under."""
        return self.directory / "warehouse"

    @property
    def metastore_dir(self) -> Path:
        """The metastore's Derby database, config and log."""
        return self.directory / "metastore"

    @property
    def logs(self) -> Path:
        """The broker's and the registry's logs."""
        return self.directory / "logs"

    @property
    def trino_dir(self) -> Path:
        """Trino's configuration (`etc/`), data directory and log (`server.log`)."""
        return self.directory / "trino"

    @property
    def airflow_home(self) -> Path:
        """Airflow's `AIRFLOW_HOME`: its SQLite database, the components' and tasks' logs."""
        return self.directory / "airflow"

    @property
    def conf_file(self) -> Path:
        """The settings file `up` writes for `strata`."""
        return self.conf_dir / "local" / CONF_FILE

    def recorded(self) -> tuple[dict[str, Service], Path | None]:
        """The services and the settings file the state file records (none without one)."""
        if not self.state_file.exists():
            return {}, None
        try:
            state = json.loads(self.state_file.read_text())
            services = {n: Service(**s) for n, s in state["services"].items()}
            conf = Path(state["conf_file"]) if state.get("conf_file") else None
        except (ValueError, KeyError, TypeError) as exc:
            raise PlaygroundError(
                f"{self.state_file} is damaged ({exc}); stop what it started by hand if "
                f"anything still runs, delete the file, then run `{self.command('up')}`"
            ) from None
        return services, conf

    def record(self, services: dict[str, Service], conf_file: Path | None) -> None:
        """Write the state file (atomically: a reader never sees half of it)."""
        state = {
            "services": {n: services[n].__dict__ for n in SERVICES if n in services},
            "conf_file": None if conf_file is None else str(conf_file),
        }
        part = self.state_file.with_suffix(".json.part")
        part.write_text(json.dumps(state, indent=2) + "\n")
        part.replace(self.state_file)


def port_taken(port: int) -> bool:
    """Whether something listens on a loopback port already (a bind would fail)."""
    with socket.socket() as s:
        # As the services bind: a port left in TIME_WAIT by a stopped one is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return True
    return False


def _check_free(name: str, port: int) -> None:
    """Refuse a fixed port something else listens on, before anything starts."""
    if port and port_taken(port):
        flag = "--" + name.replace("_", "-").replace("schema-", "") + "-port"
        raise PlaygroundError(
            f"port {port} on {LOOPBACK} is taken by another process, so the {_label(name)} "
            f"cannot listen there; stop that process, or pick another port with {flag} PORT "
            "(0 takes a free one)"
        )


def _start(ground: Playground, name: str, port: int, services: dict[str, Service]) -> Service:
    """Start one service detached; its record for the state file.

    Args:
        ground: The playground's directory.
        name: The service (`_ALONE`).
        port: Its port; 0 takes a free one.
        services: Those started before it: Trino reads the metastore's address there.
    """
    service: LocalService
    if name == "broker":
        from strata.local.broker import LocalBroker

        service = LocalBroker(port or None)
        address = service.bootstrap
    elif name == "metastore":
        from strata.local.metastore import LocalMetastore

        service = LocalMetastore(ground.metastore_dir, port or None)
        address = service.uri
    elif name == "trino":
        from strata.local.trino import LocalTrino

        service = LocalTrino(ground.trino_dir, services["metastore"].address, port or None)
        address = service.url
    else:
        from strata.local.schema_registry import LocalSchemaRegistry

        service = LocalSchemaRegistry(port or None)
        address = service.url
    if name not in ("metastore", "trino"):
        # Beside the data, not in the temporary directory their tests use; the metastore
        # and Trino keep theirs in their own directories.
        service.log_path = ground.logs / f"{name}.log"
    service.detached = True
    slow = " (it takes a minute to load its catalogs)" if name == "trino" else ""
    log.info("starting the %s on %s:%s%s", _label(name), LOOPBACK, service.port, slow)
    try:
        service.start()
    except RuntimeError as exc:
        # The service stopped itself (`LocalService._fail`); the message has its log.
        raise StrataError(
            f"{exc}\nwhat did start is recorded: `{ground.command('down')}`"
        ) from None
    pid = service.pid
    assert pid is not None
    command = process_command(pid)
    if command is None:
        raise PlaygroundError(
            f"the {name} (pid {pid}) exited right after it started; see {service.log_path}"
        )
    return Service(name, pid, service.port, address, command)


def up(
    ground: Playground,
    ports: dict[str, int | None],
    registry: bool = False,
    airflow: bool = False,
    trino: bool = False,
) -> tuple[str, dict[str, Any]]:
    """Start what is not running yet, seed `clicks` if it is new, and write the settings.

    Idempotent: services already up are left alone; ones recorded but gone (stopped,
    or their machine restarted) are reported and started again.

    Args:
        ground: The playground's directory and configuration directory.
        ports: Port per service (`airflow`: its API server's); 0 takes a free one; for
            a missing name or None, the port it had before if it is restarted, else
            its default.
        registry: Start the local Schema Registry too.
        airflow: Start Airflow too, scheduling the project's DAGs over `ground.conf_dir`.
        trino: Start Trino too, on the metastore, and point `trino.url` at it.

    Returns:
        The text for people and the JSON-ready body.

    Raises:
        PlaygroundError: If a port is taken, Airflow is asked for but cannot run here,
            or the state file is damaged; nothing started.
        StrataError: If a service did not start; those started before it run, recorded.
    """
    ground.directory.mkdir(parents=True, exist_ok=True)
    services, written = ground.recorded()
    if written is not None and written != ground.conf_file.resolve():
        # Pointed at another conf/ this time: the old settings would point at nothing.
        written.unlink(missing_ok=True)
    # The optional services run when asked for or recorded (started by an earlier `up`).
    asked = {"schema_registry": registry, "trino": trino}
    wanted = [n for n in _ALONE if asked.get(n, True) or n in services]
    lines: list[str] = []
    to_start: dict[str, int] = {}
    for name in wanted:
        old = services.pop(name, None)
        # Trino is configured with the metastore's address: a metastore started again
        # (where it was, or on a port asked for) means Trino starting again on it.
        again = name == "trino" and "metastore" in to_start
        if old is not None and old.alive() and not again:
            services[name] = old
            continue
        if old is not None and again:
            lines.append(f"the metastore starts again, so the {_label(name)} does too")
        elif old is not None:
            lines.append(f"{_label(name)} (pid {old.pid}) had stopped; starting it again")
        if old is not None:
            # Not listening but still that process: a hung one (or Trino, as above).
            stop_recorded([(old.pid, old.command)])
        # Where it listened before, so the settings stay the same, unless asked otherwise.
        port = ports.get(name)
        to_start[name] = port if port is not None else old.port if old else DEFAULT_PORTS[name]
        _check_free(name, to_start[name])
    airflow_port = _airflow_to_start(ground, services, ports.get("airflow"), airflow, lines)
    started: list[str] = []
    for name, port in to_start.items():
        services[name] = _start(ground, name, port, services)
        started.append(name)
        # Recorded as each starts, so `down` stops what did start if a later one fails.
        ground.record(services, ground.conf_file.resolve())
    # Before seeding: whether tables landed from an earlier broker's `clicks`.
    landed = ground.warehouse.is_dir() and any(ground.warehouse.iterdir())
    seeded = _seed(services["broker"].address) if "broker" in started else None
    _write_settings(ground, services)
    ground.record(services, ground.conf_file.resolve())
    if airflow_port is not None:
        # After the settings: the DAG processor and every task read them.
        services.update(_start_airflow(ground, airflow_port))
        started += AIRFLOW.values()
        ground.record(services, ground.conf_file.resolve())
    if not started:
        lines.append(f"the playground is already up ({ground.directory})")
    for name in [*wanted, *(n for n in AIRFLOW.values() if n in services)]:
        # Running since an earlier `up`, or started by this one.
        verb = "started" if name in started else "running"
        lines.append(f"{verb}: {_label(name)}{services[name].where()}")
    if seeded is not None:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(seeded.items()))
        lines.append(f"created topic `{TOPIC}` ({PARTITIONS} partitions) and seeded it: {counts}")
        if landed:
            lines += _new_topic_note(ground)
    lines += _where(ground)
    lines += _shadowing_variables()
    lines += ["", "next:", *_tour(ground)]
    if "trino" in services:
        lines += _trino_next(services["trino"].address, ground)
    ui = _airflow_url(services)
    if ui is not None:
        lines += _airflow_next(ui, ground.airflow_home.resolve())
    body = {
        "status": "up",
        "started": started,
        "services": {n: services[n].__dict__ for n in SERVICES if n in services},
        "seeded": seeded,
        "conf_file": str(ground.conf_file.resolve()),
        "warehouse": str(ground.warehouse.resolve()),
        "airflow": ui,
        "trino": _trino_url(services),
    }
    return "\n".join(lines), body


def _trino_url(services: dict[str, Service]) -> str | None:
    trino = services.get("trino")
    return None if trino is None else trino.address


def _trino_next(url: str, ground: Playground) -> list[str]:
    conf = "" if ground.conf_dir == Path("conf") else f" --conf-dir {ground.conf_dir}"
    return [
        "",
        f"Trino: {url} (catalogs delta, hive and iceberg on the metastore; its UI at {url}/ui/, "
        f"any user name, no password; its log: {ground.trino_dir.resolve() / 'server.log'}). "
        f"`strata sql query` runs there now (trino.url in {ground.conf_file}); "
        f"`strata sql query --pipeline clicks{conf} --embedded ...` runs without it.",
    ]


def _airflow_to_start(
    ground: Playground,
    services: dict[str, Service],
    port: int | None,
    asked: bool,
    lines: list[str],
) -> int | None:
    """The port to start Airflow on, or None if it is not wanted or runs already.

    Airflow is wanted when asked for or recorded (as the registry is). Its components
    run as one, on one database and one secret, so if any of them stopped, the others
    are stopped too and Airflow starts again whole. Recorded components that run stay
    in `services`; ones that are to start again are taken out of it.
    """
    old = {n: services.pop(n) for n in AIRFLOW.values() if n in services}
    if not asked and not old:
        return None
    if len(old) == len(AIRFLOW) and all(s.alive() for s in old.values()):
        services.update(old)
        return None
    airflow = Path(sys.executable).parent / "airflow"
    if not airflow.exists():
        raise PlaygroundError(
            f"Airflow is not installed beside this Python ({airflow} is missing): install the "
            "`airflow` extra (`make setup` does), or run `strata-local up` without --airflow"
        )
    if not ground.dags_folder.is_dir():
        raise PlaygroundError(
            f"there is no {ground.dags_folder}/ here ({Path.cwd()}) for Airflow to schedule: "
            "run `strata-local up --airflow` in the project's root"
        )
    if old:
        gone = ", ".join(f"{_label(n)} (pid {s.pid})" for n, s in old.items() if not s.alive())
        lines.append(f"{gone or 'Airflow'} had stopped; starting Airflow again")
        stop_recorded((s.pid, s.command) for s in old.values())
    api = old.get(AIRFLOW["api-server"])
    chosen = port if port is not None else api.port if api else DEFAULT_PORTS["airflow"]
    _check_free("airflow", chosen)
    return chosen


def _start_airflow(ground: Playground, port: int) -> dict[str, Service]:
    """Start Airflow detached; a record per component for the state file."""
    airflow = LocalAirflow(
        ground.airflow_home,
        ground.dags_folder,
        {"STRATA_CONF_DIR": str(ground.conf_dir.resolve())},
        port or None,
        detached=True,
    )
    log.info(
        "starting Airflow on %s:%s (its database first: this takes a while)", LOOPBACK, airflow.port
    )
    try:
        airflow.start()
    except RuntimeError as exc:
        # It stopped what it had started; the message has the components' logs.
        raise StrataError(
            f"{exc}\nwhat did start is recorded: `{ground.command('down')}`"
        ) from None
    found: dict[str, Service] = {}
    for component, pid in airflow.pids.items():
        command = process_command(pid)
        if command is not None:
            api = component == "api-server"
            name = AIRFLOW[component]
            address = airflow.url if api else ""
            found[name] = Service(name, pid, airflow.port if api else 0, address, command)
    if len(found) < len(AIRFLOW):
        stop_recorded((s.pid, s.command) for s in found.values())
        raise PlaygroundError(
            "an Airflow component exited right after it started; see the logs in "
            f"{airflow.home / 'logs'}"
        )
    return found


def _airflow_url(services: dict[str, Service]) -> str | None:
    api = services.get(AIRFLOW["api-server"])
    return None if api is None else api.address


def _airflow_next(url: str, home: Path) -> list[str]:
    return [
        "",
        f"Airflow's UI: {url} (no sign-in: every user is an admin; its database and logs: "
        f"{home}). Its DAGs start paused, as Airflow creates them: switch "
        "strata_ingest_clicks on there and it lands `clicks` on its schedule; "
        "`strata-local events` gives it more to land.",
    ]


def down(ground: Playground, purge: bool = False) -> tuple[str, dict[str, Any]]:
    """Stop what `up` started, remove the settings file, and with `purge` the data too.

    Args:
        ground: The playground's directory.
        purge: Delete the warehouse, the metastore's database, Trino's directory,
            Airflow's home and the logs as well.

    Returns:
        The text for people and the JSON-ready body.
    """
    services, conf_file = ground.recorded()
    lines: list[str] = []
    stopped: list[str] = []
    # All at once: Airflow's components take seconds each to wind down.
    ended = set(stop_recorded((s.pid, s.command) for s in services.values()))
    for name, service in services.items():
        if service.pid in ended:
            stopped.append(name)
            lines.append(f"stopped: {_label(name)} (pid {service.pid})")
        else:
            lines.append(f"{_label(name)} (pid {service.pid}) had stopped already")
    if conf_file is not None and conf_file.exists():
        conf_file.unlink()
        lines.append(f"removed {conf_file}")
    ground.state_file.unlink(missing_ok=True)
    if not services:
        lines.append(f"the playground was not up ({ground.state_file} records nothing)")
    purged = []
    if purge:
        parts = (
            ground.warehouse,
            ground.metastore_dir,
            ground.trino_dir,
            ground.airflow_home,
            ground.logs,
        )
        for part in parts:
            if part.exists():
                shutil.rmtree(part)
                purged.append(str(part))
        if ground.directory.exists() and not any(ground.directory.iterdir()):
            ground.directory.rmdir()
        lines.append(f"deleted the playground's data ({ground.directory})")
    elif stopped and ground.warehouse.exists():
        lines.append(
            f"the tables and the metastore's database stay in {ground.directory} for the next "
            "`strata-local up` (`strata-local down --purge` deletes them); the topic's "
            "messages are gone with the broker"
        )
    body = {"status": "down", "stopped": stopped, "purged": purged}
    return "\n".join(lines), body


def status(ground: Playground) -> tuple[str, dict[str, Any]]:
    """Each service up or down, with its address.

    Raises:
        PlaygroundError: If the playground is not up, or a service of it has stopped.
    """
    services, conf_file = ground.recorded()
    if not services:
        raise PlaygroundError(
            f"the playground is not up ({ground.state_file} records nothing); start it "
            f"with `{ground.command('up')}`"
        )
    alive = {n: s.alive() for n, s in services.items()}
    lines = [f"{_label(n)}: {'up' if alive[n] else 'down'}{s.where()}" for n, s in services.items()]
    if not all(alive.values()):
        gone = ", ".join(_label(n) for n, ok in alive.items() if not ok)
        raise PlaygroundError(
            "\n".join(lines) + f"\n{gone} stopped since `strata-local up` started it; run "
            f"`{ground.command('up')}` to start it again (the tables stay)"
        )
    lines.append(f"settings: {conf_file}")
    lines.append(f"data: {ground.directory}")
    trino = _trino_url(services)
    if trino is not None:
        lines.append(f"Trino: {trino}")
    ui = _airflow_url(services)
    if ui is not None:
        lines.append(f"Airflow's UI: {ui}")
    body = {
        "status": "up",
        "services": {n: {**s.__dict__, "up": alive[n]} for n, s in services.items()},
        "conf_file": None if conf_file is None else str(conf_file),
        "warehouse": str(ground.warehouse.resolve()),
        "airflow": ui,
        "trino": trino,
    }
    return "\n".join(lines), body


def more_events(
    ground: Playground, count: int, hours: int, late: int, malformed: int
) -> tuple[str, dict[str, Any]]:
    """Produce new click events ending now to the playground's broker, and seal them.

    Args:
        ground: The playground's directory.
        count: Valid events, spread over the last `hours` hours.
        hours: Hours they span, ending now.
        late: Events among them that reach Kafka 3 to 30 hours after they happened.
        malformed: Messages the pipeline must quarantine.

    Returns:
        The text for people and the JSON-ready body.

    Raises:
        PlaygroundError: If the broker is not running.
    """
    broker = _running_broker(ground)
    now_ms = int(time.time() * 1000)
    # A seed of its own each time, so the events are new ones, not the last ones again.
    messages = click_events(
        count, now_ms - hours * HOUR_MS, hours, late=late, malformed=malformed, seed=now_ms
    )
    counts = _produce_sealed(broker.address, messages, now_ms)
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    text = (
        f"produced to `{TOPIC}` at {broker.address}: {kinds}, and sealed its partitions\n"
        "next: strata run --pipeline clicks"
    )
    return text, {"topic": TOPIC, "produced": counts}


def _running_broker(ground: Playground) -> Service:
    services, _ = ground.recorded()
    broker = services.get("broker")
    if broker is None:
        raise PlaygroundError(
            f"the playground is not up ({ground.state_file} records nothing); start it "
            f"with `{ground.command('up')}`"
        )
    if not broker.alive():
        raise PlaygroundError(
            f"the playground's broker (pid {broker.pid}, {broker.address}) has stopped; "
            f"start it again with `{ground.command('up')}`"
        )
    return broker


def _seed(bootstrap: str) -> dict[str, int] | None:
    """Create `clicks` and seed it, unless the broker has it already."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if TOPIC in admin.list_topics(timeout=30).topics:
        return None
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result(30)
    # Whole event hours before the current one, as the demo seeds, so it looks live.
    hour = int(time.time() * 1000) // HOUR_MS
    start = (hour - SEED_HOURS) * HOUR_MS
    # A seed of its own, so that a later broker's events are not the same ones again.
    messages = click_events(
        SEED_EVENTS, start, SEED_HOURS, late=20, malformed=8, future=1, seed=hour
    )
    return _produce_sealed(bootstrap, messages, start + SEED_HOURS * HOUR_MS - 1)


def _produce_sealed(bootstrap: str, messages: Iterator[Message], last_ms: int) -> dict[str, int]:
    """Produce to every partition of `clicks`, then seal them (see `LocalBroker.seal`).

    The broker reports a partition's high watermark as its last record batch's base
    offset: a one-message batch at the end makes the watermark cover the rest, so
    the next `strata run` lands all of them.
    """
    from strata.local.broker import seal

    counts = produce(bootstrap, TOPIC, PARTITIONS, messages)
    event = {"event_id": "seal", "user_id": 0, "page": "/", "device": "desktop", "ts": last_ms}
    seal(bootstrap, TOPIC, list(range(PARTITIONS)), json.dumps(event).encode(), last_ms)
    return counts


def _write_settings(ground: Playground, services: dict[str, Service]) -> None:
    settings: dict[str, Any] = {
        "kafka": {"bootstrap_servers": services["broker"].address},
        "metastore": {"uri": services["metastore"].address},
        "warehouse": str(ground.warehouse.resolve()),
    }
    if "schema_registry" in services:
        settings["schema_registry"] = {"url": services["schema_registry"].address}
    if "trino" in services:
        # `strata sql query` then runs in Trino; `--embedded` still runs without it.
        settings["trino"] = {"url": services["trino"].address}
    ground.conf_file.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# Written by `strata-local up` and removed by `strata-local down`: it points every\n"
        "# `strata` command at the playground. Edits are lost at the next `up`.\n"
    )
    ground.conf_file.write_text(header + yaml.safe_dump(settings, sort_keys=False))


def _where(ground: Playground) -> list[str]:
    return [
        f"settings for `strata`: {ground.conf_file.resolve()}",
        f"tables: {ground.warehouse.resolve()}",
        f"metastore database: {ground.metastore_dir.resolve()}",
        "the broker keeps its messages in memory (the wheel's Tansu has no disk storage): "
        "they last until `strata-local down`; the tables, the ledger and the metastore stay",
    ]


def _shadowing_variables() -> list[str]:
    """Warn of variables that override the settings file in this shell."""
    return [
        f"warning: {name} is set in this shell and overrides the playground's settings; "
        f"unset {name}"
        for name in _STRATA_ENV
        if os.environ.get(name)
    ]


def _tour(ground: Playground) -> list[str]:
    conf = "" if ground.conf_dir == Path("conf") else f" --conf-dir {ground.conf_dir}"
    steps = [
        (f"strata run --pipeline clicks{conf}", "land what `clicks` holds"),
        (f"strata status --pipeline clicks{conf}", "committed ranges, batches, lag"),
        (f"strata sql query --pipeline clicks{conf} rows_per_hour", "query what landed"),
        (ground.command("events"), "more events, for the next run"),
        (ground.command("down"), "stop; --purge deletes the data too"),
    ]
    width = max(len(command) for command, _ in steps)
    return [f"  {command:<{width}}  # {why}" for command, why in steps]


def _new_topic_note(ground: Playground) -> list[str]:
    """What to do when the tables continue a topic an earlier broker held."""
    conf = "" if ground.conf_dir == Path("conf") else f" --conf-dir {ground.conf_dir}"
    return [
        f"the broker is new, so `{TOPIC}` is a new topic whose offsets start at 0 again, while "
        f"the ledger in {ground.warehouse.resolve()} goes on from the earlier one's; `strata run` "
        "reads it once the ledger records the new topic:",
        f"  strata ledger seek --pipeline clicks{conf} --topic {TOPIC} --to earliest "
        '--reason "new playground broker"',
    ]


def _label(name: str) -> str:
    return _LABELS.get(name, name)
