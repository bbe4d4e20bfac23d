"""Writer schemas from a Confluent Schema Registry, for Avro in Confluent wire format.

A `confluent_avro` message names the schema it was written with by the 4-byte id in
its header. With `schema_registry` configured, that writer schema is fetched by id and
the message is read with it, resolved into the table's schema (`schema_file`) by
Avro's resolution rules: a field the writer added is dropped, a field the reader added
takes its default. So a producer's compatible schema change lands, typed as the table.

What the registry says about an id decides the fate of every message written with it,
the same way on every run: an id the registry does not know, a schema that is not
Avro (JSON Schema, Protobuf) or not valid, and a field whose logical type differs
between writer and reader (a `timestamp-millis` read as `timestamp-micros` would be
off by a thousand) send the message to quarantine with the reason. A registry that
cannot be reached, times out, answers 5xx or refuses the credentials raises
`SchemaRegistryUnavailable` instead: that depends on the moment, not on the message,
so the Spark task fails and is retried, and the batch fails with that error.

A process asks the registry about an id once and parses its schema once, whatever
the number of tasks it runs (Spark reuses its Python workers).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from strata.config import SchemaRegistryConfig, redact
from strata.errors import SchemaRegistryUnavailable
from strata.schema import non_null, without_logical_types

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

# The registry's error code for "schema not found" (HTTP 404); any other 404 (a wrong
# url path, a proxy's page) is no statement about the id, and is not quarantined on.
_SCHEMA_NOT_FOUND = 40403
# Requests retried by the client on a connection failure or a 5xx before giving up:
# the task fails after that, and Spark retries it.
_RETRIES = 2
# Answers about ids kept per process. Ids come from producers' bytes, so a topic of
# garbage could name millions; past this many the memory is given back and re-filled.
_MAX_KNOWN_IDS = 100_000

_lock = threading.Lock()
_clients: dict[tuple[Any, ...], SchemaRegistryClient] = {}
# (registry url, schema id) -> the writer schema, or why its messages are quarantined.
_fetched: dict[tuple[str, int], _Fetched | str] = {}


@dataclass(frozen=True)
class WriterSchema:
    """How to read the messages written with one schema id.

    Attributes:
        writer: The writer schema, parsed by fastavro, without logical types.
        reader: The table's schema to resolve into (parsed, without logical types), or
            None when the writer schema is the table's own and needs no resolution.
    """

    writer: Any
    reader: Any


@dataclass(frozen=True)
class _Fetched:
    """A writer schema as the registry holds it, parsed once per process."""

    parsed: Any
    plain: Any  # the schema without logical types, as JSON, to compare with the reader's
    logical: dict[str, tuple[Any, ...]]


class WriterSchemas:
    """What each schema id of a pipeline's messages is read with, or why it is quarantined.

    One per task; the parsed schemas behind it are shared by the whole process.
    """

    def __init__(
        self,
        registry: SchemaRegistryConfig,
        reader: dict[str, Any],
        parsed_reader: Any,  # noqa: ANN401 - a fastavro parsed schema
        reader_name: str,
        pinned_id: int | None = None,
    ) -> None:
        """Prepare the lookups; nothing is asked of the registry yet.

        Args:
            registry: The registry settings (`url` set).
            reader: The table's Avro schema, with its logical types.
            parsed_reader: The same, parsed by fastavro without logical types.
            reader_name: The schema file's name, for reasons.
            pinned_id: The id `schema_file` is registered under (`schema_id`), if
                configured: its messages are read with the table's schema without
                asking the registry.
        """
        if registry.url is None:
            raise ValueError("WriterSchemas needs schema_registry.url")
        self.url = registry.url
        self._registry = registry
        self._reader_plain = without_logical_types(reader)
        self._reader = parsed_reader
        self._reader_logical = _logical_types(reader)
        self._reader_name = reader_name
        self._by_id: dict[int, WriterSchema | str] = {}
        if pinned_id is not None:
            self._by_id[pinned_id] = WriterSchema(parsed_reader, None)

    def lookup(self, schema_id: int) -> WriterSchema | str:
        """How to read messages written with a schema id, or the reason to quarantine them.

        Args:
            schema_id: The id in a message's header.

        Returns:
            The schemas to read with, or a quarantine reason.

        Raises:
            SchemaRegistryUnavailable: If the registry cannot be reached or refuses the
                request; the outcome would depend on the moment, not on the message.
        """
        known = self._by_id.get(schema_id)
        if known is None:
            known = self._by_id[schema_id] = self._resolve(schema_id)
        return known

    def _resolve(self, schema_id: int) -> WriterSchema | str:
        fetched = _fetch(self._registry, schema_id)
        if isinstance(fetched, str):
            return fetched
        for path, writer_kind in fetched.logical.items():
            reader_kind = self._reader_logical.get(path)
            if reader_kind is not None and reader_kind != writer_kind:
                return (
                    f"written with schema id {schema_id}, whose field `{path}` is "
                    f"{_describe(writer_kind)} where {self._reader_name} has "
                    f"{_describe(reader_kind)}; its values would be misread"
                )
        if fetched.plain == self._reader_plain:
            return WriterSchema(fetched.parsed, None)
        return WriterSchema(fetched.parsed, self._reader)


def _fetch(registry: SchemaRegistryConfig, schema_id: int) -> _Fetched | str:
    """A writer schema by id, fetched and parsed once per process, or a quarantine reason."""
    assert registry.url is not None
    key = (registry.url, schema_id)
    with _lock:
        known = _fetched.get(key)
    if known is not None:
        return known
    client = _client(registry)
    try:
        schema = client.get_schema(schema_id)
        outcome = _parse(client, schema_id, schema)
    except SchemaRegistryUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - sorted below: the message's fault, or the moment's
        outcome = _not_found(registry, schema_id, exc)
    with _lock:
        if len(_fetched) >= _MAX_KNOWN_IDS:
            _fetched.clear()
        _fetched[key] = outcome
    return outcome


def _not_found(registry: SchemaRegistryConfig, schema_id: int, exc: Exception) -> str:
    """The quarantine reason for an id the registry does not know; raises for anything else."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    if isinstance(exc, SchemaRegistryError) and exc.error_code == _SCHEMA_NOT_FOUND:
        return (
            f"written with schema id {schema_id}, which the Schema Registry at {registry.url} "
            "does not know"
        )
    raise SchemaRegistryUnavailable(_unavailable(registry, schema_id, exc)) from None


