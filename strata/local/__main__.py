"""`python -m strata.local`: the same as the `strata-local` command."""

from strata.local.cli import entry

entry()
