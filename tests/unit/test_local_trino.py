"""The local Trino and the delta-spark jars: the versions the build files pin, caches that
are only read, never fetched, at run time, and the Java 24+ Trino is started on."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from strata.errors import JavaMissing
from strata.local import delta_spark, trino
from strata.local.delta_spark import DELTA_VERSION, DeltaSparkMissing, delta_spark_home
from strata.local.jvm_cache import COMPLETE
from strata.local.trino import TRINO_VERSION, LocalTrino, TrinoMissing, trino_home

ROOT = Path(__file__).resolve().parents[2]
JVM = ROOT / "jvm"


def _pinned(part: str, key: str) -> str | None:
    return ET.parse(JVM / part / "pom.xml").getroot().findtext(f"properties/{key}")


def test_the_local_trino_and_delta_spark_are_the_versions_the_build_files_fetch():
    assert _pinned("trino", "trino.version") == TRINO_VERSION
    tarballs = [
        line.split()[1] for line in (JVM / "trino" / "server.sha256").read_text().splitlines()
    ]
    assert tarballs == [f"trino-server-{TRINO_VERSION}.tar.gz"]
    assert trino_home().name == f"trino-server-{TRINO_VERSION}"
    assert _pinned("delta-spark", "delta.version") == DELTA_VERSION
    sums = (JVM / "delta-spark" / "jars.sha256").read_text().splitlines()
    assert sorted(line.split()[1] for line in sums) == sorted(delta_spark.JARS)
    assert delta_spark_home().name == f"delta-spark-{DELTA_VERSION}"


@pytest.mark.parametrize("cache", ["absent", "without its stamp"])
def test_without_a_complete_cache_trino_and_delta_spark_name_make_setup(
    cache, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    homes = [trino_home(), delta_spark_home()]
    assert all(home.parent == tmp_path / "cache" / "strata" / "jvm" for home in homes)
    if cache == "without its stamp":
        # A fetch cut short: files in place, the stamp (written last) never was.
        for home in homes:
            home.mkdir(parents=True)
            (home / "lib").mkdir()
    assert not any((home / COMPLETE).exists() for home in homes)

    with pytest.raises(TrinoMissing, match="run `make setup`") as raised:
        LocalTrino(tmp_path / "trino", "thrift://127.0.0.1:9083").start()
    assert str(homes[0]) in str(raised.value)
    assert not (tmp_path / "trino").exists()  # nothing started, nothing written
    with pytest.raises(DeltaSparkMissing, match="run `make setup`") as missing:
        delta_spark.session_settings()
    assert str(homes[1]) in str(missing.value)


def _jdk(folder: Path, name: str, version: str) -> Path:
    """A JDK home whose `java -version` says `version`, as a real one prints it."""
    java = folder / name / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/sh\necho 'openjdk version \"{version}\" 2025-09-16' >&2\n")
    java.chmod(0o755)
    return folder / name


def test_trino_runs_on_the_newest_java_24_or_later_installed_beside_the_default(
    tmp_path, monkeypatch
):
    jvms = tmp_path / "jvm"
    _jdk(jvms, "java-17-openjdk", "17.0.15")
    newest = _jdk(jvms, "temurin-25-jdk", "25.0.3")
    _jdk(jvms, "jdk-24", "24.0.2")
    monkeypatch.setattr(trino, "JVM_FOLDERS", (jvms,))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv("STRATA_TRINO_JAVA_HOME", raising=False)
    assert trino.trino_java() == str(newest / "bin" / "java")

    # Named: that one, if it is new enough.
    older = jvms / "jdk-24"
    monkeypatch.setenv("STRATA_TRINO_JAVA_HOME", str(older))
    assert trino.trino_java() == str(older / "bin" / "java")
    monkeypatch.setenv("STRATA_TRINO_JAVA_HOME", str(jvms / "java-17-openjdk"))
    with pytest.raises(JavaMissing, match="is Java 17; Trino 476 needs Java 24 or newer"):
        trino.trino_java()


def test_without_a_java_24_trino_says_what_to_install(tmp_path, monkeypatch):
    jvms = tmp_path / "jvm"
    _jdk(jvms, "java-17-openjdk", "17.0.15")
    monkeypatch.setattr(trino, "JVM_FOLDERS", (jvms,))
    monkeypatch.setenv("JAVA_HOME", str(jvms / "java-17-openjdk"))
    monkeypatch.delenv("STRATA_TRINO_JAVA_HOME", raising=False)
    with pytest.raises(JavaMissing) as raised:
        trino.trino_java()
    message = str(raised.value)
    assert "no Java 24 or newer found" in message and str(jvms) in message
    assert "temurin-25-jdk" in message and "STRATA_TRINO_JAVA_HOME" in message


def test_the_one_node_server_listens_on_loopback_and_never_drops_itself(tmp_path):
    server = LocalTrino(tmp_path / "trino", "thrift://127.0.0.1:9083", port=18080)
    server.configure(tmp_path / "server")
    written = (tmp_path / "trino" / "etc" / "config.properties").read_text().splitlines()
    settings = dict(line.split("=", 1) for line in written)
    assert settings["node.bind-ip"] == "127.0.0.1"
    assert settings["discovery.uri"] == "http://127.0.0.1:18080"
    # Its only node missing a few heartbeats on a busy machine must not empty the cluster.
    assert settings["failure-detector.enabled"] == "false"


def test_the_server_is_ready_only_once_the_node_manager_has_seen_its_announcement():
    # Lines of Trino's HTTP request log (tab-separated: time, client, method, path, ...).
    def line(method: str, path: str) -> str:
        return "\t".join(["2026-12-02T15:11:04.313Z", "127.0.0.1", method, path, "null", "200"])

    starting = [line("GET", "/v1/service/trino/general"), line("GET", "/v1/info/state")]
    announced = [*starting, line("PUT", "/v1/announcement/632f9f67"), line("GET", "/v1/memory")]
    # Before the announcement, the node manager's state polls do not count; after it,
    # the next one is the refresh that gives each catalog its node.
    assert not trino.schedules_catalogs("\n".join(starting))
    assert not trino.schedules_catalogs("\n".join(announced))
    assert trino.schedules_catalogs("\n".join([*announced, line("GET", "/v1/info/state")]))
    assert not trino.schedules_catalogs("")