def _unavailable(registry: SchemaRegistryConfig, schema_id: int, exc: Exception) -> str:
    """Why the registry gave no answer about an id, and what to do; one line, no secret."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    where = f"the Schema Registry at {registry.url}"
    if isinstance(exc, SchemaRegistryError):
        status, detail = exc.http_status_code, f"{exc.error_code}: {exc.error_message}"
        if status in (401, 403):
            text = (
                f"{where} refused the request for schema id {schema_id} (HTTP {status}, "
                f"{detail}); check schema_registry.username and schema_registry.password"
            )
        else:
            text = (
                f"{where} answered HTTP {status} ({detail}) for schema id {schema_id}; no "
                "message was quarantined for it. Check the registry and schema_registry.url, "
                "then re-run the batch"
            )
    else:
        text = (
            f"{where} could not be reached for schema id {schema_id} "
            f"({type(exc).__name__}: {exc}); no message was quarantined for it. Check that "
            "the registry is up and schema_registry.url, then re-run the batch"
        )
    return _shown(registry, text)


def _shown(registry: SchemaRegistryConfig, text: str) -> str:
    """An error's text on one line, without the registry's password (whatever its length)."""
    text = " ".join(text.split())
    if registry.password:
        text = text.replace(registry.password, "***")
    return redact(text)


def _parse(client: SchemaRegistryClient, schema_id: int, schema: Schema) -> _Fetched | str:
    """A registered schema parsed for reading, or why its messages cannot be read."""
    from fastavro import parse_schema

    kind = (schema.schema_type or "AVRO").upper()
    if kind != "AVRO":
        return f"written with schema id {schema_id}, a {kind} schema; Strata decodes Avro only"
    # The referenced schemas are fetched first: a failure there is the registry's.
    texts = [*_references(client, schema, set()), schema.schema_str or ""]
    named: dict[str, Any] = {}
    try:
        for text in texts:
            document = json.loads(text)
            parsed = parse_schema(without_logical_types(document), named)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the schema's fault
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:240]
        return f"written with schema id {schema_id}, whose schema is not valid Avro ({detail})"
    return _Fetched(parsed, without_logical_types(document), _logical_types(document))


def _references(client: SchemaRegistryClient, schema: Schema, seen: set[Any]) -> list[str]:
    """The schemas a schema refers to (Confluent schema references), those they need first."""
    texts: list[str] = []
    for ref in schema.references or []:
        if ref.subject is None or ref.version is None or (ref.subject, ref.version) in seen:
            continue
        seen.add((ref.subject, ref.version))
        registered = client.get_version(ref.subject, ref.version)
        texts += _references(client, registered.schema, seen)
        texts.append(registered.schema.schema_str or "")
    return texts


def latest_schema(registry: SchemaRegistryConfig, subject: str) -> dict[str, Any] | None:
    """The newest Avro schema registered under a subject, or None if the subject has none.

    Args:
        registry: The registry settings (`url` set).
        subject: The subject, e.g. `clicks-value`.

    Returns:
        The schema as JSON, or None when the registry does not know the subject or its
        newest schema is not Avro.

    Raises:
        SchemaRegistryUnavailable: If the registry cannot be reached or refuses.
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = _client(registry)
    try:
        # Not `get_latest_version`: the client keeps its answer for the life of the
        # process, and a long-lived driver (an Airflow worker) would never see a new one.
        # A version, once registered, never changes: that lookup may be cached.
        newest = max(client.get_versions(subject))
        registered = client.get_version(subject, newest)
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            return None
        raise SchemaRegistryUnavailable(_unavailable_subject(registry, subject, exc)) from None
    except Exception as exc:  # noqa: BLE001 - connection failures of any client layer
        raise SchemaRegistryUnavailable(_unavailable_subject(registry, subject, exc)) from None
    schema = registered.schema
    if (schema.schema_type or "AVRO").upper() != "AVRO" or not schema.schema_str:
        return None
    document = json.loads(schema.schema_str)
    return document if isinstance(document, dict) else None


