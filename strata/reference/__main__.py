"""`python -m strata.reference [--check] DIRECTORY`: write the reference pages, or check them.

Exit codes: 0 when the pages were written or are up to date, 1 when `--check` found
a page missing or stale (it names them, and the command that rewrites them).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from strata.reference import COMMAND, PAGES, stale, write


def main(argv: Sequence[str] | None = None) -> int:
    """Write the pages into the directory given, or with `--check` compare them.

    Args:
        argv: Arguments; `sys.argv[1:]` if None.

    Returns:
        The exit code.
    """
    parser = argparse.ArgumentParser(
        prog="python -m strata.reference",
        description="Write the documentation's reference pages ("
        + ", ".join(PAGES)
        + ") from the code.",
    )
    parser.add_argument("directory", help="where the pages go, e.g. docs/reference")
    parser.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 naming the pages that differ from the code",
    )
    args = parser.parse_args(argv)
    if args.check:
        found = stale(args.directory)
        if found:
            where = ", ".join(f"{args.directory.rstrip('/')}/{name}" for name in found)
            sys.stderr.write(
                f"stale reference pages: {where}; the code changed since they were "
                f"written: run `{COMMAND}` and commit the result\n"
            )
            return 1
        sys.stdout.write(f"the reference pages in {args.directory} are up to date\n")
        return 0
    written = write(args.directory)
    sys.stdout.write(
        f"wrote {', '.join(written)} in {args.directory}\n"
        if written
        else f"the reference pages in {args.directory} were up to date\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
