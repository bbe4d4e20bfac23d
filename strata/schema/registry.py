"""Writer schemas from a Confluent Schema Registry, for Avro in Confluent wire format.

A `confluent_avro` message names the schema it was written with by the 4-byte id in
its header. With `schema_registry` configured, that writer schema is fetched by id and
the message is read with it, resolved into the table's schema (`schema_file`) by
Avro's resolution rules: a field the writer added is dropped, a field the reader added
takes its default. So a producer's compatible schema change lands, typed as the table.

What the registry says about a schema decides the fate of every message written with
it, the same way on every run of a given registry state, and sends the message to
quarantine with the id and the reason:

- an id the registry does not know (error 40403), or a schema reference to a subject
  or version it does not know (40401, 40402, 40403);
- a schema or reference the registry calls invalid (42201, 42202), a schema that is
  not Avro (JSON Schema, Protobuf) or not valid Avro;
- references that form a cycle, nest deeper than `MAX_REFERENCE_DEPTH` (32) levels,
  name more than `MAX_REFERENCES` (1,000) schemas, or whose texts, with the schema's
  own, pass `MAX_SCHEMA_TEXT` (4 MiB of JSON); references are followed one at a time,
  never by recursion, and a schema two others reference (a diamond) is no cycle;
- a field whose logical type differs between writer and reader (a `timestamp-millis`
  read as `timestamp-micros` would be off by a thousand).

A registry that cannot be reached, times out, answers 5xx, refuses the credentials
(401, 403) or answers anything else raises `SchemaRegistryUnavailable` instead: that
depends on the moment, not on the message, so the Spark task fails and is retried,
and the batch fails with that error. Answers are told apart by the registry's error
code, never by its message.

A process keeps its answers, so it asks about an id once and parses its schema once,
whatever the number of tasks it runs (Spark reuses its Python workers). They are
bounded by `MAX_CACHE_BYTES` (128 MiB), estimated from each schema's text, the least
recently used given back first. A "not found" answer is asked again after
`NOT_FOUND_RETRY_S` (60 s), since a registry follower that lags its leader may not know
a schema yet; the other answers about a schema hold for the life of the process.

A task keeps what each id it met reads with, within the same bound. Bytes that merely
begin with the wire format's magic byte carry a random id each, so a task asks about at
most `MAX_UNKNOWN_IDS` (100) ids the registry does not know, and `MAX_TASK_SCHEMA_IDS`
(10,000) in all; past either, a message of an id new to the task is quarantined unasked,
saying so. That follows from the task's messages in order: a re-run decides the same.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from strata.config import SchemaRegistryConfig
from strata.config.secrets import redact
from strata.errors import SchemaRegistryUnavailable
from strata.schema.avro import non_null, without_logical_types

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient

# References followed from a schema, at most this deep (the schema itself is level 0).
MAX_REFERENCE_DEPTH = 32
# Distinct schemas a schema may reference, directly or not: each costs a request.
MAX_REFERENCES = 1_000
# Characters of JSON in a schema and all the schemas it references, together.
MAX_SCHEMA_TEXT = 4 * 2**20
# Estimated bytes of the answers a process keeps about schema ids.
MAX_CACHE_BYTES = 128 * 2**20
# Seconds after which an id or reference the registry did not know is asked again.
NOT_FOUND_RETRY_S = 60.0
# Distinct schema ids the registry does not know that one task asks about: a topic
# flooded with random ids would otherwise cost a request per message.
MAX_UNKNOWN_IDS = 100
# Distinct schema ids one task asks about in all, whatever the registry answers.
MAX_TASK_SCHEMA_IDS = 10_000

# What the registry's error codes say about the schema asked for; any other code (a
# wrong url path's 404, a proxy's page, 401, 5xx) is no statement about it.
_NOT_FOUND = {40401: "subject not found", 40402: "version not found", 40403: "schema not found"}
_INVALID = {42201: "invalid schema", 42202: "invalid version"}
_SCHEMA_NOT_FOUND = 40403
# Requests retried by the client on a connection failure or a 5xx before giving up:
# the task fails after that, and Spark retries it.
_RETRIES = 2
# A parsed schema takes about 15 bytes of Python objects per character of its JSON
# (measured with fastavro), plus the copy without logical types kept to compare.
_BYTES_PER_CHAR = 16
_ENTRY_BYTES = 1024

# The clock the "not found" answers expire by; monotonic, so a wall-clock step does not
# keep or drop them.
_now: Callable[[], float] = time.monotonic

_lock = threading.Lock()
_clients: dict[tuple[Any, ...], SchemaRegistryClient] = {}


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


@dataclass(frozen=True)
class _Answer:
    """What the registry said about a schema id, as a process keeps it.

    Attributes:
        outcome: The parsed writer schema, or why its messages are quarantined.
        size: Estimated bytes held.
        until: When (by `_now`) to ask again; None to keep it for the process's life.
        unknown: The registry does not know the id itself (40403 for it).
    """

    outcome: _Fetched | str
    size: int
    until: float | None = None
    unknown: bool = False


class _Answers:
    """The process's answers by (registry url, schema id), bounded in estimated bytes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: OrderedDict[tuple[str, int], _Answer] = OrderedDict()
        self.size = 0

    def get(self, key: tuple[str, int]) -> _Answer | None:
        """The answer kept for an id, or None if there is none or it is to be asked again."""
        with self._lock:
            answer = self._held.get(key)
            if answer is None:
                return None
            if answer.until is not None and _now() >= answer.until:
                self._drop(key)
                return None
            self._held.move_to_end(key)
            return answer

    def put(self, key: tuple[str, int], answer: _Answer) -> None:
        """Keep an answer; the least recently used go while the bound is passed."""
        with self._lock:
            self._drop(key)
            self._held[key] = answer
            self.size += answer.size
            while self.size > MAX_CACHE_BYTES and len(self._held) > 1:
                self._drop(next(iter(self._held)))

    def __contains__(self, key: tuple[str, int]) -> bool:
        with self._lock:
            return key in self._held

    def clear(self) -> None:
        """Forget every answer."""
        with self._lock:
            self._held.clear()
            self.size = 0

    def _drop(self, key: tuple[str, int]) -> None:
        answer = self._held.pop(key, None)
        if answer is not None:
            self.size -= answer.size


