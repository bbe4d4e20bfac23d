"""The tables' schemas: Avro to Arrow, the partitions, and the schemas producers write.

- `avro`: Avro schemas and the Arrow schemas of the tables Strata writes;
- `names`: which names fields may take, as Hive, Trino and Delta compare them;
- `partitions`: which event-time (and field) partition a row lands in, and back;
- `registry`: writer schemas from a Confluent Schema Registry;
- `evolve`: a table that follows its registry subject.
"""
