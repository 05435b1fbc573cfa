-- Whether the decide statement running in server process $1 is making
-- progress (see progress.go): it is not waiting for its commit to reach a
-- synchronous standby, and every session it waits for (pg_blocking_pids:
-- the holders of the locks it wants and the waiters queued ahead of it) is
-- a sluice session of this gateway's application_name that is running a
-- statement, not idle in a transaction. A session whose state this role
-- may not read counts as a stranger. The second column is what the
-- process waits for now (its wait event, empty when none), for the log of
-- a statement that passes its bound while progressing; the third names
-- the strangers it waits for (at most three: process id, application_name,
-- backend type, state and for how long, and the start of the query), for
-- the log of a statement that fails behind them.
--
-- pg_blocking_pids is volatile: in the WHERE clause of a scan of
-- pg_stat_activity it would run once per server process, each time taking
-- every partition of the lock manager. Materialized, it runs once.
WITH blocking AS MATERIALIZED (
        SELECT pg_blocking_pids($1::integer) AS pids),
     strangers AS (
        SELECT a.pid, a.application_name, a.backend_type, a.state, a.state_change, a.query
        FROM pg_stat_activity a, blocking b
        WHERE a.pid = ANY (b.pids)
          AND (a.state IS DISTINCT FROM 'active'
               OR a.application_name IS DISTINCT FROM current_setting('application_name')))
SELECT NOT EXISTS (SELECT 1 FROM strangers)
   AND NOT EXISTS (
        SELECT 1 FROM pg_stat_activity a
        WHERE a.pid = $1::integer AND a.wait_event = 'SyncRep'),
       coalesce((SELECT concat_ws(':', a.wait_event_type, a.wait_event)
                 FROM pg_stat_activity a WHERE a.pid = $1::integer), ''),
       coalesce((SELECT string_agg(format('process %s (application_name %L, %s, %s for %s ms: %L)',
                                          s.pid, s.application_name, s.backend_type,
                                          coalesce(s.state, 'state not readable'),
                                          coalesce(round(extract(epoch FROM clock_timestamp() - s.state_change) * 1000)::text, '?'),
                                          left(s.query, 60)), '; ' ORDER BY s.pid)
                 FROM (SELECT * FROM strangers ORDER BY pid LIMIT 3) s), '')
