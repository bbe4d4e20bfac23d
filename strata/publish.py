"""Publish: register a pipeline's tables in the Hive Metastore, idempotently.

Runs after the commit, so a publishing failure never loses data: the batch stands,
and the next run (or `strata publish`) completes the registration. Every call
compares what the metastore holds with what it should hold and changes only the
difference, so publishing twice changes nothing, and a table whose location drifted
is corrected.

Delta tables are registered the way Spark and Trino's Delta Lake connector expect
them: an external table with the location, `spark.sql.sources.provider=delta`, and
a placeholder column; readers take the schema and the files from the Delta log, so
no `register_table` call is needed by hand.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pymetastore.hive_metastore.ttypes import FieldSchema, SerDeInfo, StorageDescriptor, Table

from strata.config import PipelineConfig
from strata.metastore import MetastoreClient, MetastoreError

# Which table each location holds, and its name suffix in the metastore.
TABLE_SUFFIXES = {"table": "", "raw": "_raw", "quarantine": "_quarantine", "ledger": "_ledger"}
DELTA_PROVIDER = "delta"


class PublishError(Exception):
    """Registration failed after the batch was committed; the message says how to finish."""


@dataclass
class PublishReport:
    """What publishing changed.

    Attributes:
        database: The metastore database.
        created: Tables created.
        updated: Tables whose definition was corrected.
        unchanged: Tables already as they should be.
    """

    database: str
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)


def location_uri(location: str) -> str:
    """A table location as the metastore stores it (`file:/...` for local paths)."""
    return location if "://" in location else f"file:{location}"


def delta_table(database: str, name: str, location: str, pipeline: str) -> Table:
    """The metastore definition of an external Delta table."""
    uri = location_uri(location)
    storage = StorageDescriptor(
        # Spark's convention for a data source table: the real schema is the Delta log's.
        cols=[FieldSchema("col", "array<string>", "from deserializer")],
        location=uri,
        inputFormat="org.apache.hadoop.mapred.SequenceFileInputFormat",
        outputFormat="org.apache.hadoop.hive.ql.io.HiveSequenceFileOutputFormat",
        compressed=False,
        numBuckets=-1,
        serdeInfo=SerDeInfo(
            serializationLib="org.apache.hadoop.hive.serde2.lazy.LazySimpleSerDe",
            parameters={"path": uri, "serialization.format": "1"},
        ),
        bucketCols=[],
        sortCols=[],
        parameters={},
    )
    return Table(
        tableName=name,
        dbName=database,
        owner="strata",
        createTime=int(time.time()),
        lastAccessTime=0,
        retention=0,
        sd=storage,
        partitionKeys=[],
        parameters={
            "EXTERNAL": "TRUE",
            "spark.sql.sources.provider": DELTA_PROVIDER,
            "strata.pipeline": pipeline,
        },
        tableType="EXTERNAL_TABLE",
    )


def _same(current: Table, wanted: Table) -> bool:
    params = current.parameters or {}
    return (
        current.sd.location == wanted.sd.location
        and params.get("spark.sql.sources.provider", "").lower() == DELTA_PROVIDER
        and current.tableType == wanted.tableType
    )


def publish(cfg: PipelineConfig) -> PublishReport:
    """Register the pipeline's data, raw, quarantine and ledger tables.

    Args:
        cfg: The pipeline configuration; `metastore.uri` must be set.

    Returns:
        What changed.

    Raises:
        MetastoreError: If the metastore cannot be reached or refuses a change.
    """
    ms = cfg.metastore
    if not ms.uri:
        raise MetastoreError(
            "no metastore configured; set metastore.uri (or STRATA_METASTORE_URI) to "
            "thrift://host:port"
        )
    report = PublishReport(ms.database)
    with MetastoreClient(ms.uri, ms.timeout_s) as client:
        client.ensure_database(
            ms.database, location_uri(cfg.warehouse), "Tables landed from Kafka by Strata"
        )
        for which, suffix in TABLE_SUFFIXES.items():
            name = f"{cfg.name}{suffix}"
            wanted = delta_table(ms.database, name, cfg.location(which), cfg.name)  # type: ignore[arg-type]
            current = client.get_table(ms.database, name)
            if current is None:
                client.create_table(wanted)
                report.created.append(name)
            elif _same(current, wanted):
                report.unchanged.append(name)
            else:
                wanted.createTime = current.createTime
                client.alter_table(wanted)
                report.updated.append(name)
    return report


def render_publish(report: PublishReport) -> str:
    """The report as one line."""
    parts = [
        f"{label} {', '.join(names)}"
        for label, names in (
            ("created", report.created),
            ("updated", report.updated),
            ("unchanged", report.unchanged),
        )
        if names
    ]
    return f"metastore database {report.database}: " + "; ".join(parts)
