-- Key events: every admin reset of a counter and every change of an
-- override, so that every instance can drop that key from its over-limit
-- fast path (the LRU would otherwise keep denying it until its old reset).
-- Instances poll the recent rows (by time, with overlap: re-reading an
-- event is harmless, missing one is not); rows older than an hour are
-- pruned by the pollers. Keys are HMACs, never raw identifiers.
CREATE TABLE {{schema}}.key_events (
    id   bigserial PRIMARY KEY,
    rule text COLLATE "C" NOT NULL,
    key  text COLLATE "C" NOT NULL,
    at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX key_events_at ON {{schema}}.key_events (at);

-- An override changed (through the admin API or by hand): its key's cached
-- verdicts are stale on every instance.
CREATE FUNCTION {{schema}}.override_key_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO {{schema}}.key_events (rule, key) VALUES (OLD.rule, OLD.key);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO {{schema}}.key_events (rule, key) VALUES (NEW.rule, NEW.key);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER overrides_key_event
    AFTER INSERT OR UPDATE OR DELETE ON {{schema}}.overrides
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.override_key_event();
