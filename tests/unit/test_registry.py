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
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from strata.batch.decode import DecodeRules, decode_chunk
from strata.config import EventTimeConfig, PipelineConfig, SchemaRegistryConfig, load_pipeline
from strata.errors import ConfigError, SchemaRegistryUnavailable
from strata.local.schema_registry import LocalSchemaRegistry
from strata.local.service import free_port
from strata.schema import registry
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


def rules(
    url: str, password: str = REGISTRY_PASSWORD, schema_id: int | None = None, timeout_s: float = 2
):
    cfg = PipelineConfig(
        name="clicks",
        topics=["clicks"],
        format="confluent_avro",
        schema_file="clicks.avsc",
        schema_id=schema_id,
        schemas_dir=str(ROOT / "schemas"),
        event_time=EventTimeConfig(field="ts"),
        schema_registry=SchemaRegistryConfig(
            url=url,
            username=REGISTRY_USER,
            password=password,
            timeout_s=timeout_s,
            allow_http_on_loopback=True,
        ),
    )
    return DecodeRules.of_decoding(cfg.decoding())


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
            url=url, username=REGISTRY_USER, password=REGISTRY_PASSWORD, allow_http_on_loopback=True
        ),
    )
    return DecodeRules.of_decoding(cfg.decoding())


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


# What the registry says about a schema itself: references, bounds, the process's cache.


@pytest.fixture(autouse=True)
def _fresh_answers():
    """Each test asks afresh: a later registry may listen on a port an earlier one had."""
    registry._answers.clear()
    yield
    registry._answers.clear()


@pytest.fixture
def clock(monkeypatch):
    """The registry module's clock, moved by hand: `clock[0]` seconds."""
    now = [1_000.0]
    monkeypatch.setattr(registry, "_now", lambda: now[0])
    return now


_registering: dict[str, SchemaRegistryClient] = {}


def register(url: str, subject: str, schema: dict | str, refs=(), kind: str = "AVRO") -> int:
    """Register a schema with references given as (name, subject, version)."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    references = [SchemaReference(name, s, v) for name, s, v in refs]
    # One client per registry: a new one costs a TLS context, a chain has a thousand.
    if url not in _registering:
        _registering[url] = client(url)
    return _registering[url].register_schema(subject, Schema(text, kind, references))


def named(name: str, fields: list[dict] | None = None) -> dict:
    """A small record type other schemas refer to by name."""
    return {
        "type": "record",
        "name": name,
        "namespace": "strata.refs",
        "fields": fields or [{"name": "x", "type": "int"}],
    }


def optional(name: str, type_name: str) -> dict:
    return {"name": name, "type": ["null", f"strata.refs.{type_name}"], "default": None}


def referring(*type_names: str) -> dict:
    """The table's schema plus an optional field of each named type, all last."""
    return writer_schema(add=[optional(f"extra_{t.lower()}", t) for t in type_names])


def message(url: str, schema_id: int, extra_fields: int = 1) -> bytes:
    """A message of `referring(...)` with every extra field null (one 0 byte each)."""
    body = produce(url, READER, click(0), f"t-{uuid.uuid4().hex[:8]}")[5:]
    return b"\x00" + struct.pack(">I", schema_id) + body + b"\x00" * extra_fields


def chain(url: str, prefix: str, levels: int) -> tuple[str, str]:
    """Subjects `prefix-0` .. `prefix-(levels-1)`, each referring to the one before.

    Returns:
        The last subject and its type's name.
    """
    register(url, f"{prefix}-0", named("C0"))
    for k in range(1, levels):
        register(
            url,
            f"{prefix}-{k}",
            named(f"C{k}", [optional("prev", f"C{k - 1}")]),
            refs=[(f"strata.refs.C{k - 1}", f"{prefix}-{k - 1}", 1)],
        )
    return f"{prefix}-{levels - 1}", f"C{levels - 1}"


