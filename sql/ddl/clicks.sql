-- Tables of pipeline clicks (delta)

CREATE SCHEMA IF NOT EXISTS "delta"."strata";

CALL "delta".system.register_table(schema_name => 'strata', table_name => 'clicks', table_location => 's3://your-bucket/warehouse/clicks');

CALL "delta".system.register_table(schema_name => 'strata', table_name => 'clicks_raw', table_location => 's3://your-bucket/warehouse/clicks_raw');

CALL "delta".system.register_table(schema_name => 'strata', table_name => 'clicks_quarantine', table_location => 's3://your-bucket/warehouse/clicks_quarantine');

CALL "delta".system.register_table(schema_name => 'strata', table_name => 'clicks_ledger', table_location => 's3://your-bucket/warehouse/clicks_ledger');
