"""The reference pages (`docs/reference/`) are what the code makes of itself now.

Each page is generated (`python -m strata.reference docs/reference`): the committed
pages must equal what the generator writes, and each must list everything it is
the reference of. The configuration's descriptions are the models' `Attributes:`
docstrings, which must describe every field and no other.
"""

from __future__ import annotations

import argparse
import difflib
import re
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from strata.config import KafkaConfig
from strata.config._checks import Duration, Zone
from strata.config._load import _fix_hint
from strata.operations.metrics import METRICS
from strata.reference import COMMAND, PAGES, render, stale, write
from strata.reference import cli as cli_page
from strata.reference import config as config_page
from strata.reference import modules as modules_page
from strata.reference.__main__ import main
from strata.reference._docstrings import first_sentence, paragraphs, section
from strata.reference._markdown import cell, code

ROOT = Path(__file__).resolve().parents[2]
PAGES_DIR = ROOT / "docs" / "reference"


@pytest.fixture(scope="module")
def made() -> dict[str, str]:
    return render()


def _page(name: str) -> str:
    path = PAGES_DIR / name
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing; run `{COMMAND}`"
    return path.read_text(encoding="utf-8")


# --- the committed pages are the generator's -------------------------------------------


@pytest.mark.parametrize("name", list(PAGES))
def test_the_committed_page_is_what_the_code_makes_now(name, made):
    diff = list(
        difflib.unified_diff(
            _page(name).splitlines(),
            made[name].splitlines(),
            "committed",
            "made now",
            n=0,
            lineterm="",
        )
    )
    assert not diff, (
        f"docs/reference/{name} is stale: the code changed since it was written; "
        f"run `{COMMAND}` and commit the result. First differences:\n" + "\n".join(diff[:12])
    )


def test_a_page_with_a_line_deleted_or_missing_is_stale(tmp_path, made):
    write(tmp_path)
    assert stale(tmp_path, made) == []
    lines = (tmp_path / "metrics.md").read_text().splitlines(keepends=True)
    row = next(i for i, line in enumerate(lines) if line.startswith("| `strata_run_rows`"))
    (tmp_path / "metrics.md").write_text("".join(lines[:row] + lines[row + 1 :]))
    (tmp_path / "cli.md").unlink()
    assert stale(tmp_path, made) == ["cli.md", "metrics.md"]


