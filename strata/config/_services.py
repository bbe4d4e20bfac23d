"""The sections of the services a pipeline calls: metastore, Trino, registry, Pushgateway.

Their URLs are checked by one rule (`service_url`) that never quotes a URL back, and
credentials cross the network only over https, or to this machine where allowed.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from strata.config._checks import (
    basic_auth,
    credentials_over_http,
    pem_file,
    service_url,
    valid_name,
)
from strata.config._sections import _Strict
from strata.config.secrets import redact


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
        return valid_name(value, "database")


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
        delta_catalog: Trino catalog for Delta tables (the ledger of every pipeline).
        iceberg_catalog: Trino catalog for Iceberg tables (`table_format: iceberg`).
        register_delta_tables: Call `register_table` for Delta (and Iceberg) tables.
            Only needed when Trino's Delta (and Iceberg) catalogs use another metastore
            than `metastore.uri`; a run re-registers an Iceberg table that metastore
            holds at an older snapshot (it keeps the one registered).
        timeout_s: Bound on each statement.
    """

    url: str | None = None
    user: str = "strata"
    password: str | None = None
    access_token: str | None = None
    ca_file: str | None = None
    hive_catalog: str = "hive"
    delta_catalog: str = "delta"
    iceberg_catalog: str = "iceberg"
    register_delta_tables: bool = False
    timeout_s: float = Field(default=60.0, gt=0)

    def catalog_for(self, table_format: str) -> str:
        """The Trino catalog that reads a pipeline's data tables of this format."""
        return {"delta": self.delta_catalog, "iceberg": self.iceberg_catalog}.get(
            table_format, self.hive_catalog
        )

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
        return pem_file(value, "the Trino coordinator's")

    @field_validator("hive_catalog", "delta_catalog")
    @classmethod
    def _catalog(cls, value: str) -> str:
        return valid_name(value, "catalog")

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
        return pem_file(value, "the registry's")

    @model_validator(mode="after")
    def _credentials(self) -> SchemaRegistryConfig:
        basic_auth("schema_registry", self.username, self.password)
        credentials_over_http(
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
        basic_auth("metrics", self.username, self.password)
        if self.username is not None and self.pushgateway is None:
            raise ValueError(
                "metrics has credentials but no pushgateway; add metrics.pushgateway or remove them"
            )
        credentials_over_http(
            "metrics",
            "pushgateway",
            self.pushgateway,
            self.password is not None,
            self.allow_http_on_loopback,
        )
        return self
