-- Forgets one counter. A decision that holds the row finishes first (the
-- DELETE waits for its lock); one that is between inserting and locking it
-- sees the row gone and retries.
DELETE FROM {{schema}}.counters WHERE rule = $1::text AND key = $2::text
