"""What a statement may read in the embedded engine: the pipeline's tables, and nothing else.

DuckDB can do much more than read tables: read any file (`read_text`, `read_csv`, a
quoted path in FROM), answer about itself and the machine (`current_setting`,
`duckdb_settings()`, `duckdb_secrets()`), and run SQL given as a string (`query`,
`json_execute_serialized_sql`). The connection is shut for all of it (no external
access, the configuration locked, a private temporary directory), but DuckDB keeps its
temporary directory readable whatever it is told, since it spills there through the
same checks. So a statement is read first, and runs only if every table it names is
one of the pipeline's (or a WITH query of its own) and it calls none of DuckDB's own
functions of the engine, its files or the machine.

A statement is refused, too, where reading it would reach a limit: Trino's length
(`query.max-length`), DuckDB's expression depth, Python's recursion. Every refusal is a
`QueryError` (exit code 2) in one short line, whatever the statement's size.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from sqlglot import exp
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers
from sqlglot.optimizer.scope import traverse_scope

from strata.errors import QueryError
from strata.log import get_logger

logger = get_logger(__name__)

MAX_STATEMENT_CHARS = 1_000_000
"""The longest statement read: Trino's default `query.max-length`."""
MAX_DEPTH = 900
"""The deepest statement the embedded engine runs, in levels of its syntax tree.

DuckDB stops at 1,000 levels (`max_expression_depth`) with a hint to raise the limit,
which a locked configuration refuses; this stays below it. A chain of operators
(`1 + 1 + ...`) is a level per operator, as in DuckDB; one of AND or OR is one level.
"""
_MESSAGE_CHARS = 300
# The longest name or function a refusal quotes from the statement.
_QUOTED_CHARS = 60

TOO_DEEP = (
    "the statement nests too deeply for sqlglot to read it (parentheses, calls or "
    "subqueries one inside another, some dozens of levels); write it with fewer levels, "
    "e.g. a WITH query for each subquery"
)
OUTSIDE_THE_TABLES = (
    "the query reached outside the pipeline's tables (a file, a setting or an extension), "
    "which the embedded engine refuses; a query reads the pipeline's tables only"
)

# DuckDB's functions that read files, run SQL given as text, or answer about the engine,
# its catalog, its settings and the machine: none is Trino's. The table functions among
# them are refused anyway (FROM names tables only); they are listed all the same.
_ENGINE_FUNCTIONS = frozenset(
    {
        # settings, variables, the environment
        "current_setting",
        "getvariable",
        "getenv",
        # files and secrets
        "glob",
        "sniff_csv",
        "which_secret",
        # SQL given as text
        "query",
        "query_table",
        "json_serialize_sql",
        "json_deserialize_sql",
        "json_serialize_plan",
        "json_execute_serialized_sql",
        # the session, the catalog and its internals
        "current_query",
        "current_query_id",
        "current_connection_id",
        "current_transaction_id",
        "txid_current",
        "current_schemas",
        "in_search_path",
        "col_description",
        "obj_description",
        "shobj_description",
        "format_pg_type",
        "format_type",
        "map_to_pg_oid",
        "get_block_size",
        "index_key",
        "stats",
        "inet_client_addr",
        "inet_client_port",
        "inet_server_addr",
        "inet_server_port",
        # what changes the engine's state
        "nextval",
        "currval",
        "setval",
        "write_log",
        "parse_duckdb_log_message",
        "checkpoint",
        "force_checkpoint",
        "enable_logging",
        "disable_logging",
        "enable_profiling",
        "disable_profiling",
        "truncate_duckdb_logs",
        "summary",
        "test_all_types",
        "test_vector_types",
        "sleep_ms",
    }
)
_ENGINE_PREFIXES = ("duckdb_", "pragma_", "pg_", "read_", "parquet_")
_ENGINE_SUFFIXES = ("_privilege", "_external_resource", "_external_resource_type")


def check_length(statement: str) -> None:
    """Refuse a statement longer than Trino reads.

    Raises:
        QueryError: Saying how long it is and how long one may be.
    """
    if len(statement) > MAX_STATEMENT_CHARS:
        raise QueryError(
            f"the statement is {len(statement):,} characters long; at most "
            f"{MAX_STATEMENT_CHARS:,} are read, as Trino's query.max-length allows by default"
        )


_SQLGLOT = logging.getLogger("sqlglot")


class _HeldWarnings(logging.Filter):
    """Keeps sqlglot's records from its own handlers: logged here at DEBUG instead, short."""

    def filter(self, record: logging.LogRecord) -> bool:
        logger.debug("sqlglot: %s", one_line(record.getMessage()))
        return False


@contextmanager
def reading_statement() -> Iterator[None]:
    """sqlglot (or DuckDB) at work on a statement: its limits as the statement's refusal.

    sqlglot parses, walks and writes a statement by recursion, some twenty calls a level:
    one nested a few dozen levels deep (parentheses, calls) ends it with Python's
    RecursionError, which is the statement's doing. sqlglot also warns of a statement
    it reads as a bare command, quoting all of it; such a statement is refused, and
    sqlglot's warnings go to this module's logger at DEBUG, short.

    Raises:
        QueryError: `TOO_DEEP`, for a RecursionError raised inside.
    """
    held = _HeldWarnings()
    _SQLGLOT.addFilter(held)
    try:
        yield
    except RecursionError:
        raise QueryError(TOO_DEEP) from None
    finally:
        _SQLGLOT.removeFilter(held)


