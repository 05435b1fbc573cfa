-- Forgets one counter and records the reset, so every instance drops the
-- key from its fast path; returns the reset's time (µs, database clock). A
-- decision that holds the row finishes first (the DELETE waits for its
-- lock); one that waits for the row's lock meanwhile finds it gone and
-- creates the counter anew.
WITH gone AS (
    DELETE FROM {{schema}}.counters WHERE rule = $1::text AND key = $2::text
)
INSERT INTO {{schema}}.key_events (rule, key) VALUES ($1::text, $2::text)
RETURNING (extract(epoch FROM at) * 1e6)::bigint
