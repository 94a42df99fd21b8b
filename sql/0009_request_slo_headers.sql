-- 0009: a request's own latency objectives, as its client sent them to the gateway
-- (llm-d's x-llm-d-slo-ttft-ms / x-llm-d-slo-tpot-ms headers; gateway.completed
-- slo_ttft_ms / slo_tpot_ms in the v1 contract). NULL when the request named none.
ALTER TABLE ${db}.requests ${on_cluster}
    ADD COLUMN IF NOT EXISTS slo_ttft_ms Nullable(Float64) AFTER flags,
    ADD COLUMN IF NOT EXISTS slo_tpot_ms Nullable(Float64) AFTER slo_ttft_ms;
