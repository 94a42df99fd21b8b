-- 0003: closed event-time windows, one row per
-- (window, source topic, partition, key, boundary), as the stream emitted them.
-- The sketch's buckets are stored so that SQL merges windows, keys and
-- partitions and computes the same quantile as the stream (see
-- pipeline/adapters/sketch_sql.py). The all-traffic key is ('*', '*', '*').
-- Exactly once: a worker emits a (partition, window) only if it ends after
-- the partition's horizon, which it reads back from this table when it takes
-- the partition (max window end written), so a window written before a crash
-- is never written again and never reaches the materialized views twice.
-- SLO counts ride in the same insert, on one row per (partition, window) with
-- boundary '__slo__' (an insert into one table is atomic); a materialized view
-- spreads them into slo_windows.
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
    neg_counts        Array(UInt64),
    slo_counts        Map(String, Tuple(kind String, boundary String, threshold_ms Float64,
                          objective Float64, total UInt64, good UInt64,
                          good_secondary_only UInt64, secondary_weight Float64))
)
ENGINE = ${replicated}ReplacingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (boundary, model, priority, ctx_bucket, window_start, source_topic, partition)
SETTINGS ${dedup_window_setting};

-- SLO counts per window: kind 'slo' (total, good) or 'blended'
-- (total, good = good on primary, good_secondary_only; weight). Filled by
-- slo_windows_mv from the '__slo__' rows of window_sketches.
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

CREATE MATERIALIZED VIEW IF NOT EXISTS ${db}.slo_windows_mv ${on_cluster} TO ${db}.slo_windows AS
SELECT w.window_start AS window_start, w.window_ms AS window_ms,
       w.source_topic AS source_topic, w.partition AS partition,
       slo_name AS slo, v.kind AS kind, v.boundary AS boundary, v.threshold_ms AS threshold_ms,
       v.objective AS objective, v.total AS total, v.good AS good,
       v.good_secondary_only AS good_secondary_only, v.secondary_weight AS secondary_weight
FROM ${db}.window_sketches AS w
ARRAY JOIN mapKeys(w.slo_counts) AS slo_name, mapValues(w.slo_counts) AS v
-- w.boundary, qualified: the alias "boundary" above would shadow the column
WHERE w.boundary = '__slo__';

-- Per partition, for operators: the close horizon of its windows, the offset
-- committed with it and the late records seen (informational; the horizon a
-- worker resumes from is read from window_sketches itself).
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
