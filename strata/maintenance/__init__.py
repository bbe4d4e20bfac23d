"""Keeping the tables fast to read: compaction, log checkpoints, vacuum.

- `compact`: small files merged into target-sized ones, disturbing no run; behind it,
  `_bins` (the partitions picked, the Spark task merging a bin), `_commit` (a Delta
  partition's commit), `_moves` (a plain Parquet partition's move) and `_iceberg` (an
  Iceberg partition's swap);
- `vacuum`: log checkpoints, files no table needs deleted, and the tables' health;
  behind it, `_iceberg` (expired snapshots, an Iceberg table's orphans), `_sweep` (what
  plain Parquet moves left), and `_ownership` (a place holding another table's files
  is refused);
- `_fences`: the highest fence the tables hold, which a maintenance lease's token starts
  above;
- `report`: what a checkpoint or vacuum did, in one shape for every table format.
"""
