-- 0002: raw lifecycle events, as received (valid ones), kept for ${raw_ttl_days} days.
-- One row per event_id (a re-delivered event collapses at merge time).
CREATE TABLE IF NOT EXISTS ${db}.lifecycle_events ${on_cluster}
(
    event_id         String,
    kind             LowCardinality(String),
    request_id       String,
    ts_unix_ns       Int64,                                   -- emitting host's wall clock
    ts               DateTime64(3, 'UTC') MATERIALIZED fromUnixTimestamp64Milli(intDiv(ts_unix_ns, 1000000), 'UTC'),
    host             LowCardinality(String),
    model            LowCardinality(String),
    source_topic     LowCardinality(String),
    source_partition UInt16,
    source_offset    Int64,
    payload          String CODEC(ZSTD(3))                    -- the event as JSON
)
ENGINE = ${replicated}ReplacingMergeTree(${replica_args_only})
PARTITION BY toYYYYMMDD(ts)
ORDER BY (request_id, event_id)
TTL toDateTime(ts) + INTERVAL ${raw_ttl_days} DAY;
