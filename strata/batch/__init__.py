"""One batch, step by step: plan, read, decode, write, reconcile, commit.

- `plan`: which offsets of which partitions a batch reads, how tasks split them, saved plans;
- `planning`: the checks a plan must pass, and the next batch's plan from the brokers;
- `kafka`: the brokers' side of planning (watermarks, topic ids) and offsets for lag tools;
- `read`: exact offset ranges from Kafka, inside a Spark task (behind it: `_consumer`,
  `_messages` to Arrow, `_gaps` confirmed with the broker, `_raw` for the raw copy);
- `decode`: messages to typed rows, or quarantine rows with a reason (behind it: `_rules`,
  `_json`, `_avro`, `_values` checked against their types, `_event_time`);
- `write`: a task's rows split by partition and written as files of a target size;
- `task`: one Spark task: read, decode and write its split;
- `reconcile`: every offset read accounted for once;
- `commit`: the commit protocol, table by table, resumable after a crash at any step;
- `outcome`: what a run did, for its summary, metrics and Airflow's XCom.
"""
