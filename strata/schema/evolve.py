"""A table that follows its Schema Registry subject: optional fields producers add become columns.

With `schema_registry.evolve`, the table's schema is `schema_file`'s fields, then every
field that the table took on since, in the order it took them on. When a batch is
planned, the newest schema of each of its topics' subjects is read, and each field it
has and the table lacks is added if it is optional (`["null", ...]` with default null):
the one change a table takes without rewriting its files (`strata.schema.avro.schema_changes`).
Every other field is left out with a warning naming the subject and the field, and
messages written with it still land, without it, by Avro's resolution: a field that is
not optional, one whose type is named elsewhere in the schema, one named as Strata's
own columns are (`_*`, `dt`, `hr`, the field partition's `p_<field>`) or as a field the
table has, in any case (Hive, Trino and Delta compare column names without case), and
one the table's schema check refuses (a type Strata cannot hold). So evolution never
makes a schema the next plan refuses.

A newest schema that is not a record Strata can read (not JSON, not a record, its
fields not a list, a field entry that is not an object or has no string name) is
warned of, and the table takes none of that subject's new fields this time; the plan
goes on. A subject the registry does not know holds no schema to follow. A registry
that cannot be reached fails the plan (`SchemaRegistryUnavailable`).

The schema a batch is read with is saved in its plan, so a resumed batch reads as it
began, and recorded in the ledger with the batch, so the next plan starts from it and
a column, once added, is never dropped (a table never drops a column).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from strata.config import Decoding, PartitioningConfig
from strata.log import get_logger
from strata.schema.names import OWN_COLUMNS, is_own_column
from strata.store.places import Places

log = get_logger(__name__)


@dataclass(frozen=True)
class LeftOut:
    """Something of another schema version that the table does not take.

    Attributes:
        field: The field's name; None when the whole schema is left out.
        why: A phrase saying why: after "field F, " for a field, after "the schema "
            for the whole schema.
    """

    field: str | None
    why: str


def table_schema(places: Places, decoding: Decoding) -> str:
    """The schema the table has evolved to, as the text to read with.

    The caller reads with it: `cfg.with_schema_text(text)`.

    Args:
        places: The pipeline's (or routed table's) places; its ledger records the
            schema each batch was read with.
        decoding: How its messages are decoded (`PipelineConfig.decoding`): the schema
            read with now, the partitioning, and whether the table follows its
            registry (`schema_registry.evolve`).

    Returns:
        `schema_file`'s fields and those the table took on since (as the ledger recorded
        them with the newest batch); or the schema read with now, as it is, when the
        table does not follow its registry or reads with an evolved schema already.
    """
    spec = decoding.schemas
    if not decoding.registry.evolve or not decoding.reads_schema_file:
        # Not following the registry, or reading with an evolved schema already (a
        # plan's, or this function's): the ledger is not read again.
        return spec.text
    from strata.store.ledger import committed_reader_schema

    recorded = committed_reader_schema(places)
    base = _document(spec.text)
    if recorded is None or base is None:
        # Nothing recorded yet; or `schema_file` is no record, which the schema check
        # reports with the file's name.
        return spec.text
    batch, schema = recorded
    merged, left_out = merged_fields(base, schema, _partition_column(spec.partitioning))
    for item in left_out:
        if item.field is None:
            log.warning(
                "the schema recorded with batch %d %s; the table takes none of its fields",
                batch,
                item.why,
            )
        else:
            log.warning(
                "the schema recorded with batch %d has field %r, %s; the table does not take it",
                batch,
                item.field,
                item.why,
            )
    return spec.text if merged == base else json.dumps(merged)


def evolved(decoding: Decoding, topics: Iterable[str]) -> str:
    """The table's schema with the optional fields its topics' newest registered schemas add.

    The caller reads with it: `cfg.with_schema_text(text)`.

    Args:
        decoding: How the pipeline's messages are decoded, reading with the table's
            current schema (`table_schema`); its `registry` holds the subjects.
        topics: The topics the batch reads.

    Returns:
        The evolved schema's text (the current one when nothing was added).

    Raises:
        SchemaRegistryUnavailable: If the registry cannot be reached; nothing is planned.
    """
    from strata.schema.registry import latest_schema

    spec, registry = decoding.schemas, decoding.registry
    base = _document(spec.text)
    if base is None:
        return spec.text
    column = _partition_column(spec.partitioning)
    schema = base
    for topic in sorted(set(topics)):
        subject = registry.subject.replace("{topic}", topic)
        text = latest_schema(registry, subject)
        if text is None:
            log.warning(
                "subject %r holds no Avro schema; the table follows none for %s", subject, topic
            )
            continue
        latest = _json(text)
        if isinstance(latest, LeftOut):
            left_out = [latest]
        else:
            known = len(schema["fields"])
            schema, left_out = merged_fields(schema, latest, column)
            schema, refused = _held(decoding, schema, known)
            left_out += refused
        for item in left_out:
            if item.field is None:
                log.warning(
                    "subject %r: its newest schema %s; the table takes none of its new "
                    "fields this time",
                    subject,
                    item.why,
                )
            else:
                log.warning(
                    "subject %r adds field %r, %s; the table does not take it",
                    subject,
                    item.field,
                    item.why,
                )
    return spec.text if schema == base else json.dumps(schema)


def merged_fields(
    base: dict[str, Any],
    other: Any,  # noqa: ANN401 - any JSON, checked here
    partition_column: str | None = None,
) -> tuple[dict[str, Any], list[LeftOut]]:
    """`base` with the optional top-level fields of `other` that it lacks, appended in order.

    Args:
        base: The table's Avro record schema.
        other: Another version of it (a registered one, or one recorded earlier), as
            parsed from JSON: anything at all, checked here.
        partition_column: The field partition's column, if the pipeline has one: a
            field of that name (in any case) is left out.

    Returns:
        The merged schema, and what of `other` was left out: the fields it adds that
        are not optional, cannot be read on their own (a type named elsewhere in
        `other`), carry a name the table keeps for its own columns or differ only in
        case from a field the table has; or, when `other` (or `base`) is not a record
        schema, the whole of it, with `base` unchanged.
    """
    from fastavro import parse_schema

    problem = _malformed(base)
    if problem is not None:
        return base, [LeftOut(None, f"cannot be merged into the table's schema, which {problem}")]
    problem = _malformed(other)
    if problem is not None:
        return base, [LeftOut(None, problem)]
    fields = list(base["fields"])
    # By name without case, as Hive, Trino and Delta tell columns apart.
    have = {f["name"].lower(): f["name"] for f in fields}
    left_out = []
    for field in other["fields"]:
        name = field["name"]
        if have.get(name.lower()) == name:
            continue
        if is_own_column(name) or name.lower() == partition_column:
            own = OWN_COLUMNS + (f", {partition_column!r}" if partition_column else "")
            left_out.append(
                LeftOut(
                    name,
                    f"whose name is one Strata keeps for its own columns ({own}); rename it "
                    "in the subject's schema to have it added",
                )
            )
            continue
        if name.lower() in have:
            left_out.append(
                LeftOut(
                    name,
                    f"whose name differs only in case from the table's field "
                    f"`{have[name.lower()]}`, and Hive, Trino and Delta, which compare column "
                    "names without case, would take them for one; rename it in the subject's "
                    "schema to have it added",
                )
            )
            continue
        if not _optional(field):
            left_out.append(
                LeftOut(
                    name,
                    'which is not optional (declare it ["null", ...] with "default": null to '
                    "have it added)",
                )
            )
            continue
        try:
            parse_schema({**base, "fields": [*fields, field]}, _write_hint=False)
        except Exception as exc:  # noqa: BLE001 - any parse failure means the field cannot stand alone
            # Most often a type named elsewhere in `other`, which the table does not have.
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            left_out.append(LeftOut(name, f"which does not parse in the table's schema ({detail})"))
            continue
        fields.append(field)
        have[name.lower()] = name
    return {**base, "fields": fields}, left_out


def _held(
    decoding: Decoding, schema: dict[str, Any], known: int
) -> tuple[dict[str, Any], list[LeftOut]]:
    """`schema` without the added fields the table's schema check would refuse.

    The check a plan makes (`DecodeRules.of`) also depends on the pipeline:
    its formats, its field partition. A field it refuses would be refused again on every
    plan, so it is tried here, one added field at a time, and left out.

    Args:
        decoding: How the pipeline's messages are decoded.
        schema: The merged schema.
        known: How many of its fields the table had before this merge.
    """
    from strata.batch.decode import DecodeRules

    fields = list(schema["fields"][:known])
    refused = []
    for field in schema["fields"][known:]:
        candidate = {**schema, "fields": [*fields, field]}
        try:
            text = json.dumps(candidate)
            DecodeRules.of_decoding(decoding.reading(text))
        except Exception as exc:  # noqa: BLE001 - whatever the check refuses it with, the plan would too
            detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            refused.append(LeftOut(field["name"], f"which the table cannot hold ({detail})"))
            continue
        fields.append(field)
    return {**schema, "fields": fields}, refused


def _json(text: str) -> Any:  # noqa: ANN401 - any JSON
    """A schema's text parsed, or what keeps it from being JSON (whole schema left out)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        return LeftOut(None, f"is not JSON ({detail})")


