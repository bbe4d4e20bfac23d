"""One namespace of tables: a place or metastore name two owners claim is refused at load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from strata.config import load_pipeline, load_pipelines
from strata.errors import ConfigError
from strata.store.places import Namespace, OwnedTable
from tests.conftest import ROOT

GOOD = {"topics": ["clicks"], "schema_file": "clicks.avsc", "event_time": {"field": "ts"}}
METASTORE = {"metastore": {"uri": "thrift://metastore.internal:9083"}}


def conf_dir(tmp_path: Path, pipelines: dict[str, dict]) -> Path:
    """A configuration directory holding the given pipelines, all sharing one warehouse."""
    conf = tmp_path / "conf"
    (conf / "pipelines").mkdir(parents=True)
    (tmp_path / "schemas").mkdir()
    for table in ("clicks", "rc", "rc_raw"):
        shutil.copy(ROOT / "schemas" / "clicks.avsc", tmp_path / "schemas" / f"{table}.avsc")
    for name, body in pipelines.items():
        (conf / "pipelines" / f"{name}.yaml").write_text(yaml.safe_dump(body))
    return conf


def test_routed_topics_whose_tables_would_share_a_place_and_a_name_are_refused(tmp_path):
    routed = {
        **GOOD,
        **METASTORE,
        "topics": ["rc", "rc.raw"],
        "schema_file": "{table}.avsc",
        "routing": {"table": "{topic}"},
    }
    conf = conf_dir(tmp_path, {"events": routed})
    with pytest.raises(ConfigError) as err:
        load_pipeline("events", conf)
    text = str(err.value)
    assert "events.yaml" in text
    assert "the raw copy of table `events:rc` (topic `rc`)" in text
    assert "the data table of table `events:rc_raw` (topic `rc.raw`)" in text
    assert "both named strata.rc_raw in the metastore" in text
    assert "name the table of topic `rc.raw` with `routing.tables`" in text
    # Named apart, the same topics load.
    apart = {**routed, "routing": {"table": "{topic}", "tables": {"rc.raw": "rc_raw_events"}}}
    shutil.copy(ROOT / "schemas" / "clicks.avsc", tmp_path / "schemas" / "rc_raw_events.avsc")
    (conf / "pipelines" / "events.yaml").write_text(yaml.safe_dump(apart))
    assert load_pipeline("events", conf).routed


def test_two_pipelines_of_one_directory_that_share_a_place_are_both_refused(tmp_path):
    conf = conf_dir(tmp_path, {"orders": GOOD, "orders_raw": GOOD, "views": GOOD})
    loaded = load_pipelines(conf)
    assert not isinstance(loaded["views"], ConfigError)
    for name in ("orders", "orders_raw"):
        error = loaded[name]
        assert isinstance(error, ConfigError), name
        text = str(error)
        assert f"{name}.yaml" in text
        assert "the raw copy of pipeline `orders`" in text
        assert "the data table of pipeline `orders_raw`" in text
        assert "move the raw copy with `raw_table` in orders.yaml" in text
        with pytest.raises(ConfigError, match="clash with another pipeline"):
            load_pipeline(name, conf)
    assert load_pipeline("views", conf).name == "views"


def test_pipelines_in_other_warehouses_clash_only_by_metastore_name(tmp_path):
    conf = conf_dir(
        tmp_path,
        {
            "orders": {**GOOD, **METASTORE, "warehouse": "one"},
            "orders_raw": {**GOOD, **METASTORE, "warehouse": "two"},
        },
    )
    with pytest.raises(ConfigError) as err:
        load_pipeline("orders", conf)
    text = str(err.value)
    assert "both named strata.orders_raw in the metastore" in text and "both at" not in text
    assert "another `metastore.database`" in text
    # In another database, they are apart.
    body = {**GOOD, **METASTORE, "warehouse": "two"}
    body["metastore"] = {**body["metastore"], "database": "raw_events"}
    (conf / "pipelines" / "orders_raw.yaml").write_text(yaml.safe_dump(body))
    assert load_pipeline("orders", conf).name == "orders"


def test_a_table_inside_another_tables_place_is_refused(tmp_path):
    conf = conf_dir(tmp_path, {"clicks": {**GOOD, "raw_table": "clicks/raw"}})
    with pytest.raises(ConfigError) as err:
        load_pipeline("clicks", conf)
    assert "one inside the other" in str(err.value) and "raw_table" in str(err.value)


def test_a_pipeline_that_does_not_load_leaves_the_others_loading(tmp_path):
    conf = conf_dir(tmp_path, {"clicks": GOOD, "broken": {**GOOD, "limits": {"x": 1}}})
    assert load_pipeline("clicks", conf).name == "clicks"
    assert isinstance(load_pipelines(conf)["broken"], ConfigError)


def test_the_index_finds_places_above_below_and_equal_and_names_once():
    def owned(owner: str, role: str, location: str, name: str | None = None) -> OwnedTable:
        metastore = None if name is None else ("thrift://m:1", "db", name)
        return OwnedTable(owner, owner, role, location, metastore)  # type: ignore[arg-type]

    tables = [
        owned("a", "table", "s3://lake/a", "a"),
        owned("b", "table", "s3://lake/a/b", "b"),
        owned("c", "table", "s3://lake/ab", "c"),
        owned("d", "raw", "s3://lake/d", "a"),
    ]
    index = Namespace(tables)
    found = {(o.owner, place, name) for o, place, name in index.clashing(tables[0])}
    assert found == {("b", True, False), ("d", False, True)}
    assert {o.owner for o, _, _ in index.clashing(tables[2])} == set()
    assert len(index.clashes(tables)) == 2
