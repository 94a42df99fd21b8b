-- 0001: one row per request, every boundary side by side.
-- ReplacingMergeTree(revision): a re-delivered request writes an identical row
-- (collapsed at merge time; read with FINAL or argMax for exact counts), and a
-- partial record (revision 0) is replaced by its joined record (revision 1).
-- The ordering (= deduplication) key is request_id alone: the record of one
-- request may change its model name (gateway alias vs served name) or its
-- start time (engine-only record upgraded by a late gateway event), and
-- either in the key would keep both rows. Time-range scans prune by the daily
-- partition and the minmax index on ts; dashboards read the aggregate tables.
CREATE TABLE IF NOT EXISTS ${db}.requests ${on_cluster}
(
    request_id               String,
    revision                 UInt8,
    source                   LowCardinality(String),          -- joined | gateway_only | engine_only
    ts_unix_ns               Int64,                           -- request start, first side's own clock
    end_unix_ns              Int64,                           -- request end, same side's clock (window time)
    ts                       DateTime64(3, 'UTC') MATERIALIZED fromUnixTimestamp64Milli(intDiv(ts_unix_ns, 1000000), 'UTC'),
    model                    LowCardinality(String),
    priority                 Nullable(UInt8),
    tenant                   LowCardinality(String),          -- '' when unknown
    ctx_bucket               LowCardinality(String),
    outcome                  LowCardinality(String),
    http_status              Nullable(UInt16),
    finish_reason            LowCardinality(Nullable(String)),
    stream                   Nullable(Bool),
    gateway_host             LowCardinality(String),
    engine_host              LowCardinality(String),
    gateway_received_unix_ns Nullable(Int64),                 -- gateway wall clock
    engine_arrival_unix_ns   Nullable(Int64),                 -- engine wall clock (never subtract the two)
    prompt_tokens            Nullable(UInt32),
    output_tokens            Nullable(UInt32),
    cached_tokens            Nullable(UInt32),
    preemptions              Nullable(UInt16),
    gateway_total_ms         Nullable(Float64),
    gateway_ttfb_ms          Nullable(Float64),
    engine_e2e_ms            Nullable(Float64),
    queue_ms                 Nullable(Float64),
    prefill_ms               Nullable(Float64),
    decode_ms                Nullable(Float64),
    inference_ms             Nullable(Float64),
    ttft_engine_ms           Nullable(Float64),
    tpot_ms                  Nullable(Float64),
    gateway_overhead_ms      Nullable(Float64),
    INDEX idx_ts ts TYPE minmax GRANULARITY 1,
    INDEX idx_model model TYPE set(256) GRANULARITY 4
)
ENGINE = ${replicated}ReplacingMergeTree(${replica_args}revision)
PARTITION BY toYYYYMMDD(ts)
ORDER BY request_id
SETTINGS index_granularity = 8192;
