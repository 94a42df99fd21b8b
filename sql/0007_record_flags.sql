-- 0007: contradictions between a request's events, flagged on its record (kept as
-- reported; names and meanings in pipeline/core/record.py FLAGS):
-- ttfb_gt_total, e2e_lt_inference, e2e_lt_queue, negative_gateway_overhead.
ALTER TABLE ${db}.requests ${on_cluster}
    ADD COLUMN IF NOT EXISTS flags Array(LowCardinality(String)) AFTER gateway_overhead_ms;
