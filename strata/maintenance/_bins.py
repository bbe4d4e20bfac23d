"""A compaction's work: the partitions it picked, their bins, and the task merging one.

A partition's small files are packed into bins of about the target size (`Picked`,
`Bin`); each bin is merged in a Spark task of its own (`rewrite_bin`) into sorted,
target-sized files, which the partition's commit (Delta) or move (plain Parquet)
then puts in place of the files merged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from strata.config import Location
from strata.store.files import filesystem
from strata.store.parquet import WrittenFile, partition_path, write_sized


@dataclass(frozen=True)
class Bin:
    """Small files of one partition that one Spark task merges.

    Attributes:
        uri: The table's location.
        options: Storage options.
        paths: The files, relative to the table root.
        partition_values: Their partition values.
        stem: The merged files' path, relative to the root, without the file number.
        sort_by: The columns the merged rows are sorted by.
        target_bytes: Size at which a merged file is closed.
        row_group_rows: Rows per row group.
    """

    uri: str
    options: dict[str, str] = field(repr=False)
    paths: list[str]
    partition_values: dict[str, str]
    stem: str
    sort_by: list[str]
    target_bytes: int
    row_group_rows: int


@dataclass
class Picked:
    """One partition's plan: its files now, and the bins its small files go into.

    For a plain Parquet partition, `directory` is the new directory the merged files go
    to, and `stamp` the marker that moves the partition there.
    """

    table: Location
    values: dict[str, str]
    files: list[dict[str, Any]]
    bins: list[Bin]
    directory: str = ""
    stamp: str = ""

    @property
    def name(self) -> str:
        """`dt=…/hr=…`, or `` for an unpartitioned table."""
        return partition_path(list(self.values), list(self.values.values()))

    @property
    def merged(self) -> set[str]:
        """The paths of the files its bins merge."""
        return {path for b in self.bins for path in b.paths}


def rewrite_bin(job: Bin) -> tuple[list[WrittenFile], float]:
    """Merge one bin's files into sorted, target-sized files (runs in a Spark task).

    Files written before a column was added lack it: the bin is read with the union of
    its files' schemas, so their rows read it as null, as the table shows them.

    Returns:
        The files written, and the seconds it took.
    """
    from strata.batch.task import task_attempt

    began = time.monotonic()
    fs, root = filesystem(job.uri, job.options)
    paths = [f"{root}/{p}" for p in job.paths]
    schema = pa.unify_schemas([pq.read_schema(p, filesystem=fs) for p in paths])
    rows = ds.dataset(paths, schema=schema, format="parquet", filesystem=fs).to_table()
    keys = [(c, "ascending") for c in job.sort_by if c in schema.names]
    if keys:
        rows = rows.sort_by(keys)
    # Names of this attempt's own: a speculative or retried attempt never writes over
    # a file another attempt may have reported.
    stem = f"{job.stem}-a{task_attempt()}"
    files = write_sized(
        fs, root, stem, rows, job.partition_values, job.target_bytes, job.row_group_rows
    )
    return files, time.monotonic() - began
