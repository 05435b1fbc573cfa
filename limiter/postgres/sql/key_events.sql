-- The keys reset or re-limited since $1 (µs since the epoch), and the
-- database's clock, which is the next poll's $1 less an overlap.
SELECT e.rule, e.key, (extract(epoch FROM clock_timestamp()) * 1e6)::bigint
FROM {{schema}}.key_events e
WHERE e.at >= timestamptz 'epoch' + $1::bigint * interval '1 microsecond'
UNION ALL
SELECT NULL, NULL, (extract(epoch FROM clock_timestamp()) * 1e6)::bigint
