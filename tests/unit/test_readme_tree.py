"""The module tree in the README's Development section lists exactly the package's modules.

A folder's line stands for its `__init__.py`. The local stack's own modules may be
listed or not: `strata/local/` is one line for a reader of the product, and what is
listed under it must still exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "strata"
LOCAL = "strata/local/__init__.py"  # the one file of the local stack the tree must list

# A module or folder, indented two spaces a level, then its description after two
# spaces or more; a line that is not one continues the description above it.
ENTRY = re.compile(r"(?P<indent> *)(?P<name>[\w.]+(?:/|\.py))(?: {2,}(?P<what>\S.*))?")


def _tree(readme: str) -> list[str]:
    """The lines of the Development section's code block that begins with `strata/`."""
    section = readme.split("\n## Development\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```\n(strata/\n.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert block, "README.md's Development section has no ``` block beginning with strata/"
    return block.group(1).splitlines()


def _listed(lines: list[str]) -> dict[str, str]:
    """Each file the tree lists, relative to the repository, with its description.

    Args:
        lines: The block's lines, `strata/` first.

    Returns:
        The files (a folder as its `__init__.py`), in the tree's order.
    """
    folders: list[str] = []
    listed: dict[str, str] = {}
    for line in lines:
        entry = ENTRY.fullmatch(line)
        if not entry:
            continue
        depth, odd = divmod(len(entry["indent"]), 2)
        name = entry["name"]
        assert not odd and depth <= len(folders), f"misplaced in the tree: {line!r}"
        if depth == 0 and name != "strata/":
            break  # the repository's other folders follow the package
        del folders[depth:]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
            path = "/".join([*folders, "__init__.py"])
        else:
            path = "/".join([*folders, name])
        listed[path] = entry["what"] or ""
    return listed


def _modules() -> set[str]:
    """Every module file of the package the tree must list."""
    found = {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py")}
    return {m for m in found if not m.startswith("strata/local/") or m == LOCAL}


def _readme_tree() -> dict[str, str]:
    return _listed(_tree((ROOT / "README.md").read_text()))


def test_the_tree_lists_every_module():
    missing = sorted(_modules() - set(_readme_tree()))
    assert not missing, f"add a line for each to the module tree in README.md: {missing}"


def test_every_module_the_tree_lists_exists():
    gone = sorted(m for m in _readme_tree() if not (ROOT / m).is_file())
    assert not gone, f"take these off the module tree in README.md, or fix their paths: {gone}"


def test_every_line_of_the_tree_says_what_its_module_does():
    # The package's own line is the block's heading; the sentence above it says what it is.
    bare = sorted(m for m, what in _readme_tree().items() if not what and m != "strata/__init__.py")
    assert not bare, f"these lines of the module tree in README.md say nothing: {bare}"


def test_a_tree_is_read_by_its_indentation():
    lines = [
        "strata/",
        "  cli.py       the command",
        "  batch/       one batch",
        "    plan.py      planning, whose description",
        "                 goes on here",
        "    read.py",
        "  run.py       the conductor",
        "conf/          not the package",
        "  later.py     not the package either",
    ]
    assert _listed(lines) == {
        "strata/__init__.py": "",
        "strata/cli.py": "the command",
        "strata/batch/__init__.py": "one batch",
        "strata/batch/plan.py": "planning, whose description",
        "strata/batch/read.py": "",
        "strata/run.py": "the conductor",
    }


def test_a_line_indented_past_its_folder_is_refused():
    with pytest.raises(AssertionError, match="plan.py"):
        _listed(["strata/", "  cli.py   the command", "    plan.py   under a file"])
