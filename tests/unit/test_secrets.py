"""Secrets on a cluster: a credential set through the environment is never printed.

Each test plants canaries, distinct secrets set through the environment (as a
deployment does) or written into the git-ignored `conf/local/`, and then does what a
user does: prints the configuration, runs `strata`, breaks the YAML on the secret's
line, breaks another key, and lets Airflow parse the DAG folder. No canary may appear
in any output, error message, traceback or repr. The runs against a real broker and
S3 endpoint are in tests/integration/test_secrets.py.
"""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from strata.config import PipelineConfig, load_pipeline
from strata.errors import ConfigError
from tests.canaries import CANARIES, GOOD, SECRETS, assert_no_canary, merge
from tests.conftest import ROOT

STRATA = str(Path(sys.executable).parent / "strata")


@pytest.fixture
def canaries(monkeypatch) -> dict[str, str]:
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    return CANARIES


def project(tmp_path: Path, body: dict[str, Any], local: str | None = None) -> Path:
    """A conf dir holding pipeline `clicks`, and `conf/local/secrets.yaml` if given."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (tmp_path / "schemas").mkdir()
    shutil.copy(ROOT / "schemas" / "clicks.avsc", tmp_path / "schemas")
    (conf / "pipelines" / "clicks.yaml").write_text(yaml.safe_dump(body))
    if local is not None:
        (conf / "local").mkdir()
        (conf / "local" / "secrets.yaml").write_text(local)
    return conf


def strata(*args: str, conf: Path) -> subprocess.CompletedProcess[str]:
    """The installed command, in the environment the canaries were set in."""
    return subprocess.run(
        [STRATA, *args, "--pipeline", "clicks", "--conf-dir", str(conf)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def error_text(exc: BaseException) -> str:
    """Everything a log shows of an error: its message, its repr and its whole chain."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


def test_every_repr_of_the_configuration_hides_the_credentials(tmp_path, canaries):
    cfg = load_pipeline("clicks", project(tmp_path, merge(GOOD, SECRETS)))
    # The Spark tasks get the configuration as a pickle: the copy must print as safely.
    shipped = pickle.loads(pickle.dumps(cfg))
    for shown in (cfg, shipped, cfg.kafka, cfg.spark):
        assert_no_canary(repr(shown), str(shown))
    # Only the secrets are hidden: what an operator needs to debug stays visible.
    assert "AWS_REGION" in repr(cfg) and "eu-west-1" in repr(cfg)
    assert "security.protocol" in str(cfg.kafka) and "PLAINTEXT" in str(cfg.kafka)
    assert "sasl.password" in repr(cfg.kafka)
    # The clients still get the real values.
    assert shipped == cfg
    assert cfg.kafka.properties["sasl.password"] == canaries["KAFKA_PASSWORD"]
    assert cfg.storage_options["AWS_SECRET_ACCESS_KEY"] == canaries["S3_SECRET"]
    assert cfg.spark.conf["spark.hadoop.fs.s3a.secret.key"] == canaries["SPARK_S3A_SECRET"]


