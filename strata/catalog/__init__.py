"""The catalog: the tables in the Hive Metastore and Trino, and when a partition is complete.

- `metastore`: a thin client of the metastore's thrift API;
- `register`: the tables and their partitions registered, idempotently;
- `_partitions`: the partitions on storage, and those changed since the last registration;
- `sql`: Trino DDL and calls;
- `query`: one Trino query on the tables, embedded (DuckDB) or in Trino (`strata sql query`);
- `_reads`: what an embedded query may read: the pipeline's tables, and nothing else;
- `types`: each Arrow type as Hive and Trino spell it;
- `completeness`: when an event-time partition will not change any more.
"""
