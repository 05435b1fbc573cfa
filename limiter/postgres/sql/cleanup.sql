-- Deletes up to $2 counters whose state has expired, as of $1 (µs; NULL =
-- the transaction's now()). There is no index on expires_at (it would make
-- every counter update a non-HOT update), so the inner query is a sequential
-- scan that stops at the $2-th expired row. SKIP LOCKED passes over rows a
-- decision holds: cleanup never waits on a hot counter, and a locked row is
-- not deleted under a decision. ctid addresses exactly the row versions
-- found and locked (a TID scan), and expires_at is checked again so that
-- nothing live is deleted.
DELETE FROM {{schema}}.counters
WHERE ctid = ANY (ARRAY(
        SELECT ctid FROM {{schema}}.counters
        WHERE expires_at < coalesce(timestamptz 'epoch' + $1::bigint * interval '1 microsecond', now())
        LIMIT $2::integer
        FOR UPDATE SKIP LOCKED))
  AND expires_at < coalesce(timestamptz 'epoch' + $1::bigint * interval '1 microsecond', now())
