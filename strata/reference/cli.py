"""The command-line reference: every command, subcommand and option, from the argument parsers.

The commands are those `setup.cfg` installs (`[options.entry_points]`
`console_scripts`); each command's module builds its parser with `build_parser()`.
The local stack's command is reached by that name only: the product never imports
`strata.local`, and this generator runs in a checkout, where it is installed.
"""

from __future__ import annotations

import argparse
import configparser
import functools
import importlib
from dataclasses import dataclass
from pathlib import Path

from strata.reference._docstrings import paragraphs
from strata.reference._markdown import cell, code, generated, prose, table

ROOT = Path(__file__).resolve().parents[2]
# The width usage lines are wrapped at: argparse would take the terminal's, and the
# page must not depend on who ran the generator where.
_WIDTH = 88


@dataclass(frozen=True)
class Command:
    """One installed command and its parser.

    Attributes:
        name: The command, e.g. `strata`.
        module: The module of its entry point, e.g. `strata.cli`.
        parser: Its argument parser, as `build_parser()` builds it now.
    """

    name: str
    module: str
    parser: argparse.ArgumentParser


@dataclass(frozen=True)
class Subcommand:
    """One subcommand of a command.

    Attributes:
        name: Its name.
        aliases: Its other names.
        help: Its one line in the command's help.
        parser: Its own parser.
    """

    name: str
    aliases: tuple[str, ...]
    help: str
    parser: argparse.ArgumentParser


def console_scripts(setup_cfg: Path = ROOT / "setup.cfg") -> dict[str, str]:
    """The commands `setup.cfg` installs, each with the module of its entry point.

    Args:
        setup_cfg: The package's `setup.cfg`.

    Returns:
        Command name to module, in the file's order.
    """
    config = configparser.ConfigParser()
    config.read(setup_cfg, encoding="utf-8")
    found = {}
    for line in config.get("options.entry_points", "console_scripts").splitlines():
        if "=" in line:
            name, target = (part.strip() for part in line.split("=", 1))
            found[name] = target.split(":", 1)[0]
    return found


def commands() -> list[Command]:
    """Every installed command, with its parser built now."""
    out = []
    for name, module in console_scripts().items():
        parser = importlib.import_module(module).build_parser()
        if not isinstance(parser, argparse.ArgumentParser):
            raise TypeError(f"{module}.build_parser() made no argparse.ArgumentParser")
        out.append(Command(name, module, parser))
    return out


def _subparsers(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
    # argparse has no public way to list what a parser takes: its actions are read
    # as argparse's own help formatter reads them.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def subcommands(parser: argparse.ArgumentParser) -> list[Subcommand]:
    """A parser's subcommands, in the order they were added, aliases folded in."""
    action = _subparsers(parser)
    if action is None:
        return []
    helps = {a.dest: a.help or "" for a in action._choices_actions}
    names: dict[int, list[str]] = {}
    parsers: dict[int, argparse.ArgumentParser] = {}
    for name, sub in action.choices.items():
        names.setdefault(id(sub), []).append(name)
        parsers[id(sub)] = sub
    return [
        Subcommand(found[0], tuple(found[1:]), helps.get(found[0], ""), parsers[key])
        for key, found in names.items()
    ]


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """A parser's arguments and options as its help lists them, but `--help` and subcommands."""
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        and a.help != argparse.SUPPRESS
    ]


def argument(action: argparse.Action) -> str:
    """How an argument or option is written: `--pipeline PIPELINE`, `action`, `--json`."""
    if not action.option_strings:
        return str(action.metavar or action.dest)
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or (
        "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
    )
    return ", ".join(f"{o} {metavar}" for o in action.option_strings)


def _help(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    text = action.help or ""
    if action.choices and not isinstance(action.choices, dict):
        text += ("; " if text else "") + "one of " + ", ".join(f"`{c}`" for c in action.choices)
    for group in parser._mutually_exclusive_groups:
        if action in group._group_actions:
            others = [argument(a).split(" ")[0] for a in group._group_actions if a is not action]
            text += f" (not with {', '.join(others)})"
    return text


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    return code(str(action.default))


def _usage(parser: argparse.ArgumentParser) -> str:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=_WIDTH)
    return "```text\n" + parser.format_usage().strip() + "\n```"


def _options_table(parser: argparse.ArgumentParser) -> str | None:
    rows = [(code(argument(a)), cell(_help(a, parser)), _default(a)) for a in options(parser)]
    return table(("Argument", "Description", "Default"), rows) if rows else None


def _command(command: Command) -> list[str]:
    parser = command.parser
    module = importlib.import_module(command.module)
    intro = [parser.description or "", *paragraphs(module.__doc__)[1:]]
    out = [f"## `{command.name}`", *map(prose, intro)]
    found = subcommands(parser)
    if found:
        out.append(
            table(
                ("Subcommand", "What it does"),
                [(code(f"{command.name} {s.name}"), cell(s.help)) for s in found],
            )
        )
    else:
        out.append(_usage(parser))
    top = _options_table(parser)
    if top:
        out.append(top)
    for sub in found:
        out.append(f"### `{command.name} {sub.name}`")
        if sub.aliases:
            also = ", ".join(f"`{command.name} {a}`" for a in sub.aliases)
            out.append(f"Also called {also}.")
        out += [prose(sub.parser.description or sub.help), _usage(sub.parser)]
        own = _options_table(sub.parser)
        out.append(own or "It takes no arguments.")
    return [part for part in out if part]


def page() -> str:
    """The page `cli.md`."""
    found = commands()
    out = [
        "# Command-line reference",
        generated(
            "the argument parsers of the installed commands ("
            + ", ".join(f"`{c.module}.build_parser`" for c in found)
            + ")"
        ),
    ]
    for command in found:
        out += _command(command)
    return "\n\n".join(out) + "\n"
