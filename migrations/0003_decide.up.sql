-- Version 3 created the decide function here. It now lives beside the
-- store that calls it, in limiter/postgres/sql/decide_function.sql, and
-- migrations.Up installs it after the numbered migrations, with CREATE OR
-- REPLACE, whenever the schema holds an older version (see
-- 0005_definitions). Schemas migrated before keep what this file created
-- until then; new ones get the function from there.
SELECT 1