_answers = _Answers()


class WriterSchemas:
    """What each schema id of a pipeline's messages is read with, or why it is quarantined.

    One per task; the parsed schemas behind it are shared by the whole process. Its
    bounds are the module's (`MAX_CACHE_BYTES`, `MAX_UNKNOWN_IDS`, `MAX_TASK_SCHEMA_IDS`).
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
        self._pinned_id = pinned_id
        self._pinned = WriterSchema(parsed_reader, None)
        # What the ids the registry knows read with, and the bytes each answer holds.
        self._by_id: OrderedDict[int, tuple[WriterSchema | str, int]] = OrderedDict()
        self._size = 0
        self._unknown: dict[int, str] = {}  # the ids it does not know: their reasons
        # Every id asked about: one given back from `_by_id` is looked up again, never
        # taken for an id new to the task.
        self._met: set[int] = set()

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
        if schema_id == self._pinned_id:
            return self._pinned
        unknown = self._unknown.get(schema_id)
        if unknown is not None:
            return unknown
        held = self._by_id.get(schema_id)
        if held is not None:
            self._by_id.move_to_end(schema_id)
            return held[0]
        if schema_id not in self._met:
            bound = self._bound_reached()
            if bound is not None:
                return _shown(self._registry, f"written with schema id {schema_id}, {bound}")
            self._met.add(schema_id)
        answer = _fetch(self._registry, schema_id)
        if answer.unknown:
            assert isinstance(answer.outcome, str)
            self._unknown[schema_id] = answer.outcome
            return answer.outcome
        resolved = self._resolve(schema_id, answer.outcome)
        self._keep(schema_id, resolved, answer.size)
        return resolved

    def _bound_reached(self) -> str | None:
        """Why the task asks about no new id, or None while it may."""
        unasked = f"not asked of the Schema Registry at {self.url}: this task met"
        if len(self._unknown) >= MAX_UNKNOWN_IDS:
            return (
                f"{unasked} {len(self._unknown)} schema ids the registry does not know, "
                f"and asks about at most {MAX_UNKNOWN_IDS}"
            )
        if len(self._met) >= MAX_TASK_SCHEMA_IDS:
            return f"{unasked} {len(self._met):,} schema ids, and asks about no more"
        return None

    def _keep(self, schema_id: int, resolved: WriterSchema | str, size: int) -> None:
        """Keep what an id reads with; the least recently used go while the bound is passed."""
        self._by_id[schema_id] = (resolved, size)
        self._size += size
        while self._size > MAX_CACHE_BYTES and len(self._by_id) > 1:
            _, (_, dropped) = self._by_id.popitem(last=False)
            self._size -= dropped

    def _resolve(self, schema_id: int, fetched: _Fetched | str) -> WriterSchema | str:
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


def _fetch(registry: SchemaRegistryConfig, schema_id: int) -> _Answer:
    """What the registry says about an id, asked and parsed once per process."""
    assert registry.url is not None
    key = (registry.url, schema_id)
    known = _answers.get(key)
    if known is not None:
        return known
    client = _client(registry)
    try:
        answer = _ask(client, registry, schema_id)
    finally:
        _forget(client)
    _answers.put(key, answer)
    return answer


def _ask(client: SchemaRegistryClient, registry: SchemaRegistryConfig, schema_id: int) -> _Answer:
    """What the registry says about a schema id and the schemas it references."""
    try:
        schema = client.get_schema(schema_id)
    except Exception as exc:  # noqa: BLE001 - sorted by `_answered`: the schema's fault, or the moment's
        return _answered(registry, schema_id, exc, None)
    kind = (schema.schema_type or "AVRO").upper()
    if kind != "AVRO":
        return _quarantined(
            registry,
            f"written with schema id {schema_id}, a {kind} schema; Strata decodes Avro only",
        )
    root = _text(registry, schema_id, schema)
    if len(root) > MAX_SCHEMA_TEXT:
        return _quarantined(registry, _too_large(schema_id, None))
    referenced = _referenced(client, registry, schema_id, schema, len(root))
    if isinstance(referenced, _Answer):
        return referenced
    return _parse(registry, schema_id, referenced, root)


def _referenced(
    client: SchemaRegistryClient,
    registry: SchemaRegistryConfig,
    schema_id: int,
    schema: Schema,
    size: int,
) -> list[tuple[tuple[str, int], str]] | _Answer:
    """The schemas a schema references, each after those it references.

    Walked depth first with a stack of its own, so a chain as deep as the registry holds
    costs no recursion: it ends at `MAX_REFERENCE_DEPTH`. A reference back to a schema
    on the way there is a cycle; one to a schema already read (a diamond) is skipped.

    Args:
        client: The registry's client.
        registry: The registry settings, for reasons.
        schema_id: The id asked about, for reasons.
        schema: The schema registered under it.
        size: The characters of its own text, counted against `MAX_SCHEMA_TEXT`.

    Returns:
        Each referenced (subject, version) with its text, in the order to parse them;
        or the answer that quarantines the id.

    Raises:
        SchemaRegistryUnavailable: If a reference could not be fetched for the moment.
    """
    texts: list[tuple[tuple[str, int], str]] = []
    read: set[tuple[str, int]] = set()
    # The references being followed, outermost first, with their texts, and per level
    # (the schema itself first) the references it has left to follow.
    path: list[tuple[str, int]] = []
    held: list[str] = []
    pending: list[Iterator[SchemaReference]] = [iter(schema.references or [])]
    while pending:
        ref = next(pending[-1], None)
        if ref is None:
            pending.pop()
            if path:
                read.add(path[-1])
                texts.append((path.pop(), held.pop()))
            continue
        version = ref.version
        if not isinstance(ref.subject, str) or type(version) is not int:
            return _quarantined(
                registry,
                f"written with schema id {schema_id}, which has a reference without a subject "
                f"and version ({_shorter(str(ref.name))!r})",
            )
        at = (ref.subject, version)
        if at in path:
            cycle = " -> ".join(_version(*p) for p in [*path[path.index(at) :], at])
            return _quarantined(
                registry,
                f"written with schema id {schema_id}, whose references form a cycle: {cycle}",
            )
        if at in read:
            continue
        if len(path) >= MAX_REFERENCE_DEPTH:
            return _quarantined(
                registry,
                f"written with schema id {schema_id}, whose references nest deeper than "
                f"{MAX_REFERENCE_DEPTH} levels ({_version(*at)} is at level {len(path) + 1}); "
                f"Strata follows at most {MAX_REFERENCE_DEPTH}",
            )
        if len(read) + len(path) >= MAX_REFERENCES:
            return _quarantined(
                registry,
                f"written with schema id {schema_id}, which references more than "
                f"{MAX_REFERENCES} schemas; Strata follows at most {MAX_REFERENCES}",
            )
        try:
            registered = client.get_version(*at)
        except Exception as exc:  # noqa: BLE001 - sorted by `_answered`, as for the id
            return _answered(registry, schema_id, exc, at)
        kind = (registered.schema.schema_type or "AVRO").upper()
        if kind != "AVRO":
            return _quarantined(
                registry,
                f"written with schema id {schema_id}, which references {_version(*at)}, a "
                f"{kind} schema; Strata decodes Avro only",
            )
        text = _text(registry, schema_id, registered.schema)
        size += len(text)
        if size > MAX_SCHEMA_TEXT:
            return _quarantined(registry, _too_large(schema_id, at))
        path.append(at)
        held.append(text)
        pending.append(iter(registered.schema.references or []))
    return texts


def _answered(
    registry: SchemaRegistryConfig,
    schema_id: int,
    exc: Exception,
    reference: tuple[str, int] | None,
) -> _Answer:
    """The answer an error of the registry gives about a schema, or raise if it gives none.

    Args:
        registry: The registry settings.
        schema_id: The id asked about.
        exc: What the client raised.
        reference: The (subject, version) asked for, or None for the id itself.

    Raises:
        SchemaRegistryUnavailable: For anything but the error codes that speak of the
            schema: the registry was unreachable, slow, refused, or answered otherwise.
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    code = exc.error_code if isinstance(exc, SchemaRegistryError) else None
    meaning = (_NOT_FOUND.get(code) or _INVALID.get(code)) if isinstance(code, int) else None
    if meaning is None:
        raise SchemaRegistryUnavailable(_unavailable(registry, schema_id, exc)) from None
    where = f"the Schema Registry at {registry.url}"
    if reference is None and code == _SCHEMA_NOT_FOUND:
        reason = f"written with schema id {schema_id}, which {where} does not know"
    elif reference is None:
        reason = f"written with schema id {schema_id}; {where} answers {code} ({meaning})"
    else:
        reason = (
            f"written with schema id {schema_id}, which references {_version(*reference)}; "
            f"{where} answers {code} ({meaning})"
        )
    if code in _NOT_FOUND:
        unknown = reference is None and code == _SCHEMA_NOT_FOUND
        return _quarantined(registry, reason, until=_now() + NOT_FOUND_RETRY_S, unknown=unknown)
    return _quarantined(registry, reason)


