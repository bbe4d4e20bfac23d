"""A pipeline's tables counted in Trino and by Strata's readers, and what Trino ran.

For the tests that prove Trino reads what Strata writes, on the session's real Trino:
`strata_counts` reads each of a pipeline's (or a routed table's) five tables the way
the runs read them back, `trino_counts` counts them in the Trino catalog the
pipeline's `trino` settings name for each (`table_catalogs`, as `strata sql query`
names them), and `queries_of` is Trino's own record of the statements a user ran
(through `airflow_connection`, say).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace

from strata.catalog.query import table_catalogs
from strata.config import PipelineConfig, TrinoConfig
from strata.local.trino import ELSEWHERE, LOOPBACK, LocalTrino
from strata.quality.table import quality_table_location
from strata.store.places import TABLE_ROLES, Role, TableRef
from strata.store.tables import dataset


def registering_settings(table_format: str) -> dict[str, object]:
    """`trino` settings for the catalogs where registering a pipeline's tables does something.

    Delta and Iceberg tables: the catalogs on a metastore of Trino's own (`*_elsewhere`),
    where each table reads only once `register_table` registered it (a Trino on Strata's
    metastore reads the metastore's entries with no statement). Plain Parquet tables
    belong with the Hive catalog on Strata's metastore (`strata.catalog.sql.ddl_statements`):
    there, Strata's registration adds their partitions and Trino synchronises them.
    """
    if table_format == "parquet":
        return {}
    return {
        "delta_catalog": "delta" + ELSEWHERE,
        "hive_catalog": "hive" + ELSEWHERE,
        "iceberg_catalog": "iceberg" + ELSEWHERE,
        "register_delta_tables": True,
    }


def _readable(cfg: PipelineConfig, which: Role) -> TableRef:
    """The table itself: the quality role's is the Delta table under its folder."""
    ref = cfg.places().table(which)
    if which == "quality":
        return replace(ref, uri=quality_table_location(ref), format="delta")
    return ref


def strata_counts(cfg: PipelineConfig, roles: Iterable[Role] = TABLE_ROLES) -> dict[Role, int]:
    """Rows of each table (data, raw, quarantine, ledger, quality), read by Strata's readers."""
    out: dict[Role, int] = {}
    for which in roles:
        found = dataset(_readable(cfg, which))
        out[which] = 0 if found is None else found.count_rows()
    return out


def trino_counts(
    trino: LocalTrino,
    cfg: PipelineConfig,
    roles: Iterable[Role] = TABLE_ROLES,
    settings: TrinoConfig | None = None,
) -> dict[Role, int]:
    """Rows of each table as Trino counts them, in the catalog `cfg.trino` (or `settings`)
    names for it; in one statement, which Trino plans and reads at once."""
    catalogs = table_catalogs(cfg.table_format, (settings or cfg.trino).catalog_for)
    database = cfg.metastore.database
    counts = [
        f"SELECT '{which}', count(*) FROM "
        f'"{catalogs[which]}"."{database}"."{cfg.places().table(which).name}"'
        for which in roles
    ]
    return dict(trino.query(" UNION ALL ".join(counts)))


def trino_rows(trino: LocalTrino, cfg: PipelineConfig, statement: str) -> list[tuple]:
    """What a statement on the data table answers in Trino; `{table}` names the table."""
    catalog = table_catalogs(cfg.table_format, cfg.trino.catalog_for)["table"]
    table = f'"{catalog}"."{cfg.metastore.database}"."{cfg.places().table("table").name}"'
    return trino.query(statement.format(table=table))


def airflow_connection(trino: LocalTrino, login: str) -> str:
    """An Airflow connection to the session's Trino as `login`, as `AIRFLOW_CONN_*` holds it.

    Plain http, as the local Trino serves: the connection's sign-in over https is the
    unit tier's (tests/unit/test_airflow.py), against a peer that checks what it is sent.
    """
    return json.dumps(
        {
            "conn_type": "trino",
            "host": LOOPBACK,
            "port": trino.port,
            "login": login,
            "extra": {"protocol": "http"},
        }
    )


def queries_of(trino: LocalTrino, user: str) -> list[tuple[str, str, str]]:
    """(source, state, statement) of each statement a user ran in Trino, oldest first."""
    rows = trino.query(
        'SELECT source, state, query FROM system.runtime.queries WHERE "user" = '
        f"'{user}' ORDER BY created"
    )
    return [(source, state, query) for source, state, query in rows]
