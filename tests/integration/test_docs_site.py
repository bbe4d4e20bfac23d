"""The documentation site: built strictly, every page of its navigation, readable offline.

`mkdocs build --strict` fails on any warning: a broken link or anchor, a page of the
navigation that does not exist, a page left out of it. The configuration reference is
then rendered in headless Chromium (`make chromium` installs it), from disk, with a
network log: the page must show the real configuration keys, and nothing it loads may
come from the network (no web fonts, no scripts from a CDN).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.quality.test_quality import CHROMIUM, chromium

ROOT = Path(__file__).resolve().parents[2]
# Requests Chromium makes for itself (component updates, sign-in) have no page origin.
BROWSER_OWN = "not an origin"


def nav_pages(nav: list[object]) -> Iterator[str]:
    """The Markdown files a MkDocs `nav` names, in its order.

    Args:
        nav: The `nav` of mkdocs.yml: titles mapped to a file or to a nested list.

    Yields:
        Each file, relative to the docs directory.
    """
    for entry in nav:
        targets = entry.values() if isinstance(entry, dict) else [entry]
        for target in targets:
            if isinstance(target, list):
                yield from nav_pages(target)
            else:
                yield str(target)


def page_requests(net_log: Path) -> list[str]:
    """The http(s) URLs a page asked for, from a Chromium network log.

    Args:
        net_log: The file `--log-net-log` wrote.

    Returns:
        Every http or https URL whose request a page started (the browser's own
        background requests left out).
    """
    log = json.loads(net_log.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [
        event["params"]["url"]
        for event in log["events"]
        if event["type"] == start
        and event.get("params", {}).get("initiator", BROWSER_OWN) != BROWSER_OWN
        and re.match(r"https?://", event["params"].get("url", ""))
    ]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with `mkdocs build --strict` into a temporary directory."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=env,
    )
    assert built.returncode == 0, built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    return out


def test_every_page_of_the_navigation_is_built(site):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["theme"]["font"] is False, "Google Fonts would need the network"
    pages = list(nav_pages(config["nav"]))
    for page in (
        "index.md",
        "concepts.md",
        "configuration.md",
        "cli.md",
        "operations.md",
        "playground.md",
        "reference/configuration.md",
        "reference/cli.md",
        "reference/metrics.md",
        "reference/modules.md",
    ):
        assert page in pages, f"{page} is not in mkdocs.yml's nav"
    for page in pages:
        html = site / Path(page).with_suffix(".html")
        assert html.is_file(), f"{page} was not built"
        text = html.read_text()
        assert "<h1" in text and "<article" in text, f"{html} has no page content"
    # Every Markdown file under docs/ is a page of the navigation.
    written = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert written == set(pages)


def test_no_page_loads_anything_from_the_network(site):
    remote = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"(https?://[^\"]+)\"")
    for html in site.rglob("*.html"):
        assert not remote.findall(html.read_text()), html
    for css in site.rglob("*.css"):
        assert "fonts.googleapis.com" not in css.read_text(), css


def test_the_network_log_shows_what_a_page_fetches(tmp_path):
    """The check below can fail: a page that loads a script is caught by its request."""
    assert os.path.exists(CHROMIUM), "`make test` installs Debian's chromium (make chromium)"
    html = tmp_path / "fetches.html"
    html.write_text('<html><body><script src="http://127.0.0.1:9/cdn.js"></script></body></html>')
    net_log = tmp_path / "net-log.json"
    dumped = chromium(f"--log-net-log={net_log}", "--dump-dom", html.as_uri(), cwd=tmp_path)
    assert dumped.returncode == 0, dumped.stderr
    assert page_requests(net_log) == ["http://127.0.0.1:9/cdn.js"]


def test_the_configuration_reference_renders_offline_in_headless_chromium(site, tmp_path):
    assert os.path.exists(CHROMIUM), "`make test` installs Debian's chromium (make chromium)"
    page = (site / "reference" / "configuration.html").as_uri()
    net_log = tmp_path / "net-log.json"
    dumped = chromium(f"--log-net-log={net_log}", "--dump-dom", page, cwd=tmp_path)
    assert dumped.returncode == 0, dumped.stderr
    dom = dumped.stdout
    for key in ("kafka.bootstrap_servers", "limits.target_file_mb", "quality.gate"):
        assert f"<code>{key}</code>" in dom, key
    assert "Configuration reference" in dom
    # Material's navigation is there, with the reference section's pages.
    assert "Command-line options" in dom and "Module map" in dom
    assert page_requests(net_log) == []

    shot = tmp_path / "docs-configuration.png"
    done = chromium(f"--screenshot={shot}", "--window-size=1280,1600", page, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert shot.stat().st_size > 10_000
