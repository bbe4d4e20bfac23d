"""Keeping the tables fast to read: compaction, log checkpoints, vacuum.

- `compact`: small files merged into target-sized ones, disturbing no run;
- `vacuum`: log checkpoints, files no table needs deleted, and the tables' health.
"""
