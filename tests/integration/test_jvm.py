"""The driver's JVM: its classes mapped from the class archive, and an archive that is no use."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys

from strata.spark.jvm import (
    JVM_OPTIONS,
    build_class_archive,
    class_archive,
    driver_options,
    java_binary,
    require_java,
)
from tests.conftest import produce_clicks


def test_a_run_maps_the_driver_classes_from_the_class_archive(make_pipeline, broker, tmp_path):
    build_class_archive()  # `make` built it already; this builds it when run otherwise
    p = make_pipeline(partitions=1)
    per = produce_clicks(broker, p.topic, 1, 300)
    logs = tmp_path / "classes"
    logs.mkdir()
    # Every JVM of the run (Spark's launcher, then the driver) logs where each class came from.
    env = p.env(JAVA_TOOL_OPTIONS=f"-Xlog:class+load=info:file={logs}/%p.log")
    done = p.cli("run", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["messages"] == sum(per.values())
    [driver] = [
        f.read_text() for f in logs.iterdir() if " org.apache.spark.SparkContext " in f.read_text()
    ]
    assert "org.apache.spark.SparkContext source: shared objects file (top)" in driver
    assert driver.count("source: shared objects file (top)") > 5000


def test_an_archive_of_another_class_path_or_a_damaged_one_is_passed_over_silently(
    tmp_path, monkeypatch
):
    java = java_binary()
    assert java is not None
    version = require_java()
    built = build_class_archive()
    # The real archive, on a JVM with another class path: the JVM starts without it,
    # and says nothing on standard output, where a run's summary goes.
    foreign = subprocess.run(
        [java, *shlex.split(driver_options(version)), "-version"], capture_output=True, text=True
    )
    assert built in driver_options(version)
    assert foreign.returncode == 0 and foreign.stdout == ""
    # A truncated one (a disk that filled up while it was copied) crashes a JVM given it:
    # it is not given.
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    damaged = class_archive(version)
    assert damaged.startswith(str(tmp_path))
    (tmp_path / "share" / "strata").mkdir(parents=True)
    shutil.copy(f"{built}.size", f"{damaged}.size")
    with open(built, "rb") as whole, open(damaged, "wb") as out:
        out.write(whole.read(1 << 20))
    assert driver_options(version) == JVM_OPTIONS
    # Whole again, it is.
    shutil.copy(built, damaged)
    assert f"-XX:SharedArchiveFile={damaged}" in driver_options(version)
