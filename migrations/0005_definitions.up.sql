-- Definitions: objects replaced whole (CREATE OR REPLACE) rather than
-- changed step by step, such as the decide function. Each is one embedded
-- file that carries its version; migrations.Up installs it after the
-- numbered migrations when the schema holds an older version or none, and
-- records the version here. A store checks at start-up that the schema
-- holds at least the version it was built with.
CREATE TABLE {{schema}}.schema_definitions (
    name       text PRIMARY KEY,
    version    integer NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
