-- Tables of pipeline clicks (delta)

CREATE SCHEMA IF NOT EXISTS "delta"."strata";

-- Trino's Delta Lake and Iceberg catalogs on the metastore Strata registers in
-- (metastore.uri) read these tables with no statement: `strata register` and every
-- run record them there, and register_table would answer ALREADY_EXISTS.
-- For catalogs on another metastore, set trino.register_delta_tables: true and
-- these calls are printed to run (the procedure must be enabled there:
-- delta.register-table-procedure.enabled=true, and for Iceberg tables
-- iceberg.register-table-procedure.enabled=true):

-- CALL "delta".system.register_table(schema_name => 'strata', table_name => 'clicks', table_location => 's3://your-bucket/warehouse/clicks');

-- CALL "delta".system.register_table(schema_name => 'strata', table_name => 'clicks_raw', table_location => 's3://your-bucket/warehouse/clicks_raw');

-- CALL "delta".system.register_table(schema_name => 'strata', table_name => 'clicks_quarantine', table_location => 's3://your-bucket/warehouse/clicks_quarantine');

-- CALL "delta".system.register_table(schema_name => 'strata', table_name => 'clicks_ledger', table_location => 's3://your-bucket/warehouse/clicks_ledger');

-- CALL "delta".system.register_table(schema_name => 'strata', table_name => 'clicks_quality', table_location => 's3://your-bucket/warehouse/clicks_quality/checks');
