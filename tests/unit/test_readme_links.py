"""README.md stays a newcomer's one or two screens, and every link in it leads somewhere.

The rest of the documentation is the site under docs/ (`make docs`), which
`mkdocs build --strict` checks link by link; the README is not part of the site, so
its links are checked here: each relative link names a file of the repository, and
an anchor into a Markdown file names one of its headings.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 250

# [text](target) outside code; an image's ![alt](target) too.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")


def links(markdown: str) -> list[str]:
    """The link targets of a Markdown text, leaving out code blocks and code spans.

    Args:
        markdown: The text.

    Returns:
        Each target as written, in order.
    """
    prose = CODE.sub("", FENCE.sub("", markdown))
    return LINK.findall(prose)


def heading_anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub and MkDocs spell them.

    Args:
        markdown: The file's text.

    Returns:
        Each heading lower-cased, its punctuation dropped and spaces made hyphens.
    """
    headings = re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", markdown), re.MULTILINE)
    anchors = set()
    for heading in headings:
        text = re.sub(r"[`*_]", "", heading).strip().lower()
        anchors.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return anchors


def test_the_readme_is_under_250_lines():
    lines = README.read_text().splitlines()
    assert 20 < len(lines) < MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_gives_the_two_commands_and_the_site():
    text = README.read_text()
    for words in ("make demo", "make test", "make docs", "Python 3.11", "Java 17"):
        assert words in text, words


def test_every_relative_link_in_the_readme_names_a_file_that_exists():
    targets = links(README.read_text())
    relative = [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]
    assert len(relative) >= 10, "the README links to the documentation's pages"
    for target in relative:
        path, _, anchor = target.partition("#")
        file = (ROOT / path) if path else README
        assert file.is_file(), f"README.md links to {target}, which does not exist"
        if anchor and file.suffix == ".md":
            assert anchor in heading_anchors(file.read_text()), (
                f"README.md links to {target}: {path or 'README.md'} has no heading #{anchor}"
            )


def test_the_link_checks_see_links_and_skip_code():
    text = "See [a](docs/a.md#x) and `[b](nowhere.md)`.\n```\n[c](nowhere.md)\n```\n"
    assert links(text) == ["docs/a.md#x"]
    assert heading_anchors("# Get started: two commands\n## `strata sql`\n") == {
        "get-started-two-commands",
        "strata-sql",
    }


def commands(block: str) -> list[str]:
    """The commands of a shell block, without their comments, spaces made single."""
    lines = (line.split("#", 1)[0] if " #" in line else line for line in block.splitlines())
    return [" ".join(line.split()) for line in lines if line.strip()]


def test_the_readmes_playground_tour_is_the_tested_tour_shortened():
    # The README's tour, in order, is a part of the playground page's tour, which
    # tests/integration/local/test_playground.py runs command for command.
    readme = README.read_text()
    tour = next(
        b for b in re.findall(r"```sh\n(.*?)```", readme, re.DOTALL) if "strata-local up" in b
    )
    page = (ROOT / "docs" / "playground.md").read_text().split("## The five-minute tour", 1)[1]
    tested = commands(re.findall(r"```bash\n(.*?)```", page, re.DOTALL)[0])
    shown = commands(tour)
    assert len(shown) >= 5
    rest = iter(tested)
    missing = [line for line in shown if not any(line == t for t in rest)]
    assert not missing, (
        f"README.md's tour runs what the playground's tested tour does not: {missing}"
    )
