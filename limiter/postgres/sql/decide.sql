-- One batch of decisions in one statement; see decide_function.sql.
-- Every parameter is cast so that the statement means the same under every
-- pgx query exec mode, including simple_protocol (PgBouncer).
SELECT now_us, allowed, remaining, reset_us, retry_us, granted, held
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
    $10::bigint[],   --        calendar periods' starts, four per slot (µs)
    $11::integer[],  -- checks: decision
    $12::integer[],  --         slot (1-based)
    $13::bigint[],   --         cost (a settlement: the charge)
    $14::boolean[],  --         count=all
    $15::boolean[],  --         shadow
    $16::bigint[],   --         lease: units asked for
    $17::bigint[],   --         lease: units this gateway holds
    $18::bigint[],   --         lease: their mark (a settlement: the admission, µs)
    $19::boolean[],  --         a renewal's phantom request
    $20::bigint[]    --         a settlement's reservation, -1 for a decision
)