def test_a_reference_to_a_subject_the_registry_does_not_know_is_quarantined_then_asked_again(
    schema_registry, clock
):
    # A lagging registry follower: the schema names a subject it does not know yet.
    url, prefix = schema_registry.url, f"s-{uuid.uuid4().hex[:8]}"
    missing = f"{prefix}-gone"
    root = register(
        url, f"{prefix}-root", referring("Gone"), refs=[("strata.refs.Gone", missing, 1)]
    )
    good = produce(url, READER, click(0), prefix)
    bad = message(url, root)
    reason = (
        f"written with schema id {root}, which references version 1 of subject '{missing}'; "
        f"the Schema Registry at {url} answers 40401 (subject not found)"
    )

    out = decode_chunk(raw([good, bad]), rules(url))
    assert out.rows.column("event_id").to_pylist() == ["e0"]
    assert reasons_by_offset(out) == {1: reason}

    register(url, missing, named("Gone"))  # the follower catches up
    clock[0] += registry.NOT_FOUND_RETRY_S - 1
    assert reasons_by_offset(decode_chunk(raw([bad]), rules(url))) == {0: reason}
    clock[0] += 2
    out = decode_chunk(raw([bad]), rules(url))
    assert out.quarantine.num_rows == 0 and out.rows.column("event_id").to_pylist() == ["e0"]


def test_an_id_the_registry_does_not_know_yet_is_asked_again_after_the_bound(clock):
    with LocalSchemaRegistry(username=REGISTRY_USER, password=REGISTRY_PASSWORD) as local:
        url = local.url
        first = produce(url, READER, click(0), "t-first")
        assert schema_id(first) == 1  # a fresh registry: the next schema gets id 2
        # Written with V2 (a null `campaign` last), whose id the registry gives next.
        early = b"\x00" + struct.pack(">I", 2) + first[5:] + b"\x00"
        reason = f"written with schema id 2, which the Schema Registry at {url} does not know"
        assert reasons_by_offset(decode_chunk(raw([early]), rules(url))) == {0: reason}

        assert register(url, "t-second-value", V2) == 2
        clock[0] += registry.NOT_FOUND_RETRY_S - 1
        assert reasons_by_offset(decode_chunk(raw([early]), rules(url))) == {0: reason}
        clock[0] += 2
        out = decode_chunk(raw([early]), rules(url))
        assert out.quarantine.num_rows == 0 and out.rows.column("event_id").to_pylist() == ["e0"]


def test_references_are_followed_to_the_depth_bound_and_no_further(schema_registry):
    url, prefix = schema_registry.url, f"c-{uuid.uuid4().hex[:8]}"
    depth = registry.MAX_REFERENCE_DEPTH
    chain(url, prefix, depth + 1)
    # One root refers to the chain's level `depth` - 1 (its end is `depth` levels down),
    # another to level `depth` (its end is one level further).
    at_bound = register(
        url,
        f"{prefix}-a",
        referring(f"C{depth - 1}"),
        refs=[(f"strata.refs.C{depth - 1}", f"{prefix}-{depth - 1}", 1)],
    )
    past = register(
        url,
        f"{prefix}-b",
        referring(f"C{depth}"),
        refs=[(f"strata.refs.C{depth}", f"{prefix}-{depth}", 1)],
    )

    for _ in range(2):  # the same fate on a re-run
        registry._answers.clear()
        out = decode_chunk(raw([message(url, at_bound), message(url, past)]), rules(url))
        assert out.rows.column("event_id").to_pylist() == ["e0"]
        assert reasons_by_offset(out) == {
            1: f"written with schema id {past}, whose references nest deeper than {depth} "
            f"levels (version 1 of subject '{prefix}-0' is at level {depth + 1}); Strata "
            f"follows at most {depth}"
        }


def test_a_reference_chain_deeper_than_the_recursion_limit_is_walked_without_recursion(
    schema_registry, monkeypatch
):
    import sys

    levels = sys.getrecursionlimit() + 200
    monkeypatch.setattr(registry, "MAX_REFERENCE_DEPTH", levels)
    monkeypatch.setattr(registry, "MAX_REFERENCES", levels)
    url, prefix = schema_registry.url, f"d-{uuid.uuid4().hex[:8]}"
    last, type_name = chain(url, prefix, levels)
    root = register(
        url, f"{prefix}-root", referring(type_name), refs=[(f"strata.refs.{type_name}", last, 1)]
    )

    out = decode_chunk(raw([message(url, root)]), rules(url))

    assert out.quarantine.num_rows == 0 and out.rows.column("event_id").to_pylist() == ["e0"]


