-- 0013: what the gateway's enforcement said about a request (gateway.completed, issue 48):
-- control_mode 'shadow' | 'enforce' (NULL: off, or no control) and control_verdict, why
-- it refused the request (enforce: outcome 'rejected') or would have (shadow: the request
-- was served as without control): shed_priority | new_session | rate_limit | admission |
-- queue_timeout; NULL: admitted. From the gateway.completed the record keeps (the worse
-- of conflicting ones, whole), so they change with the row's version like its outcome.
ALTER TABLE ${db}.requests ${on_cluster}
    ADD COLUMN IF NOT EXISTS control_mode LowCardinality(Nullable(String)) AFTER conflicts,
    ADD COLUMN IF NOT EXISTS control_verdict LowCardinality(Nullable(String)) AFTER control_mode;
