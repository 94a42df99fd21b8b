-- 0021: a bloom filter on requests.request_id (issue 53). Every part of the table (one day
-- of request starts, ordered by request_id) spans the whole range of ids, so finding one
-- key read one granule of every part: ~200 granules on a month store, for each key that
-- explain or the statement's last-end check looks up (~0.3 s for a few keys). The filter
-- (~1.2 B a request) rules out the parts that do not hold the key.
ALTER TABLE ${db}.requests ${on_cluster}
    ADD INDEX IF NOT EXISTS idx_request_id request_id TYPE bloom_filter(0.01) GRANULARITY 1;
ALTER TABLE ${db}.requests ${on_cluster} MATERIALIZE INDEX idx_request_id;
