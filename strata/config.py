"""Pipeline configuration: one YAML file per pipeline, validated by one typed model.

`conf/strata.yaml` holds defaults shared by every pipeline (warehouse root, Kafka
client, storage options); `conf/pipelines/NAME.yaml` holds one pipeline and may
override any of them. `conf/local/*.yaml` (git-ignored) is merged last, for local
overrides and secrets. String values may reference environment variables as
`${NAME}` so secrets never live in committed files.

Two environment variables override the config, so the same files run locally and in
production: `STRATA_KAFKA_BOOTSTRAP` (the broker list) and `STRATA_WAREHOUSE` (the
warehouse root that relative table locations hang from).

Secrets are never printed: the models' reprs and `ConfigError` texts go through the
one rule of `strata.redaction`, and every secret a loaded file holds is remembered
there, so that `redact` removes it from any text.
"""

from __future__ import annotations

import ast
import functools
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from strata.durations import parse_duration_ms
from strata.errors import ConfigError
from strata.namespace import NAME_SUFFIXES, ROLES, Namespace, OwnedTable, owned_tables
from strata.redaction import masked, redact, remember_secrets

TableName = Literal["table", "raw", "quarantine"]
"""The tables a batch writes: the data, the raw copy of every message, the quarantine."""
MetastoreTable = Literal["table", "raw", "quarantine", "ledger"]
"""The tables registered in the metastore: a batch's three, and the ledger."""
Location = Literal["table", "raw", "quarantine", "ledger", "state", "quality"]
"""Everything of a pipeline's that has a place in the warehouse."""

ENV_BOOTSTRAP = "STRATA_KAFKA_BOOTSTRAP"
ENV_WAREHOUSE = "STRATA_WAREHOUSE"
ENV_METASTORE = "STRATA_METASTORE_URI"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


def _valid_duration(value: str) -> str:
    parse_duration_ms(value)
    return value


# A duration written with its unit ("90s", "1h", "7d"), checked when the config loads.
Duration = Annotated[str, AfterValidator(_valid_duration)]


