-- decide.sql with synchronous_commit off for this transaction only
-- (Options.AsynchronousCommit): set_config(…, true) is SET LOCAL, so it
-- lasts until this statement's implicit transaction commits, travels with
-- the statement through a transaction-mode pooler, and leaves the session's
-- other transactions alone. The WHERE clause runs it once, on the one row.
SELECT now_us, allowed, remaining, reset_us, retry_us
FROM {{schema}}.decide(
    $1::bigint,      -- now (µs) for tests, NULL = database clock
    $2::boolean,     -- peek: consume nothing
    $3::text[],      -- slots: rule
    $4::text[],      --        key
    $5::smallint[],  --        algorithm
    $6::bigint[],    --        limit
    $7::bigint[],    --        window µs
    $8::bigint[],    --        bucket µs
    $9::bigint[],    --        burst
    $10::integer[],  -- checks: decision
    $11::integer[],  --         slot (1-based)
    $12::bigint[],   --         cost
    $13::boolean[],  --         count=all
    $14::boolean[]   --         shadow
)
WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL
