-- Elects the one cleaner: a transaction-level advisory lock, released by the
-- batch's own commit or rollback. It never outlives the batch, needs no
-- dedicated connection and works through a transaction-mode pooler, where a
-- session-level lock could be left behind on a server connection that
-- another client then gets.
SELECT pg_try_advisory_xact_lock($1::bigint)
