"""Avro messages (plain, or in Confluent's wire format) read against the table's schema.

fastavro reads each message with the topic's schema without its logical types, which
the decoder applies itself; with a Schema Registry, a message is read with the writer
schema its id names, resolved into the table's.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa

from strata.batch._rules import DecodeRules, quote_reason
from strata.schema.registry import WriterSchema


def parse_avro(
    values: list[Any], candidates: list[int], rules: DecodeRules, reasons: list[str | None]
) -> tuple[pa.Table, list[int]]:
    """Read Avro values one by one; those that do not read as the schema get a reason.

    Args:
        values: The chunk's values.
        candidates: Positions of the values to read, in order.
        rules: The pipeline's decode rules.
        reasons: Each value's quarantine reason, filled in place.

    Returns:
        The records read, in the wire schema, and the positions they came from.
    """
    from fastavro import schemaless_reader
    from fastavro.read import SchemaResolutionError

    records: list[dict[str, Any]] = []
    good: list[int] = []
    confluent = rules.format == "confluent_avro"
    # With a registry, what each schema id of the chunk reads with is settled before
    # the loop, one lookup per id: a registry that cannot be reached fails the chunk
    # before any message is decided, and the loop does no more than a dict lookup.
    by_id: dict[int, WriterSchema | str] = {}
    if confluent and rules.writer_schemas is not None:
        for written in sorted(_schema_ids(values, candidates)):
            by_id[written] = rules.writer_schemas.lookup(written)
    for i in candidates:
        payload = values[i]
        writer, reader = rules.avro_reader, None
        written = -1
        if confluent:
            if len(payload) < 5 or payload[0] != 0:
                reasons[i] = "not in Confluent wire format (expected magic byte 0 and a schema id)"
                continue
            written = int.from_bytes(payload[1:5], "big")
            if rules.writer_schemas is not None:
                how = by_id[written]
                if isinstance(how, str):
                    reasons[i] = how
                    continue
                writer, reader = how.writer, how.reader
            elif written != rules.schema_id:
                reasons[i] = (
                    f"written with schema id {written}, not the configured schema_id "
                    f"{rules.schema_id}; decoding it with another schema would misread its "
                    "fields (if the topic's schema changed, update schema_file and schema_id, "
                    "then replay)"
                )
                continue
            payload = payload[5:]
        try:
            buf = io.BytesIO(payload)
            record = schemaless_reader(buf, writer, reader)
            if buf.tell() != len(payload):
                raise ValueError(f"{len(payload) - buf.tell()} trailing bytes after the record")
        except UnicodeDecodeError as exc:
            reasons[i] = (
                f"not valid Avro for the schema: a string is not UTF-8 text (byte {exc.start} "
                "of the string)"
            )
            continue
        except SchemaResolutionError as exc:
            # Only a writer schema from the registry is resolved into the table's.
            reasons[i] = quote_reason(
                f"written with schema id {written}, which cannot be read as "
                f"{rules.schema_file}: {exc}"
            )
            continue
        except Exception as exc:  # noqa: BLE001 - any decoder failure is the message's fault
            reasons[i] = quote_reason(f"not valid Avro for the schema: {type(exc).__name__}: {exc}")
            continue
        if not isinstance(record, dict):
            reasons[i] = "not valid Avro for the schema: not a record"
            continue
        records.append(record)
        good.append(i)
    return _records_table(records, good, rules.wire_schema, reasons)


def _schema_ids(values: list[Any], candidates: list[int]) -> set[int]:
    """The schema ids in the Confluent headers of the candidate messages."""
    return {
        int.from_bytes(values[i][1:5], "big")
        for i in candidates
        if len(values[i]) >= 5 and values[i][0] == 0
    }


def _records_table(
    records: list[dict[str, Any]], idx: list[int], schema: pa.Schema, reasons: list[str | None]
) -> tuple[pa.Table, list[int]]:
    """Decoded records as a table; a record Arrow refuses is isolated by bisection."""
    if not records:
        return schema.empty_table(), []
    try:
        return pa.Table.from_pylist(records, schema=schema), idx
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
        if len(records) == 1:
            reasons[idx[0]] = quote_reason(f"not valid Avro for the schema: {exc}")
            return schema.empty_table(), []
    mid = len(records) // 2
    first, first_idx = _records_table(records[:mid], idx[:mid], schema, reasons)
    second, second_idx = _records_table(records[mid:], idx[mid:], schema, reasons)
    return pa.concat_tables([first, second]), first_idx + second_idx
