"""Hostile message text in the quality reports is shown as text and never runs.

Messages carry whatever their producers put in them. Their text reaches the Great
Expectations Data Docs (unexpected and observed values) and could reach the summary page
(quarantine reasons, partition names, check names, topics, notes). Each page is opened in
headless Chromium: a payload that ran would set the document title to `pwned`, and one
rendered as markup would leave a `<script>` or `<img onerror>` element in the DOM.
"""

from __future__ import annotations

import html
import json
import os
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from strata.local.events import Message, click_events, produce
from strata.quality.checks import reason_class
from strata.quality.run import write_summary_page
from strata.run import run_batch
from strata.schema.avro import QUARANTINE_SCHEMA
from strata.store.ledger import LEDGER_SCHEMA
from tests.conftest import produce_clicks
from tests.integration.quality.test_quality import CHROMIUM, check, chromium, recent_start

pytestmark = pytest.mark.integration

# Closes a quoted attribute of either kind, then runs a script and an image's onerror.
HOSTILE = (
    "\"'><script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
)


class Dom(HTMLParser):
    """The elements and the text of a page as Chromium serialized it (`--dump-dom`)."""

    def __init__(self, markup: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self.title = ""
        self._inside: str | None = None  # script, style or title, while in one
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        if tag in ("script", "style", "title"):
            self._inside = tag

    def handle_endtag(self, tag: str) -> None:
        if tag == self._inside:
            self._inside = None

    def handle_data(self, data: str) -> None:
        if self._inside == "script":
            self.scripts.append(data)
        elif self._inside == "title" and not any(t == "body" for t, _ in self.elements):
            self.title += data  # the document's title, not an SVG <title> in the body
        elif self._inside != "style":
            self.text.append(data)

    def assert_nothing_injected(self) -> None:
        """No payload ran, and none became an element or an event handler."""
        assert "pwned" not in self.title, self.title
        assert not [s for s in self.scripts if "pwned" in s]
        assert not [a for t, a in self.elements if t == "img" and a.get("src") == "x"]
        handlers = [
            (t, a)
            for t, a in self.elements
            if any(k.startswith("on") and "pwned" in (v or "") for k, v in a.items())
        ]
        assert not handlers, handlers

    def shown(self) -> str:
        return "".join(self.text)


def open_page(path: Path, cwd: Path) -> Dom:
    done = chromium("--dump-dom", path.as_uri(), cwd=cwd)
    assert done.returncode == 0, done.stderr
    return Dom(done.stdout)


def test_hostile_messages_are_shown_as_text_in_the_data_docs_and_the_summary_page(
    make_pipeline, broker, spark, tmp_path
):
    assert os.path.exists(CHROMIUM), "`make test` installs Debian's chromium (make chromium)"
    p = make_pipeline(
        partitions=2,
        overrides={
            "quality": {
                "value_sets": {"country": ["US", "DE", "IN", "BR", "JP", "FR", "GB"]},
                "expectations": [
                    {
                        "type": "expect_column_values_to_match_regex",
                        "kwargs": {"column": "page", "regex": "^/"},
                    }
                ],
            }
        },
    )
    start = recent_start()
    [template] = [m for m in click_events(1, start, 1) if m.kind == "ok"]
    record = json.loads(template.value)
    # Valid for the schema, so they land as rows and fail the page and country checks.
    valid = [
        json.dumps({**record, "page": HOSTILE, "country": HOSTILE, "referrer": HOSTILE}).encode(),
        json.dumps({**record, "event_id": "second", "page": HOSTILE, "country": HOSTILE}).encode(),
    ]
    # Not JSON for the schema, so they are quarantined with their bytes.
    malformed = [
        f'{{"event_id": "{HOSTILE}", "user_id": 1, "page": "/x", "device": '.encode(),
        HOSTILE.encode(),
    ]
    produce(
        broker.bootstrap,
        p.topic,
        2,
        iter(Message(b"h", value, start, "hostile") for value in [*valid, *malformed]),
    )
    produce_clicks(broker, p.topic, 2, 200, start_ms=start, hours=1)
    run_batch(p.cfg(), session=lambda _: spark)
    result = check(p.cfg())

    quarantined = p.table_rows("quarantine", ["_value", "reason"]).to_pylist()
    assert sorted(r["_value"] for r in quarantined) == sorted(malformed)
    failed = {c.name + " " + (c.column or ""): c for c in result.failed}
    assert set(failed) == {
        "expect_column_values_to_match_regex page",
        "expect_column_values_to_be_in_set country",
    }
    # The result for machines keeps the text as it came; only the pages escape it.
    assert all("<script>document.title='pwned'</script>" in c.detail for c in failed.values())

    quality = Path(p.cfg().location("quality"))
    assert result.docs and (quality / result.docs).is_file()
    docs = open_page(quality / result.docs, tmp_path)
    docs.assert_nothing_injected()
    shown = docs.shown()
    # Each failed check lists the value as an unexpected value, as the text it is, and
    # escaped once: `&lt;` would be on show if it had been escaped twice.
    assert shown.count(HOSTILE) >= 2, shown
    assert html.escape(HOSTILE) not in shown and "&lt;" not in shown
    for other in (quality / "docs" / "index.html", *(quality / "docs").glob("expectations/*")):
        open_page(other, tmp_path).assert_nothing_injected()

    summary = open_page(quality / "index.html", tmp_path)
    summary.assert_nothing_injected()
    assert summary.title == f"{p.name} quality"
    assert not [t for t, _ in summary.elements if t == "script"]
    # The malformed messages are counted under their reason's class, which hides what it quotes.
    assert "not valid JSON" in summary.shown()
    [link] = [a for t, a in summary.elements if t == "a"]
    assert link["href"] == result.docs


def test_every_value_the_summary_page_shows_is_escaped(make_pipeline, tmp_path):
    """Each field of the page, given markup, shows it as text.

    The real run above cannot reach every field: the reasons the decoder writes quote
    message text only where their class puts a placeholder; topic names
    are limited by Kafka; notes, check names and partition names come from operators,
    the config and event times. So each part of the page gets hostile text here, through
    the stores it reads: the quarantine table, the ledger rows and the results.
    """
    assert os.path.exists(CHROMIUM), "`make test` installs Debian's chromium (make chromium)"
    p = make_pipeline(partitions=1, create=False)
    cfg = p.cfg()
    # The page groups reasons by class, replacing quoted values and numbers: this one,
    # with neither, is its own class.
    reason = "<img src=x onerror=document.write(document.domain)>"
    assert reason_class(reason) == reason
    coordinates = {"_topic": p.topic, "_partition": 0, "_offset": 0, "_batch": 1}
    write_deltalake(
        cfg.location("quarantine"),
        pa.Table.from_pylist([{**coordinates, "reason": reason}], QUARANTINE_SCHEMA),
    )
    now = datetime.now(UTC)
    row = {name: 0 for name in LEDGER_SCHEMA.names}
    row.update(pipeline=p.name, batch=1, partition=0, committed_at=now, note=None,
               min_event_time=None, max_event_time=None, high_watermark=None)  # fmt: skip
    ledger = pa.Table.from_pylist(
        [
            {**row, "kind": "ingest", "topic": HOSTILE, "end_offset": 10, "messages": 10},
            {**row, "kind": "loss", "topic": HOSTILE, "end_offset": 5, "note": HOSTILE},
        ],
        LEDGER_SCHEMA,
    )
    hour = datetime.fromtimestamp(recent_start() / 1000, UTC).strftime("dt=%Y-%m-%d/hr=%H")
    results = [
        {
            "batch": 1,
            "success": False,
            "docs": "javascript:document.title='pwned'//" + HOSTILE,
            "checks": [{"name": HOSTILE, "column": HOSTILE, "success": False}],
            "partitions": {hour: 3, HOSTILE: 7},
            "incomplete": [HOSTILE],
            "lateness": {},
        }
    ]
    page = Path(write_summary_page(cfg.places(), cfg.quality, results, ledger))

    dom = open_page(page, tmp_path)
    dom.assert_nothing_injected()
    assert not [t for t, _ in dom.elements if t == "script"]
    shown = dom.shown()
    # The quarantine reasons plot: the reason as the bar's label and in its title.
    assert shown.count(reason) == 2, shown
    # The loss (its topic and its note), the failed check (name and column) and the
    # event-time tile: each shown whole.
    assert f"partition 0 of {HOSTILE} (5 messages); {HOSTILE}" in shown
    assert f"{HOSTILE} ({HOSTILE})" in shown
    assert shown.count(HOSTILE) == 5, shown
    tiles = [a["title"] for t, a in dom.elements if t == "div" and a.get("class") == "hour bad"]
    assert tiles == [f"{HOSTILE}: 7 rows; incomplete (failed quality in batch 1)"]
    [link] = [a for t, a in dom.elements if t == "a"]
    # Kept relative: the scheme's colon is percent-encoded, so the link opens no script.
    assert link["href"] and link["href"].startswith("javascript%3A")