def test_the_check_names_the_stale_pages_and_the_command_that_fixes_them(tmp_path, capsys):
    assert main([str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PAGES)
    assert main(["--check", str(tmp_path)]) == 0
    (tmp_path / "configuration.md").write_text("# Configuration reference\n")
    capsys.readouterr()
    assert main(["--check", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "configuration.md" in err and COMMAND in err
    assert "cli.md" not in err
    assert main([str(tmp_path)]) == 0
    assert main(["--check", str(tmp_path)]) == 0


# --- the configuration: one source of descriptions -------------------------------------


def _models() -> list[type[BaseModel]]:
    """Every model the configuration is made of, each once."""
    return list({s.model: None for s in config_page.sections()})


def test_the_walk_reaches_every_section_of_the_configuration():
    models = {m.__name__ for m in _models()}
    # The sections nested in mappings and lists of sections are reached too.
    assert {"PipelineConfig", "KafkaConfig", "RangeRule", "ExpectationConfig"} <= models
    assert {"FieldPartitionConfig", "RoutingConfig", "MetricsConfig"} <= models


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.__name__)
def test_every_field_is_described_in_its_docstring_and_nothing_else(model):
    undescribed, unknown = config_page.described(model)
    assert not undescribed, (
        f"{model.__name__}: describe {', '.join(undescribed)} under `Attributes:` in its docstring"
    )
    assert not unknown, (
        f"{model.__name__}: its docstring describes {', '.join(unknown)}, no field of it; "
        "remove them or fix their names"
    )


def test_a_field_without_a_description_and_a_description_without_a_field_are_found():
    class Sample(BaseModel):
        """A section.

        Attributes:
            kept: Described, over
                two lines.
            gone: A field that was removed.
        """

        kept: int = 1
        added: str = "x"

    assert config_page.described(Sample) == (["added"], ["gone"])
    assert section(Sample.__doc__, "Attributes")["kept"] == "Described, over two lines."


def test_every_key_is_in_the_configuration_page():
    page = _page("configuration.md")
    keys = config_page.keys()
    assert len(keys) > 100 and "kafka.bootstrap_servers" in {k.path for k in keys}
    missing = [k.path for k in keys if f"| {code(k.path)} | {code(k.type)} |" not in page]
    assert not missing, f"not in docs/reference/configuration.md, run `{COMMAND}`: {missing}"


def test_each_key_is_listed_with_its_description_and_default():
    by_path = {k.path: k for k in config_page.keys()}
    timeout = by_path["kafka.timeout_s"]
    assert timeout.default == code(str(KafkaConfig().timeout_s))
    assert timeout.description == section(KafkaConfig.__doc__, "Attributes")["timeout_s"] != ""
    assert by_path["name"].default == "required"
    assert by_path["quality.ranges.*.min"].type == "float | None"
    assert by_path["quality.expectations[*].type"].default == "required"
    assert by_path["partitioning.field.name"].description


def test_types_are_written_readably():
    name = config_page.type_name
    assert name(Literal["delta", "parquet"]) == '"delta" | "parquet"'
    assert name(list[str]) == "list[str]"
    assert name(tuple[str, ...]) == "list[str]"
    assert name(dict[str, list[Any]]) == "dict[str, list[any]]"
    assert name(Duration) == "duration"
    assert name(Duration | None) == "duration | None"
    assert name(Zone) == "time zone"

    class Bounded(BaseModel):
        count: int = Field(default=1, gt=0, le=9)

    field = Bounded.model_fields["count"]
    assert name(field.annotation, field.metadata) == "int (> 0, <= 9)"


def test_a_type_with_a_bar_stays_in_its_table_cell():
    assert code("str | None") == "<code>str &#124; None</code>"
    assert code('"a" | "b"') == '<code>"a" &#124; "b"</code>'
    assert code("int") == "`int`"
    page = _page("configuration.md")
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    # Every row of a table has its four cells: no `|` of a type split one.
    assert rows and all(len(re.split(r"(?<!\\)\|", row)) == 6 for row in rows)


def test_a_config_error_points_at_the_configuration_page():
    for kind in ("extra_forbidden", "missing"):
        hint = _fix_hint({"type": kind})
        found = re.search(r"docs/reference/(\w+\.md)", hint)
        assert found and found.group(1) in PAGES, hint
        assert (ROOT / found.group()).is_file()


# --- the command line -------------------------------------------------------------------


def test_every_installed_command_is_in_the_cli_page():
    scripts = cli_page.console_scripts()
    assert {"strata", "strata-local"} <= set(scripts)
    page = _page("cli.md")
    missing = [name for name in scripts if f"## `{name}`" not in page]
    assert not missing, f"not in docs/reference/cli.md, run `{COMMAND}`: {missing}"


def _subsection(page: str, heading: str) -> str:
    start = page.index(heading)
    end = page.find("\n## ", start)
    nxt = page.find("\n### ", start + len(heading))
    ends = [i for i in (end, nxt) if i != -1]
    return page[start : min(ends) if ends else len(page)]


def test_every_subcommand_and_its_options_are_in_the_cli_page():
    page = _page("cli.md")
    checked = 0
    for command in cli_page.commands():
        subs = cli_page.subcommands(command.parser)
        assert subs, f"{command.name} has no subcommands"
        for sub in subs:
            heading = f"### `{command.name} {sub.name}`"
            assert heading in page, f"{heading} not in docs/reference/cli.md; run `{COMMAND}`"
            text = _subsection(page, heading)
            for action in cli_page.options(sub.parser):
                shown = f"| {code(cli_page.argument(action))} |"
                assert shown in text, f"{command.name} {sub.name}: {shown} not in its section"
                checked += 1
    assert checked > 40


def test_an_alias_is_one_subcommand_with_both_names():
    parser = argparse.ArgumentParser(prog="tool")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("register", aliases=["publish"], help="register it")
    sub.add_parser("demo")
    found = cli_page.subcommands(parser)
    assert [(s.name, s.aliases, s.help) for s in found] == [
        ("register", ("publish",), "register it"),
        ("demo", (), ""),
    ]


# --- the metrics ------------------------------------------------------------------------


def test_every_metric_is_in_the_metrics_page():
    page = _page("metrics.md")
    assert len(METRICS) > 10
    missing = [name for name in METRICS if f"| `{name}` | gauge |" not in page]
    assert not missing, f"not in docs/reference/metrics.md, run `{COMMAND}`: {missing}"
    for name, (helptext, labels) in METRICS.items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{name}` |"))
        assert all(f"`{label}`" in row for label in labels) and cell(helptext) in row


# --- the module map ---------------------------------------------------------------------

# A line of the map: its indentation (four spaces a level), name, and what it is for.
ENTRY = re.compile(r"(?P<indent> *)- `(?P<name>[\w.]+/?)`(?:: (?P<what>.+))?")


def _listed(lines: list[str]) -> dict[str, str]:
    """Each file the map lists, relative to the checkout, with its line.

    A folder stands for its `__init__.py` (or for itself, if it has none).
    """
    folders: list[str] = []
    listed: dict[str, str] = {}
    for line in lines:
        entry = ENTRY.fullmatch(line)
        if not entry:
            continue
        depth, odd = divmod(len(entry["indent"]), 4)
        assert not odd and depth <= len(folders), f"misplaced in the tree: {line!r}"
        del folders[depth:]
        name = entry["name"]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
            path = "/".join([*folders, "__init__.py"])
        else:
            path = "/".join([*folders, name])
        listed[path] = entry["what"] or ""
    return listed


def _map() -> dict[str, str]:
    return _listed(_page("modules.md").splitlines())


def test_the_map_lists_every_module():
    files = modules_page.module_files()
    assert "strata/run.py" in files and "strata/reference/__init__.py" in files
    missing = sorted(files - set(_map()))
    assert not missing, f"not in docs/reference/modules.md, run `{COMMAND}`: {missing}"


def test_every_module_the_map_lists_exists():
    # A folder's line stands for its `__init__.py`; `jobs/` has none.
    gone = sorted(
        m
        for m in _map()
        if not (ROOT / m).is_file()
        and not (m.endswith("/__init__.py") and (ROOT / m).parent.is_dir())
    )
    assert not gone, f"docs/reference/modules.md lists files that are gone: run `{COMMAND}`: {gone}"


def test_every_line_of_the_map_says_what_its_module_is_for():
    bare = sorted(m for m, what in _map().items() if not what)
    assert not bare, f"give these a docstring whose first sentence says what they are for: {bare}"
    short = sorted(m for m, what in _map().items() if len(what.split()) < 4)
    assert not short, f"the first sentence of these docstrings says too little: {short}"


def test_a_map_is_read_by_its_indentation():
    lines = [
        "- `strata/`: The package.",
        "    - `cli.py`: The command.",
        "    - `batch/`: One batch.",
        "        - `plan.py`: Planning.",
        "    - `run.py`: The conductor.",
        "- `jobs/`: The jobs.",
        "    - `ingest.py`: One batch.",
    ]
    assert _listed(lines) == {
        "strata/__init__.py": "The package.",
        "strata/cli.py": "The command.",
        "strata/batch/__init__.py": "One batch.",
        "strata/batch/plan.py": "Planning.",
        "strata/run.py": "The conductor.",
        "jobs/__init__.py": "The jobs.",
        "jobs/ingest.py": "One batch.",
    }
    with pytest.raises(AssertionError, match="plan.py"):
        _listed(["- `strata/`: x", "        - `plan.py`: under nothing"])


# --- docstrings read back ---------------------------------------------------------------


def test_a_docstring_is_read_as_paragraphs_then_sections():
    doc = """Summary that goes
    on, e.g. `x`. Second sentence.

    A paragraph.

    Attributes:
        a: First.
        b (int): Second,
            continued.

    Returns:
        Nothing.
    """
    assert paragraphs(doc) == ["Summary that goes on, e.g. `x`. Second sentence.", "A paragraph."]
    assert first_sentence(doc) == "Summary that goes on, e.g. `x`."
    assert section(doc, "Attributes") == {"a": "First.", "b": "Second, continued."}
    assert section(doc, "Args") == {}
    with pytest.raises(ValueError, match="a is described twice"):
        section("X.\n\nAttributes:\n    a: One.\n    a: Two.\n", "Attributes")
