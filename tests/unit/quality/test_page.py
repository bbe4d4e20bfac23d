"""The summary page built from figures: every value escaped, bars to scale.

The integration tier opens the page of a real run in Chromium; here each field gets
hostile text directly, and the page is read back with the standard library's parser.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from html.parser import HTMLParser
from urllib.parse import unquote

import pytest

from strata.quality.page import HEIGHT, PAD, WIDTH, docs_index, summary_page
from strata.store.ledger import LEDGER_SCHEMA

# Closes a quoted attribute of either kind, then tries a script and an image's onerror.
HOSTILE = "\"'><script>alert(1)</script><img src=x onerror=\"alert('x')\">&amp;"


class Page(HTMLParser):
    """Elements, attributes and shown text of a page, text grouped by `<h2>` section."""

    def __init__(self, markup: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.title = ""
        self.sections: dict[str, str] = {}
        self.rects: dict[str, list[dict[str, str | None]]] = {}
        self._in: list[str] = []
        self._section = ""
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        self._in.append(tag)
        if tag == "rect":
            self.rects.setdefault(self._section, []).append(dict(attrs))

    def handle_endtag(self, tag: str) -> None:
        if tag in self._in:
            del self._in[len(self._in) - 1 - self._in[::-1].index(tag) :]

    def handle_data(self, data: str) -> None:
        if not self._in:
            return
        if self._in[-1] == "h2":
            self._section = data
            self.sections[data] = ""
        elif self._in[-1] == "title" and "body" not in self._in:
            self.title += data
        elif self._in[-1] != "style":
            self.sections[self._section] = self.sections.get(self._section, "") + data


def ledger_row(batch, kind="ingest", **values):
    row = {name: 0 for name in LEDGER_SCHEMA.names}
    row.update(
        pipeline="clicks", batch=batch, kind=kind, topic="clicks", partition=0,
        committed_at=datetime(2025, 11, 22, 10, tzinfo=UTC), note=None,
        min_event_time=None, max_event_time=None, high_watermark=None,
    )  # fmt: skip
    row.update(values)
    return row


def hostile_page() -> str:
    ledger = [
        ledger_row(1, end_offset=10, messages=10, rows=10, topic=HOSTILE),
        ledger_row(1, kind="loss", start_offset=10, end_offset=15, topic=HOSTILE, note=HOSTILE),
        ledger_row(1, kind=HOSTILE),
    ]
    results = [
        {
            "batch": 1,
            "success": False,
            "docs": "javascript:alert(1)//" + HOSTILE,
            "checks": [
                {"name": HOSTILE, "column": HOSTILE, "success": False},
                {"name": "passed " + HOSTILE, "column": None, "success": True},
            ],
            "partitions": {"dt=2025-11-22/hr=10": 3, HOSTILE: 7},
            "incomplete": [HOSTILE],
            "lateness": {HOSTILE: 4, "<1m": 2},
        }
    ]
    return summary_page(HOSTILE, HOSTILE, 48, ledger, results, {HOSTILE: 2, "not valid JSON": 1})


def test_no_hostile_value_becomes_markup():
    markup = hostile_page()
    page = Page(markup)
    assert HOSTILE not in markup
    assert not re.search(r"<(script|img)\b", markup, re.IGNORECASE)
    assert not [t for t, _ in page.elements if t in ("script", "img")]
    handlers = [(t, a) for t, a in page.elements if any(k.startswith("on") for k in a)]
    assert not handlers, handlers


def test_every_field_shows_the_hostile_value_as_text():
    page = Page(hostile_page())
    assert page.title == f"{HOSTILE} quality"
    shown = page.sections
    heading = shown[""]  # the text before the first section
    assert f"{HOSTILE}: data quality" in heading and f"gate {HOSTILE}." in heading
    # The reason labels its bar, and titles it.
    assert shown["Quarantine reasons"].count(HOSTILE) == 2
    assert f"{HOSTILE}: 2 rows" in shown["Quarantine reasons"]
    assert shown["Event-time partitions"].count(HOSTILE) == 1
    assert f"partition 0 of {HOSTILE} (5 messages); {HOSTILE}" in shown["Offsets lost to retention"]
    batches = shown["Batches"]
    assert f"{HOSTILE} ({HOSTILE})" in batches  # the failed check, with its column
    assert "passed " + HOSTILE not in batches  # a check that passed is not listed
    assert f"ingest/loss/{HOSTILE}" in batches or f"{HOSTILE}/ingest/loss" in batches
    # Only the known lateness buckets are plotted: a stray key is not shown at all.
    assert HOSTILE not in shown["Late arrivals (Kafka time minus event time)"]


def test_attributes_keep_hostile_values_inside_them():
    page = Page(hostile_page())
    tiles = {
        a["title"]
        for t, a in page.elements
        if t == "div" and a.get("class") in ("hour", "hour bad")
    }
    assert tiles == {
        "dt=2025-11-22/hr=10: 3 rows",
        f"{HOSTILE}: 7 rows; incomplete (failed quality in batch 1)",
    }
    bad = [a for t, a in page.elements if t == "div" and a.get("class") == "hour bad"]
    assert [a["title"] for a in bad] == [
        f"{HOSTILE}: 7 rows; incomplete (failed quality in batch 1)"
    ]
    [link] = [a for t, a in page.elements if t == "a"]
    # Kept relative: the scheme's colon is percent-encoded, so the link runs nothing.
    assert link["href"] is not None and link["href"].startswith("javascript%3Aalert%281%29//")
    assert ":" not in link["href"] and "<" not in link["href"]


def test_the_bars_are_to_scale_and_titled_with_their_values():
    ledger = [
        ledger_row(1, rows=100, bytes=2_500_000, end_offset=100, high_watermark=130),
        ledger_row(2, rows=50, bytes=1_000_000, start_offset=100, end_offset=150),
        ledger_row(2, partition=1, rows=150, bytes=0, end_offset=150, high_watermark=150),
    ]
    results = [{"batch": 2, "success": True, "checks": [], "lateness": {"<1m": 3, ">24h": 1}}]
    page = Page(summary_page("clicks", "warn", 48, ledger, results, {"bad": 4, "worse": 1}))
    full = HEIGHT - 2 * PAD

    def heights(section):
        # Drawn to a tenth of a pixel.
        return pytest.approx([float(r["height"]) for r in page.rects[section]], abs=0.05)

    assert heights("Rows per batch") == [full * 100 / 200, full]  # batch 2: both partitions
    assert "1: 100 rows" in page.sections["Rows per batch"]
    assert "2: 200 rows" in page.sections["Rows per batch"]
    assert heights("MB per batch") == [full, full * 1.0 / 2.5]
    assert "1: 2.5 MB" in page.sections["MB per batch"]
    # 30 messages behind, then none: batch 2's one known watermark was reached.
    assert heights("Lag after each batch (messages)") == [full, 0]
    assert heights("Late arrivals (Kafka time minus event time)") == [full, 0, 0, 0, 0, full / 3]
    # Horizontal bars: their width, not their height, carries the value.
    widths = [float(r["width"]) for r in page.rects["Quarantine reasons"]]
    assert widths == [WIDTH - 80, (WIDTH - 80) / 4]
    assert "bad: 4 rows" in page.sections["Quarantine reasons"]


def test_the_page_shows_only_the_newest_batches_of_its_history():
    ledger = [ledger_row(b, rows=b) for b in range(1, 11)]
    page = Page(summary_page("clicks", "warn", 3, ledger, [], {}))
    assert len(page.rects["Rows per batch"]) == 3
    assert "3 recent batches" in page.sections[""]
    ids = [a["id"] for t, a in page.elements if t == "tr" and a.get("id")]
    assert ids == ["batch-10", "batch-9", "batch-8"]  # newest first
    assert "not checked" in page.sections["Batches"]


def test_an_empty_pipeline_says_so_instead_of_plotting():
    page = Page(summary_page("clicks", "off", 48, [], [], {}))
    assert "No batches yet." in page.sections["Rows per batch"]
    assert "No quarantined rows in these batches." in page.sections["Quarantine reasons"]
    assert "No rows yet." in page.sections["Event-time partitions"]
    assert "None recorded." in page.sections["Offsets lost to retention"]
    assert not page.rects.get("Rows per batch")


def test_the_data_docs_index_lists_every_run_newest_first_with_every_value_escaped():
    def run(batch: int, suite: str, success: bool = True) -> dict:
        return {
            "suite": suite, "run_name": f"batch-{batch:010d}", "asset_name": "rows",
            "run_time": f"2025-11-22T1{batch}:00:00+00:00", "success": success,
            "page": f"validations/{suite}/batch-{batch:010d}/x/strata-rows.html",
        }  # fmt: skip

    runs = [run(1, "clicks"), run(3, "clicks", success=False), run(2, HOSTILE)]
    markup = docs_index(HOSTILE, runs)
    page = Page(markup)
    assert HOSTILE not in markup and not re.search(r"<(script|img)\b", markup, re.I)
    assert page.title == f"{HOSTILE} data docs"
    links = [a["href"] for t, a in page.elements if t == "a"]
    assert [unquote(h) for h in links[1::2]] == [r["page"] for r in (runs[1], runs[2], runs[0])]
    # A hostile suite name stays inside a relative path, its markup percent-encoded.
    assert all(href.startswith(("expectations/", "validations/")) for href in links)
    assert not any(set("<>\"' ") & set(href) for href in links)
    assert "3 validations by Great Expectations, 1 failed" in page.sections[""]
    shown = page.sections["Validations"]
    assert shown.index("batch-0000000003") < shown.index("batch-0000000002")
    assert HOSTILE in shown
    assert "No validation yet." in Page(docs_index("clicks", [])).sections["Validations"]
