"""The module map: every module of the package, the jobs and the benchmark, with what it is for.

Each module's line is the first sentence of its docstring; a folder's is its
`__init__.py`'s. The tree is the files as they are, read without importing them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from strata.reference._docstrings import first_sentence
from strata.reference._markdown import generated, prose

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "strata": "",
    "jobs": "The Spark jobs a checkout passes to spark-submit: thin, they call `strata.jobs`.",
    "bench": "`make bench`: the benchmark and its reference programs; `make profile`.",
}
"""The folders of the checkout whose modules the map lists, with the line of one whose
`__init__.py` has no docstring to take it from (`jobs/` is no package)."""


@dataclass(frozen=True)
class Module:
    """One module file, or a folder (standing for its `__init__.py`, if it has one).

    Attributes:
        path: Relative to the checkout, `/`-separated; a folder's ends in `/`.
        depth: How deep it is in the tree; a top folder is 0.
        what: The first sentence of its docstring; empty for a folder without one.
    """

    path: str
    depth: int
    what: str


def _what(path: Path) -> str:
    if not path.is_file():
        return ""
    return first_sentence(ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))))


def _order(path: Path) -> tuple[bool, str, str]:
    # Files before folders; a private module beside the public one it serves.
    return (path.is_dir(), path.name.lstrip("_").lower(), path.name)


def _walk(root: Path, folder: Path, depth: int) -> list[Module]:
    name = folder.relative_to(root).as_posix()
    what = _what(folder / "__init__.py") or FOLDERS.get(name, "")
    out = [Module(name + "/", depth, what)]
    for path in sorted(folder.iterdir(), key=_order):
        if path.is_dir() and path.name != "__pycache__" and any(path.rglob("*.py")):
            out += _walk(root, path, depth + 1)
        elif path.suffix == ".py" and path.name != "__init__.py":
            out.append(Module(path.relative_to(root).as_posix(), depth + 1, _what(path)))
    return out


def modules(root: Path = ROOT) -> list[Module]:
    """Every module and folder the map lists, in its order.

    Args:
        root: The checkout.
    """
    return [m for f in FOLDERS if (root / f).is_dir() for m in _walk(root, root / f, 0)]


def module_files(root: Path = ROOT) -> set[str]:
    """Every module file the map must list, relative to the checkout."""
    return {p.relative_to(root).as_posix() for f in FOLDERS for p in (root / f).rglob("*.py")}


def page() -> str:
    """The page `modules.md`."""
    lines = []
    for m in modules():
        name = (
            m.path.rsplit("/", 2)[-2] + "/" if m.path.endswith("/") else m.path.rsplit("/", 1)[-1]
        )
        what = f": {prose(m.what)}" if m.what else ""
        lines.append(f"{'    ' * m.depth}- `{name}`{what}")
    return (
        "\n\n".join(
            [
                "# Module map",
                generated("the package's modules and their docstrings"),
                "Where each step of a run lives: every module of `strata/`, the spark-submit "
                "jobs of a checkout (`jobs/`) and the benchmark (`bench/`), each with the "
                "first sentence of its docstring. A folder's line is its `__init__.py`'s.",
                "\n".join(lines),
            ]
        )
        + "\n"
    )