def _unavailable_subject(registry: SchemaRegistryConfig, subject: str, exc: Exception) -> str:
    text = (
        f"the Schema Registry at {registry.url} gave no answer about subject {subject!r} "
        f"({type(exc).__name__}: {exc}); nothing was read. Check that the registry is up and "
        "schema_registry.url, then run again"
    )
    return _shown(registry, text)


def _client(registry: SchemaRegistryConfig) -> SchemaRegistryClient:
    """The process's client of a registry: one per settings, so its own cache is shared."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    key = (registry.url, registry.username, registry.password, registry.ca_file, registry.timeout_s)
    with _lock:
        client = _clients.get(key)
        if client is None:
            conf: dict[str, Any] = {
                "url": registry.url,
                "timeout": registry.timeout_s,
                "max.retries": _RETRIES,
            }
            if registry.username is not None:
                conf["basic.auth.user.info"] = f"{registry.username}:{registry.password}"
            if registry.ca_file is not None:
                conf["ssl.ca.location"] = registry.ca_file
            client = _clients[key] = SchemaRegistryClient(conf)
    return client


def _logical_types(avro_type: Any, path: str = "") -> dict[str, tuple[Any, ...]]:  # noqa: ANN401
    """Each field path's logical type (with a decimal's precision and scale)."""
    avro_type = non_null(avro_type)
    if not isinstance(avro_type, dict):
        return {}
    kind = avro_type.get("type")
    found: dict[str, tuple[Any, ...]] = {}
    if "logicalType" in avro_type:
        found[path] = (
            avro_type["logicalType"],
            avro_type.get("precision"),
            avro_type.get("scale", 0 if avro_type["logicalType"] == "decimal" else None),
        )
    if kind == "record":
        for f in avro_type.get("fields", []):
            found.update(
                _logical_types(f.get("type"), f"{path}.{f['name']}" if path else f["name"])
            )
    elif kind == "array":
        found.update(_logical_types(avro_type.get("items"), f"{path}[]"))
    elif kind == "map":
        found.update(_logical_types(avro_type.get("values"), f"{path}{{}}"))
    elif isinstance(kind, dict | list):
        found.update(_logical_types(kind, path))
    return found


def _describe(kind: tuple[Any, ...]) -> str:
    name, precision, scale = kind
    return f"decimal({precision}, {scale})" if name == "decimal" else str(name)
