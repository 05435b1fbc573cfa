-- Sets one override (its trigger records a key event) and returns the
-- database's clock (µs).
WITH changed AS (
    INSERT INTO {{schema}}.overrides (rule, key, "limit", window_us, updated_at)
    VALUES ($1::text, $2::text, $3::bigint, $4::bigint, now())
    ON CONFLICT (rule, key) DO UPDATE
    SET "limit" = excluded."limit", window_us = excluded.window_us, updated_at = excluded.updated_at
)
SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint
