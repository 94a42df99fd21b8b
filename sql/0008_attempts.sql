-- 0008: client retries that reuse a request id are attempts of one request
-- (pipeline/core/join.py): one row per (request_id, attempt).
--   attempt     1 for the first attempt, n for the client's n-th try with that id
--   superseded  a failed attempt the client retried: SLOs with `attempts: last` skip it
--   revision    now the store version 2 * revision + superseded
--               (pipeline.core.record.store_version; the highest replaces)
-- The ordering key gains a column and the version changes meaning, which ALTER cannot
-- do (a new key column may not have a default; a version column may not be updated):
-- the table is renamed, recreated and refilled (old rows: attempt 1, revision doubled).
RENAME TABLE ${db}.requests TO ${db}.requests_0007 ${on_cluster};

CREATE TABLE ${db}.requests ${on_cluster}
(
    request_id               String,
    attempt                  UInt16,                          -- 1, 2, ... (client retries with the same id)
    revision                 UInt8,                           -- 2 * (0 partial, +1 with received, +2 joined) + superseded
    superseded               Bool,                            -- failed attempt followed by a retry
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
    flags                    Array(LowCardinality(String)),   -- contradictions (0007)
    INDEX idx_ts ts TYPE minmax GRANULARITY 1,
    INDEX idx_model model TYPE set(256) GRANULARITY 4
)
ENGINE = ${replicated}ReplacingMergeTree(${replica_args}revision)
PARTITION BY toYYYYMMDD(ts)
ORDER BY (request_id, attempt)
SETTINGS index_granularity = 8192;

INSERT INTO ${db}.requests
    (request_id, attempt, revision, superseded, source, ts_unix_ns, end_unix_ns, model,
     priority, tenant, ctx_bucket, outcome, http_status, finish_reason, stream,
     gateway_host, engine_host, gateway_received_unix_ns, engine_arrival_unix_ns,
     prompt_tokens, output_tokens, cached_tokens, preemptions, gateway_total_ms,
     gateway_ttfb_ms, engine_e2e_ms, queue_ms, prefill_ms, decode_ms, inference_ms,
     ttft_engine_ms, tpot_ms, gateway_overhead_ms, flags)
SELECT request_id, 1, revision * 2, false, source, ts_unix_ns, end_unix_ns, model,
     priority, tenant, ctx_bucket, outcome, http_status, finish_reason, stream,
     gateway_host, engine_host, gateway_received_unix_ns, engine_arrival_unix_ns,
     prompt_tokens, output_tokens, cached_tokens, preemptions, gateway_total_ms,
     gateway_ttfb_ms, engine_e2e_ms, queue_ms, prefill_ms, decode_ms, inference_ms,
     ttft_engine_ms, tpot_ms, gateway_overhead_ms, flags
FROM ${db}.requests_0007;

DROP TABLE ${db}.requests_0007 ${on_cluster};
