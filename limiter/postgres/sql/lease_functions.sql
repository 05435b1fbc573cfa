-- version: 3
--
-- The statements of leases that are not decisions (limiter/postgres/lease.go;
-- the columns are explained in migration 0006): giving back units a gateway
-- leased and did not spend, and resetting a counter while units are out on
-- leases. migrations.Up installs this file like decide_function.sql.
--
-- Both lock the counters they change one by one in (rule, key) order, the
-- order every decide call locks in, so they cannot deadlock with decisions
-- or with each other.

-- return_leases takes, for each lease a gateway gives up, the units it did
-- not spend off the count of the window (or bucket) they were granted in,
-- and settles the lease: its granted units (spent or not) leave leased, so
-- that the counter no longer says others hold units. Nothing happens to a
-- counter whose window or bucket has moved on, or whose row was reset or
-- deleted meanwhile (its units then count nothing anyway), or that is
-- counted by another algorithm now. A return ends the counter's recall
-- (need_us 0) and notifies sluice_leases ('g') for those who wait on it
-- (see decide_function.sql). The inputs are parallel arrays, one
-- entry per lease; the same counter may appear more than once (a sliding
-- counter with leases of two buckets). Returns the number of entries that
-- changed a counter.
CREATE OR REPLACE FUNCTION {{schema}}.return_leases(
    r_rule    text[],
    r_key     text[],
    r_alg     smallint[],
    r_mark    bigint[],   -- window start (fixed, reset) or bucket index (sliding)
    r_bucket  bigint[],   -- sliding: the bucket width (µs) it was granted under; else 0
    r_unused  bigint[],   -- units granted and not spent: off the count
    r_settled bigint[])   -- units granted on the lease, spent or not: off leased
RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    rec     record;
    b       bigint[];
    nn      bigint;
    lsd     bigint;
    z       integer;
    done    boolean;
    changed integer := 0;
BEGIN
    IF cardinality(r_key) IS DISTINCT FROM cardinality(r_rule)
       OR cardinality(r_alg) IS DISTINCT FROM cardinality(r_rule)
       OR cardinality(r_mark) IS DISTINCT FROM cardinality(r_rule)
       OR cardinality(r_bucket) IS DISTINCT FROM cardinality(r_rule)
       OR cardinality(r_unused) IS DISTINCT FROM cardinality(r_rule)
       OR cardinality(r_settled) IS DISTINCT FROM cardinality(r_rule) THEN
        RAISE EXCEPTION 'sluice return_leases: the arrays must have equal lengths'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR rec IN
        SELECT u.rule, u.key, u.alg AS want_alg, u.mark, u.bw, u.unused, u.settled
        FROM unnest(r_rule, r_key, r_alg, r_mark, r_bucket, r_unused, r_settled)
            AS u(rule, key, alg, mark, bw, unused, settled)
        ORDER BY u.rule COLLATE "C", u.key COLLATE "C"
    LOOP
        -- Lock (and read the latest version of) one counter at a time, in
        -- canonical order.
        PERFORM 1 FROM {{schema}}.counters c
        WHERE c.rule = rec.rule AND c.key = rec.key FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        done := false;
        IF rec.want_alg IN (0, 2) THEN
            UPDATE {{schema}}.counters c
            SET n = CASE WHEN c.a = rec.mark THEN greatest(0, c.n - rec.unused) ELSE c.n END,
                leased = CASE WHEN c.lease_mark = rec.mark THEN greatest(0, c.leased - rec.settled) ELSE c.leased END,
                need_us = CASE WHEN c.lease_mark = rec.mark THEN 0 ELSE c.need_us END
            WHERE c.rule = rec.rule AND c.key = rec.key AND c.alg = rec.want_alg
              AND (c.a = rec.mark OR c.lease_mark = rec.mark);
            done := FOUND;
        ELSIF rec.want_alg = 1 THEN
            SELECT c.buckets, c.n, c.leased INTO b, nn, lsd
            FROM {{schema}}.counters c
            WHERE c.rule = rec.rule AND c.key = rec.key AND c.alg = 1 AND c.bucket_us = rec.bw;
            IF FOUND THEN
                IF b IS NOT NULL THEN
                    FOR z IN 1 .. cardinality(b) / 2 LOOP
                        IF b[2 * z - 1] = rec.mark THEN
                            nn := greatest(0, nn - least(rec.unused, b[2 * z]));
                            b[2 * z] := greatest(0, b[2 * z] - rec.unused);
                            done := true;
                        END IF;
                    END LOOP;
                END IF;
                UPDATE {{schema}}.counters c
                SET buckets = b, n = nn,
                    leased = CASE WHEN c.lease_mark = rec.mark THEN greatest(0, c.leased - rec.settled) ELSE c.leased END,
                    need_us = CASE WHEN c.lease_mark = rec.mark THEN 0 ELSE c.need_us END
                WHERE c.rule = rec.rule AND c.key = rec.key
                  AND (done OR c.lease_mark = rec.mark);
                done := done OR FOUND;
            END IF;
        END IF;
        IF done THEN
            changed := changed + 1;
            -- Whoever waits on a recall of this counter may ask again.
            PERFORM pg_notify('sluice_leases', concat_ws(chr(31), '{{schema}}', 'g', rec.rule, rec.key));
        END IF;
    END LOOP;
    RETURN changed;
