-- 0006: windows that can be corrected, and a ledger of what they counted.
--
-- A record enters a window once, in final form; a record that arrives after its
-- window closed is written as a *correction* row (correction = 1) of that window, and
-- a partial record replaced by its upgrade is taken back by a correction whose counts
-- and sketch bins are negative. Rows of one (window, partition, key, boundary) add up
-- (sum counts, sumMap bins): what the tables hold equals an exact count over
-- `requests` FINAL. So the tables are plain MergeTree (every row is a contribution;
-- a retried insert is dropped by its deduplication token), counts are signed, and the
-- '__slo__' row of each insert carries the ledger of the requests it counted
-- (request id -> version) and the source offset below which its partition's input is
-- accounted for: a worker taking a partition over reads the ledger of the rows written
-- past the offset it resumes from, and never counts a request twice (whichever worker
-- wrote it, as long as they share this store).
--
-- The old tables are renamed, the new ones created, and the old rows copied in (the
-- materialized views refill every rollup from them), then the old tables dropped.
DROP VIEW IF EXISTS ${db}.slo_windows_mv ${on_cluster};
DROP VIEW IF EXISTS ${db}.latency_1m_mv ${on_cluster};
DROP VIEW IF EXISTS ${db}.latency_1h_mv ${on_cluster};
DROP VIEW IF EXISTS ${db}.slo_1m_mv ${on_cluster};
DROP VIEW IF EXISTS ${db}.slo_1h_mv ${on_cluster};
DROP TABLE IF EXISTS ${db}.slo_1m ${on_cluster};
DROP TABLE IF EXISTS ${db}.slo_1h ${on_cluster};
DROP TABLE IF EXISTS ${db}.latency_1m ${on_cluster};
DROP TABLE IF EXISTS ${db}.latency_1h ${on_cluster};
DROP TABLE IF EXISTS ${db}.slo_windows ${on_cluster};
RENAME TABLE ${db}.window_sketches TO ${db}.window_sketches_0003 ${on_cluster};

CREATE TABLE ${db}.window_sketches ${on_cluster}
(
    window_start      DateTime64(3, 'UTC'),
    window_ms         UInt32,
    source_topic      LowCardinality(String),
    partition         UInt16,
    correction        UInt8,                               -- 0: the window as it closed, 1: a correction of it
    model             LowCardinality(String),
    priority          LowCardinality(String),              -- '0'..'3', 'unknown', '*'
    ctx_bucket        LowCardinality(String),
    boundary          LowCardinality(String),
    relative_accuracy Float64,
    records           Int64,                               -- records of this key (signed in corrections)
    count             Int64,                               -- records with a value for the boundary
    sum               Float64,
    min               Float64,                             -- +inf when nothing was added
    max               Float64,                             -- -inf when nothing was added
    zero_count        Int64,
    pos_keys          Array(Int32),
    pos_counts        Array(Int64),
    neg_keys          Array(Int32),
    neg_counts        Array(Int64),
    slo_counts        Map(String, Tuple(kind String, boundary String, threshold_ms Float64,
                          objective Float64, total Int64, good Int64,
                          good_secondary_only Int64, secondary_weight Float64)),
    through_offset    Int64 DEFAULT 0,                     -- '__slo__' rows: input below it is accounted
    ledger_ids        Array(String),                       -- '__slo__' rows: requests counted here
    ledger_versions   Array(UInt8),                        -- their versions (revision, +4 engine-only partial)
    written_at        DateTime64(3, 'UTC') DEFAULT now64(3)
)
ENGINE = ${replicated}MergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (boundary, model, priority, ctx_bucket, window_start, source_topic, partition)
SETTINGS ${dedup_window_setting};

CREATE TABLE ${db}.slo_windows ${on_cluster}
(
    window_start        DateTime64(3, 'UTC'),
    window_ms           UInt32,
    source_topic        LowCardinality(String),
    partition           UInt16,
    correction          UInt8,
    slo                 LowCardinality(String),
    kind                LowCardinality(String),
    boundary            LowCardinality(String),
    threshold_ms        Float64,
    objective           Float64,
    total               Int64,
    good                Int64,
    good_secondary_only Int64,
    secondary_weight    Float64
)
ENGINE = ${replicated}MergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (slo, window_start, source_topic, partition)
SETTINGS ${dedup_window_setting};

