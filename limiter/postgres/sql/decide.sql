-- One batch of decisions in one statement; see migrations/0003_decide.up.sql.
-- Every parameter is cast so that the statement means the same under every
-- pgx query exec mode, including simple_protocol (PgBouncer).
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
