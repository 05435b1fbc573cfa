-- An admin reset of one counter (see reset_counter in lease_functions.sql):
-- every instance drops the key from its fast path and gives up its leases
-- of it; returns the reset's time (µs, database clock). A decision that
-- holds the row finishes first (the reset waits for its lock); one that
-- waits for the row's lock meanwhile finds it gone and creates the counter
-- anew.
SELECT {{schema}}.reset_counter($1::bigint, $2::text, $3::text)