def _valid_zone(value: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {value!r}; use an IANA name such as 'UTC'") from exc
    return value


# An IANA time zone name ("UTC", "Europe/Berlin"), checked when the config loads.
Zone = Annotated[str, AfterValidator(_valid_zone)]


def service_url(value: str, service: str, credentials: str, example: str, path: bool = True) -> str:
    """An http(s) URL of a service the configuration names, checked when it loads.

    The value is never quoted back: a URL can carry a secret in many places (a user
    and password, a bare token before `@`, a query string), and the error goes to the
    terminal and into Airflow's import errors.

    Args:
        value: The URL.
        service: The service, as the error names it.
        credentials: The keys where credentials go instead.
        example: URLs the error suggests.
        path: Whether a path may follow the port.

    Returns:
        The URL without a trailing slash.

    Raises:
        ValueError: If it holds credentials, or is not `http(s)://host[:port]`.
    """
    if re.match(r"^https?://[^\s/]*@", value):
        raise ValueError(
            f"the {service} url holds credentials (before '@'); put them in {credentials} "
            "instead, so that they are never printed"
        )
    tail = r"(/[^\s?#@]*)?$" if path else r"/?$"
    if not re.match(r"^https?://[A-Za-z0-9.-]+(:\d+)?" + tail, value):
        raise ValueError(
            f"the {service} url is not http(s)://host[:port]{'[/path]' if path else ''} "
            f"(with no query string); write {example}"
        )
    return value.rstrip("/")


def _basic_auth(section: str, username: str | None, password: str | None) -> None:
    """Basic auth takes a user and a password, or neither.

    Raises:
        ValueError: Naming the key that is set and the one missing.
    """
    if (username is None) != (password is None):
        given, missing = ("username", "password") if password is None else ("password", "username")
        raise ValueError(
            f"{section}.{given} is set without {section}.{missing}; basic auth needs both "
            "(or remove both)"
        )


def _loopback(url: str) -> bool:
    """Whether a URL's host is this machine (127.0.0.0/8, ::1, `localhost`)."""
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _credentials_over_http(
    section: str, key: str, url: str | None, signed: bool, allow_loopback: bool
) -> None:
    """Credentials cross the network only encrypted: over https, or to this machine if allowed.

    Raises:
        ValueError: Naming the keys and both ways out.
    """
    if not signed or url is None or not url.startswith("http:"):
        return
    if allow_loopback and _loopback(url):
        return
    local = (
        f"{section}.allow_http_on_loopback applies only to a {key} on this machine "
        "(127.0.0.1, ::1 or localhost)"
        if allow_loopback
        else f"for a {key} on this machine (127.0.0.1, ::1 or localhost) set "
        f"{section}.allow_http_on_loopback: true"
    )
    raise ValueError(
        f"{section}.username and {section}.password would cross the network readable over a "
        f"plain http:// {key}; use https://, or {local}"
    )


def _pem_file(value: str | None, whose: str) -> str | None:
    """A `ca_file` setting: the PEM file of a service's certificate authority, if set.

    Raises:
        ValueError: If it names no file.
    """
    if value is not None and not Path(value).is_file():
        raise ValueError(
            f"{value!r} is not a file; point ca_file at the PEM file of {whose} certificate "
            "authority, or remove it"
        )
    return value


class _Strict(BaseModel):
    # pydantic's error text quotes the offending input (`input_value=...`), which may be
    # a secret, or a mapping holding some: errors name the key and the rule, never the value.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # pydantic builds repr(), str() and rich/devtools output from these pairs.
        for name, value in super().__repr_args__():
            yield name, masked(name, value)


class KafkaConfig(_Strict):
    """How to reach the brokers.

    Attributes:
        bootstrap_servers: Broker list; `STRATA_KAFKA_BOOTSTRAP` overrides it.
        properties: librdkafka properties passed through unchanged (SASL, SSL, ...).
        group_id: Consumer group the committed end offsets are published to, for lag tools.
        timeout_s: Bound on every metadata or watermark request, so a dead broker fails fast.
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    properties: dict[str, str | int | float | bool] = Field(default_factory=dict)
    group_id: str | None = None
    timeout_s: float = Field(default=15.0, gt=0)


class EventTimeConfig(_Strict):
    """Where the event time is, how to read it, and which values are believable.

    Attributes:
        field: Top-level field of the record that holds the event time.
        unit: `s`, `ms`, `us` or `ns` for epoch numbers; `iso8601` for strings.
        timezone: Zone of ISO strings that carry no offset. The partitions' zone is
            `partitioning.timezone`.
        max_future_skew: How far an event time may lie ahead of its Kafka timestamp.
        late_after: An event whose Kafka timestamp trails it by more than this is late.
        max_lateness: An event whose Kafka timestamp trails it by more than this is
            quarantined instead of landing in an old hour; None lands every late event.
        min_valid: Event times before this date are quarantined (epoch zero, unset clocks).
    """

    field: str
    unit: Literal["s", "ms", "us", "ns", "iso8601"] = "ms"
    timezone: Zone = "UTC"
    max_future_skew: Duration = "1h"
    late_after: Duration = "1h"
    max_lateness: Duration | None = "7d"
    min_valid: str = "2000-01-01"

    @property
    def max_future_skew_ms(self) -> int:
        """The allowed skew in milliseconds."""
        return parse_duration_ms(self.max_future_skew)

    @property
    def late_after_ms(self) -> int:
        """The lateness threshold in milliseconds."""
        return parse_duration_ms(self.late_after)

    @property
    def max_lateness_ms(self) -> int | None:
        """The quarantine threshold for late events in milliseconds, or None for no bound."""
        return None if self.max_lateness is None else parse_duration_ms(self.max_lateness)

    @model_validator(mode="after")
    def _lateness_order(self) -> EventTimeConfig:
        limit = self.max_lateness_ms
        if limit is not None and limit < self.late_after_ms:
            raise ValueError(
                f"max_lateness {self.max_lateness!r} is shorter than late_after "
                f"{self.late_after!r}; an event must be counted late before it is quarantined"
            )
        return self


# A value of a field partition: a Hive path segment as it is, in every store and engine
# (the writer refuses a value starting with '.').
_PARTITION_VALUE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$")
# How many values a field partition may list: each is a directory under every hour.
_MAX_PARTITION_VALUES = 256


class FieldPartitionConfig(_Strict):
    """An extra partition column from a message field, with a bounded set of values.

    Attributes:
        name: Top-level field of the record (string, enum, int or long).
        values: The values that get a partition of their own.
        other: The partition of every other value, null and a missing field included.
    """

    name: str
    values: tuple[str, ...] = Field(min_length=1)
    other: str = "__other__"

    @field_validator("values", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:  # noqa: ANN401 - YAML reads 1 as an int
        # An int field's values may be written as YAML numbers; partitions are text.
        if isinstance(value, list | tuple):
            return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        return value

    @field_validator("values", "other")
    @classmethod
    def _path_safe(cls, value: str | tuple[str, ...]) -> str | tuple[str, ...]:
        for v in (value,) if isinstance(value, str) else value:
            if not _PARTITION_VALUE.match(v):
                raise ValueError(
                    f"{v!r} cannot name a partition directory; use 1 to 64 letters, digits, "
                    "'_', '-' and '.', not starting with '.'"
                )
        return value

    @model_validator(mode="after")
    def _distinct(self) -> FieldPartitionConfig:
        if len(self.values) > _MAX_PARTITION_VALUES:
            raise ValueError(
                f"{len(self.values)} values: each is a partition under every event-time "
                f"partition; list at most {_MAX_PARTITION_VALUES}, the rest land in `other`"
            )
        if len(set(self.values)) != len(self.values):
            raise ValueError("a value is listed twice in `values`; list each once")
        if self.other in self.values:
            raise ValueError(
                f"`other` {self.other!r} is also one of `values`, so its partition would mix "
                "that value with every unlisted one; choose another name for `other`"
            )
        return self

    @property
    def column(self) -> str:
        """The partition column: `p_` and the field's name, lower-cased.

        Not the field's own name: a Hive or Trino table cannot have a data column and a
        partition column of one name, and the data column keeps each row's exact value
        (the `other` partition holds many).
        """
        return f"p_{self.name.lower()}"


class PartitioningConfig(_Strict):
    """How the data table is partitioned: event time in a zone, and optionally a field.

    A plain `partitioning: dt_hr` (or `dt`) in the YAML is the same as `by:` alone.

    Attributes:
        by: `dt` or `dt_hr` (Hive-style `dt=YYYY-MM-DD/hr=HH`).
        timezone: IANA zone of the `dt` and `hr` values: the event's local date and
            hour there. An hour that repeats when clocks go back is one partition.
        field: An extra partition column from a message field, after `dt` and `hr`.
    """

    by: Literal["dt", "dt_hr"] = "dt_hr"
    timezone: Zone = "UTC"
    field: FieldPartitionConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _plain(cls, data: Any) -> Any:  # noqa: ANN401 - pydantic hands over the raw value
        if isinstance(data, str):
            if data not in ("dt", "dt_hr"):
                raise ValueError(
                    f"{data!r} is not a partitioning; use dt, dt_hr, or a mapping with `by`, "
                    "`timezone` and `field`"
                )
            return {"by": data}
        return data

    @property
    def default(self) -> bool:
        """Whether this is plain UTC `dt`/`hr` partitioning, as before zones and fields."""
        return self.timezone == "UTC" and self.field is None


class LimitsConfig(_Strict):
    """Bounds on one batch.

    Attributes:
        max_offsets_per_partition: Cap on the range read from one partition in one batch.
        max_offsets_per_task: Longer ranges are split into tasks of at most this many offsets.
        target_file_mb: A data file is closed once it reaches about this size.
        row_group_rows: Rows per Parquet row group (fewer when the write buffer is full).
        write_buffer_mb: Memory per task and table for rows not yet written.
        read_stall_s: A task that makes no progress for this long fails (and Spark retries it).
        read_chunk_mb: A task decodes and writes what it read once this many MB of keys
            and values (or 50,000 messages) are held, so large messages never pile up.
        max_open_files: Most files one task keeps open per table; a batch touching more
            event-time partitions closes the least recently written file first.
    """

    max_offsets_per_partition: int = Field(default=5_000_000, gt=0)
    max_offsets_per_task: int = Field(default=2_000_000, gt=0)
    target_file_mb: int = Field(default=128, gt=0)
    row_group_rows: int = Field(default=65_536, gt=0)
    write_buffer_mb: int = Field(default=64, gt=0)
    read_stall_s: float = Field(default=60.0, gt=0)
    read_chunk_mb: int = Field(default=64, gt=0, le=1024)
    max_open_files: int = Field(default=64, gt=0)


class MetastoreConfig(_Strict):
    """Where the pipeline's tables are registered for Presto/Trino and Spark.

    Attributes:
        uri: `thrift://host:port` of the Hive Metastore; `STRATA_METASTORE_URI`
            overrides it. Unset: nothing is registered.
        database: Database the tables are registered in.
        timeout_s: Bound on connecting and on every metastore call.
        partition_batch: Partitions added per metastore call.
    """

    uri: str | None = None
    database: str = "strata"
    timeout_s: float = Field(default=30.0, gt=0)
    partition_batch: int = Field(default=500, gt=0)

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^thrift://[A-Za-z0-9.-]+:\d+$", value):
            raise ValueError(
                f"{redact(value)!r} is not a metastore uri; write thrift://host:9083 "
                "(the thrift protocol carries no password)"
            )
        return value

    @field_validator("database")
    @classmethod
    def _database(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"{value!r} is not a valid database name; use lower-case letters, digits and '_'"
            )
        return value


class TrinoConfig(_Strict):
    """A Trino to notify after registering the tables.

    Attributes:
        url: `http(s)://host:port` of the Trino coordinator; unset, Trino is not called.
        user: User the statements run as.
        password: Password of `user` (Trino's password authentication, over https
            only); write `${NAME}` to keep it out of the file.
        access_token: A JWT sent as a bearer token (Trino's JWT or OAuth2
            authentication), instead of a password; https only.
        ca_file: PEM file of the certificate authority that signed the coordinator's
            certificate, when it is not one the system trusts.
        hive_catalog: Trino catalog over the metastore for Parquet tables.
        delta_catalog: Trino catalog for Delta tables.
        register_delta_tables: Call `register_table` for Delta tables. Only needed when
            Trino's Delta catalog uses another metastore than `metastore.uri`.
        timeout_s: Bound on each statement.
    """

    url: str | None = None
    user: str = "strata"
    password: str | None = None
    access_token: str | None = None
    ca_file: str | None = None
    hive_catalog: str = "hive"
    delta_catalog: str = "delta"
    register_delta_tables: bool = False
    timeout_s: float = Field(default=60.0, gt=0)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        return service_url(
            value,
            "Trino",
            "trino.user and trino.password (or trino.access_token)",
            "http://host:8080 or https://host:8443",
            path=False,
        )

    @field_validator("ca_file")
    @classmethod
    def _ca_file(cls, value: str | None) -> str | None:
        return _pem_file(value, "the Trino coordinator's")

    @field_validator("hive_catalog", "delta_catalog")
    @classmethod
    def _catalog(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"{value!r} is not a valid catalog name")
        return value

    @model_validator(mode="after")
    def _authentication(self) -> TrinoConfig:
        if self.password is not None and self.access_token is not None:
            raise ValueError(
                "trino.password and trino.access_token are both set; Trino takes one way "
                "of signing in: keep the one your coordinator is configured for"
            )
        signed = self.password is not None or self.access_token is not None
        if signed and (self.url is None or not self.url.startswith("https:")):
            raise ValueError(
                "trino.password or trino.access_token needs an https trino.url: Trino refuses "
                "credentials over plain http, and they would cross the network readable"
            )
        if self.ca_file is not None and (self.url is None or not self.url.startswith("https:")):
            raise ValueError(
                "trino.ca_file applies to an https url only; use https:// or remove it"
            )
        return self


class SchemaRegistryConfig(_Strict):
    """The Confluent Schema Registry that `confluent_avro` messages name their schema in.

    With a registry, each message is decoded with the schema it was written with (its
    writer schema, fetched by the id in its header) and resolved into `schema_file`,
    so a producer's compatible schema change lands instead of being quarantined.

    Attributes:
        url: `http(s)://host:port` of the registry. Unset: no registry, and every
            message must carry `schema_id`.
        username: Basic-auth user, if the registry asks for one.
        password: Basic-auth password; write `${NAME}` to keep it out of the file.
        ca_file: PEM file of the certificate authority that signed an https registry's
            certificate, when it is not one the system trusts.
        timeout_s: Bound on each request to the registry.
        evolve: Let the table follow the registry: when a batch is planned, the
            latest schema of each topic's subject is read, and the optional fields it
            adds (nullable, default null) become columns of the table from that batch
            on. Off, the table's columns are `schema_file`'s and fields producers add
            are dropped on reading.
        subject: The subject of a topic's value schema; `{topic}` is the topic's name
            (Confluent's TopicNameStrategy).
        allow_http_on_loopback: Allow `username` and `password` over a plain `http://`
            url whose host is this machine (127.0.0.1, ::1, `localhost`), for a
            registry in development. Anywhere else credentials need `https://`.
    """

    url: str | None = None
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    timeout_s: float = Field(default=10.0, gt=0)
    evolve: bool = False
    subject: str = "{topic}-value"
    allow_http_on_loopback: bool = False

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        return service_url(
            value,
            "Schema Registry",
            "schema_registry.username and schema_registry.password",
            "http://host:8081 or https://host:8081",
        )

    @field_validator("ca_file")
    @classmethod
    def _ca_file(cls, value: str | None) -> str | None:
        return _pem_file(value, "the registry's")

    @model_validator(mode="after")
    def _credentials(self) -> SchemaRegistryConfig:
        _basic_auth("schema_registry", self.username, self.password)
        _credentials_over_http(
            "schema_registry",
            "url",
            self.url,
            self.password is not None,
            self.allow_http_on_loopback,
        )
        if self.url is None and (self.username is not None or self.ca_file is not None):
            raise ValueError(
                "schema_registry has credentials or ca_file but no url; add "
                "schema_registry.url or remove the section"
            )
        if self.evolve and self.url is None:
            raise ValueError(
                "schema_registry.evolve follows the registry's schemas but no url is set; add "
                "schema_registry.url or remove evolve"
            )
        if self.ca_file is not None and self.url is not None and self.url.startswith("http:"):
            raise ValueError(
                "schema_registry.ca_file applies to an https url only; use https:// or "
                "remove ca_file"
            )
        return self


class AirflowConfig(_Strict):
    """How Airflow schedules and runs the pipeline.

    Attributes:
        schedule: Cron expression or preset (`@hourly`) of the ingest DAG.
        spark_mode: `local` runs the job inside the Airflow worker (laptops, tests);
            `spark_submit` submits `jobs/ingest.py` to a cluster.
        spark_conn_id: Airflow connection of the Spark cluster, for `spark_submit`.
        retries: Retries of each task; safe, since batches are idempotent.
        retry_delay: Wait before a retry.
        trino_conn_id: An Airflow connection of type `trino`: the DAGs then run the
            Trino statements of registration through it (with its authentication),
            instead of `trino.url`.
        lag_growth_runs: A run says so when the lag after it has grown over this many
            runs in a row.
    """

    schedule: str = "@hourly"
    spark_mode: Literal["local", "spark_submit"] = "local"
    spark_conn_id: str = "spark_default"
    retries: int = Field(default=2, ge=0)
    retry_delay: Duration = "1m"
    trino_conn_id: str | None = None
    lag_growth_runs: int = Field(default=3, ge=2)

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:  # noqa: ANN401 - pydantic hands over the raw mapping
        if isinstance(data, dict) and "vacuum_retention" in data:
            raise ValueError(
                "airflow.vacuum_retention moved to maintenance.vacuum_retention (vacuum is a "
                "command of its own now); move the key there"
            )
        return data


# Below this, vacuum could delete a file a running query or a time-travel reader still
# reads: removed files are kept at least this long whatever the configuration says.
VACUUM_FLOOR = "1h"


class MaintenanceConfig(_Strict):
    """Compaction, log checkpoints and vacuum of the pipeline's tables.

    Attributes:
        settle: An event-time partition is compacted once its end is this long past,
            so the hour being written is left alone.
        small_file_mb: Files under this size are merged; unset, half of
            `limits.target_file_mb`. Merged files are cut at `limits.target_file_mb`.
        min_small_files: A partition is compacted once it holds this many small files.
        vacuum_retention: How long files removed from a Delta table (by compaction, a
            backfill, a replay), and a plain Parquet partition's directory compaction
            moved it away from, stay for readers that still use them, counted from
            when the removal or the move became visible; never under 1h.
    """

    settle: Duration = "2h"
    small_file_mb: int | None = Field(default=None, gt=0)
    min_small_files: int = Field(default=2, ge=2)
    vacuum_retention: Duration = "7d"

    @field_validator("vacuum_retention")
    @classmethod
    def _floor(cls, value: str) -> str:
        if parse_duration_ms(value) < parse_duration_ms(VACUUM_FLOOR):
            raise ValueError(
                f"{value!r} is under the {VACUUM_FLOOR} floor: a query running that long, or a "
                f"time-travel reader, would lose files; write at least {VACUUM_FLOOR} (7d is "
                "Delta's default)"
            )
        return value


class RangeRule(_Strict):
    """Bounds a numeric column's values must lie within (either may be open).

    Attributes:
        min: Smallest allowed value.
        max: Largest allowed value.
    """

    min: float | None = None
    max: float | None = None


class ExpectationConfig(_Strict):
    """Any Great Expectations expectation, by its snake_case name and arguments.

    Attributes:
        type: E.g. `expect_column_values_to_match_regex`.
        kwargs: Its arguments, e.g. `{column: page, regex: "^/"}`.
    """

    type: str
    kwargs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        if not re.match(r"^expect_[a-z0-9_]+$", value):
            raise ValueError(
                f"{value!r} is not a Great Expectations expectation name; write its snake_case "
                "name, e.g. expect_column_values_to_match_regex"
            )
        return value


class QualityConfig(_Strict):
    """The data-quality suite run on every batch, and what a failure does.

    Attributes:
        gate: `fail` (the Airflow quality task fails and the batch's event-time
            partitions are marked incomplete), `warn` (reported only) or `off`.
        max_lateness: Oldest event time accepted, before the check runs.
        max_skew: Newest event time accepted, after the check runs.
        ranges: Numeric bounds per column.
        value_sets: Allowed values per column.
        expectations: Further Great Expectations expectations.
        max_rows: Most rows of a batch validated; a larger batch is validated on an
            evenly spread sample of this many rows (the report says so).
        history: Batches shown on the summary page.
        location: Where results, Data Docs and the summary page go; defaults to
            `<warehouse>/<name>_quality`.
    """

    gate: Literal["fail", "warn", "off"] = "warn"
    max_lateness: Duration = "7d"
    max_skew: Duration = "1h"
    ranges: dict[str, RangeRule] = Field(default_factory=dict)
    value_sets: dict[str, list[Any]] = Field(default_factory=dict)
    expectations: list[ExpectationConfig] = Field(default_factory=list)
    max_rows: int = Field(default=2_000_000, gt=0)
    history: int = Field(default=48, gt=0)
    location: str | None = None


class MetricsConfig(_Strict):
    """Prometheus metrics of every run, per pipeline and per partition.

    Attributes:
        textfile_dir: Directory of node_exporter's textfile collector: each run replaces
            `strata_<pipeline>.prom` there, atomically.
        pushgateway: `http(s)://host:port` of a Prometheus Pushgateway each run pushes
            to, grouped by job and pipeline.
        job: The `job` label of what is pushed.
        username: Basic-auth user of the Pushgateway, if it asks for one.
        password: Basic-auth password; write `${NAME}` to keep it out of the file.
        timeout_s: Bound on a push.
        allow_http_on_loopback: Allow `username` and `password` over a plain `http://`
            pushgateway on this machine (127.0.0.1, ::1, `localhost`). Anywhere else
            credentials need `https://`.
    """

    textfile_dir: str | None = None
    pushgateway: str | None = None
    job: str = "strata"
    username: str | None = None
    password: str | None = None
    timeout_s: float = Field(default=10.0, gt=0)
    allow_http_on_loopback: bool = False

    @field_validator("pushgateway")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        return service_url(
            value, "Pushgateway", "metrics.username and metrics.password", "http://host:9091"
        )

    @field_validator("job")
    @classmethod
    def _job(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9_.-]{1,128}$", value):
            raise ValueError(f"{value!r} is not a job name; use letters, digits, '_', '.', '-'")
        return value

    @model_validator(mode="after")
    def _credentials(self) -> MetricsConfig:
        _basic_auth("metrics", self.username, self.password)
        if self.username is not None and self.pushgateway is None:
            raise ValueError(
                "metrics has credentials but no pushgateway; add metrics.pushgateway or remove them"
            )
        _credentials_over_http(
            "metrics",
            "pushgateway",
            self.pushgateway,
            self.password is not None,
            self.allow_http_on_loopback,
        )
        return self


class CompletenessConfig(_Strict):
    """When an event-time partition (`dt=`/`hr=`) is complete: it will not change any more.

    Each Kafka partition read has a low-water event time: the newest event time read
    from it. After each ingest batch the watermark is the lowest of them, leaving out
    a partition that was read to its end when its batch was planned and has read
    nothing in a later batch (an idle one); it never goes back. A partition of the
    table is marked complete after the first batch whose watermark is past its end by
    `lateness`, unless a failed quality gate marked it incomplete. Rows that arrive
    for it afterwards still land, and are counted and reported as late after
    completion (see `strata.completeness`).

    Attributes:
        enabled: Mark partitions complete at all.
        lateness: How long after a partition's end rows may still come.
        marker: Also write a `_SUCCESS` file into each complete partition's directory,
            for readers that wait for one.
    """

    enabled: bool = True
    lateness: Duration = "1h"
    marker: bool = False


class RoutingConfig(_Strict):
    """Which table each topic lands in, when the pipeline's topics go to tables of their own.

    Each table is a pipeline of its own as far as the tables go (its own schema, data,
    raw, quarantine and ledger tables, its own batches and metastore entries), named by
    the table and run by the one pipeline: `strata run --pipeline NAME` runs them all in
    one process and one Spark session, and `--pipeline NAME:TABLE` names one.

    Attributes:
        table: Template of a table's name; `{topic}` is the topic's name lower-cased,
            with every character other than a-z, 0-9 and `_` made `_`.
        tables: A table name per topic, for the topics the template should not name.
    """

    table: str = "{topic}"
    tables: dict[str, str] = Field(default_factory=dict)

    @field_validator("tables")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        for topic, table in value.items():
            if not _NAME.match(table):
                raise ValueError(
                    f"table {table!r} of topic {topic!r} is not a valid table name; use "
                    "lower-case letters, digits and '_', starting with a letter"
                )
        return value

    @field_validator("table")
    @classmethod
    def _template(cls, value: str) -> str:
        if not _NAME.match(value.replace("{topic}", "t")):
            raise ValueError(
                f"{value!r} is not a table-name template; use lower-case letters, digits, '_' "
                "and {topic}, e.g. '{topic}' or 'raw_{topic}'"
            )
        return value

    def table_for(self, topic: str) -> str:
        """The table a topic lands in."""
        if topic in self.tables:
            return self.tables[topic]
        plain = re.sub(r"[^a-z0-9_]", "_", topic.lower())
        name = self.table.replace("{topic}", plain)
        return name if _NAME.match(name) else f"t_{name}"[:63]


class SparkConfig(_Strict):
    """The Spark session the job builds when it runs outside spark-submit.

    Attributes:
        master: Spark master URL.
        tasks: How many tasks to spread a batch over; 0 means the cores of a local
            master, or the cluster's default parallelism (its executors' cores).
        conf: Extra Spark properties.
    """

    master: str = "local[2,4]"
    tasks: int = Field(default=0, ge=0)
    conf: dict[str, str] = Field(default_factory=dict)


class PipelineConfig(_Strict):
    """One pipeline: which topics, how to decode them, and where the tables live.

    Attributes:
        name: Pipeline name (the YAML file's stem); the Delta app id and ledger key.
        topics: Kafka topics read by this pipeline; all share one schema.
        topics_pattern: Instead of `topics`, a regular expression (RE2 syntax, matched
            in linear time: no lookaround, no backreferences) matched against the whole
            name of every topic on the brokers when a batch is planned (topics starting
            with `__`, Kafka's internal ones, never match). A topic created later is read
            from the next run on, from `starting_offsets`.
        routing: Send each topic to a table of its own (see `RoutingConfig`); the
            locations and `schema_file` may then hold `{table}`.
        format: `json`, `avro`, or `confluent_avro` (Avro in Confluent wire format).
        schema_file: Avro schema under `schemas/`, also used to check and coerce JSON.
        schema_id: For `confluent_avro`, the Schema Registry id under which `schema_file`
            is registered; without `schema_registry`, a message carrying another id is
            quarantined, never decoded with a schema it was not written with.
        event_time: Event-time field and its rules.
        partitioning: The data table's partition columns (see `PartitioningConfig`).
        layout: `per_task` (each task writes at most one file per event-time partition)
            or `shuffle` (rows are shuffled on the event-time partition first, so each
            gets about one file per batch, at the price of moving the rows once more).
        table_format: `delta` (default) or `parquet`: plain Hive-style Parquet
            directories for the data, raw and quarantine tables, for Presto/Hive-only
            shops. The ledger stays Delta and its commit is the batch's commit point.
        warehouse: Root that relative locations hang from; `STRATA_WAREHOUSE` overrides it.
        table: Location of the table (relative to the warehouse, absolute, or s3://).
        raw_table: Location of the raw copy of every message read.
        quarantine_table: Location of the rows that could not be decoded or trusted.
        ledger_table: Location of the per-batch, per-partition ledger.
        state_dir: Where plans are kept; defaults to `<warehouse>/_strata/<name>`.
        lock_dir: Local directory for the run lock when `state_dir` is local; defaults
            to `state_dir`.
        lock_lease: How long a run's lease on an object-store `state_dir` lasts without
            renewal; a holder that died is taken over after this long.
        starting_offsets: Where the partitions of a topic never read before start:
            `earliest`, `latest`, or a moment (ISO-8601 with its offset, or epoch
            milliseconds): the first offset whose Kafka timestamp is at or after it.
            Partitions added later to a topic already read start at their log start.
        on_data_loss: `fail` (default) stops before reading when retention deleted
            unread offsets; `accept` goes on and records the loss in the ledger.
        kafka: Broker connection.
        limits: Batch bounds.
        spark: Spark session settings.
        metastore: Hive Metastore registration.
        trino: A Trino to notify after registering the tables.
        schema_registry: The Schema Registry that `confluent_avro` writer schemas come
            from; with one, `schema_id` is optional.
        airflow: Scheduling of the pipeline's DAGs.
        quality: The data-quality suite and gate.
        maintenance: Compaction, log checkpoints and vacuum.
        metrics: Prometheus metrics of every run.
        completeness: When an event-time partition is marked complete.
        storage_options: Object-store options (endpoint, region...) for s3:// locations.
        schemas_dir: Directory holding `schema_file`; set by the loader.
    """

    _schema_text: str | None = PrivateAttr(default=None)
    # The routed pipeline this one is a table of (see `RoutingConfig`), or None.
    _route_of: str | None = PrivateAttr(default=None)
    # False once `with_schema_text` gave it a schema other than schema_file's.
    _reads_schema_file: bool = PrivateAttr(default=True)
    # The tables of the other pipelines of its configuration directory, as loaded with
    # it: a table a pattern matches later must not take one of their places or names.
    _neighbours: tuple[OwnedTable, ...] = PrivateAttr(default=())

    name: str
    topics: list[str] = Field(default_factory=list)
    topics_pattern: str | None = None
    routing: RoutingConfig | None = None
    format: Literal["json", "avro", "confluent_avro"] = "json"
    schema_file: str
    schema_id: int | None = Field(default=None, ge=0)
    event_time: EventTimeConfig
    partitioning: PartitioningConfig = Field(default_factory=PartitioningConfig)
    layout: Literal["per_task", "shuffle"] = "per_task"
    table_format: Literal["delta", "parquet"] = "delta"
    warehouse: str = "warehouse"
    table: str | None = None
    raw_table: str | None = None
    quarantine_table: str | None = None
    ledger_table: str | None = None
    state_dir: str | None = None
    lock_dir: str | None = None
    lock_lease: Duration = "2m"
    starting_offsets: str = "earliest"
    on_data_loss: Literal["fail", "accept"] = "fail"
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    metastore: MetastoreConfig = Field(default_factory=MetastoreConfig)
    trino: TrinoConfig = Field(default_factory=TrinoConfig)
    schema_registry: SchemaRegistryConfig = Field(default_factory=SchemaRegistryConfig)
    airflow: AirflowConfig = Field(default_factory=AirflowConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    maintenance: MaintenanceConfig = Field(default_factory=MaintenanceConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    completeness: CompletenessConfig = Field(default_factory=CompletenessConfig)
    # Its keys (AWS_SECRET_ACCESS_KEY, ...) show as *** in every repr, by the one rule.
    storage_options: dict[str, str] = Field(default_factory=dict)
    schemas_dir: str = "schemas"

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"{value!r} is not a valid pipeline name; use lower-case letters, digits and '_'"
            )
        return value

    @field_validator("topics")
    @classmethod
    def _topics(cls, value: list[str]) -> list[str]:
        for topic in value:
            if not _TOPIC.match(topic) or topic in (".", ".."):
                raise ValueError(
                    f"{topic!r} is not a Kafka topic name; use letters, digits, '.', '_' and '-'"
                )
        if len(set(value)) != len(value):
            raise ValueError("a topic is listed twice; list each topic once")
        return value

    @field_validator("topics_pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is None:
            return None
        topic_pattern(value)
        return value

    @model_validator(mode="after")
    def _topics_or_pattern(self) -> PipelineConfig:
        if bool(self.topics) == (self.topics_pattern is not None):
            raise ValueError(
                "give either `topics` (a list of names) or `topics_pattern` (a regular "
                "expression), not both and not neither"
            )
        return self

    @field_validator("starting_offsets", mode="before")
    @classmethod
    def _start(cls, value: Any) -> str:  # noqa: ANN401 - YAML reads a moment as a datetime
        return starting_point(value)[0]

    def reads_topic(self, topic: str) -> bool:
        """Whether this pipeline reads a topic: listed in `topics`, or matched by the pattern.

        A table of a routed pipeline reads only the topics routed to it.
        """
        if self.topics_pattern is None:
            listed = topic in self.topics
        else:
            matcher = topic_pattern(self.topics_pattern)
            listed = not topic.startswith("__") and matcher.fullmatch(topic) is not None
        return listed and (self._route_of is None or self.table_for(topic) == self.name)

    @property
    def topics_description(self) -> str:
        """The pipeline's topics in words, for messages."""
        if self.topics_pattern is None:
            return ", ".join(self.topics)
        return f"the topics matching {self.topics_pattern!r}"

    @property
    def starting_timestamp_ms(self) -> int | None:
        """The moment new topics start at, in epoch ms; None for `earliest` or `latest`."""
        return starting_point(self.starting_offsets)[1]

    @model_validator(mode="after")
    def _route(self, info: ValidationInfo) -> PipelineConfig:
        # First of the checks below: a table of a routed pipeline is checked as one
        # pipeline, the routed pipeline itself only for what all its tables share.
        if info.context and info.context.get("route_of"):
            self._route_of = info.context["route_of"]
        if self.routing is None:
            for key, value in self._locations().items():
                if value and "{table}" in value:
                    raise ValueError(f"{key} holds {{table}}, which only `routing` fills in")
        return self

    def _locations(self) -> dict[str, str | None]:
        return {
            "table": self.table,
            "raw_table": self.raw_table,
            "quarantine_table": self.quarantine_table,
            "ledger_table": self.ledger_table,
            "quality.location": self.quality.location,
            "schema_file": self.schema_file,
        }

    @property
    def routed(self) -> bool:
        """Whether this pipeline sends its topics to tables of their own (and is not one)."""
        return self.routing is not None and self._route_of is None

    @property
    def route_of(self) -> str | None:
        """The routed pipeline this configuration is a table of, or None."""
        return self._route_of

    def table_for(self, topic: str) -> str:
        """The table a topic lands in: its route's, or this pipeline's own."""
        if self.routing is None:
            return self.name
        return self.routing.table_for(topic)

    def route(self, table: str) -> PipelineConfig:
        """The configuration of one table of a routed pipeline.

        It is a pipeline of its own named by the table: its topics are those routed to
        it, `{table}` in the locations and `schema_file` is filled in, its state lives
        under the routed pipeline's, and it publishes to the routed pipeline's group.

        Args:
            table: The table's name.

        Returns:
            The table's configuration, validated as a pipeline.

        Raises:
            ConfigError: Naming the table, if it does not make a valid pipeline.
        """
        if not self.routed or self.routing is None:
            raise ConfigError(f"pipeline {self.name} does not route its topics to tables")
        if not _NAME.match(table):
            raise ConfigError(
                f"{table!r} is not a table name; use lower-case letters, digits and '_'"
            )
        data = self.model_dump(exclude_unset=False)
        data["name"] = table
        if self.topics:
            data["topics"] = [t for t in self.topics if self.routing.table_for(t) == table]
            if not data["topics"]:
                known = sorted({self.routing.table_for(t) for t in self.topics})
                raise ConfigError(
                    f"pipeline {self.name} routes no topic to table {table!r}; its tables are "
                    f"{', '.join(known)}"
                )
        for key in ("table", "raw_table", "quarantine_table", "ledger_table", "schema_file"):
            if data[key]:
                data[key] = data[key].replace("{table}", table)
        if data["quality"]["location"]:
            data["quality"]["location"] = data["quality"]["location"].replace("{table}", table)
        data["state_dir"] = f"{self.location('state')}/{table}"
        if self.lock_dir:
            data["lock_dir"] = str(Path(self.lock_dir) / self.name)
        data["kafka"]["group_id"] = self.group_id
        try:
            return PipelineConfig.model_validate(data, context={"route_of": self.name})
        except ValidationError as exc:
            problems = "; ".join(
                f"key `{'.'.join(str(p) for p in e['loc']) or '(top level)'}`: {e['msg']}"
                for e in exc.errors()
            )
            raise ConfigError(redact(f"pipeline {self.name}, table {table}: {problems}")) from None

    @model_validator(mode="after")
    def _schema_exists(self) -> PipelineConfig:
        if self.routed and "{table}" in self.schema_file:
            return self  # each table has its own, checked when it is routed to
        if not self.schema_path.is_file():
            raise ValueError(
                f"schema_file {self.schema_file!r} not found in {self.schemas_dir!r}; "
                "put the Avro schema (.avsc) there or fix the name"
            )
        # Read once, where the configuration is loaded: the text travels with the
        # configuration to every Spark task, whose host need not have the file.
        self._schema_text = self.schema_path.read_text()
        return self

    @model_validator(mode="after")
    def _state_beside_the_tables(self) -> PipelineConfig:
        remote = [w for w in ("table", "raw", "quarantine", "ledger") if "://" in self.location(w)]
        if remote and "://" not in self.location("state"):
            raise ValueError(
                f"state_dir {self.location('state')!r} is local while the {remote[0]} table is "
                "on an object store: runners on other hosts would neither see this host's "
                "saved plans nor its run lease, and could commit two plans of one batch. "
                "Remove state_dir (it defaults to <warehouse>/_strata/<name>) or put it on "
                "the same store"
            )
        return self

    def local_tables(self) -> list[Location]:
        """The tables and state that live on this host's file system (no URL scheme)."""
        return [
            w
            for w in ("table", "raw", "quarantine", "ledger", "state")
            if "://" not in self.location(w) or self.location(w).startswith("file://")
        ]

    def shared_storage_error(self, master: str) -> str | None:
        """Why this pipeline's tables cannot be written by executors of `master`, or None.

        Executors on other hosts write the tables' files: a path on the driver's disk
        would scatter them over the executors' disks, where no commit and no reader
        finds them.
        """
        local = self.local_tables()
        if master.startswith("local") or not local:
            return None
        return (
            f"the {local[0]} location {self.location(local[0])!r} is a local path, but Spark "
            f"master {master!r} runs executors on other hosts, which cannot write it. Put "
            "`warehouse` on shared storage (s3://bucket/prefix, or STRATA_WAREHOUSE), or use "
            "a local[N] master"
        )

    @model_validator(mode="after")
    def _executors_reach_the_tables(self) -> PipelineConfig:
        error = self.shared_storage_error(self.spark.master)
        if error:
            raise ValueError(f"spark.master: {error}")
        return self

    @model_validator(mode="after")
    def _confluent_schema_id(self) -> PipelineConfig:
        registry = self.schema_registry.url is not None
        if self.format == "confluent_avro" and self.schema_id is None and not registry:
            raise ValueError(
                "format confluent_avro needs `schema_id`: the Schema Registry id of "
                f"{self.schema_file}, so that messages written with another schema are "
                "quarantined instead of decoded wrongly; add schema_id: <id>, or "
                "schema_registry.url to decode each message with the schema it was written with"
            )
        if self.format != "confluent_avro" and self.schema_id is not None:
            raise ValueError("`schema_id` applies only to format confluent_avro; remove it")
        if self.format != "confluent_avro" and self.schema_registry.evolve:
            raise ValueError(
                "schema_registry.evolve follows the writer schemas that confluent_avro messages "
                "name; it applies to format confluent_avro only; remove it"
            )
        return self

    def owned_tables(self, topics: Iterable[str] = ()) -> list[OwnedTable]:
        """This pipeline's (or routed table's) five tables and state, placed and named.

        Args:
            topics: For a routed table, the topics routed to it (for messages).
        """
        uri = self.metastore.uri
        return owned_tables(
            self._route_of or self.name,
            self.name if self._route_of else None,
            {role: self.location(role) for role in ROLES},
            None if uri is None else (uri, self.metastore.database),
            topics,
        )

    def every_table(self) -> list[OwnedTable]:
        """Every table this configuration names now, each routed table's too.

        A routed pipeline's tables are those of its listed topics; a pattern's topics
        are known only on the brokers, and are checked as each run lists them
        (`strata.routes`). A listed topic's table that is not a valid pipeline is left
        out: it fails alone, naming its own problem, when it runs.
        """
        if not self.routed:
            return self.owned_tables()
        routes: dict[str, list[str]] = {}
        for topic in self.topics:
            routes.setdefault(self.table_for(topic), []).append(topic)
        out = []
        for table, topics in sorted(routes.items()):
            try:
                routed = self.route(table)
            except ConfigError:
                continue
            out += routed.owned_tables(topics)
        return out

    @model_validator(mode="after")
    def _one_owner(self) -> PipelineConfig:
        # Last: every table's place and name are settled by the checks above.
        tables = self.every_table()
        found = Namespace(tables).clashes(tables)
        if found:
            raise ValueError("\n  ".join(found))
        return self

    @property
    def neighbours(self) -> tuple[OwnedTable, ...]:
        """The tables of the other pipelines of the configuration directory it was loaded from."""
        return self._neighbours

    @model_validator(mode="after")
    def _quality_columns(self) -> PipelineConfig:
        import json

        if self.routed and "{table}" in self.schema_file:
            return self

        fields = {f["name"] for f in json.loads(self.schema_text).get("fields", [])}
        for key, columns in (
            ("ranges", self.quality.ranges),
            ("value_sets", self.quality.value_sets),
        ):
            unknown = sorted(set(columns) - fields - {"_partition", "_offset"})
            if unknown:
                raise ValueError(
                    f"quality.{key} names {', '.join(unknown)}, not a field of {self.schema_file}; "
                    f"use one of {', '.join(sorted(fields))}"
                )
        return self

    @property
    def schema_path(self) -> Path:
        """The Avro schema file (on the host that loaded the configuration)."""
        return Path(self.schemas_dir) / self.schema_file

    @property
    def schema_text(self) -> str:
        """The Avro schema as loaded with the configuration, wherever this copy runs."""
        if self._schema_text is None:
            self._schema_text = self.schema_path.read_text()
        return self._schema_text

    def with_schema_text(self, text: str) -> PipelineConfig:
        """This configuration reading with another Avro schema than `schema_file`'s.

        For a table that follows its Schema Registry subject: a batch is decoded with
        the schema it was planned with, which may hold fields `schema_file` does not.

        Args:
            text: The Avro schema, as JSON text.

        Returns:
            A copy; this one is left as it is.
        """
        copy = self.model_copy()
        copy._reads_schema_file = self.reads_schema_file and text == self.schema_text
        copy._schema_text = text
        return copy

    @property
    def reads_schema_file(self) -> bool:
        """Whether the schema read with is `schema_file`'s as loaded (see `with_schema_text`)."""
        return self._reads_schema_file

    @property
    def asset_uri(self) -> str:
        """The Airflow Asset of the data table, `strata://<pipeline>/<table>`.

        Its events announce the partitions that became complete (`strata.completeness`);
        a pipeline that does not route to tables is its own table.
        """
        return f"strata://{self._route_of or self.name}/{self.name}"

    @property
    def group_id(self) -> str:
        """Consumer group that receives the committed end offsets."""
        return self.kafka.group_id or f"strata-{self.name}"

    def location(self, which: Location) -> str:
        """Resolve a table or state location against the warehouse root.

        Args:
            which: The location to resolve.

        Returns:
            An absolute local path or an `s3://` URI, without a trailing slash.
        """
        explicit = {
            "table": self.table,
            "raw": self.raw_table,
            "quarantine": self.quarantine_table,
            "ledger": self.ledger_table,
            "state": self.state_dir,
            "quality": self.quality.location,
        }[which]
        default = f"_strata/{self.name}" if which == "state" else self.name + NAME_SUFFIXES[which]
        return _resolve(self.warehouse, explicit or default)

    @property
    def lock_path(self) -> Path | None:
        """Local file whose flock marks a run in flight, or None for an object-store state.

        Runners on several hosts share an object-store state location, where a local file
        guards nothing: their runs hold a lease under `<state location>/lease/` instead
        (`strata.lease`), and `lock_dir` is not used.
        """
        state = self.location("state")
        if "://" in state:
            return None
        if self.lock_dir:
            return Path(self.lock_dir) / f"{self.name}.lock"
        return Path(state) / "run.lock"


@functools.lru_cache(maxsize=64)
def topic_pattern(pattern: str) -> Any:  # noqa: ANN401 - re2 ships no type hints
    """A `topics_pattern` compiled for matching in time linear in the topic's name.

    Every topic name on the cluster is matched on every plan, and topic names are
    chosen by whoever may create topics: Python's backtracking `re` can take minutes
    on one name against a careless pattern (`(a+)+$`). RE2 never backtracks; it has
    no lookaround and no backreferences, which a pattern over topic names never needs.

    Args:
        pattern: The regular expression, matched against whole topic names.

    Returns:
        The compiled pattern (`fullmatch`, `search`).

    Raises:
        ValueError: Naming the construct RE2 refused, and what to write instead.
    """
    import re2

    options = re2.Options()
    # RE2 would also print the refusal to stderr itself; the error below says it.
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        why = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        raise ValueError(
            f"{pattern!r} cannot be matched in linear time ({why}). Topics are matched with "
            "RE2, which has no lookaround ((?=, (?!, (?<=, (?<!), no backreferences (\\1) and "
            "no possessive or atomic groups; rewrite it without them, e.g. 'clicks\\..*'"
        ) from None


def starting_point(value: object) -> tuple[str, int | None]:
    """A `starting_offsets` value as written canonically, and its moment in epoch ms.

    Args:
        value: `earliest`, `latest`, an ISO-8601 moment with its UTC offset (YAML may
            hand it over as a datetime), or epoch milliseconds.

    Returns:
        The canonical text (`earliest`, `latest`, or the moment in UTC, ISO-8601), and
        the moment in epoch milliseconds (None for `earliest` and `latest`).

    Raises:
        ValueError: Saying what is accepted.
    """
    from datetime import UTC, datetime

    if value in ("earliest", "latest"):
        return str(value), None
    moment: datetime | None = None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, int) and not isinstance(value, bool):
        moment = datetime.fromtimestamp(value / 1000, tz=UTC)
    elif isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?\d+", text):
            moment = datetime.fromtimestamp(int(text) / 1000, tz=UTC)
        else:
            try:
                moment = datetime.fromisoformat(text.replace("z", "Z"))
            except ValueError:
                moment = None
    if moment is None:
        raise ValueError(
            f"{value!r} is not a starting point; write earliest, latest, an ISO-8601 moment "
            "with its offset (2026-01-31T00:00:00Z) or epoch milliseconds"
        )
    if moment.tzinfo is None:
        raise ValueError(
            f"{value!r} has no UTC offset, so the moment it names depends on a time zone; "
            "add one (2026-01-31T00:00:00Z or +01:00)"
        )
    ms = int(moment.timestamp() * 1000)
    if ms < 0:
        raise ValueError(f"{value!r} is before 1970-01-01, where no Kafka timestamp lies")
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds"), ms


def _resolve(root: str, location: str) -> str:
    if "://" in location or location.startswith("/"):
        return location.rstrip("/")
    if "://" in root:
        return f"{root.rstrip('/')}/{location}"
    return str((Path(root) / location).resolve())


def _expand_env(value: Any, source: Path, key: str) -> Any:  # noqa: ANN401 - YAML is untyped
    if isinstance(value, dict):
        return {
            k: _expand_env(v, source, f"{key}.{k}" if key else str(k)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_expand_env(v, source, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(
                    f"{source}: key `{key}` refers to environment variable ${{{name}}}, "
                    f"which is not set; export {name} or remove the reference"
                )
            return os.environ[name]

        return _ENV_REF.sub(sub, value)
    return value


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: line {line} is not UTF-8 text; save the file as UTF-8"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # `from None`: the YAML error's own text, shown in any traceback of its cause,
        # quotes the broken line.
        raise ConfigError(_yaml_error(path, text, exc)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    return dict(_expand_env(data, path, ""))


# A quoted fragment of PyYAML's problem text: one character ('\t') or file content.
_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")


def _one_character(fragment: re.Match[str]) -> str:
    """Keep a quoted single character (a tab, a stray ':'); hide longer file content."""
    try:
        shown = ast.literal_eval(fragment.group())
    except (ValueError, SyntaxError):
        shown = None
    return fragment.group() if isinstance(shown, str) and len(shown) == 1 else "'...'"


def _yaml_error(path: Path, text: str, exc: yaml.YAMLError) -> str:
    """Where and why a file is not valid YAML, without showing the line.

    PyYAML's own message quotes the offending line, and a line of a config file may
    hold a password: this names the file, the line, the column and the problem only.
    """
    line: int | None = None
    column: int | None = None
    problem = type(exc).__name__
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        line, column = exc.problem_mark.line + 1, exc.problem_mark.column + 1
        problem = exc.problem or problem
        start = exc.context_mark
        if exc.context and start is not None:
            # An unclosed quote is found at the end of the file: say where it began.
            where = f"line {start.line + 1}, column {start.column + 1}"
            problem += f" ({exc.context} begun at {where})"
    elif isinstance(exc, yaml.reader.ReaderError):
        line = text[: exc.position].count("\n") + 1
        problem = "a control character is not allowed in YAML"
    where = f" at line {line}" if line else ""
    where += f", column {column}" if column else ""
    return (
        f"{path}: not valid YAML{where}: {_QUOTED.sub(_one_character, problem)}. "
        "Fix the syntax there (a value holding ': ', ' #', or starting with a special "
        "character such as *, &, !, %, @ or a quote needs quotes around it); the line is "
        "not shown, since it may hold a secret"
    )


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _origin(key_path: tuple[Any, ...], layers: list[tuple[Path, dict[str, Any]]]) -> Path:
    """The last file that set a key, so the error names the file to edit."""
    for path, data in reversed(layers):
        node: Any = data
        for part in key_path:
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                break
        else:
            return Path(path)
    return Path(layers[-1][0])


def load_pipeline(name: str, conf_dir: str | Path = "conf") -> PipelineConfig:
    """Load, merge and validate a pipeline's configuration.

    The pipeline's tables are checked against those of the other pipelines of the
    directory (`strata.namespace`): a place or metastore name two of them claim is
    refused, naming both owners and the keys that part them.

    Args:
        name: Pipeline name; the file `conf_dir/pipelines/NAME.yaml` must exist.
            `NAME:TABLE` names one table of a pipeline that routes its topics to
            tables (see `RoutingConfig`).
        conf_dir: The configuration directory.

    Returns:
        The validated configuration, with environment overrides applied.

    Raises:
        ConfigError: With the file, the key and the fix, if anything is wrong.
    """
    if ":" in name:
        parent, table = name.split(":", 1)
        cfg = load_pipeline(parent, conf_dir)
        if not cfg.routed:
            raise ConfigError(
                f"pipeline {parent} does not route its topics to tables (no `routing` key); "
                f"name it as {parent}"
            )
        routed = cfg.route(table)
        found = Namespace(cfg.neighbours).clashes(routed.owned_tables())
        if found:
            raise ConfigError(f"pipeline {parent}, table {table}: " + "\n  ".join(found))
        return routed
    loaded = load_pipelines(conf_dir, [name])[name]
    if isinstance(loaded, ConfigError):
        raise loaded
    return loaded


def load_pipelines(
    conf_dir: str | Path = "conf", names: list[str] | None = None
) -> dict[str, PipelineConfig | ConfigError]:
    """Load several pipelines of a directory, each file read once, each checked against all.

    Args:
        conf_dir: The configuration directory.
        names: The pipelines wanted; every pipeline of the directory by default.

    Returns:
        Per pipeline wanted, its configuration, or the error that names its file, the
        key and the fix (a clash with another pipeline's tables among them).
    """
    every = list_pipelines(conf_dir)
    wanted = every if names is None else names
    loaded: dict[str, PipelineConfig | ConfigError] = {}
    # The others are read too, to check the wanted ones' tables against theirs; one that
    # does not load is left out here (its own load names its problem).
    for name in dict.fromkeys([*wanted, *every]):
        try:
            loaded[name] = _load_file(name, conf_dir)
        except ConfigError as exc:
            loaded[name] = exc
    tables = {
        name: cfg.every_table() for name, cfg in loaded.items() if isinstance(cfg, PipelineConfig)
    }
    out: dict[str, PipelineConfig | ConfigError] = {}
    for name in wanted:
        cfg = loaded[name]
        if isinstance(cfg, ConfigError):
            out[name] = cfg
            continue
        neighbours = tuple(t for other, ts in tables.items() if other != name for t in ts)
        found = Namespace(neighbours).clashes(tables[name])
        if found:
            file = Path(conf_dir).resolve() / "pipelines" / f"{name}.yaml"
            out[name] = ConfigError(
                f"{file}: the tables of pipeline {name} clash with another pipeline's of "
                f"{file.parent}:\n  " + "\n  ".join(found)
            )
            continue
        cfg._neighbours = neighbours
        out[name] = cfg
    return out


def _load_file(name: str, conf_dir: str | Path) -> PipelineConfig:
    """Load, merge and validate one pipeline's files (see `load_pipeline`)."""
    conf = Path(conf_dir).resolve()
    pipeline_file = conf / "pipelines" / f"{name}.yaml"
    if not pipeline_file.is_file():
        known = sorted(p.stem for p in (conf / "pipelines").glob("*.yaml"))
        raise ConfigError(
            f"{pipeline_file}: no such pipeline file; known pipelines: {', '.join(known) or 'none'}"
        )
    layers: list[tuple[Path, dict[str, Any]]] = []
    defaults = conf / "strata.yaml"
    if defaults.is_file():
        layers.append((defaults, _read_yaml(defaults)))
    layers.append((pipeline_file, _read_yaml(pipeline_file)))
    local = conf / "local"
    if local.is_dir():
        for extra in sorted(local.glob("*.yaml")):
            layers.append((extra, _read_yaml(extra)))
    merged: dict[str, Any] = {}
    for _, data in layers:
        # Every layer's, as a secret a later file overrides may still sit in a message.
        remember_secrets(data)
        merged = _merge(merged, data)
    merged.setdefault("name", name)
    if merged["name"] != name:
        raise ConfigError(
            redact(
                f"{pipeline_file}: key `name` is {merged['name']!r} but the file is named "
                f"{name!r}; make them match or drop the key"
            )
        )
    # Relative paths in config are relative to the project root (conf's parent).
    root = conf.parent
    merged["schemas_dir"] = str((root / merged.get("schemas_dir", "schemas")).resolve())
    warehouse = os.environ.get(ENV_WAREHOUSE) or merged.get("warehouse", "warehouse")
    if "://" not in warehouse:
        warehouse = str((root / warehouse).resolve())
    merged["warehouse"] = warehouse
    if os.environ.get(ENV_METASTORE):
        merged["metastore"] = {**merged.get("metastore", {}), "uri": os.environ[ENV_METASTORE]}
    if os.environ.get(ENV_BOOTSTRAP):
        merged.setdefault("kafka", {})
        merged["kafka"] = {**merged["kafka"], "bootstrap_servers": os.environ[ENV_BOOTSTRAP]}
    remember_secrets(merged)  # the overrides' too
    try:
        return PipelineConfig.model_validate(merged)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            key = ".".join(str(p) for p in loc) or "(top level)"
            # A check across keys (loc `()`) belongs to the pipeline's own file.
            origin = _origin(loc, layers) if loc else pipeline_file
            fix = _fix_hint(err)
            # A validator's message may quote the value it refused (a URL with a password).
            lines.append(redact(f"{origin}: key `{key}`: {err['msg']}{fix}"))
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines)) from None


def _fix_hint(err: Any) -> str:  # noqa: ANN401 - pydantic's ErrorDetails
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return "; remove it or check its spelling against the README's configuration reference"
    if kind == "missing":
        return "; add it (see the README's configuration reference)"
    if kind == "literal_error":
        return ""
    return ""


def list_pipelines(conf_dir: str | Path = "conf") -> list[str]:
    """Names of every pipeline configured under `conf_dir/pipelines`."""
    return sorted(p.stem for p in (Path(conf_dir) / "pipelines").glob("*.yaml"))
