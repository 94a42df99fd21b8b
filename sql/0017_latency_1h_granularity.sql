-- 0017: latency_1h in granules of 256 rows, not 8192 (issue 53). A panel over a month
-- reads the hourly rollup's rows of one key (the all-traffic key, or a few) for a few
-- boundaries: 720 rows each, contiguous in the ordering key. But each row is a sketch
-- state (sumMap bins: ~100 a row), and the engine deserialises every state of every
-- granule it reads: with 8192-row granules the P50 / P99 panel read ~30,000 states for
-- 200 wanted (2 s on a 2-day store, more on a month); with 256-row granules, 0.24 s.
-- The granule size cannot be altered: the table is renamed, created again, refilled
-- from the old one (its states copied as they are) and the old one dropped; its view is
-- created again as 0006 defined it (the repair of rollups reads the views' SELECTs from
-- the migrations: the same text). latency_1m keeps its granules (a day of it is
-- 1,440 rows per key and boundary; refilling a month of it would take an hour).
DROP VIEW IF EXISTS ${db}.latency_1h_mv ${on_cluster};
RENAME TABLE ${db}.latency_1h TO ${db}.latency_1h_0016 ${on_cluster};

CREATE TABLE ${db}.latency_1h ${on_cluster} AS ${db}.latency_1h_0016
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (boundary, model, priority, ctx_bucket, window_start)
SETTINGS ${dedup_window_setting}, index_granularity = 256;

CREATE MATERIALIZED VIEW ${db}.latency_1h_mv ${on_cluster} TO ${db}.latency_1h AS
SELECT
    toStartOfHour(window_start) AS window_start,
    model, priority, ctx_bucket, boundary,
    sum(records) AS records, sum(count) AS count, sum(sum) AS sum,
    min(min) AS min, max(max) AS max, sum(zero_count) AS zero_count,
    sumMapState(pos_keys, pos_counts) AS pos,
    sumMapState(neg_keys, neg_counts) AS neg
FROM ${db}.window_sketches
WHERE boundary != '__slo__'
GROUP BY window_start, model, priority, ctx_bucket, boundary;

INSERT INTO ${db}.latency_1h SELECT * FROM ${db}.latency_1h_0016;

DROP TABLE ${db}.latency_1h_0016 ${on_cluster};
