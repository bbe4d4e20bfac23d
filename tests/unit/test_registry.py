"""Confluent Avro with a Schema Registry: each message is read with its writer schema.

Against the local registry server (the REST subset Confluent's clients speak), with
confluent-kafka's `AvroSerializer` writing the messages and its `SchemaRegistryClient`
reading the writer schemas, so the real client code runs on both ends.
"""

from __future__ import annotations

import copy
import json
import struct
import uuid

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from strata.config import EventTimeConfig, PipelineConfig, SchemaRegistryConfig, load_pipeline
from strata.decode import DecodeRules, decode_chunk
from strata.errors import ConfigError, SchemaRegistryUnavailable
from strata.local.schema_registry import LocalSchemaRegistry
from strata.local.service import free_port
from tests.conftest import REGISTRY_PASSWORD, REGISTRY_USER, ROOT
from tests.unit.test_config import GOOD as CONFIG
from tests.unit.test_config import _project as config_project
from tests.unit.test_decode import T0, raw, reasons_by_offset

READER = json.loads((ROOT / "schemas" / "clicks.avsc").read_text())


def writer_schema(drop: tuple[str, ...] = (), add: list[dict] | None = None, **retype) -> dict:
    """The table's schema with fields dropped, added or retyped, as a producer changes it."""
    schema = copy.deepcopy(READER)
    schema["fields"] = [f for f in schema["fields"] if f["name"] not in drop]
    for f in schema["fields"]:
        if f["name"] in retype:
            f["type"] = retype[f["name"]]
    schema["fields"] += add or []
    return schema


# v1 predates `country` (the reader's default, null, fills it); v2 adds `campaign`,
# which the table does not have (dropped).
V1 = writer_schema(drop=("country",))
V2 = writer_schema(add=[{"name": "campaign", "type": ["null", "string"], "default": None}])


def client(url: str, password: str = REGISTRY_PASSWORD) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": url, "basic.auth.user.info": f"{REGISTRY_USER}:{password}"})


def serializer(url: str, schema: dict) -> AvroSerializer:
    return AvroSerializer(client(url), json.dumps(schema), conf={"auto.register.schemas": True})


def click(i: int, **over) -> dict:
    record = {
        "event_id": f"e{i}",
        "user_id": i,
        "session_id": f"s{i}",
        "page": "/p",
        "referrer": None,
        "country": "DE",
        "device": "tablet",
        "latency_ms": i,
        "ts": T0 + i * 1000,
    }
    return {**record, **over}


def rules(url: str, password: str = REGISTRY_PASSWORD, schema_id: int | None = None):
    cfg = PipelineConfig(
        name="clicks",
        topics=["clicks"],
        format="confluent_avro",
        schema_file="clicks.avsc",
        schema_id=schema_id,
        schemas_dir=str(ROOT / "schemas"),
        event_time=EventTimeConfig(field="ts"),
        schema_registry=SchemaRegistryConfig(
            url=url, username=REGISTRY_USER, password=password, timeout_s=2
        ),
    )
    return DecodeRules.from_config(cfg)


def produce(url: str, schema: dict, record: dict, topic: str) -> bytes:
    ctx = SerializationContext(topic, MessageField.VALUE)
    value = serializer(url, schema)(record, ctx)
    assert value is not None
    return value


def schema_id(value: bytes) -> int:
    return struct.unpack(">I", value[1:5])[0]


def test_two_writer_versions_land_in_the_table_schema_correctly_typed(schema_registry):
    url, topic = schema_registry.url, f"t-{uuid.uuid4().hex[:8]}"
    v1 = [
        produce(url, V1, {k: v for k, v in click(i).items() if k != "country"}, topic)
        for i in (0, 2)
    ]
    v2 = [produce(url, V2, {**click(i), "campaign": "spring"}, topic) for i in (1, 3)]
    assert schema_id(v1[0]) != schema_id(v2[0])
    r = rules(url)

    out = decode_chunk(raw([v1[0], v2[0], v1[1], v2[1]]), r)

    assert out.quarantine.num_rows == 0
    assert out.rows.schema == r.out_schema and "campaign" not in out.rows.column_names
    rows = out.rows.to_pylist()
    assert [row["event_id"] for row in rows] == ["e0", "e1", "e2", "e3"]
    assert [row["country"] for row in rows] == [None, "DE", None, "DE"]
    assert [row["user_id"] for row in rows] == [0, 1, 2, 3]
    assert [row["device"] for row in rows] == ["tablet"] * 4
    assert [row["latency_ms"] for row in rows] == [0, 1, 2, 3]
    assert out.rows.column("latency_ms").type == pa.int32()
    assert out.rows.column("_event_time").to_pylist()[3].timestamp() * 1000 == T0 + 3000


