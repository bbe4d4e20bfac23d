"""The local Apache Kafka's jars: the version the build file pins, and a cache that is
only read, never fetched, at run time."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from strata.errors import KafkaJarsMissing
from strata.local.kafka import COMPLETE, KAFKA_VERSION, LocalKafka, kafka_home

ROOT = Path(__file__).resolve().parents[2]
POM = ROOT / "jvm" / "kafka" / "pom.xml"
SUMS = ROOT / "jvm" / "kafka" / "jars.sha256"


def test_the_local_kafka_starts_the_version_the_build_file_fetches():
    pinned = ET.parse(POM).getroot().findtext("properties/kafka.version")
    jars = {line.split()[1] for line in SUMS.read_text().splitlines()}
    assert pinned == KAFKA_VERSION
    assert {f"kafka_2.13-{KAFKA_VERSION}.jar", f"kafka-tools-{KAFKA_VERSION}.jar"} <= jars
    assert kafka_home().name == f"kafka-{KAFKA_VERSION}"


@pytest.mark.parametrize("cache", ["absent", "without its stamp"])
def test_without_a_complete_cache_the_local_kafka_names_make_setup(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    home = kafka_home()
    assert home == tmp_path / "cache" / "strata" / "jvm" / f"kafka-{KAFKA_VERSION}"
    if cache == "without its stamp":
        # A fetch cut short: jars copied, the stamp (written last) never was.
        home.mkdir(parents=True)
        (home / f"kafka_2.13-{KAFKA_VERSION}.jar").write_bytes(b"PK")
    assert not (home / COMPLETE).exists()

    with pytest.raises(KafkaJarsMissing, match="run `make setup`") as raised:
        LocalKafka(tmp_path / "broker").start()

    assert str(home) in str(raised.value)
    assert not (tmp_path / "broker").exists()  # nothing started, nothing written
