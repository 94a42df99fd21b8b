-- 0010: requests served during a cold start of their engine (engine.finished
-- cold_start_unix_ns: the engine's (re)start time on the engine's wall clock; null
-- for a warm engine). (engine_host, cold_start_unix_ns) names one cold start, so a
-- contract's "cold starts exempted, at most N per day" is computed from the data
-- (pipeline/core/statement.py), not claimed.
ALTER TABLE ${db}.requests ${on_cluster}
    ADD COLUMN IF NOT EXISTS cold_start_unix_ns Nullable(Int64) AFTER flags;
