"""The reference pages of the documentation, generated from the code so they cannot drift.

`python -m strata.reference docs/reference` writes them; with `--check`, it changes
nothing and fails naming the pages that differ from what the code makes now. Each
page is made by one module:

- `config`: `configuration.md`, every key of `PipelineConfig` with its type, default
  and description (the models' `Attributes:` docstrings);
- `cli`: `cli.md`, every command, subcommand and option, from the argument parsers;
- `metrics`: `metrics.md`, every Prometheus metric, from its definition;
- `modules`: `modules.md`, the module map, from the files and their docstrings.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from strata.reference import cli, config, metrics, modules
from strata.reference._markdown import COMMAND

PAGES: dict[str, Callable[[], str]] = {
    "configuration.md": config.page,
    "cli.md": cli.page,
    "metrics.md": metrics.page,
    "modules.md": modules.page,
}
"""Each page's file name and the function that makes its text."""


def render() -> dict[str, str]:
    """Every page's text as the code makes it now, by file name."""
    return {name: make() for name, make in PAGES.items()}


def stale(directory: Path, pages: dict[str, str] | None = None) -> list[str]:
    """The pages of a directory that are missing or differ from what the code makes now.

    Args:
        directory: Where the pages are, e.g. `docs/reference`.
        pages: The pages as made now; made here if not given.

    Returns:
        Their file names, in `PAGES` order.
    """
    made = render() if pages is None else pages
    path = Path(directory)
    return [
        name
        for name, text in made.items()
        if not (path / name).is_file() or (path / name).read_text(encoding="utf-8") != text
    ]


def write(directory: Path) -> list[str]:
    """Write every page that is missing or stale; leave the others untouched.

    Args:
        directory: Where the pages go; made if missing.

    Returns:
        The file names written.
    """
    made = render()
    changed = stale(directory, made)
    Path(directory).mkdir(parents=True, exist_ok=True)
    for name in changed:
        # newline="\n": the pages are the same bytes on every system that writes them.
        (Path(directory) / name).write_text(made[name], encoding="utf-8", newline="\n")
    return changed


__all__ = ["COMMAND", "PAGES", "render", "stale", "write"]
