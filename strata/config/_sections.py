"""The configuration's sections (Kafka, event time, limits, quality, ...), each one typed model.

Every model is strict (`extra="forbid"`), frozen, and shows no credential in its repr
(`strata.config.secrets`); the services a pipeline talks to over the network are
in `_services`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from strata.config._checks import Duration, Zone, is_name, valid_name
from strata.config.secrets import masked
from strata.durations import parse_duration_ms


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


# The presets Airflow's `DAG(schedule=...)` takes besides a cron expression
# (`airflow.sdk.definitions.timetables._cron.CRON_PRESETS`, `@once`, `@continuous`).
_SCHEDULE_PRESETS = (
    "@once",
    "@continuous",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "@quarterly",
    "@yearly",
)
_MONTHS = tuple("jan feb mar apr may jun jul aug sep oct nov dec".split())
_WEEKDAYS = tuple("sun mon tue wed thu fri sat".split())
# Each field of a cron expression: its name, its lowest and highest value, its names.
_CRON_FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _WEEKDAYS),
)
_CRON_ITEM = re.compile(r"^(?:(\*|\?)|(\w+)(?:-(\w+))?)(?:/(\d+))?$")
SCHEDULE_RULE = (
    "write a duration (30s, 15m), one of " + ", ".join(_SCHEDULE_PRESETS) + ", or a cron "
    "expression of five fields (minute hour day-of-month month day-of-week, e.g. '*/5 * * * *')"
)


def _cron_value(text: str, low: int, high: int, names: tuple[str, ...]) -> int | None:
    if text.lower() in names:
        return names.index(text.lower()) + low
    return int(text) if text.isascii() and text.isdigit() and low <= int(text) <= high else None


def _is_duration(schedule: str) -> bool:
    # A cron expression has five fields: one word starting with a digit is a duration.
    return schedule[:1].isdigit() and " " not in schedule


def _cron_problem(expression: str) -> str | None:
    """What is wrong with a five-field cron expression, or None if Airflow will take it.

    Airflow parses cron with croniter, which is Airflow's dependency and not the
    product's: this is the part of croniter's grammar a schedule needs (numbers and
    names, `*`, ranges, steps, lists; `?` in the day fields), checked the same way,
    so that a schedule the DAG would refuse fails when the configuration loads.
    """
    fields = expression.split()
    if len(fields) != 5:
        return f"it has {len(fields)} fields, not 5"
    for text, (field, low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        for item in text.split(","):
            match = _CRON_ITEM.match(item)
            if match is None:
                return f"the {field} field {text!r} is not a list of values, ranges and steps"
            wildcard, first, last, step = match.groups()
            if wildcard == "?" and field not in ("day of month", "day of week"):
                return f"'?' stands only for a day of month or of week, not the {field}"
            for value in (first, last):
                if value is not None and _cron_value(value, low, high, names) is None:
                    return f"the {field} {value!r} is not between {low} and {high}"
            if step is not None and int(step) == 0:
                return f"the {field} field {text!r} steps by 0"
    return None


def _valid_schedule(value: str) -> str:
    """A schedule of the ingest DAG: a duration, an Airflow preset or a cron expression."""
    text = value.strip()
    if text.startswith("@"):
        if text not in _SCHEDULE_PRESETS:
            raise ValueError(f"{value!r} is not a schedule preset; {SCHEDULE_RULE}")
        return text
    if _is_duration(text):
        try:
            ms = parse_duration_ms(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a schedule; {SCHEDULE_RULE}") from None
        if ms < 1000:
            raise ValueError(f"{value!r} is under a second; schedule runs at least 1s apart")
        return text
    problem = _cron_problem(text)
    if problem is not None:
        raise ValueError(f"{value!r} is not a schedule: {problem}; {SCHEDULE_RULE}")
    return text


class AirflowConfig(_Strict):
    """How Airflow schedules and runs the pipeline.

    Attributes:
        schedule: When the ingest DAG runs: a duration between the starts of runs
            (`30s`, `15m`; for less than the minute a cron expression allows), a
            preset (`@hourly`, `@daily`, `@once`, `@continuous`...) or a cron
            expression of five fields (`*/5 * * * *`). Checked at load. Runs never
            overlap: a run due while one is running starts after it.
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

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: str) -> str:
        return _valid_schedule(value)

    @property
    def dag_schedule(self) -> str | timedelta:
        """The schedule as Airflow's `DAG(schedule=...)` takes it: a duration as a timedelta."""
        if _is_duration(self.schedule):
            return timedelta(milliseconds=parse_duration_ms(self.schedule))
        return self.schedule

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


class CompletenessConfig(_Strict):
    """When an event-time partition (`dt=`/`hr=`) is complete: it will not change any more.

    Each Kafka partition read has a low-water event time: the newest event time read
    from it. After each ingest batch the watermark is the lowest of them, leaving out
    a partition that was read to its end when its batch was planned and has read
    nothing in a later batch (an idle one); it never goes back. A partition of the
    table is marked complete after the first batch whose watermark is past its end by
    `lateness`, unless a failed quality gate marked it incomplete. Rows that arrive
    for it afterwards still land, and are counted and reported as late after
    completion (see `strata.catalog.completeness`).

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
            valid_name(table, f"table (of topic {topic!r})")
        return value

    @field_validator("table")
    @classmethod
    def _template(cls, value: str) -> str:
        if not is_name(value.replace("{topic}", "t")):
            raise ValueError(
                f"{value!r} is not a table-name template; use lower-case letters, digits, '_' "
                "and {topic}, e.g. '{topic}' or 'raw_{topic}'"
            )
        return value

    def table_for(self, topic: str) -> str:
        """The table a topic lands in."""
        if topic in self.tables:
            return self.tables[topic]
        return _table_name(self.table, topic)


@lru_cache(maxsize=65_536)
def _table_name(template: str, topic: str) -> str:
    """The table `template` names for a topic (asked for every topic by every table)."""
    plain = re.sub(r"[^a-z0-9_]", "_", topic.lower())
    name = template.replace("{topic}", plain)
    return name if is_name(name) else f"t_{name}"[:63]


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