def test_a_reference_cycle_is_quarantined_and_a_diamond_is_read(schema_registry):
    url, prefix = schema_registry.url, f"r-{uuid.uuid4().hex[:8]}"
    a, b = f"{prefix}-a", f"{prefix}-b"
    # A real registry refuses a reference it cannot resolve, so never holds a cycle;
    # the local one keeps references unchecked (see strata.local.schema_registry).
    register(url, a, named("A", [optional("b", "B")]), refs=[("strata.refs.B", b, 1)])
    register(url, b, named("B", [optional("a", "A")]), refs=[("strata.refs.A", a, 1)])
    cyclic = register(url, f"{prefix}-root", referring("A"), refs=[("strata.refs.A", a, 1)])
    # D under both B2 and C2, which A2 refers to: D is read once, and is no cycle.
    d, b2, c2, a2 = (f"{prefix}-{n}" for n in ("d", "b2", "c2", "a2"))
    register(url, d, named("D"))
    register(url, b2, named("B2", [optional("d", "D")]), refs=[("strata.refs.D", d, 1)])
    register(url, c2, named("C2", [optional("d", "D")]), refs=[("strata.refs.D", d, 1)])
    register(
        url,
        a2,
        named("A2", [optional("b", "B2"), optional("c", "C2")]),
        refs=[("strata.refs.B2", b2, 1), ("strata.refs.C2", c2, 1)],
    )
    diamond = register(url, f"{prefix}-top", referring("A2"), refs=[("strata.refs.A2", a2, 1)])

    out = decode_chunk(raw([message(url, cyclic), message(url, diamond)]), rules(url))

    assert out.rows.column("event_id").to_pylist() == ["e0"]
    assert reasons_by_offset(out) == {
        0: f"written with schema id {cyclic}, whose references form a cycle: version 1 of "
        f"subject '{a}' -> version 1 of subject '{b}' -> version 1 of subject '{a}'"
    }


def test_a_referenced_schema_that_is_not_valid_avro_is_named_in_the_reason(schema_registry):
    url, prefix = schema_registry.url, f"v-{uuid.uuid4().hex[:8]}"
    small, bad = f"{prefix}-small", f"{prefix}-bad"
    register(url, small, named("Small"))
    # The local registry does not parse a schema with references; a real one refuses this.
    broken = named("Bad", [{"name": "x", "type": "strata.refs.Nope"}, optional("s", "Small")])
    register(url, bad, broken, refs=[("strata.refs.Small", small, 1)])
    root = register(url, f"{prefix}-root", referring("Bad"), refs=[("strata.refs.Bad", bad, 1)])

    out = decode_chunk(raw([message(url, root)]), rules(url))

    assert reasons_by_offset(out) == {
        0: f"written with schema id {root}, which references version 1 of subject '{bad}', "
        "whose schema is not valid Avro (UnknownType: strata.refs.Nope)"
    }


