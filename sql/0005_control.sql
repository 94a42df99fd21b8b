-- 0005: every control signal the controller issued (the audit log of
-- tailguard.control), and the budget events it raised.
CREATE TABLE IF NOT EXISTS ${db}.control_signals ${on_cluster}
(
    scope              LowCardinality(String),
    seq                UInt64,
    level              UInt8,
    phase              LowCardinality(String),
    issued_at          DateTime64(3, 'UTC'),
    expires_at         DateTime64(3, 'UTC'),
    event_time         DateTime64(3, 'UTC'),     -- the stream's event time it was decided at
    reason             String,
    figures            String,                   -- JSON: the figures that triggered it
    actions            String,                   -- JSON
    notify_customer    Bool,
    budget_exhausted   Bool,
    heartbeat          Bool,                     -- a re-issue of an unchanged directive
    kid                LowCardinality(String),
    signal             String                    -- the signed message as published
)
ENGINE = ${replicated}ReplacingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(issued_at)
ORDER BY (scope, seq);

CREATE TABLE IF NOT EXISTS ${db}.budget_events ${on_cluster}
(
    slo         LowCardinality(String),
    event       LowCardinality(String),          -- budget_80pct_consumed | budget_exhausted | alert
    event_time  DateTime64(3, 'UTC'),
    details     String                           -- JSON
)
ENGINE = ${replicated}ReplacingMergeTree(${replica_args_only})
PARTITION BY toYYYYMM(event_time)
ORDER BY (slo, event, event_time);
