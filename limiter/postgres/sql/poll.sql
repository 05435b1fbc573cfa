-- The background poll, one round trip every PollInterval: the keys reset
-- or re-limited since $1 (µs since the epoch), each with the time of its
-- event (µs) and whether it was an admin reset, then one row without a key
-- that carries the database's clock (the next poll's $1, less an overlap)
-- and the overrides' generation (a trigger bumps it on every change).
SELECT e.rule, e.key, (extract(epoch FROM e.at) * 1e6)::bigint, NULL::bigint, e.reset
FROM {{schema}}.key_events e
WHERE e.at >= timestamptz 'epoch' + $1::bigint * interval '1 microsecond'
UNION ALL
SELECT NULL, NULL, (extract(epoch FROM clock_timestamp()) * 1e6)::bigint,
       (SELECT generation FROM {{schema}}.override_epoch), NULL
