-- Admin resets among the key events. An admin reset keeps the units out on
-- leases counted until their holders give them up (reset_counter in
-- limiter/postgres/sql/lease_functions.sql); a holder that hears of a reset
-- gives back what it spent before it as well, so that the count is what was
-- spent since. It hears at once through a notification, and otherwise in its
-- next poll of this table, which must then tell a reset from an override
-- change or a recall, whose spent units stay counted.
ALTER TABLE {{schema}}.key_events
    ADD COLUMN reset boolean NOT NULL DEFAULT false;
