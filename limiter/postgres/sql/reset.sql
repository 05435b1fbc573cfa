-- Forgets one counter. A decision that holds the row finishes first (the
-- DELETE waits for its lock); one that waits for the row's lock meanwhile
-- finds it gone and creates the counter anew.
DELETE FROM {{schema}}.counters WHERE rule = $1::text AND key = $2::text
