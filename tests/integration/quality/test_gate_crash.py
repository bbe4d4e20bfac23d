"""A quality check killed between its marks and its result, under `quality.gate: fail`.

A failed gate's marks (the partitions it holds) are written before the batch's result,
and settled after it. The real process is killed at each end of that window, by a
failing and by a passing check, and the next run, `strata quality` and completeness
must then agree with the newest check that stored its result: no hour a failed gate
holds is announced complete, and none stays held once its batch passed.
"""

from __future__ import annotations

import json
import signal
import time
from datetime import UTC, datetime

import yaml

from strata import faults
from strata.catalog.completeness import completeness
from strata.cli import main
from strata.local.events import HOUR_MS
from strata.quality.run import run_quality
from strata.quality.store import ResultStore
from tests.conftest import produce_clicks
from tests.faults import armed


def held(cfg, partition: str) -> list[int]:
    """The batches holding a partition, as `strata completeness` works them out; [] if
    it is complete."""
    found = completeness(
        cfg.places(), cfg.completeness, cfg.partitioning, cfg.quality.gate, cfg.asset_uri
    )
    state = {s.partition: s for s in found.partitions}[partition]
    assert state.complete == (not state.held_by), state
    assert state.completed_batch == 1, state  # the watermark passed it in batch 1
    return state.held_by


def latency_at_most(p, top: int) -> None:
    """Set the gate's range for `latency_ms` (the events' latencies reach 900 ms)."""
    path = p.conf_dir / "pipelines" / f"{p.name}.yaml"
    body = yaml.safe_load(path.read_text())
    body["quality"]["ranges"] = {"latency_ms": {"min": 0, "max": top}}
    path.write_text(yaml.safe_dump(body))


def check(cfg, batch: int):
    return run_quality(
        cfg.places(), cfg.quality, cfg.schemas(), cfg.metastore, cfg.warehouse, batch
    )


def test_a_check_killed_between_its_marks_and_its_result_holds_only_what_its_gate_holds(
    make_pipeline, broker, spark, capsys
):
    p = make_pipeline(partitions=2, overrides={"quality": {"gate": "fail"}})
    latency_at_most(p, 500)
    # Three hours of events, recent enough for the checks: batch 1 completes the first.
    start = (int(time.time() * 1000) // HOUR_MS - 4) * HOUR_MS
    first = datetime.fromtimestamp(start / 1000, UTC).strftime("dt=%Y-%m-%d/hr=%H")
    produce_clicks(broker, p.topic, 2, 300, hours=3, start_ms=start)
    store = ResultStore.of(p.cfg().places())

    # `strata run` commits batch 1, and its failing check is killed after the marks.
    crashed = p.cli("run", env=p.env(**armed(crash_at=faults.QUALITY_MARKS_WRITTEN)))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert store.load(1) is None
    assert held(p.cfg(), first) == [1]
    # The next run commits batch 2 and announces no hour batch 1 holds.
    produce_clicks(broker, p.topic, 2, 20, hours=1, start_ms=start + 3 * HOUR_MS, seed=3)
    capsys.readouterr()
    argv = ["--pipeline", p.name, "--conf-dir", str(p.conf_dir), "--json"]
    main(["run", *argv])
    body = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert body["batch"] == 2 and first not in body.get("completed", [])
    assert held(p.cfg(), first) == [1]
    # `strata quality` checks batch 1 again: it fails, and the hour stays held.
    assert not check(p.cfg(), 1).success
    assert held(p.cfg(), first) == [1]

    # The gate is widened, and the passing check is killed after its result: the hour
    # is no longer held.
    latency_at_most(p, 1000)
    passing = p.cli(
        "quality", "--batch", "1", env=p.env(**armed(crash_at=faults.QUALITY_RESULT_WRITTEN))
    )
    assert passing.returncode == -signal.SIGKILL, passing.stderr[-3000:]
    stored = store.load(1)
    assert stored is not None and stored["success"] and not stored["incomplete"]
    assert held(p.cfg(), first) == []

    # Narrowed again, a failing check killed after its marks holds the hour, though the
    # result stored is still the passing one.
    latency_at_most(p, 500)
    failing = p.cli(
        "quality", "--batch", "1", env=p.env(**armed(crash_at=faults.QUALITY_MARKS_WRITTEN))
    )
    assert failing.returncode == -signal.SIGKILL, failing.stderr[-3000:]
    assert store.load(1)["success"]
    assert held(p.cfg(), first) == [1]
    # Checked to the end, each way, the result and the hour agree.
    assert not check(p.cfg(), 1).success
    assert held(p.cfg(), first) == [1]
    latency_at_most(p, 1000)
    assert check(p.cfg(), 1).success
    assert held(p.cfg(), first) == []