CREATE MATERIALIZED VIEW ${db}.slo_windows_mv ${on_cluster} TO ${db}.slo_windows AS
SELECT w.window_start AS window_start, w.window_ms AS window_ms,
       w.source_topic AS source_topic, w.partition AS partition, w.correction AS correction,
       slo_name AS slo, v.kind AS kind, v.boundary AS boundary, v.threshold_ms AS threshold_ms,
       v.objective AS objective, v.total AS total, v.good AS good,
       v.good_secondary_only AS good_secondary_only, v.secondary_weight AS secondary_weight
FROM ${db}.window_sketches AS w
ARRAY JOIN mapKeys(w.slo_counts) AS slo_name, mapValues(w.slo_counts) AS v
WHERE w.boundary = '__slo__';

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
    pos          AggregateFunction(sumMap, Array(Int32), Array(Int64)),
    neg          AggregateFunction(sumMap, Array(Int32), Array(Int64))
)
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (boundary, model, priority, ctx_bucket, window_start)
SETTINGS ${dedup_window_setting};

CREATE MATERIALIZED VIEW ${db}.latency_1m_mv ${on_cluster} TO ${db}.latency_1m AS
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

CREATE TABLE ${db}.latency_1h ${on_cluster} AS ${db}.latency_1m
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (boundary, model, priority, ctx_bucket, window_start)
SETTINGS ${dedup_window_setting};

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

CREATE TABLE ${db}.slo_1m ${on_cluster}
(
    window_start        DateTime('UTC'),
    slo                 LowCardinality(String),
    kind                LowCardinality(String),
    objective           SimpleAggregateFunction(any, Float64),
    secondary_weight    SimpleAggregateFunction(any, Float64),
    total               SimpleAggregateFunction(sum, Int64),
    good                SimpleAggregateFunction(sum, Int64),
    good_secondary_only SimpleAggregateFunction(sum, Int64)
)
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (slo, kind, window_start)
SETTINGS ${dedup_window_setting};

CREATE MATERIALIZED VIEW ${db}.slo_1m_mv ${on_cluster} TO ${db}.slo_1m AS
SELECT toStartOfMinute(window_start) AS window_start, slo, kind,
       any(objective) AS objective, any(secondary_weight) AS secondary_weight,
       sum(total) AS total, sum(good) AS good, sum(good_secondary_only) AS good_secondary_only
FROM ${db}.slo_windows
GROUP BY window_start, slo, kind;

CREATE TABLE ${db}.slo_1h ${on_cluster} AS ${db}.slo_1m
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (slo, kind, window_start)
SETTINGS ${dedup_window_setting};

CREATE MATERIALIZED VIEW ${db}.slo_1h_mv ${on_cluster} TO ${db}.slo_1h AS
SELECT toStartOfHour(window_start) AS window_start, slo, kind,
       any(objective) AS objective, any(secondary_weight) AS secondary_weight,
       sum(total) AS total, sum(good) AS good, sum(good_secondary_only) AS good_secondary_only
FROM ${db}.slo_windows
GROUP BY window_start, slo, kind;

INSERT INTO ${db}.window_sketches
    (window_start, window_ms, source_topic, partition, correction, model, priority, ctx_bucket,
     boundary, relative_accuracy, records, count, sum, min, max, zero_count,
     pos_keys, pos_counts, neg_keys, neg_counts, slo_counts)
SELECT window_start, window_ms, source_topic, partition, 0, model, priority, ctx_bucket,
       boundary, relative_accuracy, records, count, sum, min, max, zero_count,
       pos_keys, arrayMap(c -> toInt64(c), pos_counts), neg_keys,
       arrayMap(c -> toInt64(c), neg_counts),
       CAST(slo_counts, 'Map(String, Tuple(kind String, boundary String, threshold_ms Float64, objective Float64, total Int64, good Int64, good_secondary_only Int64, secondary_weight Float64))')
FROM ${db}.window_sketches_0003;

DROP TABLE ${db}.window_sketches_0003 ${on_cluster};

-- Per partition, for operators: where its clock and windows stand, the offset
-- committed, and what happened to late and bad input (one counter per meaning).
ALTER TABLE ${db}.worker_checkpoints ${on_cluster}
    RENAME COLUMN late_records TO corrected_records;
ALTER TABLE ${db}.worker_checkpoints ${on_cluster}
    ADD COLUMN IF NOT EXISTS watermark_ms Int64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS quarantined_events UInt64 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS replayed_records UInt64 DEFAULT 0;
