"""Ad-hoc Trino SQL on a pipeline's tables, with no server: `strata sql query`.

Analysts write Trino SQL for production. Here the same statement runs on DuckDB,
embedded in the process: it is checked to be one query (nothing that writes or
changes a setting runs), transpiled from Trino's dialect with sqlglot, and run over
the pipeline's tables, which DuckDB reads as Arrow datasets through the one reader
every other part of Strata uses (`strata.store.tables.dataset`: a Delta table's
current snapshot; a plain Parquet table's directories in use, compacted partitions'
moved ones included). The engine reads nothing else (`strata.catalog._reads`): a
statement naming anything but the tables, or calling DuckDB's own functions of files,
settings or the machine, is refused before it runs; no DuckDB extension is ever
installed or loaded; and once the tables are registered the connection may touch no
file, its configuration is locked, and its temporary files go to a directory of its
own, removed after.

Each table is a view under its metastore name, in a schema named after the
metastore database, as Trino addresses it (`strata.clicks`, `strata.clicks_ledger`),
inside a catalog named after the Trino catalog that serves it (`delta`, `iceberg`, or
`hive` for plain Parquet), so `delta.strata.clicks` reads too. The pipeline's format's
catalog and the database are the session's, as in a Trino session with `--catalog delta
--schema strata`: `clicks` alone is `delta.strata.clicks`. An Iceberg pipeline's ledger
and quality table are Delta tables, in the Delta catalog, there as in Trino (whose
Iceberg connector does not read them): `delta.strata.clicks_ledger`. A table that
nothing has been committed to yet is there, empty, with its schema.

Each view gives its columns with the types the Trino connector that reads the table
gives them (timestamps at its precision), and a comparison Trino refuses is refused
(`strata.catalog._trino_types`): where the embedded engine cannot answer as Trino does,
it refuses; it never answers otherwise. Trino's `approx_distinct` is an estimate (a
standard error of 2.3%) and the embedded engine counts exactly, within it.

The ready queries (`queries/*.sql` beside this module, package data; `sql/queries`
in a checkout points here) are written for the demo pipeline's tables
(`strata.clicks...`): `on_pipeline` renames them to another pipeline's.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError

from strata.catalog._answers import QueryAnswer, render_answer
from strata.catalog._reads import (
    OUTSIDE_THE_TABLES,
    check_length,
    check_reads,
    clipped,
    one_line,
    reading_statement,
)
from strata.catalog._trino_types import ReadAs, check_comparisons, view_select
from strata.errors import QueryError
from strata.log import get_logger
from strata.store.places import NAME_SUFFIXES, Places, Role, TableRef

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from strata.config import SchemaSpec

__all__ = [
    "DEMO_DATABASE",
    "DEMO_PIPELINE",
    "QueryAnswer",
    "QueryTable",
    "on_pipeline",
    "only_query",
    "query_tables",
    "ready_query",
    "ready_query_names",
    "render_answer",
    "run_embedded",
    "statement_for",
    "table_catalogs",
    "to_duckdb",
]

logger = get_logger(__name__)

DEMO_PIPELINE = "clicks"
"""The pipeline whose table names the ready queries are written with."""
DEMO_DATABASE = "strata"
"""The metastore database the ready queries name (the default `metastore.database`)."""

# Trino's catalogs as `trino.*_catalog` names them by default (`TrinoConfig.catalog_for`).
_DEFAULT_CATALOGS: dict[str, str] = {"delta": "delta", "iceberg": "iceberg", "parquet": "hive"}

_QUERIES = "queries"


def ready_query_names() -> list[str]:
    """The ready queries shipped with the package, by name (the file name less `.sql`)."""
    folder = resources.files(__package__ or "strata.catalog") / _QUERIES
    return sorted(f.name.removesuffix(".sql") for f in folder.iterdir() if f.name.endswith(".sql"))


def ready_query(name: str) -> str:
    """The text of a ready query.

    Args:
        name: Its name, as `ready_query_names` lists it.

    Raises:
        QueryError: If there is no ready query of that name.
    """
    names = ready_query_names()
    if name not in names:
        raise QueryError(
            f"there is no ready query {name!r}; the ready queries are {', '.join(names)} "
            "(or give a statement with -e, or a file with --file)"
        )
    folder = resources.files(__package__ or "strata.catalog") / _QUERIES
    return (folder / f"{name}.sql").read_text()


def only_query(statement: str) -> exp.Query:
    """The statement's syntax tree, if it is exactly one query.

    Only reads run: anything that writes, defines, calls or changes a setting
    (INSERT, DELETE, CREATE, DROP, SET, CALL, SHOW or EXPLAIN, which sqlglot keeps
    as commands), and more than one statement, is refused before anything runs; so is
    a statement longer than Trino reads, or nested too deeply to parse.

    Args:
        statement: Trino SQL; a trailing semicolon is allowed.

    Raises:
        QueryError: Naming what was refused, in one short line, if it is not one query
            or does not parse.
    """
    check_length(statement)
    with reading_statement():
        tree = _one_statement(statement)
        # A query holds no DML in Trino, but a parser that is lenient with one dialect's
        # extension could nest one: every node is looked at, not only the top.
        writes = next((n for n in tree.walk() if isinstance(n, _NOT_READS)), None)
        if not isinstance(tree, exp.Query) or writes is not None:
            what = _statement_kind(writes if writes is not None else tree)
            raise QueryError(
                f"only queries run here, not {what} statements: `strata sql query` reads the "
                "tables and changes nothing; give one SELECT (or WITH ... SELECT)"
            )
    return tree


def _one_statement(statement: str) -> exp.Expr:
    """The statement parsed as Trino SQL, if it is one.

    Raises:
        QueryError: If it does not parse, is empty, or is more than one.
    """
    try:
        parsed = [s for s in sqlglot.parse(statement, read="trino") if s is not None]
    except ParseError as exc:
        raise QueryError(
            f"the statement is not Trino SQL sqlglot can read: {_where(exc)}"
        ) from None
    except SqlglotError as exc:
        # An unclosed string, quoted name or comment: the tokenizer's own error.
        raise QueryError(
            f"the statement is not Trino SQL sqlglot can read: {one_line(str(exc))}"
        ) from None
    if not parsed:
        raise QueryError("the statement is empty; give one SELECT (or WITH ... SELECT) query")
    if len(parsed) > 1:
        raise QueryError(
            f"{len(parsed)} statements were given; `strata sql query` runs one query at a time"
        )
    return parsed[0]


def _where(error: ParseError) -> str:
    """What sqlglot could not parse, and where, without the statement around it."""
    first = error.errors[0] if error.errors else {}
    description = first.get("description") or str(error)
    at = f" (line {first['line']}, column {first['col']})" if first.get("line") else ""
    return one_line(f"{description}{at}")


# The statements that are not reads, as sqlglot parses Trino.
_NOT_READS = (
    exp.Insert,
    exp.Delete,
    exp.Update,
    exp.Merge,
    exp.Create,
    exp.Drop,
    exp.Alter,
    exp.Set,
    exp.Command,
    exp.Use,
    exp.Grant,
    exp.Copy,
    exp.TruncateTable,
    exp.Commit,
    exp.Rollback,
    exp.Transaction,
    exp.Describe,
    exp.Pragma,
    exp.Into,
)


def _statement_kind(node: exp.Expr) -> str:
    """What a statement is, in a word or two: `INSERT`, `CALL`, `SELECT ... INTO`."""
    if isinstance(node, exp.Command):
        return str(node.this).split()[0].upper() if node.this else "COMMAND"
    if isinstance(node, exp.Into):
        return "SELECT ... INTO"
    if not isinstance(node, _NOT_READS):
        # A word sqlglot reads as an expression (`CHECKPOINT` a column, `INSTALL x` an
        # alias): the statement's first word.
        return clipped(node.sql("trino").split(maxsplit=1)[0].upper(), 40)
    return node.key.upper().replace("TRUNCATETABLE", "TRUNCATE")


def on_pipeline(
    tree: exp.Expr, pipeline: str, database: str, catalogs: Mapping[Role, str] | None = None
) -> exp.Expr:
    """A ready query's tree, its tables renamed from the demo pipeline's to a pipeline's.

    `strata.clicks`, `strata.clicks_ledger`... become `<database>.<pipeline>`,
    `<database>.<pipeline>_ledger`...; other tables are left as they are.

    Args:
        tree: The query's tree, parsed as Trino SQL.
        pipeline: The pipeline (or routed table) to query.
        database: Its metastore database.
        catalogs: Each table's Trino catalog (`table_catalogs`): given, every renamed
            table is named in its own (an Iceberg pipeline's ledger is in the Delta one).
    """
    roles = {DEMO_PIPELINE + suffix: role for role, suffix in NAME_SUFFIXES.items()}

    def rename(node: exp.Expr) -> exp.Expr:
        if (
            isinstance(node, exp.Table)
            and node.name in roles
            and node.db in ("", DEMO_DATABASE)
            and not node.catalog
        ):
            role = roles[node.name]
            return exp.table_(
                pipeline + NAME_SUFFIXES[role],
                db=database,
                catalog=None if catalogs is None else catalogs[role],
                alias=node.alias or None,
            )
        return node

    return tree.transform(rename)


def table_catalogs(table_format: str, catalog_for: Callable[[str], str]) -> dict[Role, str]:
    """The Trino catalog of each of a pipeline's tables, as the metastore records them.

    Args:
        table_format: The pipeline's `table_format`.
        catalog_for: The catalog that reads a table of a format (`TrinoConfig.catalog_for`).
    """
    from strata.catalog.register import registered_as

    return {role: catalog_for(registered_as(table_format, role)) for role in NAME_SUFFIXES}


def to_duckdb(tree: exp.Expr) -> str:
    """The query in DuckDB's dialect, meaning what it means in Trino.

    sqlglot writes Trino's `date_diff(unit, a, b)` as DuckDB's `date_diff`, which
    counts the unit's boundaries crossed (00:59 to 01:01 is one hour); Trino counts
    whole units elapsed (none), which is DuckDB's `date_sub`.

    Trino's `approx_distinct` is within 2.3% (and exact while the values are few);
    DuckDB's `approx_count_distinct` keeps so few registers that it is off by 5-10%
    on a few hundred values. The count is made exact: on the data one process reads,
    `count(DISTINCT ...)` costs little, and it is within any error Trino allows.

    Trino's `format_datetime` and `parse_datetime` take Joda-Time patterns
    (`yyyy-MM-dd HH:mm`): sqlglot passes the first on as it is, a function DuckDB
    lacks, and hands the second's pattern to `strptime` unchanged, where it means
    nothing. Both become DuckDB's `strftime` and `strptime` with the pattern spelled
    as those read it (`_strftime_pattern`). `current_timezone()` is the session's
    zone, which DuckDB spells `current_setting('TimeZone')`.

    Raises:
        QueryError: For a Joda-Time pattern that is not a literal, or that has a
            letter DuckDB cannot spell.
    """

    def as_in_trino(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.DateDiff):
            unit = exp.Literal.string(node.text("unit") or "day")
            return exp.Anonymous(
                this="date_sub", expressions=[unit, node.expression.copy(), node.this.copy()]
            )
        if isinstance(node, exp.ApproxDistinct):
            return exp.Count(this=exp.Distinct(expressions=[node.this.copy()]))
        if isinstance(node, exp.Anonymous) and node.name.lower() == "format_datetime":
            value, pattern = _joda_arguments("format_datetime", node.expressions)
            return exp.Anonymous(this="strftime", expressions=[value, pattern])
        if isinstance(node, exp.ParseDatetime):
            value, pattern = _joda_arguments("parse_datetime", [node.this, node.args["format"]])
            # Trino's answer has a zone: the pattern's, or the session's (UTC).
            parsed = exp.Anonymous(this="strptime", expressions=[value, pattern])
            return exp.cast(parsed, exp.DType.TIMESTAMPTZ)
        if isinstance(node, exp.CurrentTimezone):
            return exp.Anonymous(
                this="current_setting", expressions=[exp.Literal.string("TimeZone")]
            )
        return node

    try:
        return _trino_names(tree.copy()).transform(as_in_trino).sql("duckdb")
    except (QueryError, RecursionError):
        raise
    except Exception as exc:  # noqa: BLE001 - sqlglot's generator fails on syntax it lacks
        # Syntax sqlglot reads but cannot write for DuckDB (MATCH_RECOGNIZE, ...) fails
        # inside its generator with whatever error it meets: a refusal, like any other.
        raise QueryError(
            f"the embedded engine cannot run this statement: sqlglot cannot translate it "
            f"({type(exc).__name__}); run it in Trino (--trino, or trino.url)"
        ) from None


def _joda_arguments(function: str, arguments: list[exp.Expr]) -> tuple[exp.Expr, exp.Literal]:
    """A Joda-Time function's value, and its pattern spelled as DuckDB's strftime reads it."""
    if len(arguments) != 2 or not (
        isinstance(arguments[1], exp.Literal) and arguments[1].is_string
    ):
        raise QueryError(
            f"{function} takes a value and a pattern written as a string literal here; "
            "give the pattern as one, or run the query in Trino (--trino)"
        )
    return arguments[0].copy(), exp.Literal.string(_strftime_pattern(arguments[1].this, function))


# Joda-Time's pattern letters, by how many times one is repeated (0: any other count),
# as DuckDB's strftime and strptime spell them. Letters left out (`k`, `K`, `Z`, `G`,
# `C`...) have no spelling there.
_JODA_LETTERS: dict[str, dict[int, str]] = {
    "y": {2: "%y", 0: "%Y"},
    "Y": {2: "%y", 0: "%Y"},
    "x": {4: "%G"},
    "w": {2: "%V"},
    "e": {1: "%u"},
    "E": {1: "%a", 2: "%a", 3: "%a", 0: "%A"},
    "M": {1: "%-m", 2: "%m", 3: "%b", 0: "%B"},
    "d": {1: "%-d", 2: "%d"},
    "D": {1: "%-j", 3: "%j"},
    "a": {1: "%p"},
    "H": {1: "%-H", 2: "%H"},
    "h": {1: "%-I", 2: "%I"},
    "m": {1: "%-M", 2: "%M"},
    "s": {1: "%-S", 2: "%S"},
    "S": {3: "%g", 6: "%f", 9: "%n"},
    "z": {1: "%Z", 2: "%Z", 3: "%Z"},
}


def _strftime_pattern(pattern: str, function: str) -> str:
    """A Joda-Time pattern (`yyyy-MM-dd'T'HH`) as DuckDB's strftime reads it.

    Text in single quotes is literal (`''` is a quote); so is anything but a letter.

    Raises:
        QueryError: For a letter, or a count of it, DuckDB has no spelling for.
    """
    out: list[str] = []
    at, quoted = 0, False
    while at < len(pattern):
        char = pattern[at]
        if pattern.startswith("''", at):
            out.append("'")
            at += 2
        elif char == "'":
            quoted = not quoted
            at += 1
        elif quoted or not (char.isascii() and char.isalpha()):
            out.append("%%" if char == "%" else char)
            at += 1
        else:
            run = len(pattern[at:]) - len(pattern[at:].lstrip(char))
            spellings = _JODA_LETTERS.get(char, {})
            spelled = spellings.get(run, spellings.get(0))
            if spelled is None:
                raise QueryError(
                    f"{function}: the pattern letter {char * run!r} in {pattern!r} has no "
                    "equivalent in the embedded engine; write the pattern without it, or "
                    "run the query in Trino (--trino)"
                )
            out.append(spelled)
            at += run
    return "".join(out)


def _trino_names(tree: exp.Expr) -> exp.Expr:
    """The query with its unnamed output columns named as Trino names them: `_col0`...

    DuckDB would name them after their expression (`count_star()`), and JSON and CSV
    answers would not carry the keys the same query has in Trino.
    """
    first = tree
    while isinstance(first, exp.SetOperation | exp.Subquery):
        first = first.this
    if isinstance(first, exp.Select):
        first.set(
            "expressions",
            [
                e if isinstance(e, exp.Alias | exp.Column | exp.Star) else exp.alias_(e, f"_col{i}")
                for i, e in enumerate(first.expressions)
            ],
        )
    return tree


@dataclass(frozen=True)
class QueryTable:
    """One table a query can name: its metastore name, where it lives, its columns.

    Attributes:
        name: Its name in the metastore (`clicks`, `clicks_raw`...).
        ref: Where it is and its format.
        schema: Its columns: what an empty table shows, and what a plain Parquet
            table's files are read with.
        read_as: How the metastore records it, so which of Trino's connectors reads it
            (`strata.catalog.register.registered_as`): its catalog, and its types.
    """

    name: str
    ref: TableRef
    schema: pa.Schema
    read_as: ReadAs


def query_tables(places: Places, schemas: SchemaSpec) -> list[QueryTable]:
    """The tables of a pipeline (or routed table) that a query can name.

    The data, raw, quarantine and ledger tables, and the quality table.

    Args:
        places: The pipeline's places.
        schemas: What its tables' columns are made from (`PipelineConfig.schemas`),
            with the schema its table evolved to.
    """
    from strata.catalog.register import registered_as
    from strata.quality.checks import QUALITY_SCHEMA
    from strata.quality.table import quality_table_location
    from strata.schema.avro import table_layout
    from strata.store.ledger import LEDGER_SCHEMA

    def read_as(role: Role) -> ReadAs:
        return registered_as(places.format, role)

    out = [
        QueryTable(
            places.table(which).name,
            places.table(which),
            table_layout(schemas, which)[0],
            read_as(which),
        )
        for which in ("table", "raw", "quarantine")
    ]
    out.append(QueryTable(places.ledger.name, places.ledger, LEDGER_SCHEMA, read_as("ledger")))
    quality = places.table("quality")
    # The quality table is Delta whatever the pipeline's format (`strata.quality.table`).
    checks = TableRef(quality_table_location(quality), "delta", quality.options, quality.name)
    out.append(QueryTable(quality.name, checks, QUALITY_SCHEMA, read_as("quality")))
    return out


def run_embedded(
    tables: Iterable[QueryTable],
    catalog: str,
    database: str,
    statement: str,
    catalog_for: Callable[[str], str] | None = None,
) -> QueryAnswer:
    """Run one Trino query on DuckDB over the tables, and over nothing else.

    Args:
        tables: The tables the query may name.
        catalog: The session's Trino catalog: the one of the pipeline's format (`delta`,
            `iceberg` or `hive`), where a table named without a catalog is looked for.
        database: Their metastore database: the schema they are in, and the session's,
            so that a table named alone (`clicks`) is found there.
        statement: The query, in Trino's dialect.
        catalog_for: The catalog that reads a table of a format
            (`TrinoConfig.catalog_for`); None: the catalogs' default names.

    Returns:
        The answer: its columns and rows.

    Raises:
        QueryError: In one short line, if the statement is not one query, names anything
            but the tables, calls DuckDB's own functions of files, settings or the
            machine, compares what Trino does not compare, nests too deeply, or DuckDB
            refuses it (an unknown column, a function it lacks).
    """
    import duckdb

    where = catalog_for or _DEFAULT_CATALOGS.__getitem__
    placed = [(where(t.read_as), t) for t in tables]
    tree = only_query(statement)
    with reading_statement():
        check_reads(tree, {t.name: c for c, t in placed}, catalog, database)
        check_comparisons(
            tree, {(c, database, t.name): t.schema for c, t in placed}, catalog, database
        )
        sql = to_duckdb(tree)
    logger.debug("the query as DuckDB reads it: %.2000s", sql)
    started = time.perf_counter()
    with reading_statement(), _connection(placed, catalog, database) as con:
        opened = time.perf_counter()
        try:
            found = con.sql(sql)
            answer = QueryAnswer([], []) if found is None else _answer(found)
        except duckdb.PermissionException:
            # What the checks above let through and the connection stopped: its message
            # names the path it was refused.
            raise QueryError(OUTSIDE_THE_TABLES) from None
        except (duckdb.ProgrammingError, duckdb.DataError, duckdb.NotSupportedError) as exc:
            # The query's own fault (syntax, a name, a type); a table's file that cannot
            # be read is not, and ends the command as such. DuckDB's message goes on
            # with the statement, which can be megabytes long: its first line says it.
            raise QueryError(f"DuckDB refused the query: {one_line(str(exc))}") from None
    logger.info(
        "query answered with %d row(s) in %.2f s (tables opened in %.2f s) by DuckDB %s",
        len(answer.rows),
        time.perf_counter() - started,
        opened - started,
        duckdb.__version__,
    )
    return answer


def _answer(found: duckdb.DuckDBPyRelation) -> QueryAnswer:
    return QueryAnswer(list(found.columns), [tuple(r) for r in found.fetchall()])


@contextmanager
def _connection(
    tables: Iterable[tuple[str, QueryTable]], catalog: str, database: str
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection holding each table as a view in its catalog, that can read
    nothing else.

    Args:
        tables: Each table and the Trino catalog it is in.
        catalog: The session's catalog.
        database: The schema of every table, and the session's.

    Its home and temporary directory are a fresh directory of this process's own
    (mode 700: no other user may enter it), removed with the connection: DuckDB's default
    temporary directory, `.tmp` under the working directory, stays readable once
    external access is off, and anyone may have put a file there.
    """
    import duckdb

    from strata.catalog.types import quote_identifier
    from strata.store.tables import dataset

    with tempfile.TemporaryDirectory(prefix="strata-query-", ignore_cleanup_errors=True) as own:
        config: dict[str, Any] = {
            # What a query needs is built in; nothing is fetched from the network.
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
            # Secrets and extensions would be looked for under the user's home.
            "allow_persistent_secrets": False,
            "home_directory": own,
            "temp_directory": f"{own}/spill",
            # A name DuckDB's Python client does not know would be looked up among the
            # variables of the calling code.
            "python_enable_replacements": False,
        }
        placed = list(tables)
        with duckdb.connect(config=config) as con:
            for name in dict.fromkeys([catalog, *(c for c, _ in placed)]):
                con.execute(f"ATTACH ':memory:' AS {quote_identifier(name)}")
                where = f"{quote_identifier(name)}.{quote_identifier(database)}"
                con.execute(f"CREATE SCHEMA IF NOT EXISTS {where}")
            # Trino shows timestamps with time zone in the session's zone; Strata's are UTC.
            con.execute("SET TimeZone = 'UTC'")
            # Trino divides integers to an integer, truncated (7 / 2 is 3): DuckDB's `/`
            # would give 3.5, and `latency_ms / 100 * 100` would no longer bucket.
            con.execute("SET integer_division = true")
            for at, (in_catalog, table) in enumerate(placed):
                schema = table.schema if table.ref.format != "delta" else None
                found = dataset(table.ref, schema=schema)
                source: Any = table.schema.empty_table() if found is None else found
                hidden = f"_strata_table_{at}"
                con.register(hidden, source)
                view = ".".join(quote_identifier(n) for n in (in_catalog, database, table.name))
                columns = view_select(source.schema, table.read_as)
                con.execute(f"CREATE VIEW {view} AS SELECT {columns} FROM {hidden}")
            # The session's catalog and schema, as Trino's CLI takes them: `clicks` alone
            # is `<database>.clicks`.
            con.execute(f"USE {quote_identifier(catalog)}.{quote_identifier(database)}")
            # From here on no statement can read or write a file of its own (but the
            # temporary directory's, where DuckDB spills): only the views.
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            yield con


def statement_for(
    name: str | None,
    file_text: str | None,
    execute: str | None,
    pipeline: str,
    database: str,
    catalogs: Mapping[Role, str] | None = None,
) -> tuple[str, bool]:
    """The statement to run: a ready query on the pipeline's tables, a file's or a given one.

    Args:
        name: A ready query's name.
        file_text: A file's text.
        execute: A statement given on the command line.
        pipeline: The pipeline the ready query is for.
        database: Its metastore database.
        catalogs: Each of its tables' Trino catalog (`table_catalogs`), which a ready
            query names them in; None: the session's.

    Returns:
        The statement in Trino's dialect, and whether it is a ready query (rewritten).

    Raises:
        QueryError: Unless exactly one of the three is given, or for an unknown name.
    """
    given = [x for x in (name, file_text, execute) if x is not None]
    if len(given) != 1:
        raise QueryError(
            "give one of: a ready query's name ("
            + ", ".join(ready_query_names())
            + "), --file PATH, or -e SQL"
        )
    if name is None:
        return given[0], False
    tree = on_pipeline(only_query(ready_query(name)), pipeline, database, catalogs)
    return tree.sql("trino", pretty=True), True
