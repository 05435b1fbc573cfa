DELETE FROM {{schema}}.overrides WHERE rule = $1::text AND key = $2::text
