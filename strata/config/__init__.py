"""Pipeline configuration: one YAML file per pipeline, validated by one typed model.

The package publishes what the rest of Strata uses; its modules are internal:

- `_model`: `PipelineConfig`, every key of a pipeline, and where each table lives;
- `_sections`, `_services`: the sections' models (Kafka, limits, ...; the metastore,
  Trino, the Schema Registry, the Pushgateway);
- `_checks`: the rules values are checked by (names, topics, URLs, credentials);
- `_specs`: the values the configuration hands down (the Kafka source, the schemas,
  the decoding) to modules that take them instead of it;
- `_load`: YAML in layers, environment variables, errors naming file, key and fix;
- `secrets`: what is a credential, and the one redaction of all text and logs.
"""

from strata.config._checks import (
    NAME_RULE,
    is_name,
    starting_point,
    topic_pattern,
    valid_name,
)
from strata.config._load import (
    ENV_BOOTSTRAP,
    ENV_METASTORE,
    ENV_WAREHOUSE,
    list_pipelines,
    load_pipeline,
    load_pipelines,
)
from strata.config._model import Location, MetastoreTable, PipelineConfig
from strata.config._sections import (
    VACUUM_FLOOR,
    AirflowConfig,
    CompletenessConfig,
    EventTimeConfig,
    ExpectationConfig,
    FieldPartitionConfig,
    KafkaConfig,
    LimitsConfig,
    MaintenanceConfig,
    PartitioningConfig,
    QualityConfig,
    RangeRule,
    RoutingConfig,
    SparkConfig,
)
from strata.config._services import (
    MetastoreConfig,
    MetricsConfig,
    SchemaRegistryConfig,
    TrinoConfig,
)
from strata.config._specs import Decoding, KafkaSource, SchemaSpec
from strata.store.places import TableName

__all__ = [
    "ENV_BOOTSTRAP",
    "ENV_METASTORE",
    "ENV_WAREHOUSE",
    "NAME_RULE",
    "VACUUM_FLOOR",
    "AirflowConfig",
    "CompletenessConfig",
    "Decoding",
    "EventTimeConfig",
    "ExpectationConfig",
    "FieldPartitionConfig",
    "KafkaConfig",
    "KafkaSource",
    "LimitsConfig",
    "Location",
    "MaintenanceConfig",
    "MetastoreConfig",
    "MetastoreTable",
    "MetricsConfig",
    "PartitioningConfig",
    "PipelineConfig",
    "QualityConfig",
    "RangeRule",
    "RoutingConfig",
    "SchemaRegistryConfig",
    "SchemaSpec",
    "SparkConfig",
    "TableName",
    "TrinoConfig",
    "is_name",
    "list_pipelines",
    "load_pipeline",
    "load_pipelines",
    "starting_point",
    "topic_pattern",
    "valid_name",
]
