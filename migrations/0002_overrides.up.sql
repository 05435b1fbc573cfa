-- Per-identity overrides: (rule, hashed key) gets its own limit and window,
-- written by the admin API and read by every gateway instance.
--
-- Instances cache the whole table and poll override_epoch, a single row
-- whose generation a statement trigger bumps on every change to overrides
-- (inserts, updates and deletes alike, including hand-written SQL). Polling
-- one row every second or two costs nothing and, unlike LISTEN/NOTIFY,
-- works through a transaction-mode pooler such as PgBouncer and survives
-- reconnections and failovers without missed notifications. Deletions are
-- seen too, which polling max(updated_at) alone would miss.
CREATE TABLE {{schema}}.overrides (
    rule       text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    "limit"    bigint NOT NULL CHECK ("limit" > 0),
    window_us  bigint NOT NULL CHECK (window_us > 0),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (rule, key)
);

COMMENT ON TABLE {{schema}}.overrides IS
    'sluice per-identity limits: rule, hashed key, limit and window (µs) replacing the rule''s';

CREATE TABLE {{schema}}.override_epoch (
    id         boolean PRIMARY KEY DEFAULT true CHECK (id),
    generation bigint NOT NULL
);

INSERT INTO {{schema}}.override_epoch (id, generation) VALUES (true, 0);

CREATE FUNCTION {{schema}}.bump_override_epoch() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {{schema}}.override_epoch SET generation = generation + 1;
    RETURN NULL;
END;
$$;

CREATE TRIGGER overrides_bump_epoch
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {{schema}}.overrides
    FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.bump_override_epoch();
