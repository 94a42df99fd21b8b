-- 0012: conflicting terminal events of a request (same request and attempt, another
-- event id, other content: two gateway.completed, ok then error 500): how many the join
-- set aside; the record holds the worse of each kind (pipeline/core/join.py, "Conflicts").
-- 0: none. A record with conflicts ranks above the same revision without in the store
-- version (revision column: 2 * revision + superseded + 8 if conflicts > 0), so a late
-- conflict's correction replaces the row it corrects.
ALTER TABLE ${db}.requests ${on_cluster}
    ADD COLUMN IF NOT EXISTS conflicts UInt16 DEFAULT 0 AFTER cold_start_unix_ns;
