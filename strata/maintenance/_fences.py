"""The fence a maintenance run's token is taken above: the highest its tables hold.

Each fenced maintenance commit leaves its fencing token in the table (Delta: the app
transaction `<pipeline>.maintenance`; Iceberg: the table property
`strata.maintenance.<pipeline>`), and a commit carrying a lower token is refused. The
lease gives every holder a token above the previous holder's, which it reads in the
lease's folder; should that folder be removed (by hand, by a bucket's lifecycle rule),
its epochs start again at 1, below what the tables hold, and every maintenance run
would be refused until the tokens caught up. So the maintenance lease is taken with
`held_fence` as its floor (`strata.store.lease`): the token starts above every fence
the tables hold, whatever became of the folder.
"""

from __future__ import annotations

from collections.abc import Iterable

from strata.config import Location
from strata.store import iceberg, iceberg_swap
from strata.store.delta import maintenance_fence, open_table
from strata.store.places import Places


def held_fence(places: Places, roles: Iterable[Location]) -> int:
    """The highest maintenance fence the pipeline's tables hold (0: none).

    A plain Parquet data table holds none: its partitions move by markers, which
    vacuum voids instead (`strata.store.locations`); its ledger, a Delta table, does.

    Args:
        places: The pipeline's places.
        roles: The tables the run is about to touch.
    """
    highest = 0
    for which in roles:
        ref = places.table(which)
        stands: int | None = None
        if ref.format == "delta":
            table = open_table(ref.uri, ref.options)
            stands = None if table is None else maintenance_fence(table, places.pipeline)
        elif ref.format == "iceberg":
            found = iceberg.open_table(ref)
            if found is not None:
                stands = iceberg_swap.maintenance_token(found, places.pipeline)
        highest = max(highest, stands or 0)
    return highest