# Broken configurations that hold the canaries: another key is wrong, a secret is in
# the wrong place or of the wrong type, a password sits in a URL, a model check fails.
BROKEN = {
    "another key": ({"limits": {"target_file_mb": -1}}, "`limits.target_file_mb`"),
    "a secret in the wrong place": (
        {"kafka": {"sasl.password": "${KAFKA_PASSWORD}"}},
        "`kafka.sasl.password`",
    ),
    "a secret of the wrong type": (
        {"storage_options": {"AWS_SECRET_ACCESS_KEY": ["${S3_SECRET}"]}},
        "`storage_options.AWS_SECRET_ACCESS_KEY`",
    ),
    "a password in a url": (
        {"metastore": {"uri": "thrift://strata:${METASTORE_PASSWORD}@metastore.internal"}},
        "`metastore.uri`",
    ),
    "a check across keys": ({"format": "confluent_avro"}, "schema_id"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_configuration_error_names_the_key_but_no_secret(tmp_path, canaries, case):
    broken, key = BROKEN[case]
    conf = project(tmp_path, merge(merge(GOOD, SECRETS), broken))
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", conf)
    assert key in str(err.value) and "clicks.yaml" in str(err.value)
    assert_no_canary(error_text(err.value))

    done = strata("run", "--json", conf=conf)
    assert done.returncode == 2 and key in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert_no_canary(done.stdout, done.stderr)


def test_pydantic_errors_do_not_echo_the_offending_value(canaries):
    # What a library user (a notebook, a test) sees when validating a dict directly.
    data = merge(GOOD, {"name": "clicks", "schemas_dir": str(ROOT / "schemas")})
    bad = [
        {"kafka": {"sasl.password": canaries["KAFKA_PASSWORD"]}},
        {"storage_options": {"AWS_SECRET_ACCESS_KEY": {"v": canaries["S3_SECRET"]}}},
        {"metastore": {"uri": f"thrift://strata:{canaries['METASTORE_PASSWORD']}@h:1:2"}},
    ]
    for broken in bad:
        with pytest.raises(ValidationError) as err:
            PipelineConfig.model_validate(merge(data, broken))
        assert_no_canary(error_text(err.value))


# A secret written into conf/local/secrets.yaml, with the YAML broken on its line (3).
BROKEN_YAML = {
    "unquoted colon": "kafka:\n  properties:\n    sasl.password: {secret}: x\n",
    "unclosed quote": 'kafka:\n  properties:\n    sasl.password: "{secret}\n',
    "stray alias": "kafka:\n  properties:\n    sasl.password: *{secret}\n",
}


@pytest.mark.parametrize("case", BROKEN_YAML)
def test_a_yaml_error_names_file_line_and_column_but_not_the_line(tmp_path, canaries, case):
    secret = canaries["KAFKA_PASSWORD"]
    conf = project(tmp_path, GOOD, BROKEN_YAML[case].format(secret=secret))
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", conf)
    text = str(err.value)
    assert "secrets.yaml" in text and "line 3, column " in text and "Fix the syntax" in text
    assert_no_canary(error_text(err.value))

    done = strata("status", conf=conf)
    assert done.returncode == 2 and "secrets.yaml" in done.stderr, done.stderr
    assert_no_canary(done.stdout, done.stderr)


@pytest.mark.parametrize(
    ("local", "named"),
    [
        ('kafka:\n  properties:\n    sasl.password: "{secret}\n', "line 3, column "),
        ("limits:\n  target_file_mb: -1\n", "`limits.target_file_mb`"),
        ("metastore:\n  uri: thrift://strata:{secret}@metastore.internal\n", "`metastore.uri`"),
    ],
    ids=["yaml syntax", "another key", "password in a url"],
)
def test_the_dag_folder_reports_a_broken_pipeline_without_its_secrets(
    tmp_path, canaries, monkeypatch, capfd, local, named
):
    from airflow.dag_processing.dagbag import DagBag

    conf = project(
        tmp_path, merge(GOOD, SECRETS), local.format(secret=canaries["METASTORE_PASSWORD"])
    )
    monkeypatch.setenv("STRATA_CONF_DIR", str(conf))
    bag = DagBag(dag_folder=str(ROOT / "airflow_dags"))
    errors = {Path(k).name: v for k, v in bag.import_errors.items()}
    # The shared ingest file leaves the pipeline out; the configuration check names it.
    assert list(errors) == ["strata_config_errors.py"], errors
    assert named in errors["strata_config_errors.py"], errors
    # Airflow also logs the error as it parses the file.
    assert_no_canary(*errors.values(), *capfd.readouterr())


def test_what_the_command_prints_is_redacted_even_when_a_message_quotes_a_secret(
    tmp_path, canaries, capsys
):
    from strata.batch.outcome import RunOutcome
    from strata.cli import run_guarded
    from strata.errors import KafkaUnavailable
    from strata.operations.report import render_summary, summary_dict

    trino = {"trino": {"url": "https://trino.internal:8443", "password": "${TRINO_PASSWORD}"}}
    cfg = load_pipeline("clicks", project(tmp_path, merge(merge(GOOD, SECRETS), trino)))
    assert_no_canary(repr(cfg), str(cfg.trino))
    # A committed run whose summary quotes the Trino URL it registered in, and a client
    # library's warning that quotes a password ("..." with quotes, as JSON escapes them).
    outcome = RunOutcome(cfg.name, "committed", batch=1)
    url = f"https://strata:{cfg.trino.password}@trino.internal:8443"
    outcome.registered = f"tables registered; 4 statement(s) run in Trino at {url}"
    password = cfg.kafka.properties["sasl.password"]
    outcome.warnings.append(f'could not publish offsets: SASL PLAIN "{password}" refused')
    assert run_guarded(lambda: (render_summary(outcome), summary_dict(outcome)), True) == 0
    shown = capsys.readouterr()
    assert "run in Trino at https://strata:***@trino.internal:8443" in shown.out
    assert json.loads(shown.out.splitlines()[-1])["batch"] == 1

    def fails() -> tuple[str, dict[str, Any]]:
        raise KafkaUnavailable(
            f"broker said: bad secret {cfg.storage_options['AWS_SESSION_TOKEN']}"
        )

    assert run_guarded(fails, True) == 1
    failed = capsys.readouterr()
    assert "broker said: bad secret ***" in failed.err
    assert_no_canary(shown.out, shown.err, failed.out, failed.err)


def test_column_names_and_described_credentials_are_not_secrets(tmp_path):
    from strata.config.secrets import is_secret_key, redact

    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    schema = json.loads((ROOT / "schemas" / "clicks.avsc").read_text())
    schema["fields"].append({"name": "api_key_kind", "type": ["null", "string"], "default": None})
    (tmp_path / "clicks.avsc").write_text(json.dumps(schema))
    body = {
        "topics": ["clicks"],
        "schema_file": "clicks.avsc",
        "schemas_dir": str(tmp_path),
        "event_time": {"field": "ts"},
        "kafka": {"properties": {"ssl.keystore.type": "PKCS12", "sasl.password": "hunter22"}},
        # A column whose name holds a secret word is data: its values are not secrets.
        "quality": {"value_sets": {"api_key_kind": ["desktop-premium", "mobile-basic"]}},
    }
    (conf / "pipelines" / "clicks.yaml").write_text(yaml.safe_dump(body))
    load_pipeline("clicks", conf)
    assert redact("device desktop-premium, keystore PKCS12, password hunter22") == (
        "device desktop-premium, keystore PKCS12, password ***"
    )
    assert not is_secret_key("keystrokes") and not is_secret_key("ssl.keystore.type")
    assert not is_secret_key("fs.s3a.aws.credentials.provider")
    assert is_secret_key("secretKey") and is_secret_key("sasl.oauthbearer.config")


def test_the_schema_registry_password_never_shows(tmp_path, canaries):
    from strata.config.secrets import redact

    registry = {
        "format": "confluent_avro",
        "schema_registry": {
            "url": "https://registry.internal:8081",
            "username": "strata",
            "password": "${METASTORE_PASSWORD}",
        },
    }
    cfg = load_pipeline("clicks", project(tmp_path, merge(GOOD, registry)))
    shipped = pickle.loads(pickle.dumps(cfg))
    for shown in (cfg, shipped, cfg.schema_registry):
        assert_no_canary(repr(shown), str(shown))
    assert "password='***'" in repr(cfg.schema_registry) and "strata" in repr(cfg.schema_registry)
    assert shipped.schema_registry.password == canaries["METASTORE_PASSWORD"]
    # A client library's message that quotes it, on its way to a terminal or a log.
    assert redact(f"401 for strata:{canaries['METASTORE_PASSWORD']}") == "401 for strata:***"

    broken = merge(registry, {"schema_registry": {"timeout_s": -1}})
    conf = project(tmp_path / "broken", merge(GOOD, broken))
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", conf)
    assert "`schema_registry.timeout_s`" in str(err.value)
    assert_no_canary(error_text(err.value))
    done = strata("run", "--json", conf=conf)
    assert done.returncode == 2 and "schema_registry.timeout_s" in done.stderr, done.stderr
    assert_no_canary(done.stdout, done.stderr)


def test_log_records_are_redacted_before_any_handler_of_the_host_sees_them(tmp_path, canaries):
    import logging

    from strata.log import get_logger

    cfg = load_pipeline("clicks", project(tmp_path, merge(GOOD, SECRETS)))
    password = cfg.kafka.properties["sasl.password"]
    seen: list[logging.LogRecord] = []

    class Host(logging.Handler):
        """A handler the host process (Airflow, a notebook) puts on the `strata` logger."""

        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    host = Host()
    root = logging.getLogger("strata")
    root.addHandler(host)
    try:
        try:
            raise RuntimeError(f"broker refused {password}")
        except RuntimeError:
            get_logger("strata.kafka").warning(
                "retrying with %s after %s", password, "a refusal", exc_info=True
            )
    finally:
        root.removeHandler(host)
    [record] = [r for r in seen if r.name == "strata.kafka"]
    shown = logging.Formatter().format(record)
    assert "retrying with *** after a refusal" in shown and "broker refused ***" in shown
    assert_no_canary(shown, record.getMessage())


def test_every_module_takes_its_logger_from_the_redacting_factory():
    import ast

    direct = []
    for path in sorted((ROOT / "strata").rglob("*.py")):
        if path.name == "log.py" or path.relative_to(ROOT).as_posix() == "strata/__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "getLogger"
                and not (
                    # Silencing a third-party library's own logger is not logging of ours.
                    node.args
                    and isinstance(node.args[0], ast.Constant)
                    and not str(node.args[0].value).startswith("strata")
                )
            ):
                direct.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not direct, f"use strata.log.get_logger instead of logging.getLogger: {direct}"


def test_credentials_taken_from_the_environment_are_redacted(monkeypatch):
    from strata.config.secrets import redact

    # What the README recommends for S3: the keys in the environment, not in a file.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary-env-secret-9Wq")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "canary-env-token-3Ys")
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    text = redact("signature mismatch for canary-env-secret-9Wq (token canary-env-token-3Ys)")
    assert text == "signature mismatch for *** (token ***)"
    assert redact("region eu-central-1") == "region eu-central-1"


def test_short_secrets_are_scrubbed_where_they_stand_as_values(tmp_path, monkeypatch):
    from strata.config.secrets import redact

    monkeypatch.setenv("SHORT_PASSWORD", "pw4")
    body = merge(GOOD, {"kafka": {"properties": {"sasl.password": "${SHORT_PASSWORD}"}}})
    load_pipeline("clicks", project(tmp_path, body))
    text = redact('sasl.password=pw4; {"password": "pw4"}; password: pw4, pw4x and pw4 alone')
    assert text == ('sasl.password=***; {"password": "***"}; password: ***, pw4x and pw4 alone')
