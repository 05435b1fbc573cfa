-- The newest migration applied to the schema.
SELECT coalesce(max(version), 0) FROM {{schema}}.schema_migrations
