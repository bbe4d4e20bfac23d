"""The `strata` command, as a user runs it: its help, and configuration errors.

Runs against the real broker are in tests/integration/test_cli.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from strata.cli import build_parser
from tests.conftest import ROOT

STRATA = str(Path(sys.executable).parent / "strata")


def test_every_subcommand_has_help():
    commands = [a for a in build_parser()._subparsers._group_actions[0].choices]  # noqa: SLF001
    assert {"run", "status", "register", "publish", "backfill", "replay", "quality"} <= set(
        commands
    )
    assert "metastore" not in commands  # the local stack has its own command
    for command in commands:
        done = subprocess.run([STRATA, command, "--help"], capture_output=True, text=True)
        assert done.returncode == 0 and "--json" in done.stdout
        assert "--pipeline" in done.stdout
    local = subprocess.run(
        [STRATA + "-local", "metastore", "--help"], capture_output=True, text=True
    )
    assert local.returncode == 0 and "--dir" in local.stdout and "--json" in local.stdout


def test_bad_config_fails_at_load_naming_file_key_and_fix(tmp_path):
    (tmp_path / "conf" / "pipelines").mkdir(parents=True)
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "clicks.avsc").write_text(
        (ROOT / "schemas" / "clicks.avsc").read_text()
    )
    body = {
        "topics": ["clicks"],
        "schema_file": "clicks.avsc",
        "event_time": {"field": "ts"},
        "limits": {"target_file_mb": -1},
    }
    (tmp_path / "conf" / "pipelines" / "clicks.yaml").write_text(yaml.safe_dump(body))
    done = subprocess.run(
        [STRATA, "run", "--pipeline", "clicks", "--conf-dir", str(tmp_path / "conf")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "clicks.yaml: key `limits.target_file_mb`: Input should be greater than 0" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_bad_config_with_json_ends_with_a_json_error_line(tmp_path):
    (tmp_path / "conf" / "pipelines").mkdir(parents=True)
    (tmp_path / "conf" / "pipelines" / "clicks.yaml").write_text("topics: [clicks]\nnope: 1\n")
    done = subprocess.run(
        [STRATA, "status", "--pipeline", "clicks", "--conf-dir", str(tmp_path / "conf"), "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2, done.stderr
    body = json.loads(done.stdout.strip().splitlines()[-1])
    assert body["status"] == "failed" and body["exit_code"] == 2
    assert "clicks.yaml" in body["error"] and "nope" in body["error"]
    assert "Traceback" not in done.stderr
