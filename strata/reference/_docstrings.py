"""Google-style docstrings read back: the summary, its paragraphs and the `Attributes:` section.

The reference pages take their words from the code's docstrings, so this reads the
small part of the Google style Strata writes: a summary paragraph, paragraphs of
text, and sections (`Attributes:`, `Args:`, ...) whose entries are `name: text`
indented one level, their text going on indented deeper.
"""

from __future__ import annotations

import inspect
import re

# A section heading of the Google style, alone on its line.
_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:$")
# An entry of a section: its name (a type in parentheses may follow) and its text.
_ENTRY = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?: \([^)]*\))?:(?: (?P<text>.*))?$")
# The end of a sentence: a stop, then a space and what starts a sentence. "e.g. `x`"
# does not end one, as the next word after an abbreviation is lower-case or code.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


def paragraphs(doc: str | None) -> list[str]:
    """The docstring's paragraphs before its first section, each as one line.

    Args:
        doc: A docstring, as `__doc__` or `ast.get_docstring` give it.

    Returns:
        The summary first; empty for no docstring.
    """
    out: list[str] = []
    lines: list[str] = []
    for line in inspect.cleandoc(doc or "").splitlines():
        if _SECTION.match(line):
            break
        if line.strip():
            lines.append(line.strip())
        elif lines:
            out.append(" ".join(lines))
            lines = []
    if lines:
        out.append(" ".join(lines))
    return out


def summary(doc: str | None) -> str:
    """The docstring's first paragraph, as one line (empty for no docstring)."""
    found = paragraphs(doc)
    return found[0] if found else ""


def first_sentence(doc: str | None) -> str:
    """The first sentence of the docstring's summary, with its full stop."""
    return _SENTENCE_END.split(summary(doc), maxsplit=1)[0]


def section(doc: str | None, heading: str) -> dict[str, str]:
    """The entries of one section of a docstring, e.g. `Attributes`.

    Args:
        doc: A docstring.
        heading: The section's heading, without its colon.

    Returns:
        Each entry's name and its text as one line, in the docstring's order; empty
        when there is no such section.

    Raises:
        ValueError: An entry is there twice, or a line of the section is neither an
            entry nor the text of one.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    try:
        start = lines.index(f"{heading}:") + 1
    except ValueError:
        return {}
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    indent: int | None = None
    for line in lines[start:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:
            break  # the next section
        indent = depth if indent is None else indent
        entry = _ENTRY.match(line.strip())
        if depth == indent and entry:
            name = entry["name"]
            if name in entries:
                raise ValueError(f"{heading}: {name} is described twice")
            current = entries[name] = [entry["text"] or ""]
        elif depth > indent and current is not None:
            current.append(line.strip())
        else:
            raise ValueError(f"{heading}: {line.strip()!r} is not an entry `name: text`")
    return {name: " ".join(t for t in text if t) for name, text in entries.items()}
