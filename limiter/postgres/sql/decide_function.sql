-- version: 7
--
-- decide: the whole limiter decision, computed in the database with the
-- database's clock, for a list of decisions at once. The store that calls
-- it (store.go, decide.go) is beside this file; migrations.Up installs it
-- with CREATE OR REPLACE whenever the schema holds an older version (the
-- number above, recorded in schema_definitions). limiter/storetest is the
-- executable definition of what it computes, for this store and the
-- in-memory one alike.
--
-- Batch-first: one call decides any number of decisions in order, each
-- seeing the state the previous one left (docs/algorithms.md, "a batch"), so
-- a gateway can send one statement for many concurrent requests. A single
-- request is simply a batch of one.
--
-- Arguments are parallel arrays, because arrays bind as ordinary typed
-- parameters (prepared once, no SQL built from values) and unnest() turns
-- them back into rows for set-based statements.
--
-- Slots are the distinct counters the batch touches, one per (rule, key),
-- sorted by (rule, key) in byte order (collation "C") and without
-- duplicates; each carries the parameters that apply to it, with any
-- per-key override already applied by the caller:
--   s_rule, s_key  the counter
--   s_alg          0 fixed, 1 sliding, 2 reset, 3 token (policy.Algorithm)
--   s_limit        limit, >= 1
--   s_window       window in µs, >= 1
--   s_bucket       sliding: bucket width in µs, dividing s_window (else 0)
--   s_burst        token: burst (else 0; 0 means the limit)
--   s_bounds       four per slot, flattened: for a fixed counter with a
--                  calendar window (policy.Calendar), the starts of four
--                  consecutive periods around the gateway's clock, b0 < b1
--                  < b2 < b3 (µs); the counter counts in whichever of
--                  [b0,b1), [b1,b2), [b2,b3) holds the database's clock,
--                  so that the gateway's zone rules and the database's
--                  instant decide together. Zeros for any other counter.
-- Checks are one rule's part of one decision, grouped by decision:
--   c_decision     decision number; checks of one decision are adjacent and
--                  decisions are applied in the order they appear
--   c_slot         1-based index of the check's counter in the slots
--   c_cost         tokens consumed, >= 1
--   c_count_all    the rule has count=all
--   c_shadow       the rule is shadow
--   c_lease        units the gateway asks to lease beyond the check's cost
--                  (0: none); granted only to a check of an allowed
--                  decision, at most a quarter of the room left after it,
--                  in whole multiples of c_cost, and never for token
--                  counters
--   c_held         units this gateway holds on a lease of the counter under
--                  c_mark (its own, so not "held by others"); 0 when none
--   c_mark         the mark (window start, or sliding bucket index) of
--                  that lease; c_held counts only when it is the
--                  counter's current mark
--   c_renewal      the decision is a lease renewal's phantom request: when
--                  allowed, its cost is leased too (the gateway holds it
--                  as a unit to spend), so leased counts every unit a
--                  gateway holds
--   c_settle       -1 for a check to decide. Otherwise the check settles a
--                  charge (charge=): c_settle is the units reserved when
--                  the request was admitted, c_cost what the response said
--                  it cost (>= 0), and c_mark the instant of the admission
--                  (µs). A settlement always applies and never denies: when
--                  the reservation still counts in the current window (or
--                  bucket span, or for a token bucket always) the
--                  difference is added, else the whole charge lands in the
--                  current window; a count never goes below zero, and may
--                  pass the limit (later requests are denied until the
--                  window gives room). A settlement's decision holds only
--                  settlements.
-- p_peek: decide but consume nothing and write nothing (the admin API's view
-- of a counter: what a request would get now).
-- p_now_us overrides the clock (µs since the Unix epoch) for tests; NULL
-- means the database clock, read with clock_timestamp() *after* the rows are
-- locked. now() would be the transaction's start, taken before a possibly
-- long wait for a lock; a decision that waited could then see a time older
-- than the state written by the decision it waited for, and a fixed window
-- would, for instance, be reset backwards and lose counts. Reading the clock
-- once the locks are held makes time move forward along each row's history.
--
-- Returns the clock used (µs) and, per check in input order: the check's own
-- verdict, the room left (negative after a charge took the counter past
-- its limit: the caller reads the count from it), the reset time (µs) and the retry-after (µs, 0 when
-- the check allowed), all computed after the decision consumed and after any
-- lease it was granted; the units granted; and, for a denied check, whether
-- other gateways hold leased units of its counter that may come back before
-- the retry-after (held).
--
-- Leases (limiter/postgres/lease.go; the columns are explained in migration
-- 0006): a granted lease is counted in n (and, for sliding, in the current
-- bucket) at once, so a counter never passes its limit whatever the holder
-- does, and it is added to leased under the counter's current mark.
-- The recall: a denied check whose counter has units leased to others
-- (leased less the asker's own c_held) recalls them: the call notifies the
-- channel sluice_leases ('r', at commit), which every gateway listens on,
-- and the holders give back at once what they have not spent (return_leases
-- notifies 'g' when they have); the denied gateway waits for that and asks
-- again. Such a denial is provisional (held): a 429 only once the committed
-- count has reached the limit. need_us is when the recall started (0: none
-- under this mark), and the first recall also writes a key event, which
-- every gateway's poll reads in case it missed the notification. Holders
-- that have not given back within recall_grace of the recall are taken to
-- be dead: the denial is then final (held false), and their units are the
-- only ones a denial ever leaves unused (the README's dead-holder bound).
--
-- Concurrency: the counters a batch touches that exist are locked FOR
-- UPDATE in (rule, key) order, then those that do not are inserted in that
-- order (the common case, every counter existing, costs one index probe per
-- counter). Every transaction takes its row locks in the one canonical
-- order, and an insert waits only for a transaction that is inserting (in
-- canonical order too) or deleting the same key, so no set of concurrent
-- decisions can wait on each other in a cycle: no deadlock, whatever order
-- the requests listed their rules in. The locks are held to commit, so the
-- counts are exact under any concurrency. A counter that another
-- transaction created between the two steps is locked only if that
-- needs no waiting (FOR UPDATE NOWAIT), since waiting out of order could
-- deadlock; otherwise the call fails with SQLSTATE 55P03
-- (lock_not_available) or 40001 (serialization_failure) having changed
-- nothing, and the caller retries (this takes two transactions creating
-- the same counter at once, and a third holding it). The exception is a
-- call that holds no row at all at that point (nothing existed, and every
-- counter it tried to create was created by another transaction first, as
-- when several gateways meet on a new hot key): it waits for the locks in
-- canonical order, exactly as step 1 does, instead of failing and making
-- its caller send the statement again. A counter deleted (by cleanup or an
-- admin reset) while the call waited for its lock is simply created anew.
--
-- Writes: each counter whose state changed is written once, by one UPDATE at
-- the end that touches no indexed column (a HOT update). Counters that
-- consumed nothing, were granted nothing and asked for nothing are not
-- written.
--
-- Version 7 added s_bounds (calendar windows) and c_settle (charges);
-- version 6 c_renewal (and the recall); version 5 the lease
-- arguments and results. A function's arguments
-- are its identity, so this creates a new function beside version 4's,
-- which older gateways of a rolling deploy keep calling (their decisions
-- stay exact: they count in n, which includes leased units). A row this call inserted and that
-- consumed nothing is deleted again before commit, so a flood of denied
-- requests from new keys leaves no rows behind.
CREATE OR REPLACE FUNCTION {{schema}}.decide(
    p_now_us    bigint,
    p_peek      boolean,
    s_rule      text[],
    s_key       text[],
    s_alg       smallint[],
    s_limit     bigint[],
    s_window    bigint[],
    s_bucket    bigint[],
    s_burst     bigint[],
    s_bounds    bigint[],
    c_decision  integer[],
    c_slot      integer[],
    c_cost      bigint[],
    c_count_all boolean[],
    c_shadow    boolean[],
    c_lease     bigint[],
    c_held      bigint[],
    c_mark      bigint[],
    c_renewal   boolean[],
    c_settle    bigint[],
    OUT now_us    bigint,
    OUT allowed   boolean[],
    OUT remaining bigint[],
    OUT reset_us  bigint[],
    OUT retry_us  bigint[],
    OUT granted   bigint[],
    OUT held      boolean[])
LANGUAGE plpgsql
-- Generic plans for the statements inside: their parameters are arrays
-- whose plans do not depend on the values, and the default (custom plans,
-- since a generic plan's estimate for unnest() looks costlier) would plan
-- every statement again on every call.
SET plan_cache_mode = force_generic_plan
-- And always through the primary key. A generic plan is made once per
-- session, from the statistics of that moment: a gateway that starts on an
-- empty or new table would plan a sequential scan with a hash join, and
-- keep it while the table grows until autovacuum's next analyze happened to
-- invalidate it, a scan of the whole table per decision. Without those
-- plans, the only one left is what the statements mean: for each counter,
-- one probe of the primary key (a nested loop over unnest), whatever the
-- statistics say. These settings hold for the function's statements only.
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
DECLARE
    ns integer := coalesce(cardinality(s_rule), 0);
    nc integer := coalesce(cardinality(c_slot), 0);

    -- Raw rows as locked, per slot.
    raw_alg  smallint[];
    raw_a    bigint[];
    raw_n    bigint[];
    raw_b    bigint[];
    raw_off  integer[];  -- offset of the row's buckets in raw_ring
    raw_len  integer[];
    raw_ring bigint[] := '{}';
    raw_leased bigint[];
    raw_mark   bigint[];
    raw_need   bigint[];
    fresh    boolean[];  -- no row before this call: no state yet
    locked   integer := 0;
    inserted integer;

    -- Working state per slot, normalised to now_us (see the algorithms):
    -- fixed and reset: st_a window start, st_n count; sliding: st_a current
    -- bucket index, st_n window total, the slot's (index, count) pairs in
    -- ring, oldest first, the last pair always the current bucket; token:
    -- st_a TAT.
    st_a   bigint[]  := array_fill(0::bigint, ARRAY[ns]);
    st_n   bigint[]  := array_fill(0::bigint, ARRAY[ns]);
    dirty  boolean[] := array_fill(false, ARRAY[ns]);
    st_k   bigint[]  := array_fill(0::bigint, ARRAY[ns]);  -- sliding: number of buckets in the window
    st_win bigint[]  := s_window;                          -- fixed: this window's length (a calendar period's)
    st_off integer[] := array_fill(0, ARRAY[ns]);          -- sliding: offset of the slot's pairs in ring
    st_len integer[] := array_fill(0, ARRAY[ns]);          -- sliding: number of pairs
    ring   bigint[] := '{}';
    -- Leases per slot: units leased under the current mark, the mark, and
    -- when the counter last asked for units back.
    st_leased bigint[] := array_fill(0::bigint, ARRAY[ns]);
    st_mark   bigint[] := array_fill(0::bigint, ARRAY[ns]);
    st_need   bigint[] := array_fill(0::bigint, ARRAY[ns]);
    need      boolean[] := array_fill(false, ARRAY[ns]);  -- ask for units back
    n_need    integer := 0;

    -- Per check.
    verdict boolean[];
    tnext   bigint[];    -- token: next TAT if the check consumes

    n_dirty integer := 0;  -- counters to write
    n_drop  integer := 0;  -- rows inserted by this call that consumed nothing

    rows  refcursor;  -- the rows being locked and loaded
    pass  integer;    -- 1: the counters that exist; 2: those created meanwhile
    rec   record;
    s     integer;
    x     integer;
    y     integer;
    q     integer;
    ok    boolean;
    valid boolean;
    alg   smallint;
    lim   bigint;
    win   bigint;
    cost  bigint;
    bw    bigint;   -- bucket width
    kk    bigint;   -- bucket count
    cur   bigint;   -- current bucket index
    j     bigint;
    v     bigint;
    acc   bigint;
    tt    bigint;   -- token emission interval T
    tau   bigint;   -- token tolerance
    rst   bigint;
    g     bigint;   -- units granted
    b0    integer;  -- a calendar slot's offset in s_bounds
    m     integer;
    z     integer;
    -- Holders that have not given back within recall_grace (µs) of a
    -- recall are taken to be dead (see the top of this file).
    recall_grace constant bigint := 1000000;
BEGIN
    IF cardinality(s_key) IS DISTINCT FROM cardinality(s_rule)
       OR cardinality(s_alg) IS DISTINCT FROM cardinality(s_rule)
       OR cardinality(s_limit) IS DISTINCT FROM cardinality(s_rule)
       OR cardinality(s_window) IS DISTINCT FROM cardinality(s_rule)
       OR cardinality(s_bucket) IS DISTINCT FROM cardinality(s_rule)
       OR cardinality(s_burst) IS DISTINCT FROM cardinality(s_rule)
       OR cardinality(c_decision) IS DISTINCT FROM cardinality(c_slot)
       OR cardinality(c_cost) IS DISTINCT FROM cardinality(c_slot)
       OR cardinality(c_count_all) IS DISTINCT FROM cardinality(c_slot)
       OR cardinality(c_shadow) IS DISTINCT FROM cardinality(c_slot)
       OR cardinality(c_lease) IS DISTINCT FROM cardinality(c_slot)
       OR cardinality(c_held) IS DISTINCT FROM cardinality(c_slot)
       OR cardinality(c_mark) IS DISTINCT FROM cardinality(c_slot)
       OR cardinality(c_renewal) IS DISTINCT FROM cardinality(c_slot)
       OR cardinality(c_settle) IS DISTINCT FROM cardinality(c_slot)
       OR coalesce(cardinality(s_bounds), 0) IS DISTINCT FROM 4 * ns THEN
        RAISE EXCEPTION 'sluice decide: slot and check arrays must each have equal lengths'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    allowed   := array_fill(false, ARRAY[nc]);
    remaining := array_fill(0::bigint, ARRAY[nc]);
    reset_us  := array_fill(0::bigint, ARRAY[nc]);
    retry_us  := array_fill(0::bigint, ARRAY[nc]);
    granted   := array_fill(0::bigint, ARRAY[nc]);
    held      := array_fill(false, ARRAY[nc]);
    IF nc = 0 OR ns = 0 THEN
        now_us := coalesce(p_now_us, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
        RETURN;
    END IF;

    -- 1. Lock the counters that exist, in canonical order, and load their
    -- state. 2. Insert the counters that do not exist yet, in canonical
    -- order, so that this transaction holds every counter it decides on;
    -- then lock and load, in a second pass, the ones another transaction
    -- created first. One loop body loads the rows of both passes.
    raw_alg := array_fill(0::smallint, ARRAY[ns]);
    raw_a   := array_fill(0::bigint, ARRAY[ns]);
    raw_n   := array_fill(0::bigint, ARRAY[ns]);
    raw_b   := array_fill(0::bigint, ARRAY[ns]);
    raw_off := array_fill(0, ARRAY[ns]);
    raw_len := array_fill(0, ARRAY[ns]);
    raw_leased := array_fill(0::bigint, ARRAY[ns]);
    raw_mark   := array_fill(0::bigint, ARRAY[ns]);
    raw_need   := array_fill(0::bigint, ARRAY[ns]);
    fresh   := array_fill(true, ARRAY[ns]);
    pass    := 1;
    LOOP
        -- The slots in canonical order, each probing the primary key for
        -- its counter and locking it: LATERAL fixes that shape. A cursor is
        -- planned for its first rows, and as a join ordered by (rule, key)
        -- it was planned, on an empty table (every fresh deployment), as a
        -- walk of the whole index in key order with the batch compared
        -- against every counter, a plan each connection then kept as the
        -- table grew. Pass 2 takes the same shape for the slots it retries.
        IF pass = 1 OR (locked = 0 AND inserted = 0) THEN
            -- Every slot, waiting for each lock in canonical order.
            OPEN rows FOR
                SELECT u.i::integer AS i, c.alg, c.a, c.n, c.bucket_us, c.buckets,
                       c.leased, c.lease_mark, c.need_us, false AS mine
                FROM (SELECT * FROM unnest(s_rule, s_key) WITH ORDINALITY AS u(rule, key, i)
                      ORDER BY u.rule COLLATE "C", u.key COLLATE "C") AS u
                CROSS JOIN LATERAL (
                    SELECT * FROM {{schema}}.counters AS c
                    WHERE c.rule = u.rule AND c.key = u.key
                    FOR UPDATE) AS c;
        ELSE
            OPEN rows FOR
                SELECT u.i::integer AS i, c.alg, c.a, c.n, c.bucket_us, c.buckets,
                       c.leased, c.lease_mark, c.need_us,
                       c.expires_at = '-infinity' AS mine
                FROM (SELECT * FROM unnest(s_rule, s_key, fresh) WITH ORDINALITY AS u(rule, key, missing, i)
                      WHERE u.missing
                      ORDER BY u.rule COLLATE "C", u.key COLLATE "C") AS u
                CROSS JOIN LATERAL (
                    SELECT * FROM {{schema}}.counters AS c
                    WHERE c.rule = u.rule AND c.key = u.key
                    FOR UPDATE NOWAIT) AS c;
        END IF;
        LOOP
            FETCH rows INTO rec;
            EXIT WHEN NOT FOUND;
            -- The rows this call inserted itself are recognised by their
            -- '-infinity', which no committed row carries.
            CONTINUE WHEN rec.mine;
            s := rec.i;
            raw_alg[s] := rec.alg;
            raw_a[s]   := rec.a;
            raw_n[s]   := rec.n;
            raw_b[s]   := rec.bucket_us;
            raw_leased[s] := rec.leased;
            raw_mark[s]   := rec.lease_mark;
            raw_need[s]   := rec.need_us;
            fresh[s]   := false;
            IF pass = 1 THEN
                locked := locked + 1;
            ELSE
                n_drop := n_drop - 1;
            END IF;
            IF rec.buckets IS NOT NULL THEN
                raw_off[s] := cardinality(raw_ring);
                raw_len[s] := cardinality(rec.buckets);
                FOR q IN 1 .. raw_len[s] LOOP
                    raw_ring[raw_off[s] + q] := rec.buckets[q];
                END LOOP;
            END IF;
        END LOOP;
        CLOSE rows;
        EXIT WHEN pass = 2 OR locked = ns OR p_peek;

        -- 2. Insert what is missing.
        n_drop := ns - locked;
        INSERT INTO {{schema}}.counters AS c (rule, key, alg, expires_at)
        SELECT u.rule, u.key, u.alg, '-infinity'
        FROM unnest(s_rule, s_key, s_alg, fresh) AS u(rule, key, alg, missing)
        WHERE u.missing
        ORDER BY u.rule COLLATE "C", u.key COLLATE "C"
        ON CONFLICT (rule, key) DO NOTHING;
        GET DIAGNOSTICS inserted = ROW_COUNT;
        EXIT WHEN inserted = n_drop;
        -- Another transaction created some of them since step 1 and has
        -- committed (the insert waited for it). Waiting for their locks now,
        -- out of canonical order, could deadlock, so take them only if they
        -- are free (NOWAIT; else SQLSTATE 55P03 ends the call having
        -- changed nothing, and the caller retries), unless this call holds
        -- no row yet: then waiting in canonical order is what step 1 does.
        pass := 2;
    END LOOP;
    IF pass = 2 AND inserted <> n_drop THEN
        -- A counter created meanwhile was deleted again before we could see
        -- it: try again from the start.
        RAISE EXCEPTION 'sluice decide: a counter was created and deleted concurrently; retry the decision'
            USING ERRCODE = 'serialization_failure';
    END IF;

    -- 3. Now that the rows are ours, read the clock.
    now_us := coalesce(p_now_us, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);

    -- 4. Normalise each counter's state to now_us. A row left by a different
    -- algorithm (or bucket layout) is read as absent.
    FOR s IN 1 .. ns LOOP
        alg := s_alg[s];
        win := s_window[s];
        valid := NOT fresh[s] AND raw_alg[s] = alg;
        CASE alg
        WHEN 0 THEN  -- fixed: windows aligned to the epoch, or calendar periods
            b0 := 4 * (s - 1);
            IF s_bounds[b0 + 2] = 0 THEN
                st_a[s] := (now_us / win) * win;
            ELSE
                q := 1;
                WHILE q <= 3 AND NOT (now_us >= s_bounds[b0 + q] AND now_us < s_bounds[b0 + q + 1]) LOOP
                    q := q + 1;
                END LOOP;
                IF q > 3 THEN
                    RAISE EXCEPTION 'sluice decide: the gateway''s clock and the database''s differ by more than a calendar period'
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
                st_a[s] := s_bounds[b0 + q];
                st_win[s] := s_bounds[b0 + q + 1] - s_bounds[b0 + q];
            END IF;
            IF valid AND raw_a[s] = st_a[s] THEN
                st_n[s] := raw_n[s];
            END IF;
        WHEN 2 THEN  -- reset: the window starts at the first consuming request
            IF valid AND now_us < raw_a[s] + win THEN
                st_a[s] := raw_a[s];
                st_n[s] := raw_n[s];
            ELSE
                st_a[s] := now_us;
            END IF;
        WHEN 3 THEN  -- token: absent means TAT = now; 0 is equivalent
            IF valid THEN
                st_a[s] := raw_a[s];
            END IF;
        WHEN 1 THEN  -- sliding: keep the buckets still inside the window
            bw  := s_bucket[s];
            kk  := win / bw;
            cur := now_us / bw;
            st_k[s]   := kk;
            st_a[s]   := cur;
            st_off[s] := cardinality(ring);
            valid := valid AND raw_b[s] = bw;
            acc := 0;
            m := 0;
            IF valid THEN
                FOR z IN 0 .. raw_len[s] / 2 - 1 LOOP
                    j := raw_ring[raw_off[s] + 2 * z + 1];
                    v := raw_ring[raw_off[s] + 2 * z + 2];
                    IF j > cur - kk AND j <= cur AND v <> 0 THEN
                        ring[st_off[s] + 2 * m + 1] := j;
                        ring[st_off[s] + 2 * m + 2] := v;
                        m := m + 1;
                        acc := acc + v;
                    END IF;
                END LOOP;
            END IF;
            -- Room for the current bucket at the end: every decision of the
            -- batch shares now_us, so no other bucket can be added.
            IF m = 0 OR ring[st_off[s] + 2 * m - 1] <> cur THEN
                ring[st_off[s] + 2 * m + 1] := cur;
                ring[st_off[s] + 2 * m + 2] := 0;
                m := m + 1;
            END IF;
            st_len[s] := m;
            st_n[s] := acc;
        ELSE
            RAISE EXCEPTION 'sluice decide: unknown algorithm %', alg
                USING ERRCODE = 'invalid_parameter_value';
        END CASE;
        -- Leases belong to the window (fixed, reset) or the bucket
        -- (sliding) they were granted in: the current mark. Leases of
        -- another mark have expired (their unspent units stay counted where
        -- they were granted until they are returned).
        IF alg <> 3 THEN
            st_mark[s] := st_a[s];
            IF valid AND raw_mark[s] = st_mark[s] THEN
                st_leased[s] := raw_leased[s];
                st_need[s] := raw_need[s];
            END IF;
        END IF;
    END LOOP;

    -- 5. Apply the decisions one after another.
    verdict := array_fill(false, ARRAY[nc]);
    tnext   := array_fill(0::bigint, ARRAY[nc]);
    x := 1;
    WHILE x <= nc LOOP
        y := x;
        WHILE y < nc AND c_decision[y + 1] = c_decision[x] LOOP
            y := y + 1;
        END LOOP;

        -- 5a. Each check's own verdict against the state as of now.
        ok := true;
        FOR q IN x .. y LOOP
            s := c_slot[q];
            lim := s_limit[s];
            cost := c_cost[q];
            IF c_settle[q] >= 0 THEN
                verdict[q] := true;  -- a settlement always applies
            ELSIF s_alg[s] = 3 THEN
                tt  := greatest(1, s_window[s] / lim);
                tau := CASE WHEN s_burst[s] > 0 THEN s_burst[s] ELSE lim END * tt;
                tnext[q] := greatest(st_a[s], now_us) + cost * tt;
                verdict[q] := tnext[q] - now_us <= tau;
            ELSE
                verdict[q] := st_n[s] + cost <= lim;
            END IF;
            IF NOT verdict[q] AND NOT c_shadow[q] THEN
                ok := false;
            END IF;
        END LOOP;

        -- 5b. All or nothing: an allowed request consumes from every check
        -- that allowed it, a denied one from none; a count=all check counts
        -- every request, allowed or denied, and whatever its own verdict (a
        -- shadow count=all check over its limit counts the request it would
        -- have denied, as it would if it were enforced).
        FOR q IN x .. y LOOP
            IF NOT p_peek AND c_settle[q] >= 0 THEN
                -- A charge settled: the difference to the reservation when
                -- the reservation still counts where the charge would go,
                -- else the whole charge, in the current window.
                s := c_slot[q];
                cost := c_cost[q];
                CASE s_alg[s]
                WHEN 3 THEN
                    tt := greatest(1, s_window[s] / s_limit[s]);
                    st_a[s] := greatest(now_us, greatest(st_a[s], now_us) + (cost - c_settle[q]) * tt);
                WHEN 1 THEN
                    bw := s_bucket[s];
                    IF c_mark[q] / bw > st_a[s] - st_k[s] THEN
                        cost := cost - c_settle[q];
                    END IF;
                    j := st_off[s] + 2 * st_len[s];  -- the current bucket's count
                    v := greatest(0, ring[j] + cost);
                    st_n[s] := st_n[s] + v - ring[j];
                    ring[j] := v;
                ELSE
                    IF c_mark[q] >= st_a[s] THEN
                        cost := cost - c_settle[q];
                    END IF;
                    st_n[s] := greatest(0, st_n[s] + cost);
                END CASE;
            ELSIF NOT p_peek AND ((ok AND verdict[q]) OR c_count_all[q]) THEN
                s := c_slot[q];
                cost := c_cost[q];
                -- A lease for an allowed check: a quarter of the room left
                -- after it at most, in whole requests of its cost.
                g := 0;
                IF ok AND verdict[q] AND c_lease[q] > 0 AND s_alg[s] <> 3 THEN
                    g := least(c_lease[q], (s_limit[s] - st_n[s] - cost) / 4);
                    g := greatest(0, g / cost * cost);
                    granted[q] := g;
                    st_leased[s] := st_leased[s] + g;
                END IF;
                IF ok AND verdict[q] AND c_renewal[q] AND s_alg[s] <> 3 THEN
                    -- The phantom request's own units are the holder's too.
                    granted[q] := granted[q] + cost;
                    st_leased[s] := st_leased[s] + cost;
                END IF;
                CASE s_alg[s]
                WHEN 3 THEN
                    st_a[s] := tnext[q];
                WHEN 1 THEN
                    j := st_off[s] + 2 * st_len[s];  -- the current bucket's count
                    ring[j] := ring[j] + cost + g;
                    st_n[s] := st_n[s] + cost + g;
                ELSE
                    st_n[s] := st_n[s] + cost + g;
                END CASE;
            ELSE
                CONTINUE;  -- nothing changed
            END IF;
            -- The counter changed: it is written once, at the end.
            IF NOT dirty[s] THEN
                dirty[s] := true;
                n_dirty := n_dirty + 1;
                IF fresh[s] THEN
                    n_drop := n_drop - 1;
                END IF;
            END IF;
        END LOOP;

        -- 5c. Results, on the state after consuming.
        FOR q IN x .. y LOOP
            s := c_slot[q];
            lim := s_limit[s];
            win := s_window[s];
            cost := c_cost[q];
            allowed[q] := verdict[q];
            CASE s_alg[s]
            WHEN 3 THEN
                tt  := greatest(1, win / lim);
                tau := CASE WHEN s_burst[s] > 0 THEN s_burst[s] ELSE lim END * tt;
                rst := greatest(st_a[s], now_us);
                -- floor division, as the memory store's, also below zero
                v := now_us + tau - rst;
                remaining[q] := CASE WHEN v >= 0 THEN v / tt ELSE -((tt - 1 - v) / tt) END;
                -- On the state after consuming, so that a counted denial's
                -- retry waits for its own count too (limiter/storetest pins
                -- this reading); for any other denial this is next - τ - now.
                IF NOT verdict[q] THEN
                    retry_us[q] := rst + cost * tt - tau - now_us;
                END IF;
            WHEN 1 THEN
                kk  := st_k[s];
                cur := st_a[s];
                bw  := s_bucket[s];
                remaining[q] := lim - st_n[s];
                rst := now_us;  -- when every bucket is empty
                z := st_len[s];
                WHILE z >= 1 LOOP
                    IF ring[st_off[s] + 2 * z] <> 0 THEN
                        rst := (ring[st_off[s] + 2 * z - 1] + kk) * bw;
                        EXIT;
                    END IF;
                    z := z - 1;
                END LOOP;
                IF NOT verdict[q] THEN
                    IF cost > lim THEN
                        retry_us[q] := rst - now_us;
                    ELSE
                        -- the first time enough old buckets have left the window
                        v := st_n[s] + cost - lim;
                        acc := 0;
                        FOR z IN 1 .. st_len[s] LOOP
                            acc := acc + ring[st_off[s] + 2 * z];
                            IF acc >= v THEN
                                retry_us[q] := (ring[st_off[s] + 2 * z - 1] + kk) * bw - now_us;
                                EXIT;
                            END IF;
                        END LOOP;
                    END IF;
                END IF;
            ELSE  -- fixed and reset
                rst := st_a[s] + st_win[s];
                remaining[q] := lim - st_n[s];
                IF NOT verdict[q] THEN
                    retry_us[q] := rst - now_us;
                END IF;
            END CASE;
            reset_us[q] := rst;
            -- Units leased to other gateways: recall them, and say the
            -- denial is provisional, unless a recall has gone unanswered
            -- for recall_grace (dead holders: the denial is final).
            IF NOT verdict[q] AND s_alg[s] <> 3 AND st_leased[s]
                    - (CASE WHEN c_mark[q] = st_mark[s] THEN c_held[q] ELSE 0 END) > 0
                    AND (st_need[s] = 0 OR now_us - st_need[s] < recall_grace) THEN
                held[q] := true;
                IF NOT p_peek AND NOT need[s] THEN
                    need[s] := true;
                    PERFORM pg_notify('sluice_leases', concat_ws(chr(31), '{{schema}}', 'r', s_rule[s], s_key[s]));
                    IF st_need[s] = 0 THEN
                        st_need[s] := now_us;
                        n_need := n_need + 1;  -- a key event, for the polls
                        IF NOT dirty[s] THEN
                            dirty[s] := true;
                            n_dirty := n_dirty + 1;
                            IF fresh[s] THEN
                                n_drop := n_drop - 1;
                            END IF;
                        END IF;
                    END IF;
                END IF;
            END IF;
        END LOOP;

        x := y + 1;
    END LOOP;

    -- 6. Write each changed counter once; drop rows this call created for
    -- nothing. expires_at is the counter's reset: after it, no row is the
    -- same as this row. (Set-based, because every distinct PL/pgSQL
    -- expression costs a set-up in each transaction.)
    IF n_dirty > 0 THEN
        UPDATE {{schema}}.counters AS c
        SET alg = u.alg, a = u.a, n = u.n,
            bucket_us = CASE WHEN u.alg = 1 THEN u.bw ELSE 0 END,
            buckets = CASE WHEN u.alg = 1 THEN ring[u.off + 1 : u.off + 2 * u.len] END,
            leased = u.leased, lease_mark = u.mark, need_us = u.need,
            expires_at = timestamptz 'epoch' + interval '1 microsecond' * CASE u.alg
                WHEN 3 THEN greatest(u.a, now_us)
                -- the current bucket is not empty (or only asked for units back)
                WHEN 1 THEN (u.a + u.k) * u.bw
                ELSE u.a + u.win END
        FROM unnest(s_rule, s_key, s_alg, st_a, st_n, s_bucket, st_win, st_k, st_off, st_len, dirty,
                    st_leased, st_mark, st_need)
            AS u(rule, key, alg, a, n, bw, win, k, off, len, dirty, leased, mark, need)
        WHERE u.dirty AND c.rule = u.rule AND c.key = u.key;
    END IF;
    IF n_need > 0 THEN
        INSERT INTO {{schema}}.key_events (rule, key)
        SELECT u.rule, u.key FROM unnest(s_rule, s_key, need, st_need) AS u(rule, key, need, at)
        WHERE u.need AND u.at = now_us;
    END IF;
    IF n_drop > 0 THEN
        DELETE FROM {{schema}}.counters AS c
        USING unnest(s_rule, s_key, fresh, dirty) AS u(rule, key, fresh, dirty)
        WHERE u.fresh AND NOT u.dirty AND c.rule = u.rule AND c.key = u.key;
    END IF;
END;
$$;

COMMENT ON FUNCTION {{schema}}.decide(bigint, boolean, text[], text[], smallint[], bigint[], bigint[],
    bigint[], bigint[], bigint[], integer[], integer[], bigint[], boolean[], boolean[], bigint[], bigint[], bigint[], boolean[],
    bigint[]) IS
    'sluice: decide a batch of rate-limit decisions atomically; source: limiter/postgres/sql/decide_function.sql';
