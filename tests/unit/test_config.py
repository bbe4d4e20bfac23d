"""Configuration: valid files load; bad ones name the file, the key and the fix."""

from __future__ import annotations

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
    assert cfg.topics == ["clicks"] and cfg.partitioning == "dt_hr"
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
        and "remove it or check its spelling" in text
    )


def test_bad_value_in_defaults_names_the_defaults_file(tmp_path):
    conf = _project(tmp_path, GOOD, {"starting_offsets": "oldest"})
    with pytest.raises(
        ConfigError,
        match=r"strata.yaml: key `starting_offsets`: Input should be 'earliest' or 'latest'",
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

    from strata.decode import DecodeRules

    cfg = load_pipeline("clicks", _project(tmp_path, GOOD))
    shipped = pickle.dumps(cfg)
    (tmp_path / "schemas" / "clicks.avsc").unlink()  # as on an executor's host
    rules = DecodeRules.from_config(pickle.loads(shipped))
    assert "user_id" in rules.out_schema.names