def test_a_writer_schema_the_table_cannot_read_is_quarantined_with_its_id(schema_registry):
    url, topic = schema_registry.url, f"t-{uuid.uuid4().hex[:8]}"
    good = produce(url, V1, {k: v for k, v in click(0).items() if k != "country"}, topic)
    # `user_id` became a string; and a writer without `page`, which the table requires.
    retyped = produce(url, writer_schema(user_id="string"), click(1, user_id="u1"), f"{topic}-b")
    no_page = writer_schema(drop=("page",))
    missing = produce(
        url, no_page, {k: v for k, v in click(2).items() if k != "page"}, f"{topic}-c"
    )

    out = decode_chunk(raw([good, retyped, missing]), rules(url))

    assert out.rows.column("event_id").to_pylist() == ["e0"]
    reasons = reasons_by_offset(out)
    assert reasons[1].startswith(
        f"written with schema id {schema_id(retyped)}, which cannot be read as clicks.avsc: "
    )
    assert "string" in reasons[1] and "long" in reasons[1]
    assert reasons[2] == (
        f"written with schema id {schema_id(missing)}, which cannot be read as clicks.avsc: "
        "No default value for field page in strata.demo.Click"
    )


def test_an_id_the_registry_does_not_know_is_quarantined(schema_registry):
    url = schema_registry.url
    value = produce(url, V2, {**click(0), "campaign": None}, f"t-{uuid.uuid4().hex[:8]}")
    unknown = b"\x00" + struct.pack(">I", 999_999) + value[5:]

    out = decode_chunk(raw([value, unknown]), rules(url))

    assert out.rows.column("event_id").to_pylist() == ["e0"]
    assert reasons_by_offset(out) == {
        1: f"written with schema id 999999, which the Schema Registry at {url} does not know"
    }


def test_json_schema_and_protobuf_messages_are_quarantined_not_decoded(schema_registry):
    url, subject = schema_registry.url, f"t-{uuid.uuid4().hex[:8]}-value"
    proto = client(url).register_schema(
        subject, Schema('syntax = "proto3"; message Click { string event_id = 1; }', "PROTOBUF")
    )
    as_json = client(url).register_schema(f"{subject}-json", Schema('{"type": "object"}', "JSON"))
    # Bytes that the table's Avro schema would read: only the schema type tells.
    body = produce(url, READER, click(0), subject.replace("-value", "-avro"))[5:]
    values = [b"\x00" + struct.pack(">I", n) + body for n in (proto, as_json)]

    out = decode_chunk(raw(values), rules(url))

    assert out.rows.num_rows == 0
    assert reasons_by_offset(out) == {
        0: f"written with schema id {proto}, a PROTOBUF schema; Strata decodes Avro only",
        1: f"written with schema id {as_json}, a JSON schema; Strata decodes Avro only",
    }


def test_a_registry_that_cannot_be_reached_fails_the_chunk_and_quarantines_nothing():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    value = b"\x00" + struct.pack(">I", 5) + b"\x02"
    with pytest.raises(SchemaRegistryUnavailable) as err:
        decode_chunk(raw([value]), rules(url))
    text = str(err.value)
    assert text.startswith(f"the Schema Registry at {url} could not be reached for schema id 5")
    assert "no message was quarantined" in text and REGISTRY_PASSWORD not in text


def test_wrong_credentials_fail_the_chunk_and_say_which_setting_to_check(schema_registry):
    value = b"\x00" + struct.pack(">I", 77) + b"\x02"
    with pytest.raises(SchemaRegistryUnavailable) as err:
        decode_chunk(raw([value]), rules(schema_registry.url, password="not-the-password"))
    text = str(err.value)
    assert "refused the request for schema id 77 (HTTP 401" in text
    assert "schema_registry.password" in text and "not-the-password" not in text


