-- 0016: a minmax skip index on requests.end_unix_ns (issue 53). Every read of a time range
-- of requests (report, statement, the exact panels) filters on the request's end, which is
-- neither the partition key (the start's day) nor in the ordering key (request_id): on a
-- month of requests a report over one hour read every row of every partition. A part
-- holds one day's requests at most (PARTITION BY toYYYYMMDD(ts)), so the index skips
-- whole days outside the range. Numbered 0016 (not 0015) to leave 0015 to a parallel
-- change. Existing parts get the index by a mutation, in the background.
ALTER TABLE ${db}.requests ${on_cluster}
    ADD INDEX IF NOT EXISTS idx_end end_unix_ns TYPE minmax GRANULARITY 1;
ALTER TABLE ${db}.requests ${on_cluster} MATERIALIZE INDEX idx_end;