def check_reads(tree: exp.Expr, tables: Mapping[str, str], catalog: str, database: str) -> None:
    """Refuse a query that reads anything but the tables, or calls DuckDB's own functions.

    Each table the query names must be one of `tables`, in its catalog and `database`,
    or a WITH query in scope; a name without a catalog is in the session's, and one
    without a schema in `database` (`clicks`, `strata.clicks`, `delta.strata.clicks`).
    Names are compared as Trino compares them, whatever their case.

    Args:
        tree: The query, parsed as Trino SQL.
        tables: The tables it may read, by their metastore names, and the Trino catalog
            each is in.
        catalog: The session's catalog.
        database: Their metastore database: the schema they are in.

    Raises:
        QueryError: Naming the first table, function or nesting refused.
    """
    _check_depth(tree)
    tree = normalize_identifiers(tree.copy(), dialect="trino")
    # In the order given (the data table first), each once.
    known = {name.lower(): where.lower() for name, where in tables.items()}
    catalog, database = catalog.lower(), database.lower()
    # A table named as a WITH query in its scope is that query (sqlglot resolves the
    # scopes as Trino and DuckDB do); every other table, wherever it stands, is a table.
    with_queries = {
        id(t)
        for scope in traverse_scope(tree)
        for t in scope.tables
        if not t.db and isinstance(t.this, exp.Identifier) and t.name in scope.cte_sources
    }
    for node in tree.walk():
        if isinstance(node, exp.Func):
            _check_function(node)
        elif isinstance(node, exp.Lateral) and not isinstance(
            node.this, exp.Subquery | exp.Query | exp.Unnest
        ):
            raise QueryError(_not_a_table(_named(node.this), known, catalog, database))
        elif isinstance(node, exp.Table) and id(node) not in with_queries:
            named = isinstance(node.this, exp.Identifier) and node.name in known
            if named and node.db in ("", database):
                if (node.catalog or catalog) == known[node.name]:
                    continue
                if not node.catalog:
                    # One of the tables, in another catalog than the session's: as in Trino,
                    # it is not found there.
                    raise QueryError(
                        f"{quoted(_named(node))} is in catalog {known[node.name]}, not in "
                        f"{catalog}, the session's: name it "
                        f"{known[node.name]}.{database}.{node.name}, as Trino reads it"
                    )
            raise QueryError(_not_a_table(_named(node), known, catalog, database))


def _check_depth(tree: exp.Expr) -> None:
    """Refuse a tree deeper than `MAX_DEPTH`, counted without recursion."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        for child in node.iter_expressions():
            # DuckDB reads `a AND b AND c` as one conjunction, not a chain.
            same_connector = isinstance(child, exp.Connector) and type(child) is type(node)
            stack.append((child, depth if same_connector else depth + 1))
    if deepest > MAX_DEPTH:
        raise QueryError(
            f"the statement nests {deepest} levels deep (each operator of a chain such as "
            f"1 + 1 + ... is a level) and the embedded engine reads at most {MAX_DEPTH}: "
            "group the terms, e.g. sum over a VALUES list, or use an IN list"
        )


def _check_function(node: exp.Func) -> None:
    """Refuse a call of one of DuckDB's own functions of the engine, its files or the machine."""
    # A function sqlglot does not know carries its name as written; one it knows, its own.
    called = [node.this] if isinstance(node.this, str) else type(node).sql_names()
    for name in (n.lower() for n in called):
        if (
            name in _ENGINE_FUNCTIONS
            or name.startswith(_ENGINE_PREFIXES)
            or name.endswith(_ENGINE_SUFFIXES)
        ):
            raise QueryError(
                f"{quoted(name)} is DuckDB's own function, refused here: the embedded engine "
                "reads the pipeline's tables, never a file, a setting or anything of the "
                "machine"
            )


def _named(node: exp.Expr) -> str:
    """What stands in FROM, as a refusal names it: a table's name, a function's `f(...)`."""
    if isinstance(node, exp.Table) and isinstance(node.this, exp.Func):
        node = node.this
    if isinstance(node, exp.Func):
        name = node.this if isinstance(node.this, str) else node.sql_name()
        return f"{name.lower()}(...)"
    if isinstance(node, exp.Table):
        return ".".join(p.sql("trino") for p in node.parts)
    return node.sql("trino")


def _not_a_table(named: str, known: Mapping[str, str], catalog: str, database: str) -> str:
    """Why a table (or what stands in FROM) is refused, listing a few of the tables."""
    tables = list(known)
    listed = ", ".join(f"{known[t]}.{database}.{t}" for t in tables[:5])
    if len(tables) > 5:
        listed += f" and {len(tables) - 5} more"
    return (
        f"{quoted(named)} is not one of the pipeline's tables, which are all the embedded "
        f"engine reads: {listed or 'none'} (unqualified names are in {catalog}.{database})"
    )


def quoted(text: str) -> str:
    """A name from the statement as a refusal quotes it: in backticks, and short."""
    return f"`{clipped(text, _QUOTED_CHARS)}`"


def one_line(text: str) -> str:
    """An engine's message as one short line: its first paragraph, its whitespace folded.

    DuckDB follows its message with the statement (`LINE 1: SELECT ...`) after a blank
    line; a statement can be megabytes long.
    """
    return clipped(text.strip().split("\n\n", 1)[0], _MESSAGE_CHARS)


def clipped(text: str, limit: int) -> str:
    """Text on one line, its whitespace folded, cut to `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
