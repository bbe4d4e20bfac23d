"""The configuration read at the edge: what the entry points hand the layers below.

The entry points (`strata.cli`, `strata.orchestrate`, `strata.jobs`) load a pipeline's
configuration; the modules below them take its places, its sections and small
settings. What more than one entry point builds from it is built here, in one place:
the settings of a pipeline's status and of a run's view of it; and, for a pipeline that
routes its topics to tables, each table configured (reading with the schema its table
evolved to) and a command run on each in turn. Which tables such a pipeline has, and
which keeps a place two would take, is `strata.operations.routes`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from strata.config import PipelineConfig
from strata.errors import ConfigError, StrataError
from strata.log import get_logger
from strata.operations.routes import (
    remembered_tables,
    require_one_table,
    retired_tables,
    topic_routes,
    unplaced_tables,
)
from strata.schema.evolve import table_schema
from strata.store.places import OwnedTable

logger = get_logger(__name__)

T = TypeVar("T")
A = TypeVar("A")

if TYPE_CHECKING:
    from strata.catalog._answers import AnswerFormat
    from strata.catalog.register import Registration
    from strata.maintenance.compact import CompactionReport
    from strata.operations.status import StatusSettings


def status_settings(cfg: PipelineConfig) -> StatusSettings:
    """What a pipeline's status, and a run's view of it, read besides its places.

    Args:
        cfg: A pipeline, or a table of a routed pipeline.
    """
    # Here, not at the top: the status loads the Kafka client and Delta, which a
    # command that shows no status is spared.
    from strata.maintenance.compact import small_bytes
    from strata.operations.status import StatusSettings

    return StatusSettings(
        cfg.source(),
        cfg.airflow.lag_growth_runs,
        cfg.completeness,
        small_bytes(cfg.maintenance, cfg.limits),
    )


def registration(cfg: PipelineConfig) -> Registration:
    """What registering the pipeline's tables needs, built from its configuration.

    The columns of a table that follows its registry are those it evolved to.

    Args:
        cfg: A pipeline, or a table of a routed pipeline.
    """
    from strata.catalog.register import Registration

    return Registration(
        cfg.places(),
        as_evolved(cfg).schemas(),
        cfg.metastore,
        cfg.warehouse,
        cfg.completeness,
        cfg.quality.gate,
        cfg.asset_uri,
    )


def compact_pipeline(
    cfg: PipelineConfig,
    partition: str | None = None,
    older_than: str | None = None,
    dry_run: bool = False,
) -> CompactionReport:
    """Merge the small files of a pipeline's settled partitions, registering what moved.

    Args:
        cfg: A pipeline, or a table of a routed pipeline.
        partition: Only this partition of the data table (`dt=…[/hr=…]`).
        older_than: Settle time overriding `maintenance.settle`.
        dry_run: Report what would be merged; change nothing and start no JVM.
    """
    from functools import partial

    from strata.catalog.register import register_tables
    from strata.maintenance.compact import Compaction, compact
    from strata.spark.session import build_session

    return compact(
        cfg.places(),
        Compaction.of(cfg.maintenance, cfg.limits, cfg.partitioning),
        partial(build_session, cfg.spark, cfg.name),
        partial(register_tables, registration(cfg)),
        partition,
        older_than,
        dry_run,
    )


def table_configs(
    cfg: PipelineConfig, *, running: bool = False
) -> list[tuple[str, PipelineConfig | StrataError]]:
    """Each table of a routed pipeline, configured, or why it cannot run.

    A table that would take another's place or metastore name cannot run
    (`strata.operations.routes.unplaced_tables`); the other tables run.

    Args:
        cfg: A routed pipeline (`cfg.routed`).
        running: For a run: leave out the tables no topic routes to now, those of topics
            taken off `topics` and those a pattern no longer matches and a run retired
            (`strata.operations.routes.retire_table`).

    Returns:
        `(table, its configuration or the error that stops it)`, sorted by table.

    Raises:
        KafkaUnavailable: If a pattern's topics cannot be listed.
    """
    if cfg.routing is None:
        raise ConfigError(f"pipeline {cfg.name} does not route its topics to tables")
    known = set(remembered_tables(cfg.places()))
    routes = topic_routes(cfg.source(), cfg.routing)
    names = known | set(routes)
    if running and cfg.topics:
        # Listed topics route to exactly these tables: one remembered beside them had
        # its topics taken off the list, and a run has nothing to read for it.
        names = set(routes)
    elif running:
        names -= retired_tables(cfg.places()) - set(routes)
    out: dict[str, PipelineConfig | StrataError] = {}
    owned: dict[str, list[OwnedTable]] = {}
    for name in sorted(names):
        try:
            # A table run before may have had its listed topics taken off the list.
            table = out[name] = cfg.route(name, taken_off=name not in routes)
        except StrataError as exc:
            out[name] = exc
            continue
        owned[name] = table.owned_tables(routes.get(name, ()))
    out.update(unplaced_tables(cfg.name, known, owned, cfg.neighbours))
    return sorted(out.items())


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


# Commands that ask the brokers about each table's topics.
ASKS_BROKERS = frozenset({"status"})


def as_evolved(cfg: PipelineConfig) -> PipelineConfig:
    """The pipeline reading with the schema its table evolved to (`table_schema`).

    Args:
        cfg: A pipeline, or a table of a routed pipeline.
    """
    return cfg.with_schema_text(table_schema(cfg.places(), cfg.decoding()))


def table_turns(
    cfg: PipelineConfig,
    step: Callable[[PipelineConfig], T],
    *,
    running: bool = False,
    asks_brokers: bool = False,
) -> list[tuple[str, T | Exception]]:
    """A step on each table of a routed pipeline, each having its turn whatever another's did.

    Args:
        cfg: A routed pipeline (`cfg.routed`).
        step: The step on one table, given with the schema its table evolved to.
        running: The step is part of a run (planning it): retired tables are left out.
        asks_brokers: The step asks the brokers about each table's topics (a plan, a
            status): they are asked once for all tables
            (`strata.batch.kafka.asked_together`).

    Returns:
        `(table, what the step returned or the error that stopped it)`, sorted by table.

    Raises:
        KafkaUnavailable: If a pattern's topics cannot be listed.
    """

    def each(tables: list[PipelineConfig]) -> list[T | Exception]:
        turns: list[T | Exception] = []
        for table in tables:
            try:
                turns.append(step(table))
            except Exception as exc:  # noqa: BLE001 - one table's failure must not stop the others
                turns.append(exc)
        return turns

    if not asks_brokers:
        return _turns(cfg, each, running=running)
    from strata.batch.kafka import asked_together

    def together(tables: list[PipelineConfig]) -> list[T | Exception]:
        with asked_together([t.source() for t in tables], retention=True):
            return each(tables)

    return _turns(cfg, together, running=running)


def then_each(
    tables: list[PipelineConfig],
    answers: list[A | Exception],
    then: Callable[[PipelineConfig, A], T],
) -> list[T | Exception]:
    """What follows a step taken on tables at once, on each table whose step went through.

    Args:
        tables: The tables.
        answers: The step's answer for each, or the error that stopped it.
        then: What follows, on one table and its answer.

    Returns:
        What followed on each table, or the error that stopped it, in order.
    """

    def one(table: PipelineConfig, answer: A | Exception) -> T | Exception:
        try:
            if isinstance(answer, Exception):
                raise answer
            return then(table, answer)
        except Exception as exc:  # noqa: BLE001 - one table's failure must not stop the others
            return exc

    pairs = list(zip(tables, answers, strict=True))
    if len(pairs) <= 1:
        return [one(table, answer) for table, answer in pairs]
    # Each table's own (its metrics, its completeness), waiting on storage more than it
    # computes: a few at once, as the batches commit (`strata.batch.commit.run_steps`).
    # What each asks the brokers (its lag and time to retention) is asked for all at once.
    from strata.batch.commit import STEP_THREADS
    from strata.batch.kafka import asked_together

    going = [t.source() for t, a in pairs if not isinstance(a, Exception)]
    with (
        asked_together(going, retention=True),
        ThreadPoolExecutor(max(STEP_THREADS, 1), "strata-table") as pool,
    ):
        return list(pool.map(one, *zip(*pairs, strict=True)))


def alone(steps: Callable[[list[PipelineConfig]], list[T | Exception]], cfg: PipelineConfig) -> T:
    """A step that is taken on tables at once (`shared_turns`), taken on one pipeline.

    Raises:
        Exception: The error that stopped it.
    """
    got = steps([cfg])[0]
    if isinstance(got, Exception):
        raise got
    return got


def shared_turns(
    cfg: PipelineConfig, steps: Callable[[list[PipelineConfig]], list[T | Exception]]
) -> list[tuple[str, T | Exception]]:
    """A step taken on all tables of a routed pipeline at once (one Spark job for all).

    This is a run: tables retired while no topic routes to them are left out.

    Args:
        cfg: A routed pipeline (`cfg.routed`).
        steps: The step on the tables that can run, each given with the schema its
            table evolved to; it answers for each, in order, with its result or the
            error that stopped that table alone (`strata.run.run_batches`).

    Returns:
        `(table, what the step returned or the error that stopped it)`, sorted by table.

    Raises:
        KafkaUnavailable: If a pattern's topics cannot be listed.
    """
    return _turns(cfg, steps, running=True)


def _turns(
    cfg: PipelineConfig,
    steps: Callable[[list[PipelineConfig]], list[T | Exception]],
    *,
    running: bool,
) -> list[tuple[str, T | Exception]]:
    """A step on the tables of a routed pipeline; for a run, without the retired ones."""
    turns: dict[str, T | Exception] = {}
    ready: list[tuple[str, PipelineConfig]] = []
    for name, table in table_configs(cfg, running=running):
        if isinstance(table, StrataError):
            turns[name] = table
            continue
        try:
            ready.append((name, as_evolved(table)))
        except Exception as exc:  # noqa: BLE001 - one table's failure must not stop the others
            turns[name] = exc
    answers = steps([table for _, table in ready]) if ready else []
    for (name, _), got in zip(ready, answers, strict=True):
        turns[name] = got
    return sorted(turns.items())


def each_table(
    cfg: PipelineConfig,
    command: str,
    handler: Callable[[PipelineConfig], tuple[str, dict[str, Any]]],
    together: Callable[[list[PipelineConfig]], list[tuple[str, dict[str, Any]] | Exception]]
    | None = None,
) -> tuple[str, dict[str, Any]]:
    """Run a command on a pipeline, or on each table of a pipeline that routes to tables.

    A table that follows its Schema Registry subject is given with the schema it
    evolved to (`as_evolved`). Each table has its turn whatever another's did
    (`table_turns`): a table that failed is named in the text and in the body's
    `tables_error`, which makes the command exit non-zero once every table had its turn.

    Args:
        cfg: The pipeline.
        command: The command's name; one outside `EVERY_TABLE` needs one table.
        handler: The command on one pipeline: the text for people and the JSON body.
        together: The command on all tables of a routed pipeline at once, when they
            share work (a run reads them all in one Spark job); `handler` otherwise.

    Returns:
        The handler's answer, or for a routed pipeline every table's, one after another.

    Raises:
        ConfigError: If the command works on one table and `cfg` routes to several.
    """
    if not cfg.routed:
        return handler(as_evolved(cfg))
    if command not in EVERY_TABLE:
        require_one_table(cfg.places(), cfg.source(), cfg.routing, command)
    from strata.errors import root_cause

    texts: list[str] = []
    bodies: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    turns = (
        table_turns(cfg, handler, asks_brokers=command in ASKS_BROKERS)
        if together is None
        else shared_turns(cfg, together)
    )
    for name, got in turns:
        if isinstance(got, StrataError):
            text, body = f"error: {got}", {"status": "failed", "error": str(got)}
        elif isinstance(got, Exception):
            message, _ = root_cause(got)
            text, body = f"error: {message}", {"status": "failed", "error": message}
        else:
            text, body = got
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


def answer_query(
    cfg: PipelineConfig,
    name: str | None,
    file_text: str | None,
    execute: str | None,
    fmt: AnswerFormat,
    engine: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """`strata sql query`: one Trino query on the pipeline's tables, and its answer.

    Embedded (DuckDB over the tables, `strata.catalog.query`), or in the Trino of
    `trino.url` when it is set (or `engine` is `trino`). A routed pipeline's tables
    are all there, each table's under its own names.

    Args:
        cfg: A pipeline, a routed pipeline, or one table of a routed pipeline.
        name: A ready query's name (rewritten for the pipeline's tables).
        file_text: A query file's text.
        execute: A query given as it is.
        fmt: The answer's format: `table`, `csv` or `json`.
        engine: `embedded`, `trino`, or None for Trino where `trino.url` is set.

    Returns:
        The answer as text, and a JSON body describing it.

    Raises:
        QueryError: For a statement that is not one query, or that the engine refuses.
        ConfigError: For Trino without `trino.url`.
    """
    import time

    from strata.catalog.query import (
        only_query,
        query_tables,
        render_answer,
        run_embedded,
        statement_for,
        table_catalogs,
    )
    from strata.errors import QueryError

    database = cfg.metastore.database
    if cfg.routed and name is not None:
        raise QueryError(
            f"pipeline {cfg.name} routes its topics to tables of their own, and a ready query "
            f"reads one table's: name it as --pipeline {cfg.name}:TABLE"
        )
    catalogs = table_catalogs(cfg.table_format, cfg.trino.catalog_for)
    statement, _ = statement_for(name, file_text, execute, cfg.name, database, catalogs)
    # Refused before anything is opened or sent, whichever engine would run it.
    only_query(statement)
    use_trino = engine == "trino" or (engine is None and cfg.trino.url is not None)
    started = time.perf_counter()
    if use_trino:
        from strata.catalog.query import QueryAnswer
        from strata.catalog.sql import query_in_trino

        if cfg.trino.url is None:
            raise ConfigError(
                f"pipeline {cfg.name} has no trino.url: set it to send queries to Trino, or "
                "leave out --trino to run them embedded"
            )
        settings = cfg.trino
        catalog = settings.catalog_for(cfg.table_format)
        answer = QueryAnswer(*query_in_trino(settings, catalog, database, statement))
    else:
        tables = [as_evolved(cfg)] if not cfg.routed else _query_routes(cfg)
        found = [t for table in tables for t in query_tables(table.places(), table.schemas())]
        catalog = cfg.trino.catalog_for(cfg.table_format)
        answer = run_embedded(found, catalog, database, statement, cfg.trino.catalog_for)
    body = {
        "pipeline": cfg.name,
        "engine": "trino" if use_trino else "embedded",
        "columns": answer.columns,
        "row_count": len(answer.rows),
        "seconds": round(time.perf_counter() - started, 3),
    }
    return render_answer(answer, fmt), body


def _query_routes(cfg: PipelineConfig) -> list[PipelineConfig]:
    """Each table of a routed pipeline that a query can read, with its evolved schema.

    Without the brokers (a pattern's topics cannot be listed), the tables it has run
    before: a table never run holds nothing yet.
    """
    from strata.errors import KafkaUnavailable

    try:
        found = table_configs(cfg)
    except KafkaUnavailable:
        found = []
        for name in remembered_tables(cfg.places()):
            try:
                found.append((name, cfg.route(name, taken_off=True)))
            except StrataError as exc:
                found.append((name, exc))
    out = []
    for name, table in found:
        if isinstance(table, StrataError):
            logger.warning("table %s of pipeline %s is left out: %s", name, cfg.name, table)
            continue
        out.append(as_evolved(table))
    return out
