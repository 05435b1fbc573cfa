-- Leases: a gateway may take a slice of a counter's room in one durable
-- transaction and spend it in memory (limiter/postgres/lease.go). The
-- units it takes are counted in n at once, so a lease never lets a window
-- pass its limit, through any crash; these columns say how many of the
-- units counted in n are out on leases, so that a gateway denied while
-- others hold units can ask for them back, and an admin reset keeps
-- counting what is still out.
--
--   leased      units granted on leases under lease_mark and not settled
--               (returned, or given up by their holder); spent units stay
--               in it until their holder settles
--   lease_mark  the window start (fixed, reset) or bucket index (sliding)
--               the leases were granted in; leases of another mark have
--               expired, and leased then means nothing
--   need_us     when (µs, database clock) a decision last asked the
--               holders for their unused units, so that a hot key asks at
--               most once per interval
--
-- No index on any of them: updates of counters stay HOT.
ALTER TABLE {{schema}}.counters
    ADD COLUMN leased bigint NOT NULL DEFAULT 0,
    ADD COLUMN lease_mark bigint NOT NULL DEFAULT 0,
    ADD COLUMN need_us bigint NOT NULL DEFAULT 0;