def test_a_writer_schema_is_fetched_once_per_process_and_the_pinned_id_never():
    with LocalSchemaRegistry(username=REGISTRY_USER, password=REGISTRY_PASSWORD) as registry:
        url = registry.url
        topic = f"t-{uuid.uuid4().hex[:8]}"
        pinned = produce(url, READER, click(0), topic)
        other = produce(url, V2, {**click(1), "campaign": "x"}, f"{topic}-b")
        assert decode_chunk(raw([other]), rules(url)).rows.num_rows == 1
    # The registry is gone: a later task of this process still reads the id it
    # fetched, and the id of schema_file (schema_id) needs no registry at all.
    r = rules(url, schema_id=schema_id(pinned))
    out = decode_chunk(raw([pinned, other]), r)
    assert out.rows.column("event_id").to_pylist() == ["e0", "e1"]
    with pytest.raises(SchemaRegistryUnavailable):
        decode_chunk(raw([b"\x00" + struct.pack(">I", 12345) + pinned[5:]]), r)


def test_a_field_whose_logical_type_changed_is_quarantined_not_misread(schema_registry):
    url, topic = schema_registry.url, f"t-{uuid.uuid4().hex[:8]}"
    millis = writer_schema(ts={"type": "long", "logicalType": "timestamp-millis"})
    micros = writer_schema(ts={"type": "long", "logicalType": "timestamp-micros"})
    # Without logical types the two are the same schema: the number would be read as
    # milliseconds, a thousand times too far in the future.
    value = produce(url, micros, click(0, ts=T0 * 1000), topic)
    r = rules_for_reader(millis, url)

    out = decode_chunk(raw([value]), r)

    assert out.rows.num_rows == 0
    assert reasons_by_offset(out) == {
        0: f"written with schema id {schema_id(value)}, whose field `ts` is timestamp-micros "
        "where reader.avsc has timestamp-millis; its values would be misread"
    }


def rules_for_reader(reader: dict, url: str):
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    (folder / "reader.avsc").write_text(json.dumps(reader))
    cfg = PipelineConfig(
        name="clicks",
        topics=["clicks"],
        format="confluent_avro",
        schema_file="reader.avsc",
        schemas_dir=str(folder),
        event_time=EventTimeConfig(field="ts"),
        schema_registry=SchemaRegistryConfig(
            url=url, username=REGISTRY_USER, password=REGISTRY_PASSWORD
        ),
    )
    return DecodeRules.from_config(cfg)


def test_a_schema_registry_makes_schema_id_optional_and_bad_settings_fail_at_load(tmp_path):
    confluent = {**CONFIG, "format": "confluent_avro"}
    registry = {"url": "https://registry.internal:8081/", "username": "u", "password": "p"}
    cfg = load_pipeline(
        "clicks", config_project(tmp_path / "ok", {**confluent, "schema_registry": registry})
    )
    assert cfg.schema_id is None and cfg.schema_registry.url == "https://registry.internal:8081"
    with pytest.raises(ConfigError, match="needs `schema_id`.*or schema_registry.url"):
        load_pipeline("clicks", config_project(tmp_path / "none", confluent))
    bad = {
        "url": ({"url": "registry:8081"}, "`schema_registry.url`: .*write http://host:8081"),
        "userinfo": (
            {"url": "https://u:hunter22@registry:8081"},
            "`schema_registry.url`: .*url holds credentials",
        ),
        "half auth": ({"url": "http://r:1", "username": "u"}, "username is set without"),
        "ca over http": ({"url": "http://r:1", "ca_file": __file__}, "https url only"),
        "no ca file": (
            {"url": "https://r:1", "ca_file": "/no/such.pem"},
            "`schema_registry.ca_file`",
        ),
        "timeout": ({"url": "http://r:1", "timeout_s": 0}, "`schema_registry.timeout_s`"),
    }
    for case, (section, message) in bad.items():
        conf = config_project(
            tmp_path / case.replace(" ", "_"), {**confluent, "schema_registry": section}
        )
        with pytest.raises(ConfigError, match=message) as err:
            load_pipeline("clicks", conf)
        assert "clicks.yaml" in str(err.value) and "hunter22" not in str(err.value)
