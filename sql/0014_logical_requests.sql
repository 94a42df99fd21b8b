-- 0014: which try of a logical request a row is, as the client said (gateway.received,
-- issue 47; producers/client_retry.py reads the SDKs' headers):
--   client_attempt       the client's retry count (x-stainless-retry-count): 0 = its first
--                        try (or unknown; every row before 0014), k = its k-th retry
--   logical_request_id   the id the client gave the logical request, the same on each of
--                        its attempts (Idempotency-Key, else x-client-request-id, else the
--                        X-Request-Id it reused); NULL: none (the row is its own request)
-- pipeline/core/logical.py counts a logical request once, by these (docs/measurement.md).
ALTER TABLE ${db}.requests ${on_cluster}
    ADD COLUMN IF NOT EXISTS client_attempt UInt16 DEFAULT 0 AFTER control_verdict,
    ADD COLUMN IF NOT EXISTS logical_request_id Nullable(String) AFTER client_attempt;
