-- The overrides' generation, bumped by a trigger on every change.
SELECT generation FROM {{schema}}.override_epoch
