"""The pipeline's configuration: one typed model of every key, and where each table lives.

A table of a routed pipeline is a pipeline of its own (`PipelineConfig.route`). Every
table a pipeline owns has one owner by place and by name, checked when it loads
(`strata.store.places`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from strata.config._checks import (
    NAME_RULE,
    Duration,
    is_name,
    starting_point,
    topic_pattern,
    valid_name,
    valid_topic,
)
from strata.config._sections import (
    AirflowConfig,
    CompletenessConfig,
    EventTimeConfig,
    KafkaConfig,
    LimitsConfig,
    MaintenanceConfig,
    PartitioningConfig,
    QualityConfig,
    RoutingConfig,
    SparkConfig,
    _Strict,
)
from strata.config._services import (
    MetastoreConfig,
    MetricsConfig,
    SchemaRegistryConfig,
    TrinoConfig,
)
from strata.config._specs import Decoding, KafkaSource, SchemaSpec
from strata.config.secrets import redact
from strata.durations import parse_duration_ms
from strata.errors import ConfigError
from strata.store.places import (
    NAME_SUFFIXES,
    TABLE_ROLES,
    Namespace,
    OwnedTable,
    Places,
    Role,
    StatePlaces,
    TableRef,
)

MetastoreTable = Literal["table", "raw", "quarantine", "ledger"]
"""The tables registered in the metastore: a batch's three, and the ledger."""
Location = Literal["table", "raw", "quarantine", "ledger", "state", "quality"]
"""Everything of a pipeline's that has a place in the warehouse."""


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
        table_format: `delta` (default), `parquet`: plain Hive-style Parquet
            directories for the data, raw and quarantine tables, for Presto/Hive-only
            shops, or `iceberg`: Iceberg tables in the Hive Metastore's catalog
            (`metastore.uri`), partitioned by identity `dt`/`hr` columns. The ledger
            stays Delta and its commit is the batch's commit point.
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
        on_tombstone: What a tombstone (a message with a null value, which a compacted
            topic's producer sends to delete a key) does in an append pipeline:
            `quarantine` (default) puts it in the quarantine table with its key;
            `skip` leaves it out of every table but the raw copy and counts it, per
            partition, in the ledger and the run summary; `fail` stops the batch before
            anything is committed, naming the partition and offset. Changing it is
            allowed on a batch that committed nothing yet.
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
    # Its places and names (`places`), built on first use.
    _places: Places | None = PrivateAttr(default=None)
    # Each table of a routed pipeline, once configured: the namespace checks at load and
    # every command on the tables ask for the same hundreds of tables again.
    _routes: dict[str, PipelineConfig] = PrivateAttr(default_factory=dict)

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
    table_format: Literal["delta", "parquet", "iceberg"] = "delta"
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
    on_tombstone: Literal["quarantine", "skip", "fail"] = "quarantine"
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
        return valid_name(value, "pipeline")

    @field_validator("topics")
    @classmethod
    def _topics(cls, value: list[str]) -> list[str]:
        for topic in value:
            valid_topic(topic)
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
    def _topics_or_pattern(self, info: ValidationInfo) -> PipelineConfig:
        if info.context and info.context.get("taken_off") and not self.topics:
            # A routed table whose listed topics were all taken off the list: it reads
            # nothing, and its tables, ledger and status stay (`route`).
            return self
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

    def schemas(self) -> SchemaSpec:
        """What this pipeline's table schemas are made from (see `SchemaSpec`)."""
        return SchemaSpec(
            self.schema_path,
            self.schema_text,
            self.format,
            self.table_format,
            self.metastore.uri is not None,
            self.partitioning,
        )

    def decoding(self) -> Decoding:
        """Everything that decides whether and where a message lands (see `Decoding`)."""
        return Decoding(
            self.schemas(),
            self.event_time,
            self.schema_id,
            self.schema_registry,
            self.schema_file,
            self.reads_schema_file,
            self.on_tombstone,
        )

    def source(self) -> KafkaSource:
        """The brokers this pipeline (or routed table) reads, which topics, its group."""
        return KafkaSource(
            self.name,
            self.kafka,
            self.group_id,
            tuple(self.topics),
            self.topics_pattern,
            self.routing if self._route_of is not None else None,
            self.name if self._route_of is not None else None,
            self.starting_offsets,
        )

    def reads_topic(self, topic: str) -> bool:
        """Whether this pipeline reads a topic: listed in `topics`, or matched by the pattern.

        A table of a routed pipeline reads only the topics routed to it.
        """
        return self.source().reads(topic)

    @property
    def topics_description(self) -> str:
        """The pipeline's topics in words, for messages."""
        return self.source().description

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

    def route(self, table: str, *, taken_off: bool = False) -> PipelineConfig:
        """The configuration of one table of a routed pipeline.

        It is a pipeline of its own named by the table: its topics are those routed to
        it, `{table}` in the locations and `schema_file` is filled in, its state lives
        under the routed pipeline's, and it publishes to the routed pipeline's group.

        Args:
            table: The table's name.
            taken_off: The table is one the pipeline ran before (`strata.edge
                .table_configs` knows), whose listed topics may all have been taken off
                `topics` since: then it is configured reading no topic, for the commands
                that look at what it holds (`status`, `register`, `compact`, ...).

        Returns:
            The table's configuration, validated as a pipeline.

        Raises:
            ConfigError: Naming the table, if it does not make a valid pipeline.
        """
        if not self.routed or self.routing is None:
            raise ConfigError(f"pipeline {self.name} does not route its topics to tables")
        if not is_name(table):
            raise ConfigError(f"{table!r} is not a table name; {NAME_RULE}")
        if table not in self._routes:
            self._routes[table] = self._configure_route(table, taken_off)
        return self._routes[table]

    def _configure_route(self, table: str, taken_off: bool) -> PipelineConfig:
        """The configuration of one table of this routed pipeline, made anew (`route`)."""
        assert self.routing is not None  # noqa: S101 - `route` checked it
        data = self.model_dump(exclude_unset=False)
        data["name"] = table
        if self.topics:
            data["topics"] = [t for t in self.topics if self.routing.table_for(t) == table]
            if not data["topics"] and not taken_off:
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
            return PipelineConfig.model_validate(
                data, context={"route_of": self.name, "taken_off": taken_off}
            )
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
    def _column_names(self) -> PipelineConfig:
        # Refused here, before any command writes a file: a field Hive, Trino and Delta
        # take for a partition column or another field (`name_clashes`) would break the
        # table at its first commit, or land a table whose partitions queries misread.
        if self.routed and "{table}" in self.schema_file:
            return self  # each table has its own, checked when it is routed to
        import json

        from strata.schema.names import name_clashes

        try:
            document = json.loads(self.schema_text)
        except ValueError:
            return self  # not JSON: the schema check names the file and the problem
        field = self.partitioning.field
        clashes = name_clashes(document, [] if field is None else [field.column])
        if clashes:
            raise ValueError(f"{self.schema_path}: {clashes}")
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

    @model_validator(mode="after")
    def _iceberg_catalog(self) -> PipelineConfig:
        if self.table_format == "iceberg" and self.metastore.uri is None:
            raise ValueError(
                "table_format iceberg keeps its tables in the Hive Metastore's catalog, and "
                "no metastore is set: set metastore.uri (or STRATA_METASTORE_URI) to "
                "thrift://host:9083, or use table_format delta"
            )
        return self

    def shared_storage_error(self, master: str) -> str | None:
        """Why this pipeline's tables cannot be written by executors of `master`, or None."""
        return self.places().shared_storage_error(master)

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

    def places(self) -> Places:
        """Every place and name of this pipeline (or routed table), built once per copy.

        The one owner of where its tables and state live, what they are called and how
        they are reached (`strata.store.places`): the modules below the conductor take
        it instead of the configuration.
        """
        if self._places is None:
            fmt = self.table_format
            options = dict(self.storage_options)
            uri = self.metastore.uri
            metastore = None if uri is None else (uri, self.metastore.database)
            refs: dict[Role, TableRef] = {
                role: TableRef(
                    self.location(role),
                    "delta" if role == "ledger" else fmt,
                    options,
                    self.name + NAME_SUFFIXES[role],
                    metastore,
                )
                for role in TABLE_ROLES
            }
            state = StatePlaces(
                self.location("state"),
                options,
                self.lock_path,
                parse_duration_ms(self.lock_lease) / 1000,
                self.lock_dir,
            )
            self._places = Places(self.name, self._route_of, fmt, refs, state, metastore)
        return self._places

    def owned_tables(self, topics: Iterable[str] = ()) -> list[OwnedTable]:
        """This pipeline's (or routed table's) five tables and state, placed and named.

        Args:
            topics: For a routed table, the topics routed to it (for messages).
        """
        return self.places().owned(topics)

    def every_table(self) -> list[OwnedTable]:
        """Every table this configuration names now, each routed table's too.

        A routed pipeline's tables are those of its listed topics; a pattern's topics
        are known only on the brokers, and are checked as each run lists them
        (`strata.operations.routes`). A listed topic's table that is not a valid pipeline is left
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

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> PipelineConfig:
        """A copy; one with keys changed (`update`) builds its places anew.

        Args:
            update: Keys whose values the copy takes instead.
            deep: Copy nested values too.

        Returns:
            The copy.
        """
        copy = super().model_copy(update=update, deep=deep)
        # Its own record of its tables: a copy with keys changed makes them anew.
        copy._routes = {} if update else dict(self._routes)
        if update:
            # A changed key (the warehouse, a location, the table format, the metastore)
            # may move a table: the places this configuration built are not the copy's.
            copy._places = None
        return copy

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

        Its events announce the partitions that became complete (`strata.catalog.completeness`);
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
        (`strata.store.lease`), and `lock_dir` is not used.
        """
        state = self.location("state")
        if "://" in state:
            return None
        if self.lock_dir:
            return Path(self.lock_dir) / f"{self.name}.lock"
        return Path(state) / "run.lock"


def _resolve(root: str, location: str) -> str:
    if "://" in location or location.startswith("/"):
        return location.rstrip("/")
    if "://" in root:
        return f"{root.rstrip('/')}/{location}"
    return str((Path(root) / location).resolve())