END;
$$;

COMMENT ON FUNCTION {{schema}}.return_leases(text[], text[], smallint[], bigint[], bigint[], bigint[], bigint[]) IS
    'sluice: give back units leased and not spent; source: limiter/postgres/sql/lease_functions.sql';

-- reset_counter forgets one counter (an admin reset) and records a key event
-- so that every gateway drops the key from its over-limit cache and gives
-- up its leases of it; it returns the event's time (µs, database clock). The
-- units out on live leases (of the counter's current window or bucket) stay
-- counted, as the counter's whole count, until their holders give them up:
-- a holder cannot tell the database which of its units it spent before the
-- reset and which after, so the count holds them all until the holder hears
-- of the reset, at once through sluice_leases ('x', with the reset's time)
-- or in its next poll (the key event says reset, migration 0007), and
-- returns what it did not spend with what it spent before the reset
-- (version 3). A counter with no live lease is deleted. p_now_us overrides
-- the clock for tests, as in decide.
CREATE OR REPLACE FUNCTION {{schema}}.reset_counter(p_now_us bigint, p_rule text, p_key text)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    c     record;
    now_us bigint;
    live  boolean;
    at_us bigint;
BEGIN
    SELECT * INTO c FROM {{schema}}.counters
    WHERE rule = p_rule AND key = p_key FOR UPDATE;
    now_us := coalesce(p_now_us, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
    IF FOUND THEN
        live := c.leased > 0 AND CASE
            WHEN c.alg = 1 THEN c.bucket_us > 0 AND c.lease_mark = now_us / c.bucket_us
            WHEN c.alg IN (0, 2) THEN c.lease_mark = c.a
                AND c.expires_at > timestamptz 'epoch' + now_us * interval '1 microsecond'
            ELSE false END;
        IF live THEN
            UPDATE {{schema}}.counters
            SET n = c.leased, need_us = 0,
                buckets = CASE WHEN c.alg = 1 THEN ARRAY[c.lease_mark, c.leased] END
            WHERE rule = p_rule AND key = p_key;
        ELSE
            DELETE FROM {{schema}}.counters WHERE rule = p_rule AND key = p_key;
        END IF;
    END IF;
    INSERT INTO {{schema}}.key_events (rule, key, reset) VALUES (p_rule, p_key, true)
    RETURNING (extract(epoch FROM at) * 1e6)::bigint INTO at_us;
    -- Every gateway hears of it at once, leases or not: its over-limit
    -- cache forgets the key now rather than at its next poll.
    PERFORM pg_notify('sluice_leases', concat_ws(chr(31), '{{schema}}', 'x', p_rule, p_key, at_us::text));
    RETURN at_us;
END;
$$;

COMMENT ON FUNCTION {{schema}}.reset_counter(bigint, text, text) IS
    'sluice: reset one counter, keeping units out on live leases counted; source: limiter/postgres/sql/lease_functions.sql';
