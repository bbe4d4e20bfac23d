"""Field names the tables cannot hold, refused through the `strata` command before anything
is written: Hive, Trino and Delta compare column names without case."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from strata.catalog.metastore import MetastoreClient
from tests.conftest import produce_clicks

FIX = "rename the field in the schema file"


def with_fields(schema: Path, *names: str) -> None:
    """Add optional string fields of these names to a schema file."""
    body = json.loads(schema.read_text())
    body["fields"] += [{"name": n, "type": ["null", "string"], "default": None} for n in names]
    schema.write_text(json.dumps(body))


@pytest.mark.parametrize("table_format", ["delta", "parquet", "iceberg"])
def test_fields_named_as_the_partition_columns_in_another_case_stop_the_run_before_any_write(
    make_pipeline, broker, metastore, table_format
):
    p = make_pipeline(
        partitions=2,
        overrides={"table_format": table_format, "metastore": {"uri": metastore.uri}},
    )
    with_fields(p.conf_dir.parent / "schemas" / "clicks.avsc", "DT", "Hr")
    produce_clicks(broker, p.topic, 2, 20)

    done = p.cli("run")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "field `DT` is the event-time partition column `dt`" in done.stderr
    assert "field `Hr` is the event-time partition column `hr`" in done.stderr
    assert FIX in done.stderr and "Traceback" not in done.stderr
    # Nothing was planned, written, committed or registered.
    assert not p.warehouse.exists()
    with MetastoreClient(metastore.uri, 30) as client:
        assert client.get_table("strata", p.name) is None


def test_a_table_a_pattern_routes_to_is_refused_alone_when_its_schema_has_a_clashing_field(
    make_pipeline, broker
):
    p = make_pipeline(partitions=1)
    # Each topic the pattern matches lands in a table named after it, with the schema
    # file of that name: known only once the run has listed the topics.
    path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    body = yaml.safe_load(path.read_text())
    body.pop("topics")
    body.update(
        topics_pattern=re.escape(p.topic), schema_file="{table}.avsc", routing={"table": "{topic}"}
    )
    path.write_text(yaml.safe_dump(body))
    table = re.sub(r"[^a-z0-9_]", "_", p.topic)
    schemas = p.conf_dir.parent / "schemas"
    (schemas / "clicks.avsc").rename(schemas / f"{table}.avsc")
    with_fields(schemas / f"{table}.avsc", "user_ID")
    produce_clicks(broker, p.topic, 1, 20)

    done = p.cli("run", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    failed = json.loads(done.stdout.strip().splitlines()[-1])["tables"][table]
    assert failed["status"] == "failed", failed
    assert "fields `user_id` and `user_ID` are one column" in failed["error"]
    assert FIX in failed["error"]
    # The table was never written, nor recorded as one the pipeline has.
    assert not (p.warehouse / table).exists()
    assert not (p.warehouse / "_strata" / p.name / "tables").exists()
