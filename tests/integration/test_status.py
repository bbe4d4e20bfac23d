"""`strata status`: lag, the age of the oldest unread message, and time to retention.

The estimate of time to size-based retention is checked in tests/unit/test_status.py.
"""

from __future__ import annotations

import json
import time

from strata.local.events import HOUR_MS
from tests.conftest import produce_clicks


def test_status_warns_before_retention_deletes_unread_messages(make_pipeline, broker):
    p = make_pipeline(partitions=1, create=False)
    broker.create_topic(p.topic, 1, {"retention.ms": str(48 * HOUR_MS)})
    written_at = int(time.time() * 1000) - 40 * HOUR_MS
    per = produce_clicks(broker, p.topic, 1, 50, start_ms=written_at, hours=1)

    done = p.cli("status", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout.strip().splitlines()[-1])
    [part] = body["partitions"]
    assert part["lag"] == per[0] and part["committed"] is None
    assert part["retention_ms"] == 48 * HOUR_MS
    # The oldest unread message was written 40 hours ago, up to 5 s after its event.
    assert abs(part["oldest_unread_age_s"] - 40 * 3600) < 300
    assert abs(part["time_to_retention_s"] - 8 * 3600) < 300
    [warning] = body["warnings"]
    assert (
        f"partition 0 of `{p.topic}`: unread messages are deleted by retention in 8.0h" in warning
    )
    assert "WARNING: partition 0" in done.stdout

    # Once read, nothing is at risk.
    assert p.cli("run").returncode == 0
    body = json.loads(p.cli("status", "--json").stdout.strip().splitlines()[-1])
    assert body["warnings"] == [] and body["partitions"][0]["lag"] == 0


def test_a_topic_without_retention_reports_none(make_pipeline, broker):
    p = make_pipeline(partitions=1)
    produce_clicks(broker, p.topic, 1, 10)
    body = json.loads(p.cli("status", "--json").stdout.strip().splitlines()[-1])
    [part] = body["partitions"]
    assert part["retention_ms"] is None and "time_to_retention_s" not in part
    assert part["oldest_unread_age_s"] > 0 and body["warnings"] == []


def test_status_warns_when_unread_bytes_near_retention_bytes(make_pipeline, broker):
    from strata.store.ledger import read_ledger

    p = make_pipeline(partitions=1, create=False)
    broker.create_topic(p.topic, 1, {"retention.bytes": "40000"})
    produce_clicks(broker, p.topic, 1, 100)
    assert p.cli("run").returncode == 0
    [row] = read_ledger(p.cfg().places()).to_pylist()
    per_message = row["bytes"] / row["messages"]
    time.sleep(1.1)  # the produce rate is measured from the batch's commit time
    more = produce_clicks(broker, p.topic, 1, 300, seed=9)

    done = p.cli("status", "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout.strip().splitlines()[-1])
    [part] = body["partitions"]
    assert part["retention_bytes"] == 40000 and part["lag"] == more[0]
    assert part["unread_bytes"] == int(more[0] * per_message) > 40000
    assert part["produce_rate_msgs_s"] > 0
    assert (part["time_to_retention_s"], part["retention_basis"]) == (0, "retention.bytes")
    [warning] = body["warnings"]
    assert warning.startswith(f"partition 0 of `{p.topic}`: about 0.1 MB are unread (300 messages)")
    assert "size-based retention may be deleting them now" in warning
    assert "retention.bytes" in done.stdout


def test_a_roomy_retention_bytes_gives_a_deadline_without_warning(make_pipeline, broker):
    p = make_pipeline(partitions=1, create=False)
    broker.create_topic(p.topic, 1, {"retention.bytes": str(50_000_000)})
    produce_clicks(broker, p.topic, 1, 100)
    assert p.cli("run").returncode == 0
    time.sleep(1.1)
    produce_clicks(broker, p.topic, 1, 100, seed=9)
    body = json.loads(p.cli("status", "--json").stdout.strip().splitlines()[-1])
    [part] = body["partitions"]
    assert part["retention_basis"] == "retention.bytes" and part["time_to_retention_s"] > 0
    assert body["warnings"] == []
