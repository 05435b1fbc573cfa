-- Least-privilege database roles for sluice.
--
--   owner    owns sluice's schema and everything in it, and runs the
--            migrations (`sluice migrate`). Nothing else uses it.
--   runtime  what every gateway connects as. It can make decisions, read
--            and reset counters, set and delete overrides, read and prune
--            key events and delete expired counters (the janitor): it may
--            read and write the rows of sluice's tables, use their
--            sequences and run sluice's functions, and nothing more. It
--            can create, alter, drop or truncate nothing in the schema, nor
--            create schemas.
--
-- Run it with psql as a superuser (or a role that can create roles and is
-- a member of the owner role), connected to the database that holds (or
-- will hold) the schema, before the first migration:
--
--   psql "postgres://postgres@db.example.com:5432/app" -v ON_ERROR_STOP=1 \
--        -v owner_password="$SLUICE_OWNER_PASSWORD" \
--        -v runtime_password="$SLUICE_RUNTIME_PASSWORD" \
--        -f deploy/postgres/roles.sql
--
-- Then migrate as the owner, and run every gateway as the runtime role
-- with SLUICE_AUTO_MIGRATE=false (on a current schema auto-migrate is
-- harmless: it finds nothing to do and changes nothing):
--
--   SLUICE_DATABASE_URL=postgres://sluice_owner:…@db.example.com/app sluice migrate
--   SLUICE_DATABASE_URL=postgres://sluice_runtime:…@db.example.com/app SLUICE_AUTO_MIGRATE=false sluice
--
-- psql variables (-v name=value), all optional:
--   schema            sluice's schema, as in SLUICE_DB_SCHEMA (default sluice)
--   owner_role        the owner role's name (default sluice_owner)
--   runtime_role      the runtime role's name (default sluice_runtime)
--   owner_password    the owner role's password; when unset, a password
--                     already set is kept (or set none, for certificate or
--                     IAM authentication; psql's \password sets one later)
--   runtime_password  the runtime role's password, likewise
--
-- Passwords travel to the server inside ALTER ROLE statements, where
-- Postgres stores them hashed (SCRAM-SHA-256 by default); a server that
-- logs DDL (log_statement = 'ddl' or 'all') logs them too: there, leave
-- them unset and use \password.
--
-- Running it again is harmless, and grants what the runtime role needs on
-- the objects that exist by then as well. Default privileges give it the
-- same on whatever later migrations create as the owner role, so upgrades
-- need no new grants. Migrations run as another role (a superuser, say)
-- create objects the runtime role cannot use: migrate as the owner role.
--
-- The runtime role keeps what Postgres gives every role in a database:
-- temporary tables, and on Postgres 14 and older, CREATE in the public
-- schema (revoke that database-wide if you want it gone; sluice never uses
-- public).

\set ON_ERROR_STOP on
\if :{?schema}
\else
  \set schema sluice
\endif
\if :{?owner_role}
\else
  \set owner_role sluice_owner
\endif
\if :{?runtime_role}
\else
  \set runtime_role sluice_runtime
\endif

BEGIN;

-- The roles: created when missing, their attributes set either way.
SELECT format('CREATE ROLE %I', :'owner_role')
WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = :'owner_role') \gexec
SELECT format('CREATE ROLE %I', :'runtime_role')
WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = :'runtime_role') \gexec
ALTER ROLE :"owner_role" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
ALTER ROLE :"runtime_role" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
\if :{?owner_password}
ALTER ROLE :"owner_role" PASSWORD :'owner_password';
\endif
\if :{?runtime_password}
ALTER ROLE :"runtime_role" PASSWORD :'runtime_password';
\endif

GRANT CONNECT ON DATABASE :"DBNAME" TO :"owner_role", :"runtime_role";

-- The schema belongs to the owner, so migrations need no CREATE on the
-- database.
SELECT format('CREATE SCHEMA %I AUTHORIZATION %I', :'schema', :'owner_role')
WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = :'schema') \gexec
ALTER SCHEMA :"schema" OWNER TO :"owner_role";
REVOKE ALL ON SCHEMA :"schema" FROM PUBLIC;
-- USAGE only: look up the schema's objects, not create any.
GRANT USAGE ON SCHEMA :"schema" TO :"runtime_role";

-- Rows, not definitions: no TRUNCATE, REFERENCES or TRIGGER. USAGE on
-- sequences is what an INSERT that takes a serial id needs (key_events,
-- written by admin resets and by the overrides' trigger).
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA :"schema" TO :"runtime_role";
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA :"schema" TO :"runtime_role";
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA :"schema" TO :"runtime_role";

-- The same for everything the owner creates from now on.
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema"
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"runtime_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema"
    GRANT USAGE, SELECT ON SEQUENCES TO :"runtime_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA :"schema"
    GRANT EXECUTE ON FUNCTIONS TO :"runtime_role";

COMMIT;