def _document(text: str) -> dict[str, Any] | None:
    """A schema's JSON, if it is a record schema the merge can work on."""
    document = _json(text)
    return document if _malformed(document) is None else None


# JSON's names for what Python's `json` reads.
_JSON_KINDS: dict[type, str] = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
}


def _malformed(schema: Any) -> str | None:  # noqa: ANN401 - any JSON
    """What keeps a schema from being a record whose fields can be merged, or None."""
    if not isinstance(schema, dict):
        kind = "null" if schema is None else _JSON_KINDS.get(type(schema), type(schema).__name__)
        return f"is not an Avro record but a JSON {kind}"
    declared = schema.get("type")
    if declared != "record":
        return f"is not an Avro record (its type is {str(declared)[:60]!r})"
    fields = schema.get("fields")
    if not isinstance(fields, list):
        return "has no list of fields"
    for i, field in enumerate(fields):
        if not isinstance(field, dict):
            return f"has a field entry that is not an object (fields[{i}])"
        if not isinstance(field.get("name"), str):
            return f"has a field entry without a string name (fields[{i}])"
    return None


def _partition_column(partitioning: PartitioningConfig) -> str | None:
    field = partitioning.field
    return None if field is None else field.column


def _optional(field: dict[str, Any]) -> bool:
    """Whether a field is `["null", ...]` with default null: old rows read it as null."""
    kind = field.get("type")
    return (
        isinstance(kind, list) and bool(kind) and kind[0] == "null" and "default" in field
    ) and field["default"] is None