def test_every_answer_about_a_reference_quarantines_with_what_was_wrong(
    schema_registry, monkeypatch
):
    url, prefix = schema_registry.url, f"q-{uuid.uuid4().hex[:8]}"
    small, proto = f"{prefix}-small", f"{prefix}-proto"
    register(url, small, named("Small"))
    register(url, proto, 'syntax = "proto3"; message P { string x = 1; }', kind="PROTOBUF")
    big = f"{prefix}-big"
    register(url, big, named("Big", [{"name": f"f{i}", "type": "int"} for i in range(200)]))
    ids = {
        "no version 7": register(
            url, f"{prefix}-1", referring("Small"), refs=[("strata.refs.Small", small, 7)]
        ),
        "version 0": register(
            url, f"{prefix}-2", referring("Small"), refs=[("strata.refs.Small", small, 0)]
        ),
        "protobuf": register(
            url, f"{prefix}-3", referring("P"), refs=[("strata.refs.P", proto, 1)]
        ),
        "too much text": register(
            url, f"{prefix}-4", referring("Big"), refs=[("strata.refs.Big", big, 1)]
        ),
        "too many": register(
            url,
            f"{prefix}-5",
            referring("Small", "Big"),
            refs=[("strata.refs.Small", small, 1), ("strata.refs.Big", big, 1)],
        ),
    }
    monkeypatch.setattr(registry, "MAX_SCHEMA_TEXT", len(json.dumps(referring("Big"))) + 2_000)
    monkeypatch.setattr(registry, "MAX_REFERENCES", 1)
    text_bound = f"{registry.MAX_SCHEMA_TEXT:,}"
    values = [message(url, i, 2 if name == "too many" else 1) for name, i in ids.items()]
    where = f"the Schema Registry at {url}"
    expected = {
        0: f"written with schema id {ids['no version 7']}, which references version 7 of "
        f"subject '{small}'; {where} answers 40402 (version not found)",
        1: f"written with schema id {ids['version 0']}, which references version 0 of "
        f"subject '{small}'; {where} answers 42202 (invalid version)",
        2: f"written with schema id {ids['protobuf']}, which references version 1 of subject "
        f"'{proto}', a PROTOBUF schema; Strata decodes Avro only",
        3: f"written with schema id {ids['too much text']}, whose schema and the schemas it "
        f"references hold more than {text_bound} characters of text (passed at version 1 of "
        f"subject '{big}'); Strata reads at most {text_bound}",
        4: f"written with schema id {ids['too many']}, which references more than 1 schemas; "
        "Strata follows at most 1",
    }

    for _ in range(2):  # the same fate on a re-run
        registry._answers.clear()
        out = decode_chunk(raw(values), rules(url))
        assert out.rows.num_rows == 0
        assert reasons_by_offset(out) == expected


def test_the_process_keeps_answers_within_a_byte_bound_and_asks_again_for_those_it_gave_back(
    monkeypatch,
):
    with LocalSchemaRegistry(username=REGISTRY_USER, password=REGISTRY_PASSWORD) as local:
        url = local.url
        values = [
            produce(url, V1, {k: v for k, v in click(0).items() if k != "country"}, "t-a"),
            produce(url, V2, {**click(1), "campaign": None}, "t-b"),
            produce(url, READER, click(2), "t-c"),
        ]
        ids = [schema_id(v) for v in values]
        assert len(set(ids)) == 3
        # Room for two of these schemas' answers, not three.
        monkeypatch.setattr(registry, "MAX_CACHE_BYTES", 2 * 16 * len(json.dumps(V2)) + 4096)
        out = decode_chunk(raw(values), rules(url))
        assert out.rows.column("event_id").to_pylist() == ["e0", "e1", "e2"]
        assert 0 < registry._answers.size <= registry.MAX_CACHE_BYTES
        assert (url, ids[0]) not in registry._answers
        assert (url, ids[2]) in registry._answers
    # The registry is gone: the answer kept is still read; the one given back is asked
    # of the registry again (the client's own cache does not answer in its place).
    assert decode_chunk(raw([values[2]]), rules(url)).rows.num_rows == 1
    with pytest.raises(
        SchemaRegistryUnavailable, match=f"could not be reached for schema id {ids[0]}"
    ):
        decode_chunk(raw([values[0]]), rules(url))


