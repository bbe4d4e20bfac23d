"""Configuration: valid files load; bad ones name the file, the key and the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from strata.config import load_pipeline
from strata.durations import parse_duration_ms
from strata.errors import ConfigError
from tests.conftest import ROOT


def _project(tmp_path: Path, body: dict, defaults: dict | None = None) -> Path:
    (tmp_path / "conf" / "pipelines").mkdir(parents=True)
    (tmp_path / "schemas").mkdir()
    shutil.copy(ROOT / "schemas" / "clicks.avsc", tmp_path / "schemas")
    (tmp_path / "conf" / "pipelines" / "clicks.yaml").write_text(yaml.safe_dump(body))
    if defaults is not None:
        (tmp_path / "conf" / "strata.yaml").write_text(yaml.safe_dump(defaults))
    return tmp_path / "conf"


GOOD = {"topics": ["clicks"], "schema_file": "clicks.avsc", "event_time": {"field": "ts"}}


def test_the_shipped_pipeline_loads():
    cfg = load_pipeline("clicks", ROOT / "conf")
    assert cfg.topics == ["clicks"] and cfg.partitioning.by == "dt_hr"
    assert cfg.location("table").endswith("/warehouse/clicks")


def test_defaults_merge_and_env_overrides_win(tmp_path, monkeypatch):
    conf = _project(tmp_path, GOOD, {"kafka": {"bootstrap_servers": "a:1", "timeout_s": 3}})
    cfg = load_pipeline("clicks", conf)
    assert cfg.kafka.bootstrap_servers == "a:1" and cfg.kafka.timeout_s == 3
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", "b:2")
    monkeypatch.setenv("STRATA_WAREHOUSE", "s3://lake/wh")
    cfg = load_pipeline("clicks", conf)
    assert cfg.kafka.bootstrap_servers == "b:2"
    assert cfg.location("table") == "s3://lake/wh/clicks"
    assert cfg.location("ledger") == "s3://lake/wh/clicks_ledger"


def test_unknown_key_names_file_key_and_fix(tmp_path):
    conf = _project(tmp_path, {**GOOD, "limits": {"max_offset_per_task": 5}})
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", conf)
    text = str(err.value)
    assert (
        "clicks.yaml" in text
        and "`limits.max_offset_per_task`" in text
        and "remove it or check its spelling against the configuration reference "
        "(docs/reference/configuration.md)"
        in text
    )


def test_bad_value_in_defaults_names_the_defaults_file(tmp_path):
    conf = _project(tmp_path, GOOD, {"starting_offsets": "oldest"})
    with pytest.raises(
        ConfigError,
        match=r"strata.yaml: key `starting_offsets`: Value error, 'oldest' is not a starting "
        r"point; write earliest, latest",
    ):
        load_pipeline("clicks", conf)


def test_missing_schema_and_bad_duration_are_reported(tmp_path):
    conf = _project(
        tmp_path,
        {**GOOD, "schema_file": "nope.avsc", "event_time": {"field": "ts", "late_after": "soon"}},
    )
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", conf)
    assert "`event_time.late_after`" in str(err.value) and "'1h'" in str(err.value)


def test_secrets_come_from_env_and_are_never_printed(tmp_path, monkeypatch):
    body = {
        **GOOD,
        "kafka": {"properties": {"sasl.password": "${KAFKA_PW}", "security.protocol": "SASL_SSL"}},
    }
    conf = _project(tmp_path, body)
    with pytest.raises(ConfigError, match=r"\$\{KAFKA_PW\}, which is not set; export KAFKA_PW"):
        load_pipeline("clicks", conf)
    monkeypatch.setenv("KAFKA_PW", "hunter2")
    cfg = load_pipeline("clicks", conf)
    assert cfg.kafka.properties["sasl.password"] == "hunter2"
    assert "hunter2" not in repr(cfg.kafka) and "hunter2" not in str(cfg)


def test_unknown_pipeline_lists_known_ones(tmp_path):
    conf = _project(tmp_path, GOOD)
    with pytest.raises(ConfigError, match=r"no such pipeline file; known pipelines: clicks"):
        load_pipeline("views", conf)


def test_durations():
    assert parse_duration_ms("90s") == 90_000 and parse_duration_ms("2d") == 172_800_000
    with pytest.raises(ValueError):
        parse_duration_ms("1 fortnight")


def test_a_local_warehouse_with_a_cluster_master_is_refused_at_load(tmp_path, monkeypatch):
    body = {**GOOD, "warehouse": str(tmp_path / "wh"), "spark": {"master": "spark://h:7077"}}
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", _project(tmp_path, body))
    text = str(err.value)
    assert "clicks.yaml" in text and "spark.master" in text and "s3://" in text
    # On shared storage, or with a local master, the same file loads.
    monkeypatch.setenv("STRATA_WAREHOUSE", "s3://lake/wh")
    assert load_pipeline("clicks", tmp_path / "conf").spark.master == "spark://h:7077"
    monkeypatch.delenv("STRATA_WAREHOUSE")
    assert load_pipeline("clicks", _project(tmp_path / "b", GOOD)).spark.master.startswith("local")


def test_the_schema_travels_with_the_configuration_to_hosts_without_the_file(tmp_path):
    import pickle

    from strata.batch.decode import DecodeRules

    cfg = load_pipeline("clicks", _project(tmp_path, GOOD))
    shipped = pickle.dumps(cfg)
    (tmp_path / "schemas" / "clicks.avsc").unlink()  # as on an executor's host
    landed = pickle.loads(shipped)
    rules = DecodeRules.of_decoding(landed.decoding())
    assert "user_id" in rules.out_schema.names


def test_topics_or_a_pattern_and_the_pattern_matches_whole_names_but_not_internal_topics(
    tmp_path,
):
    pattern = {k: v for k, v in GOOD.items() if k != "topics"} | {"topics_pattern": r"clicks\..*"}
    cfg = load_pipeline("clicks", _project(tmp_path / "a", pattern))
    assert cfg.topics == [] and cfg.reads_topic("clicks.web") and cfg.reads_topic("clicks.")
    # A whole-name match: a prefix or a suffix is not enough.
    assert not cfg.reads_topic("old.clicks.web") and not cfg.reads_topic("clicks")
    everything = pattern | {"topics_pattern": ".*"}
    cfg = load_pipeline("clicks", _project(tmp_path / "b", everything))
    assert cfg.reads_topic("views") and not cfg.reads_topic("__consumer_offsets")
    assert "topics matching '.*'" in cfg.topics_description
    for i, (body, message) in enumerate(
        (
            (GOOD | {"topics_pattern": "clicks"}, "give either `topics`"),
            ({k: v for k, v in GOOD.items() if k != "topics"}, "give either `topics`"),
            (
                pattern | {"topics_pattern": "clicks(["},
                "key `topics_pattern`: Value error, 'clicks(['",
            ),
        )
    ):
        with pytest.raises(ConfigError, match=r"clicks\.yaml: key `[a-z_() ]*`") as err:
            load_pipeline("clicks", _project(tmp_path / str(i), body))
        assert message in str(err.value)


@pytest.mark.parametrize(
    ("written", "canonical", "ms"),
    [
        ("earliest", "earliest", None),
        ("latest", "latest", None),
        ("2026-01-31T00:00:00Z", "2026-01-31T00:00:00.000+00:00", 1_769_817_600_000),
        ("2026-01-31T01:30:00+01:30", "2026-01-31T00:00:00.000+00:00", 1_769_817_600_000),
        (1_769_817_600_123, "2026-01-31T00:00:00.123+00:00", 1_769_817_600_123),
        ("1769817600123", "2026-01-31T00:00:00.123+00:00", 1_769_817_600_123),
    ],
)
def test_starting_offsets_takes_a_moment_with_its_offset_or_epoch_ms(
    tmp_path, written, canonical, ms
):
    # YAML reads an unquoted ISO moment as a datetime: the file is written as YAML would
    # carry it, unquoted.
    conf = _project(tmp_path, GOOD)
    text = (conf / "pipelines" / "clicks.yaml").read_text()
    (conf / "pipelines" / "clicks.yaml").write_text(text + f"starting_offsets: {written}\n")
    cfg = load_pipeline("clicks", conf)
    assert cfg.starting_offsets == canonical and cfg.source().starting_ms == ms


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("'2026-01-31T00:00:00'", "has no UTC offset"),
        ("yesterday", "is not a starting point"),
        ("1969-12-31T00:00:00Z", "before 1970-01-01"),
    ],
)
def test_a_starting_point_without_an_offset_or_unreadable_fails_at_load(tmp_path, written, message):
    conf = _project(tmp_path, GOOD)
    text = (conf / "pipelines" / "clicks.yaml").read_text()
    (conf / "pipelines" / "clicks.yaml").write_text(text + f"starting_offsets: {written}\n")
    with pytest.raises(ConfigError, match=r"clicks\.yaml: key `starting_offsets`") as err:
        load_pipeline("clicks", conf)
    assert message in str(err.value)


def _routed(tmp_path: Path, **over: object) -> Path:
    body = {k: v for k, v in GOOD.items() if k != "topics"} | {
        "topics": ["app.clicks", "app.views", "legacy-Orders"],
        "schema_file": "{table}.avsc",
        "routing": {"tables": {"legacy-Orders": "orders"}},
    }
    conf = _project(tmp_path, body | over)
    for table in ("app_clicks", "app_views", "orders"):
        shutil.copy(ROOT / "schemas" / "clicks.avsc", tmp_path / "schemas" / f"{table}.avsc")
    return conf


def test_a_routed_pipeline_gives_each_table_its_own_topics_schema_locations_and_state(tmp_path):
    conf = _routed(tmp_path, ledger_table="ledgers/{table}")
    cfg = load_pipeline("clicks", conf)
    assert cfg.routed and cfg.route_of is None
    assert [cfg.table_for(t) for t in cfg.topics] == ["app_clicks", "app_views", "orders"]
    clicks = cfg.route("app_clicks")
    orders = load_pipeline("clicks:orders", conf)
    assert (clicks.name, clicks.topics, clicks.route_of) == ("app_clicks", ["app.clicks"], "clicks")
    assert orders.topics == ["legacy-Orders"] and orders.schema_path.name == "orders.avsc"
    assert clicks.reads_topic("app.clicks") and not clicks.reads_topic("app.views")
    state = cfg.location("state")
    assert clicks.location("state") == f"{state}/app_clicks"
    assert orders.location("table").endswith("/warehouse/orders")
    assert orders.location("ledger").endswith("/warehouse/ledgers/orders")
    # One consumer group for the pipeline, as lag tools know it.
    assert clicks.group_id == orders.group_id == "strata-clicks"
    with pytest.raises(ConfigError, match=r"routes no topic to table 'nope'; its tables are"):
        cfg.route("nope")


def test_a_routed_table_without_its_schema_fails_naming_the_table(tmp_path):
    conf = _routed(tmp_path)
    (tmp_path / "schemas" / "orders.avsc").unlink()
    cfg = load_pipeline("clicks", conf)  # the pipeline itself loads: other tables can run
    with pytest.raises(ConfigError, match=r"pipeline clicks, table orders: .*'orders\.avsc' not"):
        cfg.route("orders")


def _with_fields(path: Path, *names: str) -> None:
    """The click schema at `path`, with optional string fields of these names added."""
    schema = json.loads((ROOT / "schemas" / "clicks.avsc").read_text())
    schema["fields"] += [{"name": n, "type": ["null", "string"], "default": None} for n in names]
    path.write_text(json.dumps(schema))


@pytest.mark.parametrize("table_format", ["delta", "parquet", "iceberg"])
def test_a_field_named_as_a_partition_column_in_another_case_fails_at_load(tmp_path, table_format):
    metastore = {"uri": "thrift://127.0.0.1:9083"}  # never dialled: the load stops first
    conf = _project(tmp_path, GOOD | {"table_format": table_format, "metastore": metastore})
    schema = tmp_path / "schemas" / "clicks.avsc"
    _with_fields(schema, "DT", "Hr")
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", conf)
    text = str(err.value)
    assert f"clicks.yaml: key `(top level)`: Value error, {schema}: " in text
    assert "field `DT` is the event-time partition column `dt`" in text
    assert "field `Hr` is the event-time partition column `hr`" in text
    assert "rename the field in the schema file" in text


def test_a_routed_table_whose_schema_has_a_clashing_field_fails_naming_the_table(tmp_path):
    conf = _routed(tmp_path)
    _with_fields(tmp_path / "schemas" / "orders.avsc", "Dt")
    cfg = load_pipeline("clicks", conf)  # the pipeline itself loads: other tables can run
    assert cfg.route("app_clicks").name == "app_clicks"
    # As a run configures each table, those of topics a pattern matches included.
    with pytest.raises(ConfigError, match=r"pipeline clicks, table orders: .*field `Dt` is the"):
        cfg.route("orders")
    with pytest.raises(ConfigError, match=r"field `Dt` is the event-time partition column `dt`"):
        load_pipeline("clicks:orders", conf)


def test_table_placeholders_need_routing_and_templates_need_valid_names(tmp_path):
    with pytest.raises(ConfigError, match=r"table holds \{table\}, which only `routing` fills in"):
        load_pipeline("clicks", _project(tmp_path / "a", GOOD | {"table": "t_{table}"}))
    with pytest.raises(ConfigError, match=r"key `routing.table`: .*not a table-name template"):
        load_pipeline("clicks", _routed(tmp_path / "b", routing={"table": "Raw-{topic}"}))
    with pytest.raises(ConfigError, match=r"does not route its topics to tables"):
        load_pipeline("clicks:app_clicks", _project(tmp_path / "c", GOOD))


@pytest.mark.parametrize(
    ("section", "fix"),
    [
        ({"trino": {"url": "https://etl:hunter22@trino:8443"}}, "trino.password"),
        ({"trino": {"url": "https://hunter22@trino:8443"}}, "trino.password"),
        ({"trino": {"url": "https://trino:8443/?password=hunter22"}}, "https://host:8443"),
        (
            {"schema_registry": {"url": "http://reg:8081/x?token=hunter22"}},
            "http://host:8081",
        ),
        ({"trino": {"url": "http://trino:8080", "password": "hunter22"}}, "https"),
        (
            {"trino": {"url": "https://trino:8443", "password": "a1b2c3", "access_token": "x"}},
            "one way",
        ),
        ({"metrics": {"pushgateway": "http://u:hunter22@pgw:9091"}}, "metrics.password"),
        ({"metrics": {"pushgateway": "http://pgw:9091", "username": "u"}}, "metrics.password"),
        ({"metrics": {"username": "u", "password": "hunter22"}}, "metrics.pushgateway"),
        (
            {
                "metrics": {
                    "pushgateway": "http://pgw:9091",
                    "username": "u",
                    "password": "hunter22",
                }
            },
            "https://",
        ),
        (
            {
                "metrics": {
                    "pushgateway": "http://pgw:9091",
                    "username": "u",
                    "password": "hunter22",
                    "allow_http_on_loopback": True,
                }
            },
            "applies only to a pushgateway on this machine",
        ),
        (
            {
                "format": "confluent_avro",
                "schema_registry": {
                    "url": "http://registry.internal:8081",
                    "username": "u",
                    "password": "hunter22",
                },
            },
            "schema_registry.allow_http_on_loopback",
        ),
        ({"completeness": {"lateness": "soon"}}, "completeness.lateness"),
    ],
)
def test_trino_metrics_and_completeness_settings_are_checked_at_load(tmp_path, section, fix):
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", _project(tmp_path, {**GOOD, **section}))
    assert "clicks.yaml" in str(err.value) and fix in str(err.value)
    assert "hunter22" not in str(err.value)


def test_credentials_over_plain_http_are_allowed_only_on_loopback_when_asked(tmp_path):
    section = {"url": "http://127.0.0.1:8081", "username": "u", "password": "hunter22"}
    body = {**GOOD, "format": "confluent_avro"}
    with pytest.raises(ConfigError, match="allow_http_on_loopback: true"):
        load_pipeline("clicks", _project(tmp_path / "a", {**body, "schema_registry": section}))
    allowed = {**section, "allow_http_on_loopback": True}
    cfg = load_pipeline("clicks", _project(tmp_path / "b", {**body, "schema_registry": allowed}))
    assert cfg.schema_registry.password == "hunter22"
    pushed = {"pushgateway": "http://localhost:9091", "username": "u", "password": "hunter22"}
    allowed_push = {**pushed, "allow_http_on_loopback": True}
    cfg = load_pipeline("clicks", _project(tmp_path / "c", {**GOOD, "metrics": allowed_push}))
    assert cfg.metrics.pushgateway == "http://localhost:9091"


def test_a_topics_pattern_is_compiled_by_re2_and_a_construct_it_lacks_fails_at_load(tmp_path):
    pattern = {"topics_pattern": "clicks\\.(?!test).*"}
    body = {k: v for k, v in GOOD.items() if k != "topics"} | pattern
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", _project(tmp_path / "a", body))
    assert "key `topics_pattern`" in str(err.value) and "(?!" in str(err.value)
    assert "clicks.yaml" in str(err.value) and "lookaround" in str(err.value)


@pytest.mark.timeout(60)
def test_a_careless_topics_pattern_matches_every_topic_name_in_linear_time(tmp_path):
    # Python's backtracking `re` takes 2**60 steps here, and the plan hangs for ever.
    body = {k: v for k, v in GOOD.items() if k != "topics"} | {"topics_pattern": "(a+)+$"}
    cfg = load_pipeline("clicks", _project(tmp_path, body))
    assert not cfg.reads_topic("a" * 60 + "!")
    assert cfg.reads_topic("a" * 60)


@pytest.mark.parametrize(
    ("schedule", "loaded", "every"),
    [
        ("30s", "30s", 30),
        ("15m", "15m", 900),
        ("@hourly", "@hourly", None),
        ("@continuous", "@continuous", None),
        (" */5 * * * * ", "*/5 * * * *", None),
        ("0 6-18/2 * jan-mar MON,fri", "0 6-18/2 * jan-mar MON,fri", None),
        ("0 0 ? * 7", "0 0 ? * 7", None),
    ],
)
def test_a_schedule_is_a_duration_a_preset_or_cron(tmp_path, schedule, loaded, every):
    from datetime import timedelta

    conf = _project(tmp_path, {**GOOD, "airflow": {"schedule": schedule}})
    airflow = load_pipeline("clicks", conf).airflow
    assert airflow.schedule == loaded
    assert airflow.dag_schedule == (loaded if every is None else timedelta(seconds=every))


@pytest.mark.parametrize(
    ("schedule", "why"),
    [
        ("every hour", "it has 2 fields, not 5"),
        ("0 * * *", "it has 4 fields, not 5"),
        ("0 0 * * * *", "it has 6 fields, not 5"),
        ("0 24 * * *", "the hour '24' is not between 0 and 23"),
        ("* * * 13 *", "the month '13' is not between 1 and 12"),
        ("0 0 * * funday", "the day of week 'funday' is not between 0 and 7"),
        ("*/0 * * * *", "the minute field '*/0' steps by 0"),
        ("? * * * *", "'?' stands only for a day of month or of week, not the minute"),
        ("1- * * * *", "the minute field '1-' is not a list of values, ranges and steps"),
        ("@often", "'@often' is not a schedule preset"),
        ("30x", "'30x' is not a schedule"),
        ("500ms", "'500ms' is under a second"),
    ],
)
def test_a_bad_schedule_fails_at_load_naming_the_file_key_and_fix(tmp_path, schedule, why):
    conf = _project(tmp_path, {**GOOD, "airflow": {"schedule": schedule}})
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", conf)
    text = str(err.value)
    assert "clicks.yaml" in text and "key `airflow.schedule`" in text and why in text
    if "under a second" not in why:
        assert "write a duration (30s, 15m), one of @once, @continuous, @hourly" in text


@pytest.mark.parametrize(
    "cron",
    [
        "* * * * *",
        "*/90 * * * *",
        "5-1 * * * *",
        "5/15 * * * *",
        "1,2-5/2 0 1-31/7 * *",
        "* * * dec-jan sat-mon",
        "0 0 * * 0-7",
        "01 * * * *",
        "0 25 * * *",
        "60 * * * *",
        "0 0 0 * *",
        "0 0 32 * *",
        "* * * 0 *",
        "0 0 * * 8",
        "*/5-10 * * * *",
        "1-5/0 * * * *",
        "a * * * *",
        "- * * * *",
        "* ? * * *",
    ],
)
def test_a_cron_schedule_is_refused_at_load_exactly_when_airflow_refuses_it(tmp_path, cron):
    # Airflow validates a cron schedule with croniter (`CronMixin.validate`); the
    # product checks it without Airflow, which is only an extra: the two must agree.
    from croniter import croniter

    try:
        croniter(cron)
        airflow_takes = True
    except ValueError:  # croniter's errors (CroniterBadCronError...) are ValueErrors
        airflow_takes = False
    conf = _project(tmp_path, {**GOOD, "airflow": {"schedule": cron}})
    try:
        load_pipeline("clicks", conf)
        loads = True
    except ConfigError:
        loads = False
    assert loads == airflow_takes
