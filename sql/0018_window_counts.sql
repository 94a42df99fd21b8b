-- 0018: what a report counts besides latency and SLOs, per window (issue 53: a report
-- over 30 days read all 50 M requests of a month twice, 55-75 s, for these figures).
--
-- The '__slo__' row of each window (and correction) carries, in the same insert as its
-- sketches, SLO counts and ledger (pipeline.core.window_counts, the row formats named in
-- pipeline/adapters/store/windows.py):
--   request_counts  per (source, outcome, model, priority, control mode, control verdict)
--                   the requests (signed in a correction); '' for a missing priority,
--                   mode or verdict (no NULL in a rollup's key);
--   slo_bad         per SLO and model its measured bad requests, their queue time and
--                   boundary time summed (the load-cause split);
--   clock_skew      per (model, gateway host, engine host) the engine clock's offsets
--                   from the gateway's over the joined requests, counted per 0.1 ms
--                   bucket (pipeline.core.skew.offset_bucket: their median, merged over
--                   windows, is the exact median's to 0.05 ms);
--   counts_kept     1: the row carries them. Rows written before this migration do not
--                   (0): the report reads the requests of their windows instead (up to
--                   the end of the last window written without them).
-- The hourly rollups below are filled by their views from those rows (a report reads
-- whole hours there, the base windows for the rest); the repair of rollups
-- (pipeline/adapters/store/rollups.py) compares them with their views' SELECT, here.
ALTER TABLE ${db}.window_sketches ${on_cluster}
    ADD COLUMN IF NOT EXISTS counts_kept UInt8 DEFAULT 0,
    ADD COLUMN IF NOT EXISTS request_counts Array(Tuple(source String, outcome String,
        model String, priority String, control_mode String, control_verdict String,
        requests Int64)),
    ADD COLUMN IF NOT EXISTS slo_bad Array(Tuple(slo String, model String,
        bad_measured Int64, bad_queue_ms Float64, bad_ms Float64)),
    ADD COLUMN IF NOT EXISTS clock_skew Array(Tuple(model String, gateway_host String,
        engine_host String, offset_buckets Array(Int64), counts Array(Int64)));

CREATE TABLE IF NOT EXISTS ${db}.request_counts_1h ${on_cluster}
(
    window_start    DateTime('UTC'),
    model           LowCardinality(String),
    source          LowCardinality(String),
    outcome         LowCardinality(String),
    priority        LowCardinality(String),
    control_mode    LowCardinality(String),
    control_verdict LowCardinality(String),
    requests        SimpleAggregateFunction(sum, Int64)
)
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (window_start, model, source, outcome, priority, control_mode, control_verdict)
SETTINGS ${dedup_window_setting};

CREATE MATERIALIZED VIEW IF NOT EXISTS ${db}.request_counts_1h_mv ${on_cluster} TO ${db}.request_counts_1h AS
SELECT toStartOfHour(w.window_start) AS window_start, c.model AS model, c.source AS source,
       c.outcome AS outcome, c.priority AS priority, c.control_mode AS control_mode,
       c.control_verdict AS control_verdict, sum(c.requests) AS requests
FROM ${db}.window_sketches AS w
ARRAY JOIN w.request_counts AS c
WHERE w.boundary = '__slo__'
GROUP BY window_start, model, source, outcome, priority, control_mode, control_verdict;

CREATE TABLE IF NOT EXISTS ${db}.slo_bad_1h ${on_cluster}
(
    window_start DateTime('UTC'),
    slo          LowCardinality(String),
    model        LowCardinality(String),
    bad_measured SimpleAggregateFunction(sum, Int64),
    bad_queue_ms SimpleAggregateFunction(sum, Float64),
    bad_ms       SimpleAggregateFunction(sum, Float64)
)
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (window_start, slo, model)
SETTINGS ${dedup_window_setting};

CREATE MATERIALIZED VIEW IF NOT EXISTS ${db}.slo_bad_1h_mv ${on_cluster} TO ${db}.slo_bad_1h AS
SELECT toStartOfHour(w.window_start) AS window_start, b.slo AS slo, b.model AS model,
       sum(b.bad_measured) AS bad_measured, sum(b.bad_queue_ms) AS bad_queue_ms,
       sum(b.bad_ms) AS bad_ms
FROM ${db}.window_sketches AS w
ARRAY JOIN w.slo_bad AS b
WHERE w.boundary = '__slo__'
GROUP BY window_start, slo, model;

CREATE TABLE IF NOT EXISTS ${db}.clock_skew_1h ${on_cluster}
(
    window_start DateTime('UTC'),
    model        LowCardinality(String),
    gateway_host LowCardinality(String),
    engine_host  LowCardinality(String),
    joined       SimpleAggregateFunction(sum, Int64),
    offsets      AggregateFunction(sumMap, Array(Int64), Array(Int64))
)
ENGINE = ${replicated}AggregatingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(window_start)
ORDER BY (window_start, model, gateway_host, engine_host)
SETTINGS ${dedup_window_setting};

CREATE MATERIALIZED VIEW IF NOT EXISTS ${db}.clock_skew_1h_mv ${on_cluster} TO ${db}.clock_skew_1h AS
SELECT toStartOfHour(w.window_start) AS window_start, k.model AS model,
       k.gateway_host AS gateway_host, k.engine_host AS engine_host,
       sum(arraySum(k.counts)) AS joined,
       sumMapState(k.offset_buckets, k.counts) AS offsets
FROM ${db}.window_sketches AS w
ARRAY JOIN w.clock_skew AS k
WHERE w.boundary = '__slo__'
GROUP BY window_start, model, gateway_host, engine_host;
