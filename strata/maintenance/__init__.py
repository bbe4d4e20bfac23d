"""Keeping the tables fast to read: compaction, log checkpoints, vacuum.

- `compact`: small files merged into target-sized ones, disturbing no run; behind it,
  `_bins` (the partitions picked, the Spark task merging a bin), `_commit` (a Delta
  partition's commit) and `_moves` (a plain Parquet partition's move);
- `vacuum`: log checkpoints, files no table needs deleted, and the tables' health.
"""
