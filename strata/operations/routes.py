"""A pipeline that routes its topics to tables of their own: which tables, and each in turn.

Each table of a routed pipeline is a pipeline of its own as far as the guarantees go
(its own plans, batches, ledger, lock and commits, see `PipelineConfig.route`), so
exactly-once holds per table by the same rules as everywhere else. What this module
adds is the list of tables: the routes of the listed topics, or of the topics a
pattern matches on the brokers now, together with every table the pipeline has run
before, so that a table whose topics were deleted still shows in `strata status`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strata.config import PipelineConfig
from strata.errors import ConfigError, StrataError
from strata.store.files import list_names, put_if_absent
from strata.store.places import Namespace, OwnedTable, describe_clash

_TABLES = "tables"


def _routes(cfg: PipelineConfig) -> tuple[set[str], dict[str, list[str]]]:
    """The tables a routed pipeline has run before, and each table its topics route to now."""
    from strata.batch.kafka import pipeline_topics

    known = set(list_names(f"{cfg.location('state')}/{_TABLES}", cfg.storage_options))
    topics = cfg.topics if cfg.topics_pattern is None else pipeline_topics(cfg.source())
    routes: dict[str, list[str]] = {}
    for topic in topics:
        routes.setdefault(cfg.table_for(topic), []).append(topic)
    return known, routes


def route_tables(cfg: PipelineConfig) -> list[str]:
    """The tables of a routed pipeline: those its topics are routed to, and those run before.

    Args:
        cfg: A routed pipeline (`cfg.routed`).

    Returns:
        The table names, sorted.

    Raises:
        KafkaUnavailable: If a pattern's topics cannot be listed.
    """
    known, routes = _routes(cfg)
    return sorted(known | set(routes))


def table_configs(cfg: PipelineConfig) -> list[tuple[str, PipelineConfig | StrataError]]:
    """Each table of a routed pipeline, configured, or why it cannot run.

    A table that would take another's place or metastore name (`strata.store.places`),
    of this pipeline or of another of its configuration directory, cannot run: with
    listed topics that is refused when the configuration loads, but a pattern matches
    topics as they come. A table that has run before keeps its place against one
    that has not (the newcomer fails, named); two newcomers, or two that both ran
    before, both fail. The other tables run.

    Args:
        cfg: A routed pipeline (`cfg.routed`).

    Returns:
        `(table, its configuration or the error that stops it)`, sorted by table.

    Raises:
        KafkaUnavailable: If a pattern's topics cannot be listed.
    """
    known, routes = _routes(cfg)
    out: dict[str, PipelineConfig | StrataError] = {}
    owned: dict[str, list[OwnedTable]] = {}
    for name in sorted(known | set(routes)):
        try:
            table = out[name] = cfg.route(name)
        except StrataError as exc:
            out[name] = exc
            continue
        owned[name] = table.owned_tables(routes.get(name, ()))
    index = Namespace([*cfg.neighbours, *(t for ts in owned.values() for t in ts)])
    for name, tables in owned.items():
        problems = [
            describe_clash(mine, other, place, by_name)
            for mine in tables
            for other, place, by_name in index.clashing(mine)
            if not _owns(name, other, cfg.name, known)
        ]
        if problems:
            out[name] = ConfigError(
                f"table {name} of pipeline {cfg.name} was not run: " + "\n  ".join(problems)
            )
    return sorted(out.items())


def _owns(name: str, other: OwnedTable, pipeline: str, known: set[str]) -> bool:
    """Whether table `name` keeps its place against `other`: it ran before, `other` did not."""
    of_this = other.pipeline == pipeline
    return of_this and name in known and other.owner.split(":", 1)[-1] not in known


def remember_table(cfg: PipelineConfig) -> None:
    """Record a table of a routed pipeline as one it has, before it is first written.

    Args:
        cfg: A table's configuration (`cfg.route_of` set); others are left alone.
    """
    if cfg.route_of is None:
        return
    parent_state = cfg.location("state").rsplit("/", 1)[0]
    put_if_absent(f"{parent_state}/{_TABLES}/{cfg.name}", cfg.storage_options, b"")


def require_one_table(cfg: PipelineConfig, command: str) -> None:
    """Stop a command that works on one table when given a routed pipeline.

    Raises:
        ConfigError: Naming the pipeline's tables and how to name one.
    """
    if not cfg.routed:
        return
    from strata.errors import KafkaUnavailable

    try:
        tables = route_tables(cfg)
    except KafkaUnavailable:
        tables = sorted(list_names(f"{cfg.location('state')}/{_TABLES}", cfg.storage_options))
    raise ConfigError(
        f"pipeline {cfg.name} routes its topics to tables of their own, and `{command}` works "
        f"on one table: name it as --pipeline {cfg.name}:TABLE "
        f"(its tables: {', '.join(tables) or 'none yet'})"
    )


# Commands that, given a pipeline routing its topics to tables, run on each table.
EVERY_TABLE = frozenset(
    {
        "run",
        "status",
        "completeness",
        "register",
        "publish",
        "sql",
        "compact",
        "checkpoint",
        "vacuum",
    }
)


def each_table(
    cfg: PipelineConfig,
    command: str,
    handler: Callable[[PipelineConfig], tuple[str, dict[str, Any]]],
) -> tuple[str, dict[str, Any]]:
    """Run a command on a pipeline, or on each table of a pipeline that routes to tables.

    A table that follows its Schema Registry subject is given with the schema it
    evolved to (`strata.schema.evolve.table_schema`). Each table has its turn whatever
    another's did: a table that failed is named in the text and in the body's
    `tables_error`, which makes the command exit non-zero once every table had its turn.

    Args:
        cfg: The pipeline.
        command: The command's name; one outside `EVERY_TABLE` needs one table.
        handler: The command on one pipeline: the text for people and the JSON body.

    Returns:
        The handler's answer, or for a routed pipeline every table's, one after another.

    Raises:
        ConfigError: If the command works on one table and `cfg` routes to several.
    """
    from strata.schema.evolve import table_schema

    if not cfg.routed:
        return handler(table_schema(cfg))
    if command not in EVERY_TABLE:
        require_one_table(cfg, command)
    from strata.errors import root_cause

    texts: list[str] = []
    bodies: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    for name, table in table_configs(cfg):
        try:
            if isinstance(table, StrataError):
                raise table
            text, body = handler(table_schema(table))
        except StrataError as exc:
            text, body = f"error: {exc}", {"status": "failed", "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - one table's failure must not stop the others
            message, _ = root_cause(exc)
            text, body = f"error: {message}", {"status": "failed", "error": message}
        if body.get("status") == "failed" or body.get("register_error") or body.get("gate_error"):
            failed.append(name)
        texts.append(f"== {cfg.name}:{name} ==\n{text}")
        bodies[name] = body
    out: dict[str, Any] = {"pipeline": cfg.name, "tables": bodies}
    if not bodies:
        texts.append(f"pipeline {cfg.name} has no table yet: no topic is routed to one")
    if failed:
        out["tables_error"] = f"table {', '.join(failed)} of pipeline {cfg.name} failed (above)"
    return "\n".join(texts), out
