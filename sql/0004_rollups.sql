-- 0004: per-minute and per-hour rollups for dashboards, fed by materialized
-- views from the base windows (partitions and topics merged). Read with
-- sumMapMerge(pos) / sumMapMerge(neg) and the quantile expression of
-- pipeline/adapters/sketch_sql.py; counts with sum().
CREATE TABLE IF NOT EXISTS ${db}.latency_1m ${on_cluster}
(
    window_start DateTime('UTC'),
    model        LowCardinality(String),
    priority     LowCardinality(String),
    ctx_bucket   LowCardinality(String),
    boundary     LowCardinality(String),
    records      SimpleAggregateFunction(sum, UInt64),
    count        SimpleAggregateFunction(sum, UInt64),
    sum          SimpleAggregateFunction(sum, Float64),
    min          SimpleAggregateFunction(min, Float64),
    max          SimpleAggregateFunction(max, Float64),
    zero_count   SimpleAggregateFunction(sum, UInt64),
    pos          AggregateFunction(sumMap, Array(Int32), Array(UInt64)),
    neg          AggregateFunction(sumMap, Array(Int32), Array(UInt64))
)
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (boundary, model, priority, ctx_bucket, window_start)
SETTINGS ${dedup_window_setting};

CREATE MATERIALIZED VIEW IF NOT EXISTS ${db}.latency_1m_mv ${on_cluster} TO ${db}.latency_1m AS
SELECT
    toStartOfMinute(window_start) AS window_start,
    model, priority, ctx_bucket, boundary,
    sum(records) AS records, sum(count) AS count, sum(sum) AS sum,
    min(min) AS min, max(max) AS max, sum(zero_count) AS zero_count,
    sumMapState(pos_keys, pos_counts) AS pos,
    sumMapState(neg_keys, neg_counts) AS neg
FROM ${db}.window_sketches
WHERE boundary != '__slo__'
GROUP BY window_start, model, priority, ctx_bucket, boundary;

CREATE TABLE IF NOT EXISTS ${db}.latency_1h ${on_cluster} AS ${db}.latency_1m
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (boundary, model, priority, ctx_bucket, window_start)
SETTINGS ${dedup_window_setting};

CREATE MATERIALIZED VIEW IF NOT EXISTS ${db}.latency_1h_mv ${on_cluster} TO ${db}.latency_1h AS
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

CREATE TABLE IF NOT EXISTS ${db}.slo_1m ${on_cluster}
(
    window_start        DateTime('UTC'),
    slo                 LowCardinality(String),
    kind                LowCardinality(String),
    objective           SimpleAggregateFunction(any, Float64),
    secondary_weight    SimpleAggregateFunction(any, Float64),
    total               SimpleAggregateFunction(sum, UInt64),
    good                SimpleAggregateFunction(sum, UInt64),
    good_secondary_only SimpleAggregateFunction(sum, UInt64)
)
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (slo, kind, window_start)
SETTINGS ${dedup_window_setting};

CREATE MATERIALIZED VIEW IF NOT EXISTS ${db}.slo_1m_mv ${on_cluster} TO ${db}.slo_1m AS
SELECT toStartOfMinute(window_start) AS window_start, slo, kind,
       any(objective) AS objective, any(secondary_weight) AS secondary_weight,
       sum(total) AS total, sum(good) AS good, sum(good_secondary_only) AS good_secondary_only
FROM ${db}.slo_windows
GROUP BY window_start, slo, kind;

CREATE TABLE IF NOT EXISTS ${db}.slo_1h ${on_cluster} AS ${db}.slo_1m
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (slo, kind, window_start)
SETTINGS ${dedup_window_setting};

CREATE MATERIALIZED VIEW IF NOT EXISTS ${db}.slo_1h_mv ${on_cluster} TO ${db}.slo_1h AS
SELECT toStartOfHour(window_start) AS window_start, slo, kind,
       any(objective) AS objective, any(secondary_weight) AS secondary_weight,
       sum(total) AS total, sum(good) AS good, sum(good_secondary_only) AS good_secondary_only
FROM ${db}.slo_windows
GROUP BY window_start, slo, kind;
