"""A run's view of its pipeline reads the ledger from one snapshot."""

from __future__ import annotations

from strata.edge import status_settings
from strata.operations.status import pipeline_view
from strata.store import ledger as ledger_module
from strata.store.ledger import commit_ledger, unread_row


def test_the_view_after_a_run_opens_the_ledger_once(make_pipeline, monkeypatch):
    p = make_pipeline(partitions=2)
    cfg = p.cfg()
    places = cfg.places()
    for batch in (1, 2):
        row = unread_row("ingest", p.topic, 0, batch - 1, batch, 0, None)
        row.update(messages=1, rows=1, bytes=10, high_watermark=batch)
        assert commit_ledger(places, batch, [row])
    opened = []
    real = ledger_module.open_table
    monkeypatch.setattr(ledger_module, "open_table", lambda *a: opened.append(a) or real(*a))
    view = pipeline_view(places, status_settings(cfg))
    # Opening the ledger loads its whole file list, a file per batch until compaction:
    # the state and the newest rows are both read from one snapshot.
    assert len(opened) == 1
    assert view["last_batch"] == 2
    committed = {q["partition"]: q["committed"] for q in view["partitions"]}
    assert committed[0] == 2


def test_a_batch_opens_its_ledger_once_to_plan_check_commit_and_sum_up(
    make_pipeline, broker, spark, monkeypatch
):
    from strata.run import run_batch
    from tests.conftest import produce_clicks

    p = make_pipeline(partitions=2)
    produce_clicks(broker, p.topic, 2, 30)
    assert run_batch(p.cfg(), session=lambda _: spark).status == "committed"
    produce_clicks(broker, p.topic, 2, 10, seed=3)
    opened = []
    real = ledger_module.open_table
    monkeypatch.setattr(ledger_module, "open_table", lambda *a: opened.append(a) or real(*a))
    import strata.catalog.completeness as completeness_module

    monkeypatch.setattr(completeness_module, "open_table", ledger_module.open_table)

    cfg = p.cfg()
    outcome = run_batch(cfg, session=lambda _: spark, register_tables=False)
    assert outcome.status == "committed" and outcome.batch == 2
    # Planning (the state, the topics' ids, the columns) and the ledger commit share one
    # snapshot; what follows the commit (the late rows' count, the summary's view) takes
    # the state and rows the commit recorded instead of opening the ledger again.
    places = cfg.places()
    assert [a[0] for a in opened].count(places.ledger.uri) == 1, opened
    settings = status_settings(cfg)
    summed_up = pipeline_view(places, settings, watermark=True, seen=outcome.seen)
    assert [a[0] for a in opened].count(places.ledger.uri) == 1, opened
    # And it is what reading the ledger back gives.
    read_back = pipeline_view(places, settings, watermark=True)
    assert summed_up == read_back
    assert summed_up["last_batch"] == 2 and summed_up["watermark"] is not None
    assert {q["partition"]: q["committed"] for q in summed_up["partitions"]} == {
        r.partition: r.end for r in outcome.ranges
    }
