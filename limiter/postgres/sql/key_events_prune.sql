-- Drops key events no poller needs any more.
DELETE FROM {{schema}}.key_events WHERE at < clock_timestamp() - interval '1 hour'
