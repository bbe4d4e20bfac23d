"""A table that follows its Schema Registry subject: optional fields producers add become columns.

With `schema_registry.evolve`, the table's schema is `schema_file`'s fields, then every
field that the table took on since, in the order it took them on. When a batch is
planned, the newest schema of each of its topics' subjects is read, and each field it
has and the table lacks is added if it is optional (`["null", ...]` with default null):
the one change a table takes without rewriting its files (`strata.schema.schema_changes`).
A field that is not optional is left out with a warning, and messages written with it
still land, without it, by Avro's resolution.

The schema a batch is read with is saved in its plan, so a resumed batch reads as it
began, and recorded in the ledger with the batch, so the next plan starts from it and
a column, once added, is never dropped (a table never drops a column).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from strata.config import PipelineConfig

log = logging.getLogger(__name__)


def table_schema(cfg: PipelineConfig) -> PipelineConfig:
    """The configuration reading with the schema the table has evolved to.

    Args:
        cfg: A pipeline; one that does not follow its registry is returned as it is.

    Returns:
        `cfg`, or a copy reading with `schema_file`'s fields and those the table took
        on since (as the ledger recorded them with the newest batch).
    """
    if not cfg.schema_registry.evolve or not cfg.reads_schema_file:
        # Not following the registry, or reading with an evolved schema already (a
        # plan's, or this function's): the ledger is not read again.
        return cfg
    from strata.ledger import committed_reader_schema

    recorded = committed_reader_schema(cfg)
    if recorded is None:
        return cfg
    base = json.loads(cfg.schema_text)
    merged, _ = merged_fields(base, recorded[1])
    return cfg if merged == base else cfg.with_schema_text(json.dumps(merged))


def evolved(cfg: PipelineConfig, topics: Iterable[str]) -> PipelineConfig:
    """The table's schema with the optional fields its topics' newest registered schemas add.

    Args:
        cfg: The pipeline, reading with the table's current schema (`table_schema`).
        topics: The topics the batch reads.

    Returns:
        `cfg` reading with the evolved schema (unchanged when nothing was added).

    Raises:
        SchemaRegistryUnavailable: If the registry cannot be reached; nothing is planned.
    """
    from strata.registry import latest_schema

    base = schema = json.loads(cfg.schema_text)
    for topic in sorted(set(topics)):
        subject = cfg.schema_registry.subject.replace("{topic}", topic)
        latest = latest_schema(cfg.schema_registry, subject)
        if latest is None:
            log.warning(
                "subject %r holds no Avro schema; the table follows none for %s", subject, topic
            )
            continue
        schema, refused = merged_fields(schema, latest)
        for name in refused:
            log.warning(
                "subject %r adds field %r, which is not optional; the table does not take it "
                '(declare it ["null", ...] with "default": null to have it added)',
                subject,
                name,
            )
    return cfg if schema == base else cfg.with_schema_text(json.dumps(schema))


def merged_fields(base: dict[str, Any], other: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`base` with the optional top-level fields of `other` that it lacks, appended in order.

    Args:
        base: The table's Avro record schema.
        other: Another version of it (a registered one, or one recorded earlier).

    Returns:
        The merged schema, and the names of fields `other` adds that were left out
        because they are not optional or cannot be read on their own (a type named
        elsewhere in `other`).
    """
    from fastavro import parse_schema

    have = {f["name"] for f in base.get("fields", [])}
    fields = list(base.get("fields", []))
    refused = []
    for field in other.get("fields", []):
        if field.get("name") in have:
            continue
        candidate = {**base, "fields": [*fields, field]}
        if not _optional(field):
            refused.append(str(field.get("name")))
            continue
        try:
            parse_schema(candidate, _write_hint=False)
        except Exception:  # noqa: BLE001 - any parse failure means the field cannot stand alone
            refused.append(str(field.get("name")))
            continue
        fields.append(field)
        have.add(field["name"])
    return {**base, "fields": fields}, refused


def _optional(field: dict[str, Any]) -> bool:
    """Whether a field is `["null", ...]` with default null: old rows read it as null."""
    kind = field.get("type")
    return (
        isinstance(kind, list) and bool(kind) and kind[0] == "null" and "default" in field
    ) and field["default"] is None
