-- Removes one override (its trigger records a key event) and returns the
-- database's clock (µs).
WITH gone AS (
    DELETE FROM {{schema}}.overrides WHERE rule = $1::text AND key = $2::text
)
SELECT (extract(epoch FROM clock_timestamp()) * 1e6)::bigint
