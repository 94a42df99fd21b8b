-- 0022: by_tenant (0020) again, with granules of 4,096 rows (issue 53). ClickHouse reads a
-- query from the projection when that reads fewer marks: as 0020 made it, the projection
-- of a month (8,192 rows a granule, packed in its own order) had slightly fewer marks than
-- the table (6,395 against 6,523), so every scan of the whole table went through it and
-- lost what the table's own order gives (the report's check for retried requests, 0.06 s
-- from the table: 2.0 s from the projection; a report over 30 days 2.6 s against 0.46).
-- With granules half as long a whole scan has twice the marks there and stays on the
-- table; a tenant's period is still a few hundred marks of the projection.
ALTER TABLE ${db}.requests ${on_cluster} DROP PROJECTION IF EXISTS by_tenant;
ALTER TABLE ${db}.requests ${on_cluster}
    ADD PROJECTION IF NOT EXISTS by_tenant (SELECT * ORDER BY tenant, end_unix_ns)
    WITH SETTINGS (index_granularity = 4096);
ALTER TABLE ${db}.requests ${on_cluster} MATERIALIZE PROJECTION by_tenant;