def _quarantined(
    registry: SchemaRegistryConfig,
    reason: str,
    until: float | None = None,
    *,
    unknown: bool = False,
) -> _Answer:
    """An answer that quarantines an id's messages, on one line and without secrets."""
    reason = _shown(registry, reason)
    return _Answer(reason, _ENTRY_BYTES + len(reason), until, unknown)


def _version(subject: str, version: int) -> str:
    return f"version {version} of subject {_shorter(subject)!r}"


def _shorter(text: str) -> str:
    """A name from the registry, cut short enough for a reason."""
    return text if len(text) <= 200 else f"{text[:200]}..."


def _too_large(schema_id: int, at: tuple[str, int] | None) -> str:
    where = "" if at is None else f" (passed at {_version(*at)})"
    return (
        f"written with schema id {schema_id}, whose schema and the schemas it references "
        f"hold more than {MAX_SCHEMA_TEXT:,} characters of text{where}; Strata reads at "
        f"most {MAX_SCHEMA_TEXT:,}"
    )


def _text(registry: SchemaRegistryConfig, schema_id: int, schema: Schema) -> str:
    """A schema's text; the registry always sends one, so an answer without is no answer."""
    if isinstance(schema.schema_str, str):
        return schema.schema_str
    raise SchemaRegistryUnavailable(
        _shown(
            registry,
            f"the Schema Registry at {registry.url} answered without a schema text for schema "
            f"id {schema_id}; no message was quarantined for it. Check that schema_registry.url "
            "is the registry's, then re-run the batch",
        )
    )


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


