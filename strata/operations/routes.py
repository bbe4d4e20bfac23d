"""A pipeline that routes its topics to tables of their own: which tables it has.

Each table of a routed pipeline is a pipeline of its own as far as the guarantees go
(its own plans, batches, ledger, lock and commits, see `PipelineConfig.route`), so
exactly-once holds per table by the same rules as everywhere else. What this module
adds is the list of tables: the routes of the listed topics, or of the topics a
pattern matches on the brokers now, together with every table the pipeline has run
before, so that a table whose topics were deleted still shows in `strata status`;
and which of them keeps a place two would take. The entry points configure each
table and run a command on each (`strata.edge`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from strata.config import KafkaSource, RoutingConfig
from strata.errors import ConfigError
from strata.store.files import delete_object, list_names, put_if_absent
from strata.store.places import Namespace, OwnedTable, Places, describe_clash

_TABLES = "tables"
_RETIRED = "retired"


def remembered_tables(places: Places) -> list[str]:
    """The tables a routed pipeline has run before (each recorded by `remember_table`).

    Args:
        places: The routed pipeline's places (its state holds the record).

    Returns:
        The table names, sorted.
    """
    return sorted(list_names(f"{places.state.uri}/{_TABLES}", places.options))


def remember_table(places: Places) -> None:
    """Record a table of a routed pipeline as one it has, before it is first written.

    Args:
        places: A table's places (`places.route_of` set); others are left alone.
    """
    if places.route_of is None:
        return
    put_if_absent(f"{_parent_state(places)}/{_TABLES}/{places.pipeline}", places.options, b"")


def _parent_state(places: Places) -> str:
    """The routed pipeline's state, from one of its tables' places."""
    return places.state.uri.rsplit("/", 1)[0]


def retired_tables(places: Places) -> set[str]:
    """The tables of a routed pipeline that runs leave out while no topic routes to them.

    Args:
        places: The routed pipeline's places.
    """
    return set(list_names(f"{places.state.uri}/{_RETIRED}", places.options))


def retire_table(places: Places) -> None:
    """Leave a table out of the pipeline's runs while no topic on the brokers routes to it.

    A pattern's topics come and go (a topic a day, deleted after its retention): a table
    whose topics are all gone would otherwise be planned by every run for ever. Its
    tables, ledger and status stay; a topic routed to it again brings it back at once
    (`strata.edge.table_configs` leaves out only retired tables no topic routes to).

    Args:
        places: A table's places (`places.route_of` set); others are left alone.
    """
    if places.route_of is not None:
        put_if_absent(f"{_parent_state(places)}/{_RETIRED}/{places.pipeline}", places.options, b"")


def revive_table(places: Places) -> None:
    """Take a table back into its pipeline's runs (a backfill or replay saved a plan for it).

    Args:
        places: A table's places (`places.route_of` set); others are left alone.
    """
    if places.route_of is not None:
        delete_object(f"{_parent_state(places)}/{_RETIRED}/{places.pipeline}", places.options)


def topic_routes(source: KafkaSource, routing: RoutingConfig) -> dict[str, list[str]]:
    """Each table a routed pipeline's topics route to now, with its topics.

    Args:
        source: The routed pipeline's brokers and topics (`PipelineConfig.source`).
        routing: Its `routing` section.

    Raises:
        KafkaUnavailable: If a pattern's topics cannot be listed.
    """
    from strata.batch.kafka import pipeline_topics

    topics = source.topics if source.pattern is None else pipeline_topics(source)
    routes: dict[str, list[str]] = {}
    for topic in topics:
        routes.setdefault(routing.table_for(topic), []).append(topic)
    return routes


def route_tables(places: Places, source: KafkaSource, routing: RoutingConfig) -> list[str]:
    """The tables of a routed pipeline: those its topics are routed to, and those run before.

    Args:
        places: The routed pipeline's places.
        source: Its brokers and topics.
        routing: Its `routing` section.

    Returns:
        The table names, sorted.

    Raises:
        KafkaUnavailable: If a pattern's topics cannot be listed.
    """
    known = remembered_tables(places)
    return sorted(set(known) | set(topic_routes(source, routing)))


def unplaced_tables(
    pipeline: str,
    known: Collection[str],
    owned: Mapping[str, list[OwnedTable]],
    neighbours: Iterable[OwnedTable],
) -> dict[str, ConfigError]:
    """The tables of a routed pipeline that cannot run: they would take another's place.

    A table that would take another's place or metastore name (`strata.store.places`),
    of this pipeline or of another of its configuration directory, cannot run: with
    listed topics that is refused when the configuration loads, but a pattern matches
    topics as they come. A table that has run before keeps its place against one
    that has not (the newcomer fails, named); two newcomers, or two that both ran
    before, both fail. The other tables run.

    Args:
        pipeline: The routed pipeline's name.
        known: The tables it has run before (`remembered_tables`).
        owned: Each table that could be configured, with the tables and state it owns.
        neighbours: The tables of the other pipelines of its configuration directory.

    Returns:
        Each table that cannot run, with the error naming why.
    """
    index = Namespace([*neighbours, *(t for ts in owned.values() for t in ts)])
    out: dict[str, ConfigError] = {}
    for name, tables in owned.items():
        problems = [
            describe_clash(mine, other, place, by_name)
            for mine in tables
            for other, place, by_name in index.clashing(mine)
            if not _owns(name, other, pipeline, known)
        ]
        if problems:
            out[name] = ConfigError(
                f"table {name} of pipeline {pipeline} was not run: " + "\n  ".join(problems)
            )
    return out


def _owns(name: str, other: OwnedTable, pipeline: str, known: Collection[str]) -> bool:
    """Whether table `name` keeps its place against `other`: it ran before, `other` did not."""
    of_this = other.pipeline == pipeline
    return of_this and name in known and other.owner.split(":", 1)[-1] not in known


def require_one_table(
    places: Places, source: KafkaSource, routing: RoutingConfig | None, command: str
) -> None:
    """Stop a command that works on one table when given a routed pipeline.

    Args:
        places: The pipeline's (or routed table's) places.
        source: Its brokers and topics (`PipelineConfig.source`).
        routing: Its `routing` section, if any; a pipeline without one, or a table of
            a routed pipeline (`places.route_of` set), is one table.
        command: The command, for the message.

    Raises:
        ConfigError: Naming the pipeline's tables and how to name one.
    """
    if routing is None or places.route_of is not None:
        return
    from strata.errors import KafkaUnavailable

    try:
        tables = route_tables(places, source, routing)
    except KafkaUnavailable:
        tables = remembered_tables(places)
    name = places.pipeline
    raise ConfigError(
        f"pipeline {name} routes its topics to tables of their own, and `{command}` works "
        f"on one table: name it as --pipeline {name}:TABLE "
        f"(its tables: {', '.join(tables) or 'none yet'})"
    )
