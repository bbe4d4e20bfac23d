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

from strata.errors import StrataError

# Written by the Makefile into a part's directory after everything in it was checked.
COMPLETE = ".complete"


def jvm_cache(entry: str) -> Path:
    """The directory of one fetched part, as the Makefile names it: `strata/jvm/ENTRY`
    under `XDG_CACHE_HOME` (`~/.cache` when unset)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "strata" / "jvm" / entry


def fetched(entry: str, what: str, target: str, missing: type[StrataError]) -> Path:
    """A part's directory, once `make setup` has filled it whole (its stamp is there).

    Args:
        entry: The directory's name in the cache (`jvm_cache`).
        what: What it holds, for the error: "the Trino server 476".
        target: The Makefile target that fetches it alone.
        missing: The error to raise.

    Raises:
        StrataError: `missing`, naming the directory and `make setup`, if the part is
            missing or its fetch never completed.
    """
    home = jvm_cache(entry)
    if not (home / COMPLETE).is_file():
        raise missing(
            f"{what} is not in {home}: run `make setup` (or `make {target}`), which "
            "fetches it once with Maven and checks it"
        )
    return home
