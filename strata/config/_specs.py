"""What the configuration hands down: values built from it once, taken instead of it.

Below the entry points and the conductor, no function takes the whole configuration:
it takes the places of its tables (`strata.store.places.Places`), one of these
values, a section, or plain values. Each is built by a method of `PipelineConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from strata.config._checks import starting_point, topic_pattern
from strata.config._sections import (
    EventTimeConfig,
    KafkaConfig,
    PartitioningConfig,
    RoutingConfig,
)
from strata.config._services import SchemaRegistryConfig


@dataclass(frozen=True)
class KafkaSource:
    """The brokers a pipeline reads, which of their topics, and its consumer group.

    Built once per pipeline (`PipelineConfig.source`); what the Kafka side of a run
    (`strata.batch.kafka`) takes instead of the whole configuration.

    Attributes:
        pipeline: The pipeline's (or routed table's) name, for messages.
        kafka: How to reach the brokers.
        group_id: The consumer group the committed end offsets are published to.
        topics: The topics listed by name (empty with a pattern).
        pattern: `topics_pattern`, or None.
        routing: The routing of a routed pipeline's table, or None.
        table: For a table of a routed pipeline, its name: it reads only the topics
            routed to it.
        starting_offsets: Where a topic never read before starts (`starting_offsets`).
    """

    pipeline: str
    kafka: KafkaConfig
    group_id: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    routing: RoutingConfig | None = None
    table: str | None = None
    starting_offsets: str = "earliest"

    def reads(self, topic: str) -> bool:
        """Whether the pipeline reads a topic: listed, or matched by the pattern.

        A table of a routed pipeline reads only the topics routed to it.
        """
        return self.matches(topic) and self.routes_here(topic)

    def matches(self, topic: str) -> bool:
        """Whether a topic is listed, or matched by the pattern, whatever table it routes to."""
        if self.pattern is None:
            return topic in self.topics
        matcher = topic_pattern(self.pattern)
        return not topic.startswith("__") and matcher.fullmatch(topic) is not None

    def routes_here(self, topic: str) -> bool:
        """Whether a topic the pipeline matches lands here: for a routed table, in it."""
        if self.table is None or self.routing is None:
            return True
        return self.routing.table_for(topic) == self.table

    @property
    def description(self) -> str:
        """The pipeline's topics in words, for messages."""
        if self.pattern is None:
            return ", ".join(self.topics)
        return f"the topics matching {self.pattern!r}"

    @property
    def starting_ms(self) -> int | None:
        """The moment new topics start at, in epoch ms; None for `earliest` or `latest`."""
        return starting_point(self.starting_offsets)[1]


@dataclass(frozen=True)
class SchemaSpec:
    """What a pipeline's table schemas are made from, and what they must be held in.

    Built per configuration (`PipelineConfig.schemas`): the Avro schema a batch reads
    with (a plan's own, or `schema_file`'s), and the settings that decide whether its
    fields can be read and held (`strata.schema.avro.load_pipeline_schema`).

    Attributes:
        path: The schema file, for messages.
        text: The Avro schema, as JSON text.
        format: `json`, `avro` or `confluent_avro`.
        table_format: `delta`, `parquet` or `iceberg`.
        registered: Whether the tables are registered in a metastore (Hive's and
            Trino's types then bound them too).
        partitioning: The data table's partitioning.
    """

    path: Path
    text: str
    format: str
    table_format: str
    registered: bool
    partitioning: PartitioningConfig


@dataclass(frozen=True)
class Decoding:
    """Everything that decides whether and where a message lands (`PipelineConfig.decoding`).

    Attributes:
        schemas: The Avro schema read with, and what the tables hold it in.
        event_time: Where the event time is and which values are believable.
        schema_id: For `confluent_avro`, the id `schema_file` is registered under.
        registry: The Schema Registry writer schemas come from.
        schema_file: `schema_file` as configured, for reasons.
        reads_schema_file: Whether `schemas` holds `schema_file`'s schema as loaded;
            only then are messages written with `schema_id` read without asking the
            registry (`PipelineConfig.reads_schema_file`).
        tombstones: What a null value does (`on_tombstone`): `quarantine`, `skip` or
            `fail`. Not part of the plan's fingerprint: a batch that committed nothing
            may finish under another rule, and one partly committed is held to the
            counts its commits recorded (`strata.batch.reconcile.reconcile_resumed`).
    """

    schemas: SchemaSpec
    event_time: EventTimeConfig
    schema_id: int | None
    registry: SchemaRegistryConfig
    schema_file: str = ""
    reads_schema_file: bool = True
    tombstones: Literal["quarantine", "skip", "fail"] = "quarantine"

    def reading(self, text: str) -> Decoding:
        """These settings reading with another Avro schema (`PipelineConfig.with_schema_text`).

        Args:
            text: The Avro schema, as JSON text.

        Returns:
            A copy; `reads_schema_file` holds only while the text is the same.
        """
        return replace(
            self,
            schemas=replace(self.schemas, text=text),
            reads_schema_file=self.reads_schema_file and text == self.schemas.text,
        )
