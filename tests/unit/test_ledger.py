"""Which log each partition's offsets belong to: recorded only of what was touched."""

from __future__ import annotations

import json

from strata.store.ledger import PARTITION_IDS_KEY, TOPIC_IDS_KEY, LogIds


def test_a_seek_of_one_partition_vouches_for_it_alone():
    recorded = LogIds(3, {"a": "old-a", "b": "old-b"})
    sought = recorded.vouched({}, {("a", 0): "new-a"})
    assert sought.of("a", 0) == "new-a"
    # The other partition of the topic, and the other topic, keep what was recorded.
    assert sought.of("a", 1) == "old-a" and sought.of("b", 0) == "old-b"


def test_an_ingest_vouches_for_the_whole_topics_it_checked_and_nothing_else():
    recorded = LogIds(3, {"a": "old-a", "gone": "old-gone"}, {"a": {0: "new-a"}})
    ingested = recorded.vouched({"a": "new-a"}, {})
    assert ingested.topics == {"a": "new-a", "gone": "old-gone"}
    # Partition 0's own entry is the topic's now: it needs none.
    assert ingested.partitions == {}


def test_a_partition_moved_back_onto_its_topics_log_needs_no_entry():
    recorded = LogIds(1, {"a": "id-a"}, {"a": {1: "other"}})
    assert recorded.vouched({}, {("a", 1): "id-a"}).partitions == {}


def test_the_map_survives_the_commit_metadata_round_trip():
    ids = LogIds(0, {"a": "id-a"}, {"a": {0: "id-x", 7: "id-y"}})
    meta = ids.metadata()
    commit = {"strata.batch": 5, **{k: json.dumps(v) for k, v in meta.items()}}
    assert set(meta) == {TOPIC_IDS_KEY, PARTITION_IDS_KEY}
    back = LogIds.from_commit(commit)
    assert back == LogIds(5, ids.topics, ids.partitions)
    assert LogIds(0, {"a": "x"}).metadata() == {TOPIC_IDS_KEY: {"a": "x"}}
