"""One batch, step by step: plan, read, decode, write, reconcile, commit.

- `plan`: which offsets of which partitions a batch reads, its checks, saved plans;
- `kafka`: the brokers' side of planning (watermarks, topic ids) and offsets for lag tools;
- `read`: exact offset ranges from Kafka, inside a Spark task;
- `decode`: messages to typed rows, or quarantine rows with a reason;
- `write`: Parquet files, named per batch, task attempt and run;
- `task`: one Spark task: read, decode and write its split;
- `reconcile`: every offset read accounted for once;
- `commit`: the commit protocol, table by table, resumable after a crash at any step.
"""
