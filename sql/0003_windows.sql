-- 0003: closed event-time windows, one row per
-- (window, source topic, partition, key, boundary), as the stream emitted them.
-- The sketch's buckets are stored so that SQL merges windows, keys and
-- partitions and computes the same quantile as the stream (see
-- pipeline/adapters/sketch_sql.py). The all-traffic key is ('*', '*', '*').
-- A window is inserted as one block with an insert_deduplication_token per
-- (group, topic, partition, window): a re-emitted window (after a crash) is
-- dropped by ClickHouse, and so never reaches the materialized views twice.
CREATE TABLE IF NOT EXISTS ${db}.window_sketches ${on_cluster}
(
    window_start      DateTime64(3, 'UTC'),
    window_ms         UInt32,
    source_topic      LowCardinality(String),
    partition         UInt16,
    model             LowCardinality(String),
    priority          LowCardinality(String),              -- '0'..'3', 'unknown', '*'
    ctx_bucket        LowCardinality(String),
    boundary          LowCardinality(String),
    relative_accuracy Float64,
    records           UInt64,                              -- records of this key in this window
    count             UInt64,                              -- records with a value for the boundary
    sum               Float64,
    min               Float64,
    max               Float64,
    zero_count        UInt64,
    pos_keys          Array(Int32),
    pos_counts        Array(UInt64),
    neg_keys          Array(Int32),
    neg_counts        Array(UInt64)
)
ENGINE = ${replicated}ReplacingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (boundary, model, priority, ctx_bucket, window_start, source_topic, partition)
SETTINGS ${dedup_window_setting};

-- SLO counts per window: kind 'slo' (total, good) or 'blended'
-- (total, good = good on primary, good_secondary_only; weight).
CREATE TABLE IF NOT EXISTS ${db}.slo_windows ${on_cluster}
(
    window_start        DateTime64(3, 'UTC'),
    window_ms           UInt32,
    source_topic        LowCardinality(String),
    partition           UInt16,
    slo                 LowCardinality(String),
    kind                LowCardinality(String),
    boundary            LowCardinality(String),
    threshold_ms        Float64,
    objective           Float64,
    total               UInt64,
    good                UInt64,
    good_secondary_only UInt64,
    secondary_weight    Float64
)
ENGINE = ${replicated}ReplacingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (slo, window_start, source_topic, partition)
SETTINGS ${dedup_window_setting};

-- Per partition: the close horizon of its windows and the offset committed
-- with it. A worker taking a partition over never re-opens a window that
-- ended at or before the horizon. Version = horizon (monotone).
CREATE TABLE IF NOT EXISTS ${db}.worker_checkpoints ${on_cluster}
(
    group_id          String,
    source_topic      String,
    partition         UInt16,
    close_horizon_ms  Int64,
    committed_offset  Int64,
    late_records      UInt64,
    updated_at        DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ${replicated}ReplacingMergeTree(${replica_args}close_horizon_ms)
ORDER BY (group_id, source_topic, partition);
