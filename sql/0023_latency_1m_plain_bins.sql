-- 0023: latency_1m keeps its sketch bins as plain arrays, in granules of 1,024 rows
-- (issue 53), as latency_1h since 0017 and 0019. The report's and the panels' reads under
-- a day (the P50 / P99 series per minute) merge the minute rows of one key: as aggregate
-- states the engine deserialises every state of every granule it reads. On the month
-- store the P50 / P99 panel over 1 h read 480 wanted states from 9 granules of 8,192
-- rows (1.1 s), over 24 h 1.1-1.5 s, and `report --json` took 2.5 s over 1 h and 3.9 s
-- over 24 h against 1.1 s over 30 days (read from latency_1h). Refilling a month of it
-- (20.8 M rows) finalises each state once: ~6 s a day of rows on a 2-core machine.
-- The table is renamed, created again, refilled from the old one (each row's state
-- finalised: its bins) and the old one dropped; its view is created again with sumMap
-- for the bins (the repair of rollups reads the views' SELECTs from the migrations).
DROP VIEW IF EXISTS ${db}.latency_1m_mv ${on_cluster};
RENAME TABLE ${db}.latency_1m TO ${db}.latency_1m_0022 ${on_cluster};

CREATE TABLE ${db}.latency_1m ${on_cluster}
(
    window_start DateTime('UTC'),
    model        LowCardinality(String),
    priority     LowCardinality(String),
    ctx_bucket   LowCardinality(String),
    boundary     LowCardinality(String),
    records      SimpleAggregateFunction(sum, Int64),
    count        SimpleAggregateFunction(sum, Int64),
    sum          SimpleAggregateFunction(sum, Float64),
    min          SimpleAggregateFunction(min, Float64),
    max          SimpleAggregateFunction(max, Float64),
    zero_count   SimpleAggregateFunction(sum, Int64),
    pos          SimpleAggregateFunction(sumMap, Tuple(Array(Int32), Array(Int64))),
    neg          SimpleAggregateFunction(sumMap, Tuple(Array(Int32), Array(Int64)))
)
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (boundary, model, priority, ctx_bucket, window_start)
SETTINGS ${dedup_window_setting}, index_granularity = 1024;

CREATE MATERIALIZED VIEW ${db}.latency_1m_mv ${on_cluster} TO ${db}.latency_1m AS
SELECT
    toStartOfMinute(window_start) AS window_start,
    model, priority, ctx_bucket, boundary,
    sum(records) AS records, sum(count) AS count, sum(sum) AS sum,
    min(min) AS min, max(max) AS max, sum(zero_count) AS zero_count,
    sumMap(pos_keys, pos_counts) AS pos,
    sumMap(neg_keys, neg_counts) AS neg
FROM ${db}.window_sketches
WHERE boundary != '__slo__'
GROUP BY window_start, model, priority, ctx_bucket, boundary;

INSERT INTO ${db}.latency_1m
SELECT window_start, model, priority, ctx_bucket, boundary, records, count, sum, min, max,
    zero_count, finalizeAggregation(pos), finalizeAggregation(neg)
FROM ${db}.latency_1m_0022;

DROP TABLE ${db}.latency_1m_0022 ${on_cluster};
