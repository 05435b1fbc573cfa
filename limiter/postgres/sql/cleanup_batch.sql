-- One batch of the gateways' cleanup, as one statement: it elects the one
-- cleaner with a transaction-level advisory lock ($3) and, if elected,
-- runs cleanup.sql's DELETE (its text is put in below, with its $1 and
-- $2), then says whether it was elected and how many rows went. Not
-- elected, the one-time filter keeps the DELETE from scanning or locking
-- anything.
--
-- One statement is one implicit transaction, which the server commits as
-- soon as the DELETE is done. Sent as three round trips (BEGIN and the
-- lock, the DELETE, COMMIT), a batch held the rows it had deleted, idle in
-- transaction, for as long as the gateway took to send its COMMIT: on a
-- loaded machine, longer than a decision's deadline, and a decision of one
-- of those keys (back in a new window) waited for the row and failed.
--
-- The lock is released by the same commit: it never outlives the batch,
-- needs no dedicated connection and works through a transaction-mode
-- pooler, where a session-level lock could be left behind on a server
-- connection that another client then gets.
WITH elected AS MATERIALIZED (SELECT pg_try_advisory_xact_lock($3::bigint) AS ok),
deleted AS (
{{cleanup}}
    AND (SELECT ok FROM elected)
    RETURNING 1)
SELECT (SELECT ok FROM elected), (SELECT count(*) FROM deleted)
