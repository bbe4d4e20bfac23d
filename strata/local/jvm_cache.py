"""Where `make setup` puts what it fetches from Maven Central for the local stack.

Each part (the Trino server, the delta-spark jars) goes into a directory of its own in
the user's cache, outside any clone, and is marked complete (`COMPLETE`, written last)
only once every file was checked against the checksums committed beside its build file
in `jvm/`. Nothing here fetches anything: a part missing or never completed is an error
that names `make setup`.
"""

from __future__ import annotations

import os
from pathlib import Path

# Written by the Makefile into a part's directory after everything in it was checked.
COMPLETE = ".complete"


def jvm_cache(entry: str) -> Path:
    """The directory of one fetched part, as the Makefile names it: `strata/jvm/ENTRY`
    under `XDG_CACHE_HOME` (`~/.cache` when unset)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "strata" / "jvm" / entry


def is_complete(home: Path) -> bool:
    """Whether `make setup` finished filling `home` (its stamp is there)."""
    return (home / COMPLETE).is_file()
