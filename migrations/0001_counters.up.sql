-- The counters: one row per (rule, key), shared by every gateway instance.
--
-- Why this shape:
--  * The table is update-heavy: a decision rewrites its rows, often the same
--    hot row thousands of times a second. Postgres can make such an update
--    "HOT" (heap-only tuple: the new version goes on the same page, no index
--    entry is written, and page pruning reclaims the old version without
--    waiting for VACUUM) only when no indexed column changes and the page has
--    room. So the only index is the primary key on the immutable (rule, key),
--    every mutable column is left unindexed (expires_at included: cleanup
--    finds expired rows with a bounded sequential scan instead), and
--    fillfactor leaves room on each page.
--  * rule and key use the "C" collation: byte-wise comparison is cheaper than
--    a linguistic one, and it is the order Go's string comparison gives, so
--    the gateway can sort counters exactly as the database locks them.
--  * key is already an HMAC of the identity (hex or base64 text): no raw IP,
--    e-mail or tenant id is ever stored.
--  * Time is kept as bigint microseconds since the Unix epoch, the unit of
--    docs/algorithms.md, so the database and the in-memory store agree to the
--    microsecond; expires_at alone is a timestamptz, for operators and
--    cleanup (including a pg_cron job) to read.
--
-- What the state columns mean depends on alg (policy.Algorithm):
--   0 fixed    a = window start (µs), n = count in that window
--   1 sliding  a = index (now / bucket_us) of the newest bucket, n = the
--              window's total at the last write (informational),
--              bucket_us = bucket width (µs), buckets = the non-empty
--              buckets of the window as flat (index, count) pairs, oldest
--              first: {j1, n1, j2, n2, …}. Sparse, because a window can
--              hold thousands of buckets (1 s buckets over a day) of which
--              few are used; at most the window's bucket count.
--   2 reset    a = window start (µs), n = count in that window
--   3 token    a = theoretical arrival time, TAT (µs), n = 0
-- A row whose alg (or, for sliding, bucket width) differs from
-- the rule's current settings is read as absent, so changing a rule never
-- misreads old state.
--
-- expires_at is when the state may be forgotten (the counter's Reset time):
-- after it the row means the same as no row, and cleanup deletes it.
-- '-infinity' marks a row inserted by a decision still in progress: the
-- decision always overwrites or deletes it before committing.
CREATE TABLE {{schema}}.counters (
    rule       text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    alg        smallint NOT NULL,
    a          bigint NOT NULL DEFAULT 0,
    n          bigint NOT NULL DEFAULT 0,
    bucket_us  bigint NOT NULL DEFAULT 0,
    buckets    bigint[],
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (rule, key)
) WITH (
    -- 30% of each page stays free for new row versions, so updates stay HOT
    -- even when a page's rows are all updated between two prunings. The
    -- table is small relative to its write rate, so the space is cheap.
    fillfactor = 70,
    -- Vacuum after 1% of the rows (plus 1,000) changed instead of the default
    -- 20%: most row versions die within seconds, and prompt vacuuming keeps
    -- the table and its primary key from bloating and keeps the free space
    -- map current for the inserts of new keys.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    -- Inserts of new keys (e.g. a flood of new client IPs) also trigger a
    -- vacuum, so the visibility map stays current for cleanup's scans.
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_vacuum_insert_threshold = 1000,
    -- Statistics hardly matter (every query is by primary key or a scan),
    -- so analyze less eagerly than vacuum.
    autovacuum_analyze_scale_factor = 0.1,
    -- No sleeping during this table's vacuum: it is small and hot, and a
    -- throttled vacuum falls behind the write rate.
    autovacuum_vacuum_cost_delay = 0
);

COMMENT ON TABLE {{schema}}.counters IS
    'sluice rate-limit counters, one row per (rule, hashed key); see migration 0001 for the layout';
