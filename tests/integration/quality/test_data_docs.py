"""The Data Docs site of a pipeline through the real run: its index keeps every run."""

from __future__ import annotations

import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

from strata.local.events import HOUR_MS
from strata.run import run_batch
from tests.conftest import produce_clicks
from tests.integration.quality.test_quality import check


class Links(HTMLParser):
    """Every link's target in a page, and its text."""

    def __init__(self, markup: str) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None
        self.feed(markup)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self.links.append((unquote(self._href), data))
            self._href = None


def test_the_index_links_every_checked_batch_and_each_page_is_there(make_pipeline, broker, spark):
    p = make_pipeline(partitions=1)
    start = (int(time.time() * 1000) // HOUR_MS - 2) * HOUR_MS
    docs = {}
    for batch in (1, 2, 3):
        produce_clicks(broker, p.topic, 1, 40, start_ms=start, hours=1, seed=batch)
        run_batch(p.cfg(), session=lambda _: spark)
        docs[batch] = check(p.cfg(), batch).docs
    quality = Path(p.cfg().location("quality"))

    index = (quality / "docs" / "index.html").read_text()
    links = Links(index).links
    pages = {href for href, _ in links if href.startswith("validations/")}
    for batch, page in docs.items():
        assert page is not None and page.removeprefix("docs/") in pages, (batch, sorted(pages))
        assert f"/batch-{batch:010d}/" in page
    # Each batch has a page per suite: its rows, and uniqueness over the table.
    assert len(pages) == 6
    assert all((quality / "docs" / page).is_file() for page in pages)
    suites = {href for href, _ in links if href.startswith("expectations/")}
    assert suites == {f"expectations/{p.name}.html", f"expectations/{p.name}_table.html"}
    assert all((quality / "docs" / page).is_file() for page in suites)
    # Newest first: batch 3's validations, then 2's, then 1's.
    runs = [href.split("/")[2] for href, _ in links if href.startswith("validations/")]
    assert runs == [f"batch-{b:010d}" for b in (3, 3, 2, 2, 1, 1)]