def _parse(
    registry: SchemaRegistryConfig,
    schema_id: int,
    referenced: list[tuple[tuple[str, int], str]],
    text: str,
) -> _Answer:
    """A registered schema parsed for reading, or the answer that quarantines its id."""
    from fastavro import parse_schema

    named: dict[str, Any] = {}
    whose = "whose schema"
    try:
        for at, each in referenced:
            whose = f"which references {_version(*at)}, whose schema"
            parse_schema(without_logical_types(json.loads(each)), named)
        whose = "whose schema"
        document = json.loads(text)
        fetched = _Fetched(
            parse_schema(without_logical_types(document), named),
            without_logical_types(document),
            _logical_types(document),
        )
    except Exception as exc:  # noqa: BLE001 - any failure to read it is the schema's fault
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:240]
        return _quarantined(
            registry, f"written with schema id {schema_id}, {whose} is not valid Avro ({detail})"
        )
    chars = len(text) + sum(len(each) for _, each in referenced)
    return _Answer(fetched, _ENTRY_BYTES + _BYTES_PER_CHAR * chars)


def latest_schema(registry: SchemaRegistryConfig, subject: str) -> str | None:
    """The text of the newest Avro schema registered under a subject, if it has one.

    Args:
        registry: The registry settings (`url` set).
        subject: The subject, e.g. `clicks-value`.

    Returns:
        The schema's text, as registered (whether it is a record the table can follow
        is the caller's to judge); None when the registry does not know the subject or
        its newest schema is not Avro.

    Raises:
        SchemaRegistryUnavailable: If the registry cannot be reached, refuses, or
            answers anything but the schema or "not found".
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = _client(registry)
    try:
        # Not `get_latest_version`: the client keeps its answer for the life of the
        # process, and a long-lived driver (an Airflow worker) would never see a new one.
        versions = client.get_versions(subject)
        if not isinstance(versions, list):
            raise TypeError(f"the versions of a subject came as {type(versions).__name__}")
        numbers = [v for v in versions if type(v) is int]
        if not numbers:
            return None
        registered = client.get_version(subject, max(numbers))
    except SchemaRegistryError as exc:
        # The subject, or its newest version, is gone (deleted since it was listed).
        if exc.error_code in (40401, 40402):
            return None
        raise SchemaRegistryUnavailable(_unavailable_subject(registry, subject, exc)) from None
    except Exception as exc:  # noqa: BLE001 - connection failures of any client layer
        raise SchemaRegistryUnavailable(_unavailable_subject(registry, subject, exc)) from None
    finally:
        _forget(client)
    schema = registered.schema
    if (schema.schema_type or "AVRO").upper() != "AVRO":
        return None
    return schema.schema_str or ""


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


def _forget(client: SchemaRegistryClient) -> None:
    """Empty the client's own caches, so the next question reaches the registry.

    The client keeps every schema it fetched, by id and by subject and version, for the
    life of the process and without bound (negative answers it does not keep). The
    process's answers are kept here instead, bounded, and asked again when due.
    """
    client.clear_caches()  # type: ignore[no-untyped-call]


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
