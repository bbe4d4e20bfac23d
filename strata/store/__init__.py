"""Where a pipeline's tables and state live, and how they are opened, committed and locked.

- `places`: the one owner of every table's name, location, storage options and file
  system, and of the state locations, built once per pipeline by the entry points;
- `files`: local paths and `s3://` (atomic writes, create-if-absent);
- `parquet`: a table's Parquet files, written whole and named per batch and task;
- `ranges`: offset ranges, what a batch reads and the ledger commits;
- `delta`: Delta commits through delta-rs, one transaction per table and batch;
- `iceberg`, `iceberg_swap`: Iceberg commits through pyiceberg's Hive catalog, and swaps;
- `iceberg_entries`: what is left of an Iceberg table dropped or renamed in the metastore;
- `ledger`: the ledger table, the truth of what is committed (its state in
  `_ledger_state`, the topics' ids in `_log_ids`);
- `identity`: the ledger and the tables vouch for each other: a table deleted,
  dropped or replaced by hand stops the run;
- `tables`: reading a table back, Delta, Iceberg or plain Parquet;
- `locations`: where a plain Parquet partition's files are now;
- `lock`, `lease`: one run (and one maintenance) per pipeline at a time.
"""
