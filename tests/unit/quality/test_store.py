"""The quality location on a local directory: results, the summary page, the Data Docs."""

from __future__ import annotations

import json
from dataclasses import asdict

from strata.quality.checks import Check, QualityResult
from strata.quality.store import ResultStore


def result(batch: int, incomplete: list[str] | None = None) -> QualityResult:
    return QualityResult(
        pipeline="clicks",
        batch=batch,
        kind="ingest",
        gate="fail",
        success=not incomplete,
        checked_at="2025-11-22T10:05:00+00:00",
        committed_at="2025-11-22T10:00:00+00:00",
        rows=10 * batch,
        validated_rows=10 * batch,
        sampled=False,
        ledger={"rows": 10 * batch, "quarantined": 1},
        lag_after=None,
        checks=[Check("reconcile: data files present", not incomplete, None, "", 0)],
        partitions={"dt=2025-11-22/hr=10": 10 * batch},
        incomplete=incomplete or [],
        losses=[{"topic": "t", "partition": 0, "start_offset": 1, "end_offset": 2, "note": "x"}],
    )


def test_a_saved_result_loads_back_as_the_json_of_it(tmp_path):
    store = ResultStore(str(tmp_path / "quality"))
    saved = result(3, ["dt=2025-11-22/hr=10"])
    store.save(saved)
    path = tmp_path / "quality" / "results" / "batch-0000000003.json"
    assert json.loads(path.read_text()) == asdict(saved)
    assert store.load(3) == asdict(saved)
    assert store.load(4) is None
    # Saving again replaces it.
    store.save(result(3))
    loaded = store.load(3)
    assert loaded is not None and loaded["incomplete"] == [] and loaded["success"] is True


def test_recent_results_are_the_newest_oldest_first_and_ignore_other_files(tmp_path):
    store = ResultStore(str(tmp_path))
    assert store.recent(5) == []  # nothing saved yet: no results directory
    for batch in (2, 11, 1, 7):
        store.save(result(batch))
    (tmp_path / "results" / "notes.json").write_text("{}")
    (tmp_path / "results" / "batch-12.json").write_text("{}")
    assert [r["batch"] for r in store.recent(3)] == [2, 7, 11]
    assert [r["batch"] for r in store.recent(100)] == [1, 2, 7, 11]


def test_incomplete_partitions_come_from_every_stored_result(tmp_path):
    store = ResultStore(str(tmp_path))
    store.save(result(1, ["dt=2025-11-22/hr=10"]))
    store.save(result(2))
    store.save(result(3, ["dt=2025-11-22/hr=10", "dt=2025-11-22/hr=11"]))
    assert store.incomplete() == {"dt=2025-11-22/hr=10": [1, 3], "dt=2025-11-22/hr=11": [3]}


def test_the_marks_are_read_from_their_own_folder_not_from_every_result(tmp_path):
    store = ResultStore(str(tmp_path))
    store.save(result(1, ["dt=2025-11-22/hr=10"]))
    for batch in range(2, 40):
        store.save(result(batch))
    assert store.incomplete() == {"dt=2025-11-22/hr=10": [1]}
    # Only the batch that marked a partition has a file there.
    assert sorted(p.name for p in (tmp_path / "marks").iterdir()) == [
        "batch-0000000001.json",
        "ready",
    ]
    for path in (tmp_path / "results").iterdir():
        path.unlink()  # the marks alone answer now
    assert store.incomplete() == {"dt=2025-11-22/hr=10": [1]}


def test_a_batch_checked_again_and_passing_releases_its_partitions(tmp_path):
    store = ResultStore(str(tmp_path))
    store.save(result(4, ["dt=2025-11-22/hr=10"]))
    store.save(result(5, ["dt=2025-11-22/hr=10"]))
    store.save(result(4))
    assert store.incomplete() == {"dt=2025-11-22/hr=10": [5]}
    # The passing check removed its batch's marks file; the other batch's stays.
    assert sorted(p.name for p in (tmp_path / "marks").iterdir()) == [
        "batch-0000000005.json",
        "ready",
    ]
    store.save(result(5))
    assert store.incomplete() == {}
    assert sorted(p.name for p in (tmp_path / "marks").iterdir()) == ["ready"]


def test_a_location_written_before_the_marks_is_indexed_once_from_its_results(tmp_path):
    store = ResultStore(str(tmp_path))
    store.save(result(1, ["dt=2025-11-22/hr=10"]))
    store.save(result(2))
    store.save(result(3, ["dt=2025-11-22/hr=11"]))
    for path in (tmp_path / "marks").iterdir():
        path.unlink()
    (tmp_path / "marks").rmdir()
    assert store.incomplete() == {"dt=2025-11-22/hr=10": [1], "dt=2025-11-22/hr=11": [3]}
    assert (tmp_path / "marks" / "ready").exists()
    assert store.incomplete() == {"dt=2025-11-22/hr=10": [1], "dt=2025-11-22/hr=11": [3]}


def test_the_page_and_the_docs_land_under_the_location(tmp_path):
    store = ResultStore(str(tmp_path / "quality"))
    path = store.write_page("<!doctype html><p>one</p>")
    assert (tmp_path / "quality" / "index.html").read_text() == "<!doctype html><p>one</p>"
    assert path.endswith("/index.html")
    store.write_page("<p>two</p>")
    assert (tmp_path / "quality" / "index.html").read_text() == "<p>two</p>"

    built = tmp_path / "gx" / "docs"
    (built / "validations" / "clicks").mkdir(parents=True)
    (built / "index.html").write_text("site")
    (built / "validations" / "clicks" / "batch.html").write_text("page")
    docs = store.copy_docs(built, "validations/clicks/batch.html")
    assert docs == "docs/validations/clicks/batch.html"
    assert (tmp_path / "quality" / docs).read_text() == "page"
    assert (tmp_path / "quality" / "docs" / "index.html").read_text() == "site"
    assert store.copy_docs(built, None) is None
    assert store.copy_docs(tmp_path / "never-built", "x.html") is None


def test_the_documented_runs_are_kept_under_the_docs_and_replaced_whole(tmp_path):
    store = ResultStore(str(tmp_path))
    assert store.docs_runs() == []  # no docs yet
    runs = [{"suite": "clicks", "run_name": "batch-0000000001", "page": "validations/a.html"}]
    store.save_docs_runs(runs)
    assert json.loads((tmp_path / "docs" / "runs.json").read_text()) == runs
    more = runs + [
        {"suite": "clicks", "run_name": "batch-0000000002", "page": "validations/b.html"}
    ]
    store.save_docs_runs(more)
    assert store.docs_runs() == more