def test_a_task_asks_about_a_bounded_number_of_unknown_ids_and_decides_the_same_each_run(
    schema_registry, monkeypatch
):
    from tests.registry_stub import served

    url, topic = schema_registry.url, f"t-{uuid.uuid4().hex[:8]}"
    known = [
        produce(url, READER, click(0), topic),
        produce(url, V1, {k: v for k, v in click(1).items() if k != "country"}, f"{topic}-b"),
    ]
    later = produce(url, V2, {**click(2), "campaign": None}, f"{topic}-c")
    ids = [schema_id(v) for v in [*known, later]]
    unknown = [4_000_000_000 + n for n in range(5)]  # past every id the registry gives
    flooded = [b"\x00" + struct.pack(">I", n) + known[0][5:] for n in unknown]
    monkeypatch.setattr(registry, "MAX_UNKNOWN_IDS", 3)
    # Room for one answer: the task gives back what it met, and looks it up when met again.
    # A chunk's ids are looked up in order, so the lower of the two is given back.
    monkeypatch.setattr(registry, "MAX_CACHE_BYTES", 1)
    given_back = 0 if ids[0] < ids[1] else 1
    where = f"the Schema Registry at {url}"
    not_asked = (
        f"not asked of {where}: this task met 3 schema ids the registry does not know, and "
        "asks about at most 3"
    )

    for _ in range(2):  # a re-run decides every message as the first run did
        registry._answers.clear()
        before = served(schema_registry.log_path)
        task = rules(url)  # one task's rules: its chunks share what it met
        first = decode_chunk(raw([*known, *flooded]), task)
        second = decode_chunk(raw([known[given_back], later, flooded[0], flooded[3]]), task)
        asked = served(schema_registry.log_path) - before

        assert first.rows.column("event_id").to_pylist() == ["e0", "e1"]
        assert reasons_by_offset(first) == {
            2 + i: f"written with schema id {n}, which {where} does not know"
            if i < 3
            else f"written with schema id {n}, {not_asked}"
            for i, n in enumerate(unknown)
        }
        # An id met before the bound still reads, given back or not; one new to the task
        # past it is quarantined, whatever the registry would say of it.
        assert second.rows.column("event_id").to_pylist() == [f"e{given_back}"]
        assert reasons_by_offset(second) == {
            1: f"written with schema id {ids[2]}, {not_asked}",
            2: f"written with schema id {unknown[0]}, which {where} does not know",
            3: f"written with schema id {unknown[3]}, {not_asked}",
        }
        assert {f"/schemas/ids/{n}": 1 for n in unknown[:3]} == {
            path: count for path, count in asked.items() if int(path.rsplit("/", 1)[1]) in unknown
        }
        assert asked[f"/schemas/ids/{ids[given_back]}"] == 2
        assert asked[f"/schemas/ids/{ids[2]}"] == 0


REFERRING = json.dumps(referring("Small"))


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (
            {"/schemas/ids/7": (500, {"error_code": 50001, "message": "store down"})},
            "answered HTTP 500 (50001: store down) for schema id 7",
        ),
        (
            {"/schemas/ids/7": (403, {"error_code": 40301, "message": "forbidden"})},
            "refused the request for schema id 7 (HTTP 403",
        ),
        ({}, "answered HTTP 404 (404: HTTP 404 Not Found) for schema id 7"),  # a wrong path
        (
            {"/schemas/ids/7": (404, b"<html>no such page</html>")},  # a proxy's page
            "answered HTTP 404 (-1: Unknown Schema Registry Error",
        ),
        (
            {  # a reference's fetch fails for the moment: nothing is quarantined
                "/schemas/ids/7": (
                    200,
                    {
                        "schema": REFERRING,
                        "references": [{"name": "strata.refs.Small", "subject": "s", "version": 1}],
                    },
                ),
                "/subjects/s/versions/1": (503, {"error_code": 50003, "message": "busy"}),
            },
            "answered HTTP 503 (50003: busy) for schema id 7",
        ),
        ({"/schemas/ids/7": (200, {"id": 7})}, "answered without a schema text for schema id 7"),
    ],
    ids=["5xx", "403", "wrong path", "proxy page", "reference 5xx", "no schema"],
)
def test_a_registry_that_answers_nothing_about_the_schema_fails_the_chunk(answers, expected):
    from tests.registry_stub import StubRegistry

    value = b"\x00" + struct.pack(">I", 7) + b"\x02"
    with StubRegistry(answers) as stub, pytest.raises(SchemaRegistryUnavailable) as err:
        decode_chunk(raw([value]), rules(stub.url))
    assert expected in str(err.value) and REGISTRY_PASSWORD not in str(err.value)
    assert (stub.url, 7) not in registry._answers


def test_a_registry_slower_than_the_timeout_fails_the_chunk():
    from tests.registry_stub import StubRegistry

    value = b"\x00" + struct.pack(">I", 7) + b"\x02"
    answers = {"/schemas/ids/7": (200, {"schema": json.dumps(READER)})}
    with (
        StubRegistry(answers, delay_s=1.5) as stub,
        pytest.raises(SchemaRegistryUnavailable) as err,
    ):
        decode_chunk(raw([value]), rules(stub.url, timeout_s=0.3))
    assert str(err.value).startswith(
        f"the Schema Registry at {stub.url} could not be reached for schema id 7 (ReadTimeout"
    )
    assert len(stub.requests) == 3  # the first try and two retries
